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
