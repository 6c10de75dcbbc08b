"""Attention dropout (the FlashAttention paper's Algorithms 2 and 4): the keep mask and every kernel.

The mask is a hash of (seed, query head, row, column) (flash_numba/kernels/_dropout.py): the
host's scalar version, the device version (run here in the simulator) and the NumPy version the
reference uses give the same bits; its keep rate and the independence of neighbouring rows,
columns, heads and seeds are checked on a fixed set of entries (deterministic given the seeds).
Every kernel at every dtype, forward and backward with dropout against the float64 reference with
the same mask, counted bytes == IO model (no mask in HBM), and dropout_p=0 bitwise attention
without dropout: the test matrix (tests/test_kernels.py).
"""

import math

import numpy as np
import pytest
from numba import cuda

import flash_numba as fn
from flash_numba import reference
from flash_numba.kernels import _dropout

from test_flash2 import err64
from test_gqa import make

SEEDS = (0, 1, 12345, 2**32 - 1)


# ----------------------------------------------------------------------------- the keep mask


def test_host_device_and_numpy_masks_are_bit_identical():
    """keep_hash on Python ints, row_hash_dev + keep_scale_dev in a (simulated) kernel, and keep_mask on
    NumPy arrays: the same hash, so the same mask, for every (seed, bh, i, j) of a small grid."""
    BH, N, M, p = 2, 5, 7, 0.5
    thr, inv_keep = _dropout.threshold(p), 1.0 / (1.0 - p)

    @cuda.jit
    def factors(out, seed, threshold, inv):
        bh, i, j = cuda.grid(3)
        if bh < out.shape[0] and i < out.shape[1] and j < out.shape[2]:
            out[bh, i, j] = _dropout.keep_scale_dev(_dropout.row_hash_dev(seed, bh, i), j, threshold, inv)

    for seed in SEEDS:
        host = np.array([[[_dropout.keep_hash(seed, bh, i, j) for j in range(M)] for i in range(N)]
                         for bh in range(BH)], dtype=np.uint64)
        vec = _dropout.keep_hash(np.uint64(seed), np.arange(BH, dtype=np.uint64)[:, None, None],
                                 np.arange(N, dtype=np.uint64)[:, None], np.arange(M, dtype=np.uint64))
        assert np.array_equal(host, vec) and host.max() < 2**32
        out = np.full((BH, N, M), np.nan)
        factors[(1, 1, 1), (BH, N, M)](out, seed, thr, inv_keep)
        want = _dropout.keep_mask(seed, np.arange(BH), N, M, p)
        assert np.array_equal(want, host >= thr)
        assert np.array_equal(out, np.where(want, inv_keep, 0.0))


@pytest.mark.parametrize("p", [0.1, 0.25, 0.5, 0.9])
def test_keep_rate_and_independence(p):
    """Over 4 seeds x 64 x 64 entries the kept fraction is 1 - p within 6 binomial sigmas; two
    neighbouring columns, rows, heads or seeds agree as often as independent draws would,
    (1 - p)^2 + p^2, within 6 sigmas."""
    Z = np.stack([_dropout.keep_mask(s, np.arange(2), 64, 64, p) for s in SEEDS])  # (seed, bh, i, j)

    def within(fraction, want, n):
        return abs(fraction - want) <= 6 * math.sqrt(want * (1 - want) / n)

    assert within(Z.mean(), 1 - p, Z.size)
    agree = (1 - p) ** 2 + p**2
    for a, b in ((Z[..., 1:], Z[..., :-1]), (Z[..., 1:, :], Z[..., :-1, :]), (Z[:, 1], Z[:, 0]), (Z[1:], Z[:-1])):
        assert within((a == b).mean(), agree, a.size)


def test_threshold_rounds_p_times_two_to_the_32():
    assert _dropout.threshold(0.0) == 0 and _dropout.threshold(0.5) == 2**31
    assert _dropout.threshold(0.25) == 2**30


# ----------------------------------------------------------------------------- every kernel


def test_dropout_changes_o_and_the_backward_needs_the_same_seed(rng):
    """The mask matters: O differs from attention without dropout (L does not), and a backward with
    another seed regenerates another mask, so its dV misses the reference's."""
    q, k, v, do = make(rng, (1, 1), 1, 9, 9, 8, np.float64)
    f = fn.attention_forward(q, k, v, kernel="flash2", dropout_p=0.5, dropout_seed=7)
    plain = fn.attention_forward(q, k, v, kernel="flash2")
    assert np.array_equal(f.lse, plain.lse) and err64(f.o, plain.o) > 1e-3
    want = reference.attention_backward(q, k, v, f.o, f.lse, do, dropout_p=0.5, dropout_seed=7)[2]
    right = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2", dropout_p=0.5, dropout_seed=7)
    wrong = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2", dropout_p=0.5, dropout_seed=8)
    assert err64(right.dv, want) < 1e-12 and err64(wrong.dv, want) > 1e-3


def test_forward_draws_a_seed_when_none_is_given(rng):
    q, k, v, _ = make(rng, (1, 1), 1, 5, 5, 4, np.float32)
    f = fn.attention_forward(q, k, v, kernel="flash2", dropout_p=0.5)
    assert isinstance(f.dropout_seed, int) and 0 <= f.dropout_seed < 2**32
    again = fn.attention_forward(q, k, v, kernel="flash2", dropout_p=0.5, dropout_seed=f.dropout_seed)
    assert np.array_equal(f.o, again.o)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("p, error", [(1.0, ValueError), (-0.1, ValueError), (float("nan"), ValueError),
                                      ("0.5", TypeError), (True, TypeError)])
def test_bad_p_names_the_argument(rng, p, error):
    q, k, v, _ = make(rng, (1, 1), 1, 3, 3, 4, np.float32)
    with pytest.raises(error, match="^dropout_p: "):
        fn.attention_forward(q, k, v, dropout_p=p, dropout_seed=1)
    with pytest.raises(error, match="^dropout_p: "):
        reference.attention_forward(q, k, v, dropout_p=p, dropout_seed=1)


@pytest.mark.parametrize("seed, error", [(1.5, TypeError), ("1", TypeError), (-1, ValueError), (2**32, ValueError)])
def test_bad_seed_names_the_argument(rng, seed, error):
    q, k, v, _ = make(rng, (1, 1), 1, 3, 3, 4, np.float32)
    with pytest.raises(error, match="^dropout_seed: "):
        fn.attention_forward(q, k, v, dropout_p=0.5, dropout_seed=seed)


def test_backward_with_dropout_needs_the_seed(rng):
    q, k, v, do = make(rng, (1, 1), 1, 3, 3, 4, np.float32)
    f = fn.attention_forward(q, k, v, dropout_p=0.5)
    with pytest.raises(ValueError, match="^dropout_seed: "):
        fn.attention_backward(q, k, v, f.o, f.lse, do, dropout_p=0.5)
    with pytest.raises(ValueError, match="^dropout_seed: "):
        reference.attention_backward(q, k, v, f.o, f.lse, do, dropout_p=0.5)
