"""flash2: forward and backward against the float64 reference, HBM counts against the IO model.

Simulator tests use tiny sizes and explicit small blocks (tiles cut by the
sequence's end, Br and Bc that are not multiples of the 8 x 16 thread grid);
``gpu`` tests use real sizes and the default blocks.  Errors are relative to the
largest entry of the reference: ``max|x - ref| / max|ref|``.
"""

import math

import numpy as np
import pytest

import flash_numba as fn
from flash_numba import _inputs, blocks, iomodel, reference
from flash_numba.device import STATIC_SHARED_LIMIT
from flash_numba.kernels import flash2

DS = (16, 32, 64, 80, 128)
DTYPES = (np.float16, np.float32, np.float64)


def default_block(d, dtype, pass_):
    """flash2's block for 48 KB of shared memory, whatever the device present."""
    return flash2.SPEC.block(d, dtype, pass_, budget=STATIC_SHARED_LIMIT)


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    # relative to the largest entry, absolute when every entry is below 1: a gradient that cancels
    # (one visible key: dS = P (dP - D) with P = 1) is rounding noise, ~1e-16 in float64, ~1e-7 here
    return np.max(np.abs(x - ref)) / max(np.max(np.abs(ref)), 1.0)


def err64(x, ref):
    """For float64: relative to the largest entry, absolute where all entries are below 1
    (gradients that cancel to ~0, e.g. one visible key or a one-hot softmax, give dS ~ 1e-16)."""
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return np.max(np.abs(x - ref)) / max(np.max(np.abs(ref)), 1.0)


def make(rng, BH, Nq, Nk, d, dtype, spread=1.0):
    """q, k, v, do with standard normal entries (q and k times ``spread``), shape (BH, N, d)."""
    q = spread * rng.standard_normal((BH, Nq, d))
    k = spread * rng.standard_normal((BH, Nk, d))
    v = rng.standard_normal((BH, Nk, d))
    do = rng.standard_normal((BH, Nq, d))
    return tuple(x.astype(dtype) for x in (q, k, v, do))


def run(q, k, v, do, causal, block=None, count_hbm=True):
    f = fn.flash_attention_forward(q, k, v, causal=causal, kernel="flash2", block=block, count_hbm=count_hbm)
    b = fn.flash_attention_backward(
        q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2", block=block, count_hbm=count_hbm
    )
    return f, b


def outputs(f, b):
    return f.o, f.lse, b.dq, b.dk, b.dv


def check_counts(f, b, q, k, causal):
    """Counted bytes equal the IO model, kernel by kernel."""
    BH, Nq, d = q.shape
    Nk, dt = k.shape[1], q.dtype
    assert f.hbm == iomodel.forward("flash2", BH, Nq, Nk, d, dt, causal, f.block)
    assert b.hbm == iomodel.backward("flash2", BH, Nq, Nk, d, dt, causal, b.block)
    assert list(b.hbm.per_kernel) == ["D = rowsum(dO*O)", "dK, dV", "dQ"]


def check_lse(lse, lse_ref, tol):
    """Same -inf rows (no visible key), finite elsewhere and within ``tol`` (relative)."""
    masked = np.isneginf(lse_ref)
    assert np.array_equal(np.isneginf(lse), masked)
    assert np.all(np.isfinite(lse[~masked]))
    if (~masked).any():
        assert rel_err(lse[~masked], lse_ref[~masked]) < tol


def plain_backward(q, k, v, o, do, causal, dtype=np.float16):
    """The backward computed and rounded entirely in ``dtype``: the baseline of Dao-AILab's rule."""
    q, k, v, o, do = (np.asarray(x).astype(dtype) for x in (q, k, v, o, do))
    s = dtype(1 / math.sqrt(q.shape[-1]))
    S = (q * s) @ k.swapaxes(-1, -2)  # (BH, Nq, Nk)
    if causal:
        S = np.where(reference.causal_mask(q.shape[-2], k.shape[-2]), S, dtype(-np.inf))
    m = S.max(axis=-1, keepdims=True)
    P = np.exp(S - np.where(m == -np.inf, dtype(0), m))
    l = P.sum(axis=-1, keepdims=True)
    P = P / np.where(l > 0, l, dtype(1))
    dv = P.swapaxes(-1, -2) @ do
    dP = do @ v.swapaxes(-1, -2)
    D = (do * o).sum(axis=-1, keepdims=True)
    dS = P * (dP - D)
    return ((dS @ k) * s, (dS.swapaxes(-1, -2) @ q) * s, dv)


# ----------------------------------------------------------------------------- simulator sizes

# (BH, Nq, Nk, d, (Br, Bc), causal)
SHAPES = [
    (2, 17, 17, 8, (8, 16), False),  # tiles cut by the end of both sequences
    (1, 13, 22, 8, (5, 8), True),  # Nq < Nk; Br not a multiple of 8
    (1, 22, 13, 16, (8, 5), True),  # Nq > Nk: rows 0..8 see no key, query block 0 visits no K/V block
    (1, 22, 13, 4, (16, 32), False),  # Nq > Nk; one K/V block larger than Nk
    (1, 5, 7, 8, (16, 16), True),  # blocks larger than both sequences
    (1, 1, 1, 4, (3, 3), False),  # N = 1
    (1, 1, 9, 4, (2, 4), True),  # Nq = 1 sees every key (bottom-right aligned)
    (1, 9, 1, 4, (4, 2), True),  # Nk = 1: only the last query row sees it
]


@pytest.mark.parametrize("BH, Nq, Nk, d, block, causal", SHAPES)
def test_float64_matches_reference_and_io_model(rng, BH, Nq, Nk, d, block, causal):
    q, k, v, do = make(rng, BH, Nq, Nk, d, np.float64)
    f, b = run(q, k, v, do, causal, block)
    o_ref, lse_ref = reference.attention_forward(q, k, v, causal=causal)
    grads_ref = reference.attention_backward(q, k, v, o_ref, lse_ref, do, causal=causal)
    assert f.block == block and b.block == block
    assert rel_err(f.o, o_ref) < 1e-13
    check_lse(f.lse, lse_ref, 1e-13)
    for g, g_ref in zip((b.dq, b.dk, b.dv), grads_ref):
        assert g.shape == g_ref.shape
        assert err64(g, g_ref) < 1e-12
    check_counts(f, b, q, k, causal)
    if causal and Nq > Nk:  # rows with no visible key: O = 0, dQ = 0 exactly, no NaN
        blind = np.isneginf(lse_ref)
        assert blind.any()
        assert np.all(f.o[blind] == 0) and np.all(b.dq[blind] == 0)


# (Nq, Nk, Br, Bc): many block shapes at d = 2, where a call is cheap
COUNT_SHAPES = [(9, 9, 4, 4), (12, 7, 5, 2), (5, 3, 1, 1), (3, 10, 8, 16)]


@pytest.mark.parametrize("causal", [False, True])
def test_counted_bytes_equal_io_model(rng, causal):
    for Nq, Nk, Br, Bc in COUNT_SHAPES:
        q, k, v, do = make(rng, 1, Nq, Nk, 2, np.float32)
        f, b = run(q, k, v, do, causal, (Br, Bc))
        check_counts(f, b, q, k, causal)


def test_attention_api_runs_flash2_with_default_blocks(rng):
    q, k, v, _ = make(rng, 2, 11, 11, 8, np.float32)
    q, k, v = (x.reshape(2, 1, 11, 8) for x in (q, k, v))  # (B, H, N, d)
    o = fn.attention(q, k, v, causal=True, kernel="flash2")
    o_ref, _ = reference.attention_forward(q, k, v, causal=True)
    assert o.shape == (2, 1, 11, 8) and o.dtype == np.float32
    assert rel_err(o, o_ref) < 1e-6
    assert fn.flash_attention_forward(q, k, v, kernel="flash2").block == default_block(8, np.float32, "forward")


# ----------------------------------------------------------------------------- block sizes and the model


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", DS)
def test_default_blocks_fit_48kb_and_limits(d, dtype):
    for pass_ in ("forward", "backward"):
        Br, Bc = default_block(d, dtype, pass_)
        max_Br, max_Bc = flash2.block_limits(d, dtype, pass_)
        assert 1 <= Br <= max_Br and 1 <= Bc <= max_Bc
        assert flash2.shared_bytes(Br, Bc, d, dtype, pass_) <= STATIC_SHARED_LIMIT
        assert fn.resolve_block("flash2", d, dtype, pass_=pass_) == (Br, Bc)


def test_forward_blocks_follow_the_paper_rule_when_they_fit():
    # d = 128, float32: M = 12288 elements, Bc = ceil(M / 4d) = 24, Br = min(Bc, d) = 24
    assert blocks.paper_block_sizes(STATIC_SHARED_LIMIT // 4, 128) == (24, 24)
    assert default_block(128, np.float32, "forward") == (24, 24)


def test_every_head_dim_gets_a_block():
    for d in range(1, 129):
        for dtype in DTYPES:
            for pass_ in ("forward", "backward"):
                Br, Bc = default_block(d, dtype, pass_)
                assert flash2.shared_bytes(Br, Bc, d, dtype, pass_) <= STATIC_SHARED_LIMIT


def test_oversized_block_is_refused_with_a_clear_message(rng):
    q, k, v, _ = make(rng, 1, 4, 4, 64, np.float32)
    max_Br, max_Bc = flash2.block_limits(64, np.float32, "forward")
    with pytest.raises(ValueError, match="exceeds this kernel's limits"):
        fn.flash_attention_forward(q, k, v, kernel="flash2", block=(max_Br + 1, 8))
    with pytest.raises(ValueError, match="bytes of shared memory"):
        fn.flash_attention_forward(q, k, v, kernel="flash2", block=(64, 256))


@pytest.mark.parametrize("dtype", DTYPES)
def test_model_is_the_documented_closed_form(dtype):
    BH, Nq, Nk, d, Br, Bc = 3, 1000, 777, 64, 40, 48
    s, a = np.dtype(dtype).itemsize, _inputs.acc_dtype(dtype).itemsize
    Tr = math.ceil(Nq / Br)
    fwd = iomodel.forward("flash2", BH, Nq, Nk, d, dtype, False, (Br, Bc))
    assert fwd.bytes_read == BH * (Nq * d * s + Tr * 2 * Nk * d * s)
    assert fwd.bytes_written == BH * (Nq * d * s + Nq * a)
    bwd = iomodel.backward("flash2", BH, Nq, Nk, d, dtype, False, (Br, Bc))
    Tc = math.ceil(Nk / Bc)
    assert bwd.per_kernel["dK, dV"].bytes_read == BH * (2 * Nk * d * s + Tc * Nq * (2 * d * s + 2 * a))
    assert bwd.per_kernel["dQ"].bytes_read == BH * (Nq * (2 * d * s + 2 * a) + Tr * 2 * Nk * d * s)
    assert bwd.bytes_written == BH * (Nq * a + 2 * Nk * d * s + Nq * d * s)


def test_causal_model_reads_about_half_the_keys():
    N, d, Br, Bc = 4096, 64, 64, 64
    full = iomodel.forward("flash2", 1, N, N, d, np.float32, False, (Br, Bc))
    causal = iomodel.forward("flash2", 1, N, N, d, np.float32, True, (Br, Bc))
    Tr = N // Br
    q_o_l = N * d * 4 * 2 + N * 4
    assert causal.total - q_o_l == (full.total - q_o_l) * (Tr + 1) // (2 * Tr)


# ----------------------------------------------------------------------------- real sizes (GPU)

GPU_NS = (1, 17, 64, 97, 128, 1000, 1025)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", DS)
@pytest.mark.parametrize("N", GPU_NS)
def test_gpu_float32(rng, N, d, causal):
    q, k, v, do = make(rng, 3, N, N, d, np.float32)
    f, b = run(q, k, v, do, causal, count_hbm=False)
    o_ref, lse_ref = reference.attention_forward(q, k, v, causal=causal)
    grads_ref = reference.attention_backward(q, k, v, o_ref, lse_ref, do, causal=causal)
    assert rel_err(f.o, o_ref) < 1e-5
    check_lse(f.lse, lse_ref, 1e-5)
    for g, g_ref in zip((b.dq, b.dk, b.dv), grads_ref):
        assert rel_err(g, g_ref) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", (16, 64, 80, 128))
@pytest.mark.parametrize("Nq, Nk", [(1000, 1025), (1025, 97), (17, 1000), (128, 1), (1, 1025), (97, 64)])
def test_gpu_float32_nq_ne_nk_with_counts(rng, Nq, Nk, d, causal):
    q, k, v, do = make(rng, 2, Nq, Nk, d, np.float32)
    f, b = run(q, k, v, do, causal)
    o_ref, lse_ref = reference.attention_forward(q, k, v, causal=causal)
    grads_ref = reference.attention_backward(q, k, v, o_ref, lse_ref, do, causal=causal)
    assert rel_err(f.o, o_ref) < 1e-5
    check_lse(f.lse, lse_ref, 1e-5)
    for g, g_ref in zip((b.dq, b.dk, b.dv), grads_ref):
        assert rel_err(g, g_ref) < 1e-5
    check_counts(f, b, q, k, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", DS)
@pytest.mark.parametrize("Nq, Nk", [(97, 97), (1025, 1025), (1000, 1025)])
def test_gpu_float16_dao_rule(rng, Nq, Nk, d, causal):
    q, k, v, do = make(rng, 2, Nq, Nk, d, np.float16)
    f, b = run(q, k, v, do, causal, count_hbm=False)
    o_ref, lse_ref = reference.attention_forward(q, k, v, causal=causal)
    grads_ref = reference.attention_backward(q, k, v, o_ref, lse_ref, do, causal=causal)
    plain_o = reference.plain_attention(q, k, v, causal=causal, dtype=np.float16)
    assert rel_err(f.o, o_ref) <= 3 * rel_err(plain_o, o_ref) + 1e-6
    check_lse(f.lse, lse_ref, 1e-5)
    plain_grads = plain_backward(q, k, v, plain_o, do, causal)
    for g, g_plain, g_ref in zip((b.dq, b.dk, b.dv), plain_grads, grads_ref):
        assert rel_err(g, g_ref) <= 3 * rel_err(g_plain, g_ref) + 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_bitwise_identical_and_float64_exact(rng, dtype):
    q, k, v, do = make(rng, 4, 1025, 1000, 64, dtype)
    first = run(q, k, v, do, True, count_hbm=False)
    second = run(q, k, v, do, True, count_hbm=False)
    for x, y in zip(outputs(*first), outputs(*second)):
        assert np.array_equal(x, y)
    if dtype == np.float64:
        o_ref, lse_ref = reference.attention_forward(q, k, v, causal=True)
        assert rel_err(first[0].o, o_ref) < 1e-12
