"""The standard-attention kernels (S, P = softmax(S), O = P V; the paper's Algorithm 3 backward).

In the simulator: tiny awkward sizes (17 and 23 straddle the 16 x 16 tiles, 1 is
a single row or key), against the float64 reference; counted bytes against the
closed-form IO model; the tiled matrix product against NumPy.  Marked ``gpu``:
real sizes, float32 against float64.
"""

import math

import numpy as np
import pytest

import flash_numba as fn
from flash_numba import reference
from flash_numba.iomodel import standard as iomodel
from flash_numba.kernels import standard


def _qkv(rng, lead, Nq, Nk, d, dtype):
    q = rng.standard_normal(lead + (Nq, d)).astype(dtype)
    k = rng.standard_normal(lead + (Nk, d)).astype(dtype)
    v = rng.standard_normal(lead + (Nk, d)).astype(dtype)
    return q, k, v


def _rel(x, ref):
    """max |x - ref| / max |ref|, absolute where |ref| < 1e-3 (a gradient that is 0 in
    exact arithmetic, such as dq with a single key, is only rounding noise in the reference)."""
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return np.abs(x - ref).max() / max(np.abs(ref).max(), 1e-3)


def _check_lse(lse, ref_lse, tol):
    """Same -inf rows (no visible key) and, elsewhere, lse within ``tol``."""
    lse = np.asarray(lse, np.float64)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    assert np.abs(lse[fin] - ref_lse[fin]).max(initial=0.0) <= tol


def _run(q, k, v, causal, count_hbm=False, seed=0):
    """Forward and backward through the API, with a fresh dO; returns the results and dO."""
    fwd = fn.standard_attention_forward(q, k, v, causal=causal, count_hbm=count_hbm)
    do = np.random.default_rng(seed).standard_normal(fwd.o.shape).astype(q.dtype)
    bwd = fn.standard_attention_backward(q, k, v, fwd.o, fwd.lse, do, causal=causal, count_hbm=count_hbm)
    return fwd, bwd, do


def _check_masked_rows(fwd, bwd, lse_ref):
    """Rows with no visible key: O = 0 and dQ = 0 exactly, L = -inf; no NaN anywhere."""
    masked = np.isneginf(lse_ref)
    assert np.all(fwd.o[masked] == 0) and np.all(bwd.dq[masked] == 0)
    for x in (fwd.o, fwd.lse, bwd.dq, bwd.dk, bwd.dv):
        assert not np.isnan(x).any()


def _check_against_reference(q, k, v, causal, fwd, bwd, do, tol):
    o_ref, lse_ref = reference.attention_forward(q, k, v, causal=causal)
    assert fwd.o.shape == q.shape and fwd.lse.shape == q.shape[:-1]
    assert fwd.o.dtype == q.dtype and fwd.lse.dtype == np.dtype(fn._inputs.acc_dtype(q.dtype))
    _check_masked_rows(fwd, bwd, lse_ref)
    assert _rel(fwd.o, o_ref) < tol
    _check_lse(fwd.lse, lse_ref, tol * max(1.0, np.abs(lse_ref[np.isfinite(lse_ref)]).max(initial=1.0)))
    grads_ref = reference.attention_backward(q, k, v, fwd.o, fwd.lse, do, causal=causal)
    for name, g, g_ref in zip(("dq", "dk", "dv"), (bwd.dq, bwd.dk, bwd.dv), grads_ref):
        assert g.dtype == q.dtype
        assert _rel(g, g_ref) < tol, name


# Nq != Nk both ways, N = 1 on either side, d = 1, 5, 16, the three input ranks;
# causal with Nq > Nk has fully masked rows.
CASES = [
    ((), 17, 23, 5, False, np.float32),
    ((1,), 23, 17, 16, True, np.float32),
    ((1, 1), 1, 17, 16, True, np.float32),
    ((), 17, 1, 5, False, np.float64),
    ((1,), 17, 23, 1, True, np.float64),
]


@pytest.mark.parametrize("lead, Nq, Nk, d, causal, dtype", CASES)
def test_matches_reference(rng, lead, Nq, Nk, d, causal, dtype):
    q, k, v = _qkv(rng, lead, Nq, Nk, d, dtype)
    fwd, bwd, do = _run(q, k, v, causal)
    assert fwd.hbm is None and bwd.hbm is None and fwd.block is None
    if causal and Nq > Nk:
        assert np.isneginf(fwd.lse).sum() == Nq - Nk  # query rows 0 .. Nq - Nk - 1 see no key
    tol = 1e-6 if dtype == np.float32 else 1e-12
    _check_against_reference(q, k, v, causal, fwd, bwd, do, tol)


def _plain_backward(q, k, v, do, causal, dtype):
    """Algorithm 3 with every operation done and rounded in ``dtype`` (the float16 baseline)."""
    q, k, v, do = (x.astype(dtype) for x in (q, k, v, do))
    Nq, d = q.shape[-2:]
    Nk = k.shape[-2]
    s = dtype(1.0 / math.sqrt(d))
    S = (q * s) @ k.swapaxes(-1, -2)  # (..., Nq, Nk)
    if causal:
        S = np.where(reference.causal_mask(Nq, Nk), S, dtype(-np.inf))
    m = S.max(axis=-1, keepdims=True)
    P = np.exp(S - np.where(m == -np.inf, dtype(0), m))
    P = P / np.where(P.sum(axis=-1, keepdims=True) > 0, P.sum(axis=-1, keepdims=True), dtype(1))
    dv = P.swapaxes(-1, -2) @ do
    dP = do @ v.swapaxes(-1, -2)
    dS = P * (dP - (P * dP).sum(axis=-1, keepdims=True))
    return (dS @ k) * s, (dS.swapaxes(-1, -2) @ q) * s, dv


def _check_float16(q, k, v, causal, fwd, bwd, do):
    """float16 error at most 3x that of attention computed entirely in float16 (Dao-AILab's rule)."""
    assert fwd.o.dtype == np.float16 and fwd.lse.dtype == np.float32
    o_ref, lse_ref = reference.attention_forward(q, k, v, causal=causal)
    _check_masked_rows(fwd, bwd, lse_ref)
    o_plain = reference.plain_attention(q, k, v, causal=causal, dtype=np.float16)
    err_plain = np.abs(o_plain.astype(np.float64) - o_ref).max()
    assert np.abs(fwd.o.astype(np.float64) - o_ref).max() <= 3 * err_plain + 1e-4
    _check_lse(fwd.lse, lse_ref, 1e-2)
    grads_ref = reference.attention_backward(q, k, v, o_ref, lse_ref, do, causal=causal)
    grads_plain = _plain_backward(q, k, v, do, causal, np.float16)
    for name, g, g_ref, g_plain in zip(("dq", "dk", "dv"), (bwd.dq, bwd.dk, bwd.dv), grads_ref, grads_plain):
        err_plain = np.abs(g_plain.astype(np.float64) - g_ref).max()
        assert np.abs(g.astype(np.float64) - g_ref).max() <= 3 * err_plain + 1e-4, name


def test_float16_dao_rule(rng):
    q, k, v = _qkv(rng, (1,), 23, 17, 16, np.float16)
    fwd, bwd, do = _run(q, k, v, True)
    _check_float16(q, k, v, True, fwd, bwd, do)


# (BH, Nq, Nk, d, causal, dtype): 1, 16 and 17 give one tile, a full tile and one more
COUNT_CASES = [
    (1, 1, 1, 1, False, np.float32),
    (2, 16, 5, 3, True, np.float32),
    (1, 17, 16, 17, False, np.float16),
    (1, 3, 17, 16, True, np.float64),
]


@pytest.mark.parametrize("BH, Nq, Nk, d, causal, dtype", COUNT_CASES)
def test_counts_equal_io_model(rng, BH, Nq, Nk, d, causal, dtype):
    q, k, v = _qkv(rng, (BH,), Nq, Nk, d, dtype)
    fwd, bwd, do = _run(q, k, v, causal, count_hbm=True)
    want_f = iomodel.forward(BH, Nq, Nk, d, dtype, causal, None)
    want_b = iomodel.backward(BH, Nq, Nk, d, dtype, causal, None)
    assert list(fwd.hbm.per_kernel) == list(want_f.per_kernel)  # names, in launch order
    assert list(bwd.hbm.per_kernel) == list(want_b.per_kernel)
    assert fwd.hbm == want_f
    assert bwd.hbm == want_b
    # the counting kernels compute the same results
    if dtype == np.float16:
        _check_float16(q, k, v, causal, fwd, bwd, do)
    else:
        _check_against_reference(q, k, v, causal, fwd, bwd, do, 1e-6 if dtype == np.float32 else 1e-12)


def test_io_model_closed_form():
    """The model's matrix-product formula, and the N^2 terms that S and P bring, by hand."""
    e = 4
    # (BH=1) S = Q K^T with Nq = Nk = 32, d = 16: 2 x 2 tiles of C, each stages 16 x 16 of Q and of K
    assert iomodel.matmul(1, 32, 32, 16, np.float32) == fn.KernelBytes(2 * 32 * 16 * e + 2 * 16 * 32 * e, 32 * 32 * e)
    f = iomodel.forward(3, 32, 32, 16, np.float32, False, None)
    assert f.per_kernel["P = softmax(S)"] == fn.KernelBytes(3 * 3 * 32 * 32 * e, 3 * 32 * 32 * e + 3 * 32 * 4)
    # doubling N quadruples the bytes of the N x N steps
    f2 = iomodel.forward(3, 64, 64, 16, np.float32, False, None)
    assert f2.per_kernel["P = softmax(S)"].total == 4 * f.per_kernel["P = softmax(S)"].total - 2 * 3 * 32 * 4
    assert f2.per_kernel["S = scale*Q@K^T"].total == 4 * f.per_kernel["S = scale*Q@K^T"].total


def test_batch_and_heads(rng):
    """(B, H, N, d) with B, H > 1: each (batch, head) pair is its own problem."""
    q, k, v = _qkv(rng, (2, 2), 5, 7, 4, np.float64)
    fwd, bwd, do = _run(q, k, v, False)
    assert bwd.dq.shape == q.shape and bwd.dk.shape == k.shape and bwd.dv.shape == v.shape
    _check_against_reference(q, k, v, False, fwd, bwd, do, 1e-12)


@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (False, True), (True, False), (True, True)])
def test_matmul_wrapper(rng, trans_a, trans_b):
    BH, M, N, K = 2, 17, 5, 19
    a = rng.standard_normal((BH, K, M) if trans_a else (BH, M, K)).astype(np.float32)
    b = rng.standard_normal((BH, N, K) if trans_b else (BH, K, N)).astype(np.float32)
    want = 0.5 * (a.swapaxes(1, 2) if trans_a else a) @ (b.swapaxes(1, 2) if trans_b else b)
    c, hbm = standard.matmul(a, b, trans_a=trans_a, trans_b=trans_b, alpha=0.5, count_hbm=True)
    assert isinstance(c, np.ndarray) and c.shape == (BH, M, N) and c.dtype == np.float32
    assert _rel(c, want) < 1e-6
    assert hbm.per_kernel == {"C = alpha*op(A)@op(B)": iomodel.matmul(BH, M, N, K, np.float32)}


def test_matmul_wrapper_2d_device_and_dtypes(rng):
    from numba import cuda

    a = rng.standard_normal((3, 20)).astype(np.float64)
    b = rng.standard_normal((20, 18)).astype(np.float64)
    c = standard.matmul(a, b)
    assert c.shape == (3, 18) and _rel(c, a @ b) < 1e-14
    c_dev = standard.matmul(cuda.to_device(a), cuda.to_device(b), trans_b=False)
    assert not isinstance(c_dev, np.ndarray) and np.array_equal(c_dev.copy_to_host(), c)
    a16, b16 = a.astype(np.float16), b.astype(np.float16)
    c16 = standard.matmul(a16, b16)
    assert c16.dtype == np.float16
    want = a16.astype(np.float64) @ b16.astype(np.float64)
    assert np.abs(c16 - want).max() <= 2 * np.abs(want.astype(np.float16) - want).max()


def test_matmul_wrapper_rejects_bad_arguments(rng):
    a = np.ones((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="inner dimension"):
        standard.matmul(a, np.ones((2, 5, 6), np.float32))
    with pytest.raises(ValueError, match="batch"):
        standard.matmul(a, np.ones((3, 4, 6), np.float32))
    with pytest.raises(TypeError, match="dtype"):
        standard.matmul(a, np.ones((2, 4, 6), np.float64))
    with pytest.raises(TypeError, match="alpha"):
        standard.matmul(a, np.ones((2, 4, 6), np.float32), alpha=float("nan"))


def test_protocol():
    assert standard.USES_BLOCKS is False
    assert fn.resolve_block("standard", 64, np.float32) is None
    for dtype in (np.float16, np.float32, np.float64):
        assert standard.shared_bytes(None, None, 128, dtype, "forward") <= 48 * 1024
    assert standard.shared_bytes(None, None, 64, np.float64, "backward") == 2 * 16 * 17 * 8


# --------------------------------------------------------------------------- real sizes (GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("N", [1, 17, 97, 1000])
@pytest.mark.parametrize("d", [16, 64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_float32_real_sizes(rng, N, d, causal):
    BH = 4 if N < 1000 else 2
    q, k, v = _qkv(rng, (BH,), N, N, d, np.float32)
    fwd, bwd, do = _run(q, k, v, causal)
    _check_against_reference(q, k, v, causal, fwd, bwd, do, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("Nq, Nk", [(1025, 1000), (64, 1025)])
def test_gpu_counts_and_float16_real_sizes(rng, Nq, Nk):
    d = 80
    q, k, v = _qkv(rng, (3,), Nq, Nk, d, np.float32)
    fwd, bwd, do = _run(q, k, v, True, count_hbm=True)
    assert fwd.hbm == iomodel.forward(3, Nq, Nk, d, np.float32, True, None)
    assert bwd.hbm == iomodel.backward(3, Nq, Nk, d, np.float32, True, None)
    _check_against_reference(q, k, v, True, fwd, bwd, do, 1e-5)
    q16, k16, v16 = (x.astype(np.float16) for x in (q, k, v))
    o16 = fn.standard_attention_forward(q16, k16, v16, causal=True).o
    o_ref, _ = reference.attention_forward(q16, k16, v16, causal=True)
    o_plain = reference.plain_attention(q16, k16, v16, causal=True, dtype=np.float16)
    assert np.abs(o16 - o_ref).max() <= 3 * np.abs(o_plain.astype(np.float64) - o_ref).max() + 1e-4
