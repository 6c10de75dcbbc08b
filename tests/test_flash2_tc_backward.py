"""flash2_tc's backward in the simulator (the mma stand-ins): dq, dk, dv against float64 by Dao-AILab's rule,
both backward paths, both instruction paths, float16 and bfloat16, causal, Nq != Nk, GQA, dropout; the
deterministic path bit for bit over repeated calls; counted bytes equal to the IO model.

Tiny sizes run everywhere (the simulator runs every thread as Python: the file takes about 80 s on the CI
machine); real sizes (N = 97 .. 4099, d = 64 and 128) and 20 repeated calls only on a GPU."""

import numpy as np
import pytest

import flash_numba as fn
from flash_numba import _switches, iomodel, reference
from flash_numba.kernels import _bf16



def _inputs(rng, lead, Nq, Nk, d, dtype, kv_lead=None):
    kv_lead = lead if kv_lead is None else kv_lead
    x = [rng.standard_normal(shape + (n, d)) for shape, n in ((lead, Nq), (kv_lead, Nk), (kv_lead, Nk), (lead, Nq))]
    if dtype == "bfloat16":
        words = [_bf16.to_bf16_bits(a) for a in x]
        return [fn.as_bfloat16(w) for w in words], [_bf16.from_bf16_bits(w).astype(np.float64) for w in words]
    half = [a.astype(np.float16) for a in x]
    return half, [a.astype(np.float64) for a in half]


def _as_f64(x, dtype):
    x = np.asarray(x)
    return _bf16.from_bf16_bits(x.view(np.uint16)).astype(np.float64) if dtype == "bfloat16" else x.astype(np.float64)


def _plain(q, k, v, do, causal, dtype, dropout=None):
    """A plain attention backward rounded to the storage type after every step (the same-precision yardstick)."""
    rnd = (lambda a: _bf16.from_bf16_bits(_bf16.to_bf16_bits(a)).astype(np.float64)) if dtype == "bfloat16" \
        else (lambda a: a.astype(np.float16).astype(np.float64))
    G = q.shape[-3] // k.shape[-3] if q.ndim > 2 else 1
    if G > 1:
        k, v = (np.repeat(a, G, axis=-3) for a in (k, v))
    scale = q.shape[-1] ** -0.5
    s = rnd(scale * q @ np.swapaxes(k, -1, -2))
    Nq, Nk = s.shape[-2:]
    if causal:
        s = np.where(np.arange(Nk)[None, :] > np.arange(Nq)[:, None] + Nk - Nq, -np.inf, s)
    m = np.max(s, -1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m)
    p = rnd(e / np.maximum(e.sum(-1, keepdims=True), 1e-300))
    pd = p if dropout is None else rnd(p * dropout)
    o = rnd(pd @ v)
    dv = rnd(np.swapaxes(pd, -1, -2) @ do)
    dp = rnd(do @ np.swapaxes(v, -1, -2))
    if dropout is not None:
        dp = dp * dropout
    ds = rnd(p * (dp - rnd((do * o).sum(-1, keepdims=True))))
    dq, dk = rnd(scale * ds @ k), rnd(scale * np.swapaxes(ds, -1, -2) @ q)
    if G > 1:
        dk, dv = (a.reshape(a.shape[:-3] + (a.shape[-3] // G, G) + a.shape[-2:]).sum(-3) for a in (dk, dv))
    return dq, dk, dv


def _check(rng, lead, Nq, Nk, d, causal, dtype, deterministic, kv_lead=None, dropout_p=0.0, repeat=False):
    (q, k, v, do), (q64, k64, v64, do64) = _inputs(rng, lead, Nq, Nk, d, dtype, kv_lead)
    fwd = fn.attention_forward(q, k, v, causal=causal, kernel="flash2_tc", dropout_p=dropout_p)
    o = fn.as_bfloat16(fwd.o) if dtype == "bfloat16" else fwd.o  # NumPy bfloat16 outputs are uint16 words
    res = fn.attention_backward(q, k, v, o, fwd.lse, do, causal=causal, kernel="flash2_tc",
                                      deterministic=deterministic, count_hbm=True, dropout_p=dropout_p,
                                      dropout_seed=fwd.dropout_seed if dropout_p else None)
    assert res.kernel == "flash2_tc"
    keep = None
    seed = fwd.dropout_seed if dropout_p else None
    if dropout_p:
        from flash_numba.kernels import _dropout
        BH = int(np.prod(q64.shape[:-2]))
        keep = (_dropout.keep_mask(seed, np.arange(BH), Nq, Nk, dropout_p) / (1 - dropout_p)).reshape(
            q64.shape[:-2] + (Nq, Nk))
    o64, lse64 = reference.attention_forward(q64, k64, v64, causal=causal, dropout_p=dropout_p, dropout_seed=seed)
    want = reference.attention_backward(q64, k64, v64, o64, lse64, do64, causal=causal, dropout_p=dropout_p,
                                        dropout_seed=seed)
    plain = _plain(q64, k64, v64, do64, causal, dtype, keep)
    for name, got, w, p in zip(("dq", "dk", "dv"), (res.dq, res.dk, res.dv), want, plain):
        g = _as_f64(got, dtype)
        assert not np.isnan(g).any(), f"{name}: an element was never written"
        ours, base = np.abs(g - w).max(), np.abs(p - w).max()
        assert ours <= 2 * base + 1e-3 * np.abs(w).max() + 1e-6, (name, ours, base)
    BH = int(np.prod(q64.shape[:-2]))
    G = BH // int(np.prod(k64.shape[:-2]))
    model = iomodel.backward("flash2_tc", BH, Nq, Nk, d, np.uint16 if dtype == "bfloat16" else np.float16, causal,
                             deterministic=deterministic, G=G)
    assert res.hbm.per_kernel == model.per_kernel
    if repeat:
        again = fn.attention_backward(q, k, v, o, fwd.lse, do, causal=causal, kernel="flash2_tc",
                                            deterministic=True)
        for a, b in zip((res.dq, res.dk, res.dv), (again.dq, again.dk, again.dv)):
            assert np.array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))


@pytest.mark.parametrize("Nq, Nk, d, causal, dtype, deterministic", [
    (17, 17, 16, False, "float16", True),
    (33, 20, 32, True, "float16", False),  # Nq > Nk: rows that see no key
    (1, 33, 16, True, "bfloat16", True),
    (20, 33, 16, False, "bfloat16", False),
    (17, 40, 48, True, "float16", False),  # d/2 an odd number of n8 tiles: the atomic dQ's last tile alone
    (17, 40, 80, True, "float16", False),  # 32 keys a dK/dV block, an odd number of dK/dV tiles a warp
    (33, 17, 96, False, "bfloat16", True),
])
def test_gradients_dao_rule_and_counted_bytes(rng, Nq, Nk, d, causal, dtype, deterministic):
    _check(rng, (1,), Nq, Nk, d, causal, dtype, deterministic, repeat=deterministic and Nq == 17)


def test_gqa_and_dropout(rng):
    _check(rng, (4,), 17, 17, 16, True, "float16", True, kv_lead=(2,), dropout_p=0.25)


def test_sm75_path(rng, monkeypatch):
    monkeypatch.setattr(_switches, "TC_PATH", "sm75")
    _check(rng, (1,), 17, 17, 16, True, "float16", False)


def test_dropout_atomic(rng):
    _check(rng, (2,), 20, 17, 32, False, "bfloat16", False, dropout_p=0.2)


def test_strided_views_give_the_same_bits(rng):
    """q, k, v as views of one packed (B, N, 3, H, d) buffer and o, dO transposed (B, N, H, d): read in place, the
    gradients bit for bit those of contiguous inputs (the same kernels on the same values)."""
    from numba import cuda
    from test_strides import packed, transposed

    q, k, v, do = (rng.standard_normal((2, 2, 17, 32)).astype(np.float16) for _ in range(4))
    fwd = fn.attention_forward(q, k, v, causal=True, kernel="flash2_tc")
    o = np.asarray(fwd.o)
    want = fn.attention_backward(q, k, v, o, fwd.lse, do, causal=True, kernel="flash2_tc")
    dq_, dk_, dv_ = packed(q, k, v)
    for deterministic in (True, False):
        got = fn.attention_backward(dq_, dk_, dv_, transposed(o), cuda.to_device(fwd.lse), transposed(do), causal=True,
                                    kernel="flash2_tc", deterministic=deterministic, count_hbm=True)
        assert got.hbm.per_kernel == iomodel.backward("flash2_tc", 4, 17, 17, 32, np.float16, True,
                                                      deterministic=deterministic).per_kernel
        if deterministic:
            for a, b in zip((want.dq, want.dk, want.dv), (got.dq, got.dk, got.dv)):
                assert np.array_equal(np.asarray(a), b.copy_to_host())


@pytest.mark.gpu
@pytest.mark.parametrize("N, d, causal, dtype", [(97, 64, False, "float16"), (1000, 64, True, "bfloat16"),
                                                 (1000, 128, False, "float16"), (4099, 128, True, "float16"),
                                                 (4099, 64, False, "bfloat16")])
def test_gpu_real_sizes(rng, N, d, causal, dtype):
    """Both backward paths at real sizes against float64 (Dao-AILab's rule), counted bytes == model, and the
    deterministic path bit for bit over repeated calls."""
    for deterministic in (True, False):
        _check(rng, (1,), N, N, d, causal, dtype, deterministic, repeat=deterministic)


@pytest.mark.gpu
def test_gpu_deterministic_over_20_calls(rng):
    (q, k, v, do), _ = _inputs(rng, (2, 4), 1000, 1000, 64, "float16")
    f = fn.attention_forward(q, k, v, kernel="flash2_tc", causal=True)
    first = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_tc", causal=True)
    for _ in range(19):
        again = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_tc", causal=True)
        for a, b in zip((first.dq, first.dk, first.dv), (again.dq, again.dk, again.dv)):
            assert np.array_equal(np.asarray(a), np.asarray(b))


def test_unaligned_rows_take_element_loads(rng, monkeypatch):
    """q starting 2 bytes past a 16-byte boundary: no 16-byte loads (the launcher sees it), the same bits."""
    from numba import cuda

    from flash_numba.kernels import _vec

    q, k, v, do = (rng.standard_normal((1, 2, 17, 16)).astype(np.float16) for _ in range(4))
    fwd = fn.attention_forward(q, k, v, kernel="flash2_tc")
    o = np.asarray(fwd.o)
    want = fn.attention_backward(q, k, v, o, fwd.lse, do, kernel="flash2_tc")
    buf = cuda.to_device(np.concatenate([np.zeros(1, np.float16), q.ravel()]))
    q_off = buf[1:].reshape(q.shape)
    seen = []
    real = _vec.aligned16
    monkeypatch.setattr(_vec, "aligned16", lambda x, lay: seen.append(real(x, lay)) or seen[-1])
    dev = [cuda.to_device(x) for x in (k, v, o, fwd.lse, do)]
    for deterministic in (True, False):
        got = fn.attention_backward(q_off, dev[0], dev[1], dev[2], dev[3], dev[4], kernel="flash2_tc",
                                    deterministic=deterministic)
        for a, b in zip((want.dq, want.dk, want.dv), (got.dq, got.dk, got.dv)):
            assert np.array_equal(np.asarray(a), b.copy_to_host())
    assert seen and not seen[0]  # q's rows: not on 16 bytes
