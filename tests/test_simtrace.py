"""The simulator's access trace: every element read and write, with the thread that made it."""

import numpy as np
import pytest
from numba import cuda

from flash_numba.device import SIMULATOR

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the access trace exists only in the simulator")


@cuda.jit
def _copy_twice_row0(a, out):
    i = cuda.threadIdx.x
    out[i] = a[i] + a[0]  # every thread also reads a[0]


def test_trace_counts_reads_and_writes_per_thread():
    from flash_numba.sim.trace import AccessLog, traced

    log = AccessLog()
    a = np.arange(5, dtype=np.float32)
    a_d, out_d = traced(a, "a", log), traced(np.zeros(5, np.float32), "out", log)
    _copy_twice_row0[1, 5](a_d, out_d)
    assert np.array_equal(out_d.copy_to_host(), a + a[0])
    assert log.per_array() == {"a": (10, 0), "out": (0, 5)}
    assert log.bytes("r") == 40 and log.bytes("w") == 20
    assert log.count_map("a", "r", (5,)).tolist() == [6, 1, 1, 1, 1]
    assert log.touch_map("out", "w", (5,)).tolist() == [0, 1, 2, 3, 4]
    assert log.touch_map("out", "w", (5,), block=(1, 0, 0)).tolist() == [-1] * 5


def test_run_returns_outputs_and_the_log():
    from flash_numba.sim.trace import run

    out, log = run(_copy_twice_row0, 1, 3, [("a", np.ones(3, np.float32)), ("out", np.zeros(3, np.float32))])
    assert out["out"].tolist() == [2.0, 2.0, 2.0] and log.per_array() == {"a": (6, 0), "out": (0, 3)}
