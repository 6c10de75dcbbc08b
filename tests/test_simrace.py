"""The shared-memory race detector: a missing barrier is a race whatever order the simulator ran the threads in."""

import numpy as np
import pytest
from numba import cuda, float32

from flash_numba.device import SIMULATOR

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the detector watches the simulator's shared arrays")

T = 8  # threads of the block, and elements of the shared array


def _neighbour_kernel(barrier: bool):
    """out[t] = the value thread t+1 stored; with or without the barrier between the store and the load."""

    @cuda.jit
    def neighbour(x, out):
        t = cuda.threadIdx.x
        tile = cuda.shared.array(T, float32)
        tile[t] = x[cuda.blockIdx.x * T + t]
        if barrier:
            cuda.syncthreads()
        out[cuda.blockIdx.x * T + t] = tile[(t + 1) % T]

    return neighbour


def _run(barrier: bool):
    from flash_numba.sim.races import race_check

    x = np.arange(2 * T, dtype=np.float32)
    out = np.full(2 * T, np.nan, np.float32)
    with race_check() as races:
        _neighbour_kernel(barrier)[2, T](x, out)
    return races, x, out


@pytest.mark.parametrize("run", range(3))
def test_a_missing_barrier_is_a_race_every_run(run):
    races, _, _ = _run(barrier=False)
    r = races.first
    assert r is not None and races.count >= 1
    assert r.array == "tile" and r.epoch == 0 and r.first != r.second
    # the two accesses to element [i]: the store of thread i and the load of thread i - 1, in either order
    i = r.index[0]
    assert {(r.first, r.first_kind), (r.second, r.second_kind)} == {(i, "wrote"), ((i - 1) % T, "read")}
    assert str(r).startswith("threads race on shared array tile (thread ")


@pytest.mark.parametrize("run", range(3))
def test_with_the_barrier_there_is_no_race(run):
    races, x, out = _run(barrier=True)
    assert races.first is None and races.count == 0
    np.testing.assert_array_equal(out, np.roll(x.reshape(2, T), -1, axis=1).ravel())


def test_off_outside_the_context():
    from flash_numba.sim import warps as _simwarp
    from flash_numba.sim.races import race_check

    assert _simwarp.WATCH is None
    with pytest.raises(ZeroDivisionError), race_check():
        assert _simwarp.WATCH is not None
        1 / 0
    assert _simwarp.WATCH is None  # also after an exception inside


def _after_a_shuffle_kernel(partner_in_another_warp: bool):
    """Thread t stores, all threads shuffle (a warp operation, no syncthreads), thread t reads a neighbour's store:
    the neighbour in the same warp (ordered by the shuffle, as on a GPU) or in the other warp (not ordered)."""
    W = 32

    @cuda.jit
    def after_shuffle(x, out):
        t = cuda.threadIdx.x
        tile = cuda.shared.array(2 * W, float32)
        tile[t] = x[t]
        cuda.shfl_xor_sync(0xFFFFFFFF, t, 1)
        src = (t + W) % (2 * W) if partner_in_another_warp else t - t % W + (t + 1) % W
        out[t] = tile[src]

    return after_shuffle


@pytest.mark.parametrize("other_warp", [False, True])
def test_a_warp_operation_orders_one_warp_not_the_block(other_warp):
    """On a GPU a shuffle (or an mma or ldmatrix) synchronises the lanes of one warp, never two warps: the detector
    reports a store read by another warp after only a warp operation, and not one read within the warp."""
    from flash_numba.sim.races import race_check

    x = np.arange(64, dtype=np.float32)
    out = np.full(64, np.nan, np.float32)
    with race_check() as races:
        _after_a_shuffle_kernel(other_warp)[1, 64](x, out)
    if other_warp:
        assert races.first is not None and races.first.first // 32 != races.first.second // 32
    else:
        assert races.first is None and races.count == 0
