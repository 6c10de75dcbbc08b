"""The device layer (flash_numba.device) and ``flash-numba info``.

In the simulator: the mode line says so, :func:`device.info` returns stand-ins
marked ``simulated``, :func:`device.jit` drops the options the simulator rejects,
and nothing pretends to measure time.  On a GPU (``-m gpu``): the real numbers.
"""

import numpy as np
import pytest
from numba import cuda

import flash_numba
from flash_numba import cli, device
from flash_numba.device import SIMULATOR

sim_only = pytest.mark.skipif(not SIMULATOR, reason="simulator behaviour")


@sim_only
def test_mode_and_describe_in_the_simulator():
    assert device.mode() == "simulator"
    line = device.describe()
    assert line.startswith("simulator")
    assert "times are not measured" in line
    assert "48 KB" in line


@sim_only
def test_info_gives_stand_ins_marked_simulated():
    info = device.info()
    assert info.simulated and info.mode == "simulator"
    assert info.name == "Numba CUDA simulator"
    assert info.compute_capability == (7, 5)
    assert info.shared_mem_per_block == device.STATIC_SHARED_LIMIT == 48 * 1024
    assert info.total_memory is None
    assert info.warp_size == 32


@sim_only
def test_plain_cuda_jit_rejects_tuning_options_in_the_simulator():
    # why device.jit exists: without it these options break every kernel in the simulator
    for option in ({"max_registers": 64}, {"lineinfo": True}, {"launch_bounds": (64,)}):
        with pytest.raises(TypeError, match=next(iter(option))):
            cuda.jit(**option)(lambda x: None)


def test_jit_with_tuning_options_builds_a_kernel_that_runs():
    @device.jit(max_registers=64, lineinfo=True, launch_bounds=(64,))
    def twice(x, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = 2 * x[i]

    x = np.arange(70, dtype=np.float32)
    out = cuda.to_device(np.full_like(x, np.nan))
    twice[2, 64](cuda.to_device(x), out)
    np.testing.assert_array_equal(out.copy_to_host(), 2 * x)


@sim_only
def test_cuda_timer_reports_none_with_a_reason_in_the_simulator():
    with device.CudaTimer() as t:
        pass
    assert t.ms is None
    assert "-1" in t.note and "simulator" in t.note


@sim_only
def test_time_ms_returns_none_in_the_simulator():
    calls = []
    assert device.time_ms(lambda: calls.append(1)) is None
    assert calls == []  # nothing is run for a timing that cannot be taken


@sim_only
def test_info_command_prints_the_mode_line_device_and_block_sizes(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == device.describe()
    assert "Numba CUDA simulator (stand-in numbers)" in out
    assert "compute capability 7.5" in out
    for name in ("flash1", "flash2"):
        for dtype in cli.DTYPES:
            for pass_ in ("forward", "backward"):
                row = next(line for line in lines if line.split()[:3] == [name, pass_, dtype])
                Br, Bc = flash_numba.resolve_block(name, 64, dtype, pass_=pass_)
                assert f"({Br}, {Bc})" in row
    assert "not available" not in out


@pytest.mark.gpu
def test_gpu_mode_info_and_timing():
    assert device.mode() == "gpu"
    info = device.info()
    assert not info.simulated
    assert info.compute_capability >= (7, 5)
    assert 0 < info.shared_mem_per_block <= device.STATIC_SHARED_LIMIT
    assert device.describe().startswith(f"gpu: {info.name}")

    x = cuda.to_device(np.zeros(1 << 20, dtype=np.float32))

    @device.jit
    def bump(x):
        i = cuda.grid(1)
        if i < x.size:
            x[i] += 1

    times = device.time_ms(lambda: bump[(x.size + 255) // 256, 256](x), warmup=1, repeats=5)
    assert len(times) == 5 and all(t > 0 for t in times)
    assert np.all(x.copy_to_host() == 6)


def test_numba_device_bytes_is_none_in_the_simulator():
    if SIMULATOR:
        assert device.numba_device_bytes() is None


@pytest.mark.gpu
def test_numba_device_bytes_counts_this_process_allocations_exactly():
    # what the bench harness and figure 4 read; other processes on the GPU must not move it
    cuda.current_context().memory_manager.deallocations.clear()  # earlier tests' garbage out of the count
    before = device.numba_device_bytes()
    with cuda.defer_cleanup():
        a = cuda.device_array(1 << 20, dtype=np.uint8)
        b = cuda.device_array(1000, dtype=np.float32)
        assert device.numba_device_bytes() - before == (1 << 20) + 4000
        del a, b  # freed lazily: still held until the queue is flushed
        assert device.numba_device_bytes() - before == (1 << 20) + 4000
    cuda.current_context().memory_manager.deallocations.clear()
    assert device.numba_device_bytes() == before
