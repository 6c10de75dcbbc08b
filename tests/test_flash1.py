"""flash1 (the paper's Algorithms 1 and 4) against the float64 reference and its IO model.

Simulator tests use tiny sizes and explicit blocks such as (4, 8), (8, 4) and
(5, 3), so that both loops run over several blocks and the last tiles are
partial.  The ``gpu`` tests run real sizes with the default blocks.
"""

import math

import numpy as np
import pytest

import flash_numba as fn
from flash_numba import iomodel, reference
from flash_numba.kernels import flash1

KERNEL = "flash1"
TOL = {np.float32: 1e-5, np.float64: 1e-12}
DAO_FACTOR = 3  # float16: at most this times the error of a plain float16 implementation


def rel_err(x, ref):
    """max |x - ref| relative to max |ref| (floored at 1e-3 for gradients that are all ~0); NaN fails."""
    x = np.asarray(x, dtype=np.float64)
    return np.max(np.abs(x - ref)) / max(np.max(np.abs(ref)), 1e-3)


def make(rng, lead, Nq, Nk, d, dtype, spread=1.0):
    """q, k, v, do with standard normal entries (q and k times ``spread``) in ``dtype``."""
    q = spread * rng.standard_normal(lead + (Nq, d))
    k = spread * rng.standard_normal(lead + (Nk, d))
    v = rng.standard_normal(lead + (Nk, d))
    do = rng.standard_normal(lead + (Nq, d))
    return tuple(x.astype(dtype) for x in (q, k, v, do))


def run(q, k, v, do, causal, block, count_hbm=False):
    """flash1 forward, then backward from the reference's o and lse (so each pass is checked alone)."""
    fwd = fn.flash_attention_forward(q, k, v, causal=causal, kernel=KERNEL, block=block, count_hbm=count_hbm)
    o, lse = reference.attention_forward(q, k, v, causal=causal)
    o_in, lse_in = o.astype(q.dtype), lse.astype(fwd.lse.dtype)
    bwd = fn.flash_attention_backward(
        q, k, v, o_in, lse_in, do, causal=causal, kernel=KERNEL, block=block, count_hbm=count_hbm
    )
    grads = reference.attention_backward(q, k, v, o_in, lse_in, do, causal=causal)
    return fwd, (o, lse), bwd, grads, (o_in, lse_in)


def check_lse(lse, lse_ref, tol):
    """Equal -inf entries (rows with no visible key), close finite ones."""
    lse = np.asarray(lse, dtype=np.float64)
    masked = np.isneginf(lse_ref)
    np.testing.assert_array_equal(np.isneginf(lse), masked)
    if (~masked).any():
        assert np.max(np.abs(lse[~masked] - lse_ref[~masked])) <= tol * max(1.0, np.max(np.abs(lse_ref[~masked])))


# (lead dims, Nq, Nk, d, (Br, Bc), causal): flash1 takes any block; these are blocks no other kernel takes
# (every kernel's checks at its own small block, every dtype: tests/test_kernels.py)
CASES = [
    ((2,), 17, 17, 8, (4, 8), True),
    ((1, 2), 13, 29, 5, (8, 4), False),  # (B, H, N, d), Nq < Nk
    ((), 29, 11, 8, (5, 3), True),  # (N, d), Nq > Nk, causal: query rows 0..17 see no key
    ((1,), 24, 24, 16, (8, 8), True),  # blocks dividing N
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("lead, Nq, Nk, d, block, causal", CASES)
def test_matches_reference(rng, lead, Nq, Nk, d, block, causal, dtype):
    q, k, v, do = make(rng, lead, Nq, Nk, d, dtype)
    fwd, (o, lse), bwd, grads, _ = run(q, k, v, do, causal, block)
    tol = TOL[dtype]
    assert fwd.o.dtype == dtype and fwd.lse.dtype == dtype
    assert fwd.o.shape == q.shape and fwd.lse.shape == lead + (Nq,)
    assert fwd.block == block and bwd.block == block
    assert rel_err(fwd.o, o) < tol
    check_lse(fwd.lse, lse, tol)
    for name, got, want in zip(("dq", "dk", "dv"), (bwd.dq, bwd.dk, bwd.dv), grads):
        assert got.dtype == dtype and got.shape == want.shape, name
        assert rel_err(got, want) < tol, name


# (BH lead, Nq, Nk, d, (Br, Bc), causal, dtype)
COUNT_CASES = [
    ((2,), 17, 17, 3, (4, 8), False, np.float32),
    ((2,), 17, 17, 3, (4, 8), True, np.float32),
    ((3,), 11, 23, 2, (3, 7), True, np.float16),
    ((3,), 23, 11, 2, (7, 3), True, np.float16),
    ((1, 2), 20, 3, 2, (4, 2), True, np.float64),  # the first query blocks meet no key block at all
    ((1, 2), 20, 3, 2, (4, 2), False, np.float64),
    ((2,), 1, 1, 2, (4, 8), False, np.float32),
    ((2,), 1, 6, 2, (1, 1), True, np.float16),
    ((2,), 16, 16, 2, (8, 8), True, np.float32),
    ((), 9, 14, 4, (5, 3), False, np.float16),
]


@pytest.mark.parametrize("lead, Nq, Nk, d, block, causal, dtype", COUNT_CASES)
def test_hbm_count_equals_model(rng, lead, Nq, Nk, d, block, causal, dtype):
    q, k, v, do = make(rng, lead, Nq, Nk, d, dtype)
    fwd, _, bwd, _, _ = run(q, k, v, do, causal, block, count_hbm=True)
    BH = int(np.prod(lead))
    assert list(fwd.hbm.per_kernel) == list(flash1.FORWARD_NAMES)
    assert list(bwd.hbm.per_kernel) == list(flash1.BACKWARD_NAMES)
    assert fwd.hbm == iomodel.forward(KERNEL, BH, Nq, Nk, d, dtype, causal, block)
    assert bwd.hbm == iomodel.backward(KERNEL, BH, Nq, Nk, d, dtype, causal, block)


def test_model_is_theorem_2_count_plus_extras():
    # One head, N = Nq = Nk, float32: the docstring's 2Nd + Tc(3Nd + 4N) elements, plus the init
    # kernel (Nd + 2N written) and L = m + log(l) (2N read, N written), times 4 bytes.
    N, d, Br, Bc = 1000, 64, 48, 48
    Tc = math.ceil(N / Bc)
    count = iomodel.forward(KERNEL, 1, N, N, d, np.float32, False, (Br, Bc))
    assert count.total == 4 * (2 * N * d + Tc * (3 * N * d + 4 * N) + (N * d + 2 * N) + 3 * N)
    # Br changes nothing; Bc sets the number of passes
    assert iomodel.forward(KERNEL, 1, N, N, d, np.float32, False, (8, Bc)) == count
    assert iomodel.forward(KERNEL, 1, N, N, d, np.float32, False, (Br, 2 * Bc)).total < count.total
    # causal with N a multiple of Br = Bc: query block i meets i + 1 key blocks, about half the rows
    rows = iomodel.flash1.query_rows_processed(1024, 1024, 32, 32, True)
    assert rows == 32 * sum(i + 1 for i in range(32))


# the paper's rule Bc = ceil(M / 4d), Br = min(Bc, d) with M = 48 KB / 4 (8 for float64), shrunk to fit
DEFAULT_BLOCKS = {
    # (d, dtype): (forward (Br, Bc), backward (Br, Bc))
    (16, np.float32): ((16, 192), (16, 120)),
    (32, np.float32): ((32, 96), (32, 48)),
    (64, np.float32): ((48, 48), (24, 24)),
    (80, np.float32): ((32, 32), (16, 16)),
    (128, np.float32): ((24, 24), (8, 8)),
    (64, np.float16): ((48, 48), (24, 24)),
    (64, np.float64): ((24, 24), (8, 8)),
    (128, np.float64): ((8, 8), (7, 7)),
}


@pytest.mark.parametrize("d, dtype", list(DEFAULT_BLOCKS))
def test_default_block_choice(d, dtype):
    for pass_, want in zip(("forward", "backward"), DEFAULT_BLOCKS[d, dtype]):
        Br, Bc = fn.resolve_block(KERNEL, d, dtype, pass_=pass_)
        assert (Br, Bc) == want, pass_
        M = 48 * 1024 // np.dtype(np.float64 if dtype == np.float64 else np.float32).itemsize
        assert Bc <= math.ceil(M / (4 * d)) and Br <= min(Bc, d)
        assert flash1.shared_bytes(Br, Bc, d, dtype, pass_) <= 48 * 1024
        assert max(Br, Bc) <= flash1.MAX_THREADS


def test_default_blocks_run(rng):
    # d = 16: forward (16, 192), backward (16, 120): one key block, two partial query blocks
    q, k, v, do = make(rng, (1,), 20, 20, 16, np.float32)
    fwd, (o, _), bwd, grads, _ = run(q, k, v, do, True, None)
    assert fwd.block == (16, 192) and bwd.block == (16, 120)
    assert rel_err(fwd.o, o) < TOL[np.float32]
    for got, want in zip((bwd.dq, bwd.dk, bwd.dv), grads):
        assert rel_err(got, want) < TOL[np.float32]


def test_block_validation():
    q = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="limits"):
        fn.flash_attention_forward(q, q, q, kernel=KERNEL, block=(8, flash1.MAX_THREADS + 1))
    with pytest.raises(ValueError, match="shared memory"):
        fn.flash_attention_forward(q, q, q, kernel=KERNEL, block=(256, 256))


# ---------------------------------------------------------------- real sizes, on a GPU

def plain_backward(q, k, v, o, lse, do, causal, dtype):
    """The backward computed entirely in ``dtype`` (no upcast): the baseline of the Dao rule."""
    q, k, v, o, do = (x.astype(dtype) for x in (q, k, v, o, do))
    scale = dtype(1.0 / math.sqrt(q.shape[-1]))
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    p = np.exp(s - np.where(np.isfinite(lse), lse, 0).astype(dtype)[..., None])
    if causal:
        p = np.where(reference.causal_mask(q.shape[-2], k.shape[-2]), p, dtype(0))
    dv = np.swapaxes(p, -1, -2) @ do
    ds = p * (do @ np.swapaxes(v, -1, -2) - (do * o).sum(-1, keepdims=True))
    return (ds @ k) * scale, (np.swapaxes(ds, -1, -2) @ q) * scale, dv


def abs_err(x, ref):
    return np.max(np.abs(np.asarray(x, dtype=np.float64) - ref))



GPU_N = [1, 17, 64, 97, 128, 1000, 1025]
GPU_D = [16, 32, 64, 80, 128]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", GPU_D)
@pytest.mark.parametrize("N", GPU_N)
def test_gpu_float32_real_sizes(rng, N, d, causal):
    q, k, v, do = make(rng, (1, 2), N, N, d, np.float32)
    fwd, (o, lse), bwd, grads, _ = run(q, k, v, do, causal, None)
    assert rel_err(fwd.o, o) < 1e-5
    check_lse(fwd.lse, lse, 1e-5)
    for name, got, want in zip(("dq", "dk", "dv"), (bwd.dq, bwd.dk, bwd.dv), grads):
        assert rel_err(got, want) < 1e-5, name


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq, Nk", [(97, 1025), (1025, 97), (1, 1000), (1000, 1), (64, 1000)])
@pytest.mark.parametrize("d", [16, 80, 128])
def test_gpu_float32_unequal_lengths(rng, Nq, Nk, d, causal):
    q, k, v, do = make(rng, (2,), Nq, Nk, d, np.float32)
    fwd, (o, lse), bwd, grads, _ = run(q, k, v, do, causal, None)
    assert rel_err(fwd.o, o) < 1e-5
    check_lse(fwd.lse, lse, 1e-5)
    for name, got, want in zip(("dq", "dk", "dv"), (bwd.dq, bwd.dk, bwd.dv), grads):
        assert rel_err(got, want) < 1e-5, name


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("Nq, Nk", [(97, 97), (1000, 1000), (1025, 64)])
def test_gpu_float16_dao_rule(rng, Nq, Nk, d, causal):
    q, k, v, do = make(rng, (2,), Nq, Nk, d, np.float16)
    fwd, (o, _), bwd, grads, (o_in, lse_in) = run(q, k, v, do, causal, None)
    assert abs_err(fwd.o, o) <= DAO_FACTOR * abs_err(reference.plain_attention(q, k, v, causal=causal), o)
    plain = plain_backward(q, k, v, o_in, lse_in, do, causal, np.float16)
    for name, got, want, base in zip(("dq", "dk", "dv"), (bwd.dq, bwd.dk, bwd.dv), grads, plain):
        assert abs_err(got, want) <= DAO_FACTOR * abs_err(base, want), name


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_hbm_count_equals_model(rng, causal, dtype):
    q, k, v, do = make(rng, (2, 3), 1000, 1025, 64, dtype)
    fwd, _, bwd, _, _ = run(q, k, v, do, causal, None, count_hbm=True)
    assert fwd.hbm == iomodel.forward(KERNEL, 6, 1000, 1025, 64, dtype, causal)
    assert bwd.hbm == iomodel.backward(KERNEL, 6, 1000, 1025, 64, dtype, causal)
