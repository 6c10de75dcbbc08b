"""Standard attention's float16 forward on tensor cores (kernels/standard/tensor.py), in the simulator.

The mma and ldmatrix stand-ins of :mod:`flash_numba.kernels._mma` run the PTX ISA's fragment layouts, so a
wrong register fails here as on a GPU.  Tiny awkward sizes (N = 1, 17, 33; d not a multiple of 16 or of 8,
so the zero-padded columns and the element-by-element moves run), causal with fully masked rows, both
instruction paths (sm_80's m16n8k16, sm_75's m16n8k8), poisoned outputs (conftest), counted bytes == the
IO model, float16 against float64 within Dao-AILab's rule.  GQA: tests/test_gqa.py runs standard in float16
(bitwise against repeated K and V).  The float32/float64 kernels are untouched (test_standard.py).
"""

import numpy as np
import pytest

import flash_numba as fn
from flash_numba import iomodel as io
from flash_numba import reference
from flash_numba.kernels import standard
from flash_numba.kernels.standard import halves, layout

from test_flash2_tc import check_dao, from_bf16_bits, inputs
from test_standard import _qkv


def _forward(q, k, v, causal, block, count_hbm=True):
    return fn.attention_forward(q, k, v, kernel="standard", causal=causal, block=block, count_hbm=count_hbm)


def _dao(q, k, v, causal, o, lse, factor=2.0):
    """O within ``factor`` x the error of attention done plainly in float16, L within float16's rounding of S
    (|L| <= a few units here: 2^-10 relative, plus the float32 sums); fully masked rows O = 0, L = -inf."""
    o_ref, lse_ref = reference.attention_forward(*(x.astype(np.float64) for x in (q, k, v)), causal=causal)
    plain = reference.plain_attention(q, k, v, causal=causal, dtype=np.float16)
    err_plain = np.abs(plain.astype(np.float64) - o_ref).max()
    assert np.isfinite(o).all()
    assert np.abs(o.astype(np.float64) - o_ref).max() <= factor * err_plain + 1e-4
    hidden = np.isneginf(lse_ref)
    assert np.array_equal(np.isneginf(lse), hidden) and np.all(o[hidden] == 0)
    seen = ~hidden
    assert np.abs(lse[seen] - lse_ref[seen]).max(initial=0) <= 2.0**-10 * (1 + np.abs(lse_ref[seen]).max(initial=0))


# (BH, Nq, Nk, d, causal, block, path): N = 1; Nk = 17 (rows of S not 16-byte aligned: element-wise stores);
# d = 24 (padded to 32) and d = 12 (rows of q not 16-byte aligned: element-wise loads); Nq > Nk causal
# (rows that see no key); Nk = 48 at Bc = 16 (three key blocks, every move 16 bytes)
CASES = [
    (1, 1, 1, 16, False, None, "sm80"),
    (2, 17, 17, 16, True, (64, 16), "sm80"),
    (1, 33, 17, 24, True, (64, 32), "sm75"),
    (1, 17, 33, 12, False, (64, 16), "sm75"),
    (1, 16, 48, 16, False, (64, 16), "sm80"),
]


@pytest.mark.parametrize("BH, Nq, Nk, d, causal, block, path", CASES)
def test_forward_matches_float64_and_counts_equal_the_model(rng, monkeypatch, BH, Nq, Nk, d, causal, block, path):
    monkeypatch.setenv("FLASH_NUMBA_TC_PATH", path)
    q, k, v = _qkv(rng, (BH,), Nq, Nk, d, np.float16)
    f = _forward(q, k, v, causal, block)
    assert f.kernel == "standard" and f.block == (block or (64, 64))
    assert f.o.dtype == np.float16 and f.lse.dtype == np.float32
    _dao(q, k, v, causal, f.o, f.lse)
    assert f.hbm == io.forward("standard", BH, Nq, Nk, d, np.float16, causal, f.block)


def test_both_instruction_paths_agree(rng, monkeypatch):
    """m16n8k8 twice or m16n8k16 once: the same products up to float32 rounding of the partial sums."""
    q, k, v = _qkv(rng, (1,), 17, 20, 16, np.float16)
    out = {}
    for path in ("sm75", "sm80"):
        monkeypatch.setenv("FLASH_NUMBA_TC_PATH", path)
        out[path] = _forward(q, k, v, True, (64, 16), count_hbm=False)
    assert np.abs(out["sm75"].o.astype(np.float64) - out["sm80"].o).max() <= 2.0**-10
    assert np.abs(out["sm75"].lse - out["sm80"].lse).max() <= 1e-5


def test_masked_keys_add_nothing_against_inf_in_v(rng):
    """Causal: +Inf in v[5, 0] reaches column 0 of rows 5.. only; the rows above it, for which key 5 is
    masked inside a tile that the diagonal crosses, stay finite (no 0 * Inf on the tensor cores)."""
    q, k, v = _qkv(rng, (1,), 9, 9, 16, np.float16)
    v[0, 5, 0] = np.inf
    f = _forward(q, k, v, True, (64, 16), count_hbm=False)
    assert np.isfinite(f.o[0, :5]).all()
    assert np.all(np.isposinf(f.o[0, 5:, 0])) and np.isfinite(f.o[0, 5:, 1:]).all()


def test_scores_are_stored_rounded_and_masked(rng):
    """The S that the scores kernel writes: scale Q K^T rounded to float16, -inf above the diagonal, and the
    softmax's m, l its row max and sum of exp (the same contract as the CUDA-core kernel)."""
    q, k, v = _qkv(rng, (1,), 17, 17, 16, np.float16)
    launches, arrays = standard.forward_launches(q, k, v, causal=True)
    for _, run in launches:
        run()
    S = arrays["S"].copy_to_host()[0]
    ml = arrays["ml"].copy_to_host()[0]
    want = (q[0].astype(np.float64) @ k[0].T.astype(np.float64)) / 4.0
    mask = reference.causal_mask(17, 17)
    assert np.all(np.isneginf(S[~mask]))
    assert np.abs(S[mask] - want[mask]).max() <= 2.0**-11 * np.abs(want[mask]).max() + 1e-3
    Sm = np.where(mask, S.astype(np.float64), -np.inf)
    assert np.array_equal(ml[0], Sm.max(axis=1).astype(np.float32))
    np.testing.assert_allclose(ml[1], np.exp(Sm - Sm.max(axis=1, keepdims=True)).sum(axis=1), rtol=1e-5)


def test_block_rule():
    """float16 forward: Br = 64 and Bc 16, 32 or 64 (the tensor-core tiles), the largest that fits; other
    blocks refused by name; float32, float64 and every backward keep their rule."""
    assert standard.choose_block(64, np.float16, 48 * 1024, "forward") == (64, 64)
    assert standard.choose_block(128, np.float16, 48 * 1024, "forward") == (64, 64)
    assert standard.choose_block(128, np.float16, 40 * 1024, "forward") == (64, 32)
    assert standard.choose_block(64, np.float32, 48 * 1024, "forward") == (64, 32)
    assert standard.choose_block(64, np.float16, 48 * 1024, "backward") == standard.choose_block(
        64, np.float32, 48 * 1024, "backward")
    q, k, v = _qkv(np.random.default_rng(0), (1,), 4, 4, 16, np.float16)
    with pytest.raises(ValueError, match=r"^block: standard's float16 and bfloat16 forward runs on tensor cores"):
        _forward(q, k, v, False, (16, 16))
    assert layout.tc_shared_bytes(64, 128) <= 48 * 1024


def test_mma_path_switch(monkeypatch):
    """flash2_tc's switch: the T4's path below cc 8.0, or forced by FLASH_NUMBA_TC_PATH."""
    monkeypatch.delenv("FLASH_NUMBA_TC_PATH", raising=False)
    assert layout.mma_path((7, 5)) == "sm75" and layout.mma_path((9, 0)) == "sm80"
    monkeypatch.setenv("FLASH_NUMBA_TC_PATH", "sm75")
    assert layout.mma_path((9, 0)) == "sm75"
    monkeypatch.setenv("FLASH_NUMBA_TC_PATH", "sm70")
    with pytest.raises(ValueError, match="^FLASH_NUMBA_TC_PATH"):
        layout.mma_path()


def test_rows_aligned():
    from numba import cuda

    x = cuda.to_device(np.zeros((2, 3, 5, 16), np.float16))
    assert halves.rows_aligned(x)
    assert not halves.rows_aligned(cuda.to_device(np.zeros((2, 3, 5, 12), np.float16)))  # 24-byte rows
    assert not halves.rows_aligned(x[:, :, :, 1:9])  # starts 2 bytes in


@pytest.mark.slow
def test_launch_shares_tool_in_the_simulator():
    """The timing tool runs the launches (no clock here): bytes counted == modelled, no times."""
    from flash_numba.tools import launch_shares

    for dtype in ("float16", "bfloat16", "float32"):
        rows = launch_shares.measure(1, 17, 16, dtype, True, repeats=1)
        assert [r["launch"] for r in rows] == list(standard.FORWARD_NAMES)
        assert all(r["counted_bytes"] == r["model_bytes"] > 0 and r["ms"] is None for r in rows)
        assert "forward" in launch_shares.table(rows)


@pytest.mark.parametrize("Nq, Nk, d, causal", [(17, 33, 16, True), (1, 9, 32, False)])
def test_bfloat16_forward(rng, monkeypatch, Nq, Nk, d, causal):
    """bfloat16 (uint16 words): the same kernels with bfloat16 mma and conversions, the softmax on words;
    Dao-AILab's rule against attention done plainly in bfloat16 (tests/test_flash2_tc.py's), counts == model."""
    monkeypatch.delenv("FLASH_NUMBA_TC_PATH", raising=False)
    (q, k, v), (q64, k64, v64) = inputs(rng, (1,), Nq, Nk, d, 1, "bfloat16")
    f = fn.attention_forward(q, k, v, kernel="standard", causal=causal, block=(64, 16), count_hbm=True)
    assert f.kernel == "standard" and f.o.dtype == np.uint16 and f.lse.dtype == np.float32
    check_dao(f.o, q64, k64, v64, causal, 1, "bfloat16")
    assert f.hbm == io.forward("standard", 1, Nq, Nk, d, np.uint16, causal, (64, 16))
    o_ref, lse_ref = reference.attention_forward(q64, k64, v64, causal=causal)
    assert np.abs(from_bf16_bits(f.o).astype(np.float64) - o_ref).max() <= 2.0**-6
    assert np.abs(f.lse - lse_ref).max() <= 2.0**-6 * (1 + np.abs(lse_ref).max())


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_dropout_on_chip(rng, dtype_name):
    """O = (Zs P) V with the reference's mask (the P_ij tile times Zs in shared memory, rounded to the storage
    dtype), L as without dropout; the bound from the arithmetic: S, P, Zs P and O each rounded once (unit
    roundoff u), S's rounding moving P by |S| u: |O - O64| <= u ((4 + max|S|) max|v| / (1 - p) + max|O64|)."""
    p, seed = 0.25, 11
    (q, k, v), (q64, k64, v64) = inputs(rng, (1, 2), 17, 20, 16, 1, dtype_name)
    f = fn.attention_forward(q, k, v, kernel="standard", causal=True, block=(64, 16), dropout_p=p,
                             dropout_seed=seed, count_hbm=True)
    o_ref, lse_ref = reference.attention_forward(q64, k64, v64, causal=True, dropout_p=p, dropout_seed=seed)
    u = {"float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype_name]
    s_max = np.abs(q64 @ k64.swapaxes(-1, -2)).max() / 4.0
    o = f.o.astype(np.float64) if dtype_name == "float16" else from_bf16_bits(f.o).astype(np.float64)
    assert np.abs(o - o_ref).max() <= u * ((4 + s_max) * np.abs(v64).max() / (1 - p) + np.abs(o_ref).max())
    assert np.abs(f.lse - lse_ref).max() <= 2 * u * (1 + np.abs(lse_ref).max())
    no_drop = fn.attention_forward(q, k, v, kernel="standard", causal=True, block=(64, 16))
    assert np.array_equal(f.lse, no_drop.lse) and not np.array_equal(f.o, no_drop.o)
    storage = np.float16 if dtype_name == "float16" else np.uint16
    assert f.hbm == io.forward("standard", 2, 17, 20, 16, storage, True, (64, 16))


def test_bfloat16_refusals(rng, monkeypatch):
    """The backward and the T4's path refuse bfloat16 by name; a T4 is refused by the spec."""
    (q, k, v), _ = inputs(rng, (1,), 5, 5, 16, 1, "bfloat16")
    f = fn.attention_forward(q, k, v, kernel="standard")
    with pytest.raises(TypeError, match="^q: dtype bfloat16 is not supported by standard's backward"):
        fn.attention_backward(q, k, v, fn.as_bfloat16(f.o), f.lse, q, kernel="standard")
    monkeypatch.setenv("FLASH_NUMBA_TC_PATH", "sm75")
    with pytest.raises(ValueError, match="^q: dtype bfloat16 is not supported on the sm_75 path"):
        fn.attention_forward(q, k, v, kernel="standard")
    spec = standard.SPEC
    assert spec.supports(64, "bfloat16", (7, 5), "Tesla T4") == (
        "standard needs compute capability 8.0 for bfloat16; this GPU (Tesla T4) is 7.5")
    assert spec.supports(64, "float16", (7, 0)) is None  # float16 below 7.5: the CUDA-core kernels


def test_float16_below_cc_7_5_keeps_the_cuda_core_rule():
    assert not layout.tensor_cores("float16", "forward", (7, 0))
    assert layout.tensor_cores("float16", "forward", (7, 5)) and layout.tensor_cores(np.uint16, "forward", (9, 0))
    assert not layout.tensor_cores("float16", "backward", (9, 0)) and not layout.tensor_cores("float32", "forward")
    assert standard.choose_block(64, np.float16, 48 * 1024, "forward", (7, 0)) == standard.choose_block(
        64, np.float32, 48 * 1024, "forward")


def test_strided_inputs_give_the_same_bits(rng):
    """q, k, v read in place through their strides: a (B, N, H, d) transposed view (rows 16-byte aligned: 16-byte
    loads) and a column slice starting 2 bytes in (element by element) give the contiguous call's bits."""
    q, k, v = _qkv(rng, (1, 2), 17, 17, 16, np.float16)
    want = _forward(q, k, v, True, (64, 16), count_hbm=False)
    qt, kt, vt = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3) for x in (q, k, v))
    wide = [np.zeros(x.shape[:-1] + (24,), np.float16) for x in (q, k, v)]
    for w, x in zip(wide, (q, k, v)):
        w[..., 1:17] = x
    qs, ks, vs = (w[..., 1:17] for w in wide)
    for args in ((qt, kt, vt), (qs, ks, vs)):
        got = _forward(*args, True, (64, 16), count_hbm=False)
        assert np.array_equal(got.o, want.o) and np.array_equal(got.lse, want.lse)


# --------------------------------------------------------------------------- real sizes (GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("N", [1, 17, 97, 1000])
@pytest.mark.parametrize("d", [16, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_float16_real_sizes(rng, N, d, causal):
    q, k, v = _qkv(rng, (2,), N, N, d, np.float16)
    f = _forward(q, k, v, causal, None, count_hbm=N < 1000)
    _dao(q, k, v, causal, f.o, f.lse)
    if N < 1000:
        assert f.hbm == io.forward("standard", 2, N, N, d, np.float16, causal, f.block)


@pytest.mark.gpu
@pytest.mark.parametrize("path, dtype_name", [("sm80", "bfloat16"), ("sm75", "float16"), ("sm80", "float16")])
def test_gpu_paths_and_bfloat16(rng, monkeypatch, path, dtype_name):
    """Nq != Nk (1025 query rows, 999 keys: neither a multiple of 8), causal, GQA (G = 2), both paths."""
    monkeypatch.setenv("FLASH_NUMBA_TC_PATH", path)
    (q, k, v), (q64, k64, v64) = inputs(rng, (1, 4), 1025, 999, 64, 2, dtype_name)
    f = fn.attention_forward(q, k, v, kernel="standard", causal=True)
    check_dao(f.o, q64, k64, v64, True, 2, dtype_name)
