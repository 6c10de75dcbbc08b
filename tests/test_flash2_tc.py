"""flash2_tc, the tensor-core forward, in the simulator (the mma/ldmatrix stand-ins of kernels/_mma.py).

Values against the float64 reference with Dao-AILab's rule: the kernel's error at most 2x that of a plain
implementation in the same precision, plus one rounding of the output (the half type's unit roundoff u
times max |v|: a kernel and a baseline that both round O can differ by that much where the baseline happens
to round the right way).  Both instruction paths: "sm80" (m16n8k16; float16 and bfloat16) and "sm75" (two
m16n8k8 per step; float16).  Outputs are NaN-poisoned (conftest): an unwritten element fails.  Counted bytes
equal the IO model exactly.  GPU sizes: benchmarks/tc_check.py and the ``gpu`` tests at the end.
"""

import numpy as np
import pytest

import flash_numba as fn
from flash_numba import _switches, iomodel, kernels, reference
from flash_numba.kernels._bf16 import from_bf16_bits, round_to_bf16
from flash_numba.kernels.flash2_tc import layout

U = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}  # unit roundoff of the storage type
CASES = [  # (lead, Nq, Nk, d, causal, G)
    ((1,), 1, 1, 16, False, 1),
    ((2,), 17, 17, 16, True, 1),
    ((2,), 33, 20, 32, True, 2),  # Nq > Nk: rows that see no key (causal), GQA
    ((1,), 20, 33, 16, True, 1),  # Nq < Nk
    ((1,), 17, 70, 16, False, 1),  # two key blocks, the last partial
    ((1,), 70, 9, 32, False, 1),  # two query blocks
]


PATH_DTYPES = [("sm80", "float16"), ("sm80", "bfloat16"), ("sm75", "float16")]  # a T4 has no bfloat16


def inputs(rng, lead, Nq, Nk, d, G, dtype_name):
    """(q, k, v) as the kernel takes them, and their float64 values (k, v with lead[-1] // G heads)."""
    kv_lead = lead[:-1] + (lead[-1] // G,)
    xs = [rng.standard_normal(sh).astype(np.float32) for sh in (lead + (Nq, d), kv_lead + (Nk, d), kv_lead + (Nk, d))]
    if dtype_name == "float16":
        xs = [x.astype(np.float16) for x in xs]
        return xs, [x.astype(np.float64) for x in xs]
    words = [fn.as_bfloat16(x) for x in xs]
    return words, [from_bf16_bits(w).astype(np.float64) for w in words]


def as_float64(o, dtype_name):
    return o.astype(np.float64) if dtype_name == "float16" else from_bf16_bits(o).astype(np.float64)


def plain_bf16(q, k, v, causal):
    """Attention with every step rounded to bfloat16 (products summed in float32, as bfloat16 hardware does)."""
    r = round_to_bf16
    d = q.shape[-1]
    S = r(reference.plain_matmul(r(q * np.float32(1 / np.sqrt(d))).astype(np.float32),
                                 k.swapaxes(-1, -2).astype(np.float32)))
    if causal:
        S = np.where(reference.causal_mask(q.shape[-2], k.shape[-2]), S, -np.inf)
    m = S.max(axis=-1, keepdims=True)
    P = r(np.exp(S - np.where(m == -np.inf, 0, m)))
    l = r(P.sum(axis=-1, keepdims=True))
    P = r(P / np.where(l > 0, l, 1))
    return r(reference.plain_matmul(P.astype(np.float32), v.astype(np.float32)))


def check_dao(o, q64, k64, v64, causal, G, dtype_name, o_ref=None):
    k64, v64 = np.repeat(k64, G, axis=-3), np.repeat(v64, G, axis=-3)
    if o_ref is None:
        o_ref, _ = reference.attention_forward(q64, k64, v64, causal=causal)
    if dtype_name == "float16":
        plain = reference.plain_attention(q64, k64, v64, causal=causal, dtype=np.float16).astype(np.float64)
    else:
        plain = plain_bf16(q64.astype(np.float32), k64.astype(np.float32), v64.astype(np.float32), causal)
    ours = np.abs(as_float64(o, dtype_name) - o_ref).max()
    base = np.abs(plain - o_ref).max()
    assert ours <= 2 * base + U[dtype_name] * np.abs(v64).max(), (ours, base)


@pytest.mark.parametrize("path, dtype_name", PATH_DTYPES)
@pytest.mark.parametrize("lead, Nq, Nk, d, causal, G", CASES)
def test_forward_dao_rule(rng, monkeypatch, path, dtype_name, lead, Nq, Nk, d, causal, G):
    monkeypatch.setattr(_switches, "TC_PATH", path)
    (q, k, v), (q64, k64, v64) = inputs(rng, lead, Nq, Nk, d, G, dtype_name)
    res = fn.attention_forward(q, k, v, kernel="flash2_tc", causal=causal, count_hbm=True)
    assert res.kernel == "flash2_tc" and res.o.dtype == (np.float16 if dtype_name == "float16" else np.uint16)
    check_dao(res.o, q64, k64, v64, causal, G, dtype_name)
    _, lse = reference.attention_forward(q64, np.repeat(k64, G, -3), np.repeat(v64, G, -3), causal=causal)
    finite = np.isfinite(lse)
    np.testing.assert_allclose(res.lse[finite], lse[finite], rtol=1e-5, atol=1e-5)  # L from float32 S and l
    assert np.array_equal(np.isneginf(res.lse), np.isneginf(lse))  # rows that see no key: L = -inf, O = 0
    assert np.all(as_float64(res.o, dtype_name)[np.isneginf(lse)] == 0)
    assert res.hbm == iomodel.forward("flash2_tc", int(np.prod(lead)), Nq, Nk, d, res.o.dtype, causal, None, G=G)


def test_the_two_paths_agree_closely(rng, monkeypatch):
    """sm75 sums each k16 step in two halves: the same products, nearly the same float32 sums."""
    (q, k, v), _ = inputs(rng, (2,), 33, 40, 32, 1, "float16")
    outs = []
    for p in layout.PATHS:
        monkeypatch.setattr(_switches, "TC_PATH", p)
        outs.append(fn.attention_forward(q, k, v, kernel="flash2_tc").o.astype(np.float64))
    assert np.abs(outs[0] - outs[1]).max() <= 2 * U["float16"]


def test_dropout_matches_the_reference_mask(rng):
    (q, k, v), (q64, k64, v64) = inputs(rng, (2,), 17, 23, 16, 1, "float16")
    res = fn.attention_forward(q, k, v, kernel="flash2_tc", dropout_p=0.3, dropout_seed=1234)
    o_ref, _ = reference.attention_forward(q64, k64, v64, dropout_p=0.3, dropout_seed=1234)
    # the baseline: plain float16 attention, then the same mask (scaled) applied to its P: bound by the
    # undropped rule with the scale 1 / (1 - p) on the output rounding
    ours = np.abs(res.o.astype(np.float64) - o_ref).max()
    plain = np.abs(reference.plain_attention(q64, k64, v64, dtype=np.float16).astype(np.float64)
                   - reference.attention_forward(q64, k64, v64)[0]).max()
    assert ours <= (2 * plain + U["float16"] * np.abs(v64).max()) / 0.7, (ours, plain)
    assert res.dropout_seed == 1234


def test_strided_and_unaligned_device_inputs(rng):
    """q, k, v as views of wider device rows: read in place, with element copies where rows do not start on
    16 bytes (the offset-1 view), 16-byte copies where they do."""
    from numba import cuda

    (q, k, v), (q64, k64, v64) = inputs(rng, (2,), 17, 19, 16, 1, "float16")
    for offset in (0, 1, 8):
        views = []
        for x in (q, k, v):
            wide = np.zeros(x.shape[:-1] + (40,), np.float16)
            wide[..., offset:offset + 16] = x
            views.append(cuda.to_device(wide)[:, :, offset:offset + 16])  # (device arrays take no ...)
        res = fn.attention_forward(*views, kernel="flash2_tc", count_hbm=True)
        check_dao(res.o.copy_to_host(), q64, k64, v64, False, 1, "float16")
        assert res.hbm == iomodel.forward("flash2_tc", 2, 17, 19, 16, np.float16, False, None)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_backward_runs_flash2_tc_and_says_so(rng, dtype_name):
    """The tensor-core backward runs both dtypes (tests/test_flash2_tc_backward.py checks its gradients)."""
    (q, k, v), _ = inputs(rng, (1,), 9, 11, 16, 1, dtype_name)
    f = fn.attention_forward(q, k, v, kernel="flash2_tc")
    o = fn.as_bfloat16(f.o) if dtype_name == "bfloat16" else f.o
    b = fn.attention_backward(q, k, v, o, f.lse, q, kernel="flash2_tc")
    assert b.kernel == "flash2_tc"
    assert np.isfinite(as_float64(b.dq, dtype_name)).all()


def test_bfloat16_refused_on_the_sm75_path(rng, monkeypatch):
    monkeypatch.setattr(_switches, "TC_PATH", "sm75")
    (q, k, v), _ = inputs(rng, (1,), 4, 4, 16, 1, "bfloat16")
    with pytest.raises(ValueError, match="sm_75 path"):
        fn.attention_forward(q, k, v, kernel="flash2_tc")


@pytest.mark.parametrize("d", [8, 24, 72])
def test_head_dims_not_multiple_of_16_are_refused(rng, d):
    q = rng.standard_normal((4, d)).astype(np.float16)
    with pytest.raises(ValueError, match=f"q: head dim d = {d} is not supported by flash2_tc; .*16 to 128, a multiple"):
        fn.attention_forward(q, q, q, kernel="flash2_tc")


def test_float32_is_refused_naming_the_dtypes(rng):
    q = rng.standard_normal((4, 16)).astype(np.float32)
    with pytest.raises(TypeError, match="flash2_tc runs float16 and bfloat16"):
        fn.attention_forward(q, q, q, kernel="flash2_tc")


def test_spec_support_rules():
    spec = kernels.get("flash2_tc")
    assert spec.supports(64, "bfloat16", (7, 5), "Tesla T4") == (
        "flash2_tc needs compute capability 8.0 for bfloat16; this GPU (Tesla T4) is 7.5")
    assert spec.supports(64, "float16", (7, 5)) is None
    assert spec.supports(128, "bfloat16", (9, 0)) is None


def test_environment_forces_the_sm75_path(monkeypatch):
    monkeypatch.setattr(_switches, "TC_PATH", None)
    monkeypatch.setenv("FLASH_NUMBA_TC_PATH", "sm75")
    assert layout.path((9, 0)) == "sm75"
    monkeypatch.setenv("FLASH_NUMBA_TC_PATH", "sm70")
    with pytest.raises(ValueError, match="FLASH_NUMBA_TC_PATH"):
        layout.path((9, 0))
    monkeypatch.delenv("FLASH_NUMBA_TC_PATH")
    assert layout.path((7, 5)) == "sm75" and layout.path((8, 0)) == "sm80" and layout.path(None) == "sm80"


def test_ml_dtypes_style_and_torch_cpu_bfloat16(rng):
    """bfloat16 through the PyTorch drop-in on CPU tensors (the simulator): a bfloat16 tensor comes back."""
    torch = pytest.importorskip("torch")
    from flash_numba.torch import scaled_dot_product_attention

    q = torch.randn(1, 2, 9, 16, dtype=torch.bfloat16)
    o = scaled_dot_product_attention(q, q, q, kernel="flash2_tc")
    assert o.dtype == torch.bfloat16 and o.shape == q.shape
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), q.double(), q.double())
    assert (o.double() - ref).abs().max().item() < 4 * U["bfloat16"] * q.double().abs().max().item()


# ---------------------------------------------------------------- real sizes, on a GPU
GPU_CASES = [(Nq, d, causal) for Nq in (1, 17, 97, 1000, 4099) for d in (64, 128) for causal in (False, True)]
ROWS = 128  # the rows the GPU tests compare: the last ones (the float16 baseline is slow in NumPy at N = 4099)


def last_rows(o, q64, n=ROWS):
    """The last n query rows: with the bottom-right causal mask they see the same keys as in the full problem."""
    return o[..., -n:, :], q64[..., -n:, :]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("Nq, d, causal", GPU_CASES)
def test_gpu_forward_dao_rule(rng, dtype_name, Nq, d, causal):
    (q, k, v), (q64, k64, v64) = inputs(rng, (2,), Nq, Nq, d, 1, dtype_name)
    res = fn.attention_forward(q, k, v, kernel="flash2_tc", causal=causal)
    assert np.isfinite(as_float64(res.o, dtype_name)).all()  # every element written (outputs poisoned)
    check_dao(*last_rows(res.o, q64), k64, v64, causal, 1, dtype_name)


@pytest.mark.gpu
@pytest.mark.parametrize("Nq, d, causal", [(97, 64, True), (1000, 128, False), (4099, 64, False)])
def test_gpu_sm75_path_dao_rule(rng, monkeypatch, Nq, d, causal):
    monkeypatch.setattr(_switches, "TC_PATH", "sm75")
    (q, k, v), (q64, k64, v64) = inputs(rng, (2,), Nq, Nq + 3, d, 1, "float16")
    res = fn.attention_forward(q, k, v, kernel="flash2_tc", causal=causal)
    assert np.isfinite(res.o).all()
    check_dao(*last_rows(res.o, q64), k64, v64, causal, 1, "float16")


@pytest.mark.gpu
def test_gpu_forward_is_deterministic(rng):
    (q, k, v), _ = inputs(rng, (4,), 1000, 1000, 64, 1, "float16")
    first = fn.attention_forward(q, k, v, kernel="flash2_tc").o
    for _ in range(19):
        assert np.array_equal(fn.attention_forward(q, k, v, kernel="flash2_tc").o, first)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_gpu_torch_tensors_default_kernel(rng, dtype_name):
    """CUDA tensors through the drop-in with kernel=None: flash2_tc runs (bfloat16 through an int16 view), the
    output is a tensor of the input's dtype, within the bound of plain attention in that dtype."""
    torch = pytest.importorskip("torch")
    from flash_numba.torch import scaled_dot_product_attention

    tdt = getattr(torch, dtype_name)
    q, k, v = (torch.randn(2, 3, 257, 64, dtype=tdt, device="cuda") for _ in range(3))
    res = fn.attention_forward(q, k, v, causal=True)
    assert res.kernel == "flash2_tc" and res.o.dtype == tdt
    o = scaled_dot_product_attention(q, k, v, is_causal=True)
    assert o.dtype == tdt and torch.equal(o, res.o)
    host = [x.view(torch.int16).cpu().numpy().view(np.uint16) if dtype_name == "bfloat16" else x.cpu().numpy()
            for x in (o, q, k, v)]
    q64, k64, v64 = (as_float64(x, dtype_name) for x in host[1:])
    check_dao(*last_rows(host[0], q64), k64, v64, True, 1, dtype_name)


def test_non_finite_inputs(rng):
    """docs/RELIABILITY.md's rule where it holds for tensor cores: a NaN row of q gives that row NaN and no
    other; +Inf in v at a key every row sees gives +Inf in that column; rows the causal mask hides get O = 0
    and L = -inf even when v holds Inf (and a NaN in k at a key they cannot see)."""
    (q, k, v), _ = inputs(rng, (1,), 20, 9, 16, 1, "float16")  # causal, Nq > Nk: rows 0..10 see no key
    q[0, 15] = np.nan
    v[0, 0, 3] = np.inf  # key 0: every visible row sees it
    k[0, 8] = np.nan  # key 8: only the last row sees it
    res = fn.attention_forward(q, k, v, kernel="flash2_tc", causal=True)
    o, lse = res.o.astype(np.float64), res.lse
    assert np.all(o[0, :11] == 0) and np.all(np.isneginf(lse[0, :11]))
    assert np.isnan(o[0, 15]).all() and np.isnan(lse[0, 15])
    assert np.isnan(o[0, 19]).all()  # the row that sees key 8
    rest = [r for r in range(11, 19) if r != 15]
    assert np.all(o[0, rest, 3] == np.inf)
    assert np.isfinite(np.delete(o[0, rest], 3, axis=-1)).all() and np.isfinite(lse[0, rest]).all()


def test_resolve_block_takes_bfloat16_by_name():
    assert fn.resolve_block("flash2_tc", 64, "bfloat16") == (64, 64)
    with pytest.raises(TypeError, match="flash2_fast runs float16, float32 and float64"):
        fn.resolve_block("flash2_fast", 64, "bfloat16")


def test_reference_reads_bfloat16_words_by_value(rng):
    x = rng.standard_normal((5, 16)).astype(np.float32)
    words = fn.as_bfloat16(x)
    o, _ = reference.attention_forward(words, words, words)
    x64 = round_to_bf16(x).astype(np.float64)
    np.testing.assert_array_equal(o, reference.attention_forward(x64, x64, x64)[0])


def test_default_kernel_dispatch(rng):
    """kernel=None: flash2_tc for float16 and bfloat16 where it runs, flash2_fast for other head dims and dtypes,
    bfloat16 where flash2_tc cannot run it refused with the reason; result.kernel names what ran."""
    from flash_numba.api import default_kernel

    assert default_kernel("float16", 64, (7, 5)) == default_kernel("bfloat16", 128, (9, 0)) == "flash2_tc"
    assert default_kernel("float16", 72, (9, 0)) == default_kernel("float32", 64, (9, 0)) == "flash2_fast"
    assert default_kernel("float16", 64, (7, 0)) == "flash2_fast"  # below flash2_tc's cc 7.5
    with pytest.raises(ValueError, match=r"flash2_tc needs compute capability 8.0 for bfloat16; this GPU \(Tesla T4\)"):
        default_kernel("bfloat16", 64, (7, 5), "Tesla T4")
    with pytest.raises(ValueError, match="head dim d = 8 is not supported by flash2_tc"):
        default_kernel("bfloat16", 8, (9, 0))
    (q, k, v), _ = inputs(rng, (1,), 5, 6, 16, 1, "float16")
    assert fn.attention_forward(q, k, v).kernel == "flash2_tc"
    assert fn.attention_forward(q[..., :8], k[..., :8], v[..., :8]).kernel == "flash2_fast"
    (q, k, v), _ = inputs(rng, (1,), 5, 6, 16, 1, "bfloat16")
    assert fn.attention(q, k, v).dtype == np.uint16
