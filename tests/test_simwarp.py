"""The simulator's block scheduler (greenlets, flash_numba.sim.warps): barriers, votes, shuffles, errors.

Kernels here are tiny and plain: they check the scheduler, not attention.  On a GPU
the same kernels run for real (the rules they check are CUDA's).
"""

import numpy as np
import pytest
from numba import cuda

from flash_numba.device import SIMULATOR

NT = 64


@cuda.jit
def _reverse_through_shared(x, out):
    """out = x reversed: each thread writes one element of a shared tile and reads another after the barrier."""
    tile = cuda.shared.array(NT, np.float64)
    t = cuda.threadIdx.x
    tile[t] = x[cuda.blockIdx.x, t]
    cuda.syncthreads()
    out[cuda.blockIdx.x, t] = tile[NT - 1 - t]


def test_a_barrier_orders_writes_before_reads_in_every_block():
    x = np.arange(3 * NT, dtype=np.float64).reshape(3, NT)
    out = np.full_like(x, np.nan)
    _reverse_through_shared[3, NT](x, out)
    np.testing.assert_array_equal(out, x[:, ::-1])


@cuda.jit
def _early_exit_then_barrier(out):
    """Threads t >= 16 return at once; the others meet at two barriers (the barrier opens for the live threads)."""
    tile = cuda.shared.array(NT, np.int64)
    t = cuda.threadIdx.x
    if t >= 16:
        return
    tile[t] = t
    cuda.syncthreads()
    out[t] = tile[15 - t]
    cuda.syncthreads()


def test_a_barrier_opens_when_every_live_thread_reached_it():
    out = np.full(16, -1, dtype=np.int64)
    _early_exit_then_barrier[1, NT](out)
    np.testing.assert_array_equal(out, np.arange(16)[::-1])


@cuda.jit
def _votes(flags, out):
    t = cuda.threadIdx.x
    f = flags[t]
    c = cuda.syncthreads_count(f)
    a = cuda.syncthreads_and(f)
    o = cuda.syncthreads_or(f)
    out[t, 0], out[t, 1], out[t, 2] = c, a, o


@pytest.mark.parametrize("pattern", ["none", "some", "all"])
def test_block_votes_count_and_or(pattern):
    flags = {"none": np.zeros(NT, np.int32), "all": np.ones(NT, np.int32),
             "some": (np.arange(NT) % 3 == 0).astype(np.int32)}[pattern]
    out = np.full((NT, 3), -1, dtype=np.int64)
    _votes[1, NT](flags, out)
    n = int(flags.sum())
    expect = np.array([n, int(n == NT), int(n > 0)])
    np.testing.assert_array_equal(out, np.broadcast_to(expect, (NT, 3)))


@cuda.jit
def _xor_butterfly_sum(x, out):
    """Sum of a warp's 32 values by shfl_xor_sync (every lane ends with the warp's sum)."""
    t = cuda.threadIdx.x
    v = x[t]
    for mask in (16, 8, 4, 2, 1):
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, mask)
    out[t] = v


def test_shuffles_sum_each_warp():
    x = np.arange(NT, dtype=np.float64) ** 2
    out = np.full(NT, np.nan)
    _xor_butterfly_sum[1, NT](x, out)
    np.testing.assert_array_equal(out, np.repeat(x.reshape(-1, 32).sum(axis=1), 32))


@cuda.jit
def _reads_past_the_end(x):
    t = cuda.threadIdx.x
    x[t + 1] = 1.0


@pytest.mark.skipif(not SIMULATOR, reason="out-of-bounds accesses raise only in the simulator")
def test_an_error_names_the_thread_and_block_and_the_next_launch_runs():
    x = np.zeros(4)
    with pytest.raises(IndexError, match=r"tid=\[3, 0, 0\] ctaid=\[0, 0, 0\]"):
        _reads_past_the_end[1, 4](x)
    test_a_barrier_orders_writes_before_reads_in_every_block()  # the scheduler is usable again
