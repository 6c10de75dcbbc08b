"""flash_numba.tools.microbench: each kernel computes what it claims, in the simulator and for real GPUs.

The simulator cannot time, so here the tests check the kernels' results (on
awkward sizes), the bookkeeping of each Measurement, that a hollow kernel
fails the built-in check, the roofline arithmetic, and (compile tier) that the
kernels build for sm_75 and sm_90 with the instruction mix they are meant to
measure.  The gpu tests only check that a number comes back.
"""

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import cuda

from flash_numba import compile_check
from flash_numba.tools import microbench
from flash_numba.device import SIMULATOR, jit


# ---------------------------------------------------------------------------- the kernels


@pytest.mark.parametrize("n, blocks, threads", [(1, 1, 32), (97, 1, 32), (1001, 3, 32), (4 * 96, 3, 32)])
def test_copy_kernel_copies_every_element(rng, n, blocks, threads):
    src_host = rng.standard_normal(n).astype(np.float32)
    dst = cuda.to_device(np.full(n, np.nan, dtype=np.float32))
    microbench.copy_kernel[blocks, threads](cuda.to_device(src_host), dst)
    np.testing.assert_array_equal(dst.copy_to_host(), src_host)


def _shared_sums_by_loops(tile, iters, threads):
    """What shared_read_kernel computes, one thread at a time, written as plainly as possible."""
    out = []
    for t in range(threads):
        lane, acc = t % 32, 0.0
        for it in range(iters):
            w = it & (microbench.SMEM_WINDOWS - 1)
            for u in range(microbench.SMEM_UNROLL):
                acc += tile[w * microbench.SMEM_WINDOW + 32 * u + lane]
        out.append(acc)
    return np.array(out)


@pytest.mark.parametrize("iters", [1, 5])
def test_shared_read_kernel_sums_its_windows(rng, iters):
    blocks, threads = 2, 64
    tile = rng.integers(0, 8, microbench.SMEM_TILE).astype(np.float32)
    out = cuda.to_device(np.full(blocks * threads, np.nan, dtype=np.float32))
    microbench.shared_read_kernel[blocks, threads](cuda.to_device(tile), out, iters, microbench.SMEM_WINDOWS - 1)
    want = _shared_sums_by_loops(tile, iters, threads)
    np.testing.assert_array_equal(out.copy_to_host(), np.tile(want, blocks))
    np.testing.assert_array_equal(microbench._expected_shared_sums(tile, iters, threads), want)


def test_fma_kernel_runs_eight_chains_of_fmas():
    threads, iters, x, y = 32, 2, 0.5, 0.25
    out = cuda.to_device(np.full(threads, np.nan, dtype=np.float32))
    microbench.fma_kernel[1, threads](out, np.float32(x), np.float32(y), iters)
    chains = np.arange(8, dtype=np.float64)
    for _ in range(iters * microbench.FMA_UNROLL):
        chains = chains * x + y
    np.testing.assert_allclose(out.copy_to_host(), chains.sum(), rtol=1e-6)


# ---------------------------------------------------------------------------- the measurements


def test_simulator_measurements_say_they_did_not_time():
    if not SIMULATOR:
        pytest.skip("the simulator's behaviour")
    hbm = microbench.hbm_bandwidth()
    assert (hbm.work, hbm.work_unit, hbm.unit) == (2 * 1000 * 4, "bytes", "GB/s")
    smem = microbench.shared_bandwidth()
    assert (smem.work, smem.work_unit) == (1 * 32 * 4 * microbench.SMEM_UNROLL * 4, "bytes")
    fp32 = microbench.fp32_peak()
    assert (fp32.work, fp32.work_unit, fp32.unit) == (2 * 32 * 2 * microbench.FMA_PER_ITER, "FLOP", "TFLOP/s")
    for m in (hbm, smem, fp32):
        assert m.value is None and m.ms is None and m.per_second is None
        assert "simulator" in m.note and "checked" in m.note
        assert "n/a" in str(m) and m.method


def test_a_hollow_kernel_fails_the_check(monkeypatch):
    @jit
    def copy_without_tail(src, dst):  # the main loop of copy_kernel only: misses the last elements
        stride = cuda.gridsize(1)
        i = cuda.grid(1)
        while i + 3 * stride < src.size:
            for j in range(4):
                dst[i + j * stride] = src[i + j * stride]
            i += 4 * stride

    monkeypatch.setattr(microbench, "copy_kernel", copy_without_tail)
    with pytest.raises(RuntimeError, match="did not copy"):
        microbench.hbm_bandwidth()


def test_measurement_rate_and_text():
    m = microbench.Measurement("x", 2.0, "GB/s", "how", 4_000_000, "bytes", 2.0)
    assert m.per_second == pytest.approx(2e9)
    assert str(m) == "x: 2.0 GB/s (4,000,000 bytes in 2.000 ms)"


def test_hbm_bandwidth_refuses_buffers_that_fit_in_l2():
    if SIMULATOR:
        pytest.skip("the simulator ignores nbytes")
    with pytest.raises(ValueError, match="L2"):
        microbench.hbm_bandwidth(nbytes=microbench.l2_cache_bytes())


def test_device_attributes_read_on_a_gpu_exist():
    """The GPU-only code reads device attributes by name; a misspelt one would fail only on a GPU."""
    import re

    binding = pytest.importorskip("cuda.bindings.driver")
    with open(microbench.__file__) as f:
        names = set(re.findall(r"get_current_device\(\)\.([A-Z0-9_]+)", f.read()))
    assert names == {"L2_CACHE_SIZE", "MAX_THREADS_PER_MULTIPROCESSOR"}
    for name in names:
        assert hasattr(binding.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}"), name


# ---------------------------------------------------------------------------- the roofline


def test_roofline_is_the_lower_of_the_two_ceilings():
    roof = microbench.roofline(peak_flops=60e12, bandwidth=4e12)
    assert roof.ridge == pytest.approx(15.0)
    got = roof.attainable([1.0, 15.0, 100.0])
    np.testing.assert_allclose(got, [4e12, 60e12, 60e12])
    assert roof.attainable(7.5) == pytest.approx(30e12)


def test_roofline_measures_only_what_is_not_given(monkeypatch):
    def fail():
        raise AssertionError("measured although given")

    monkeypatch.setattr(microbench, "fp32_peak", fail)
    measured = microbench.Measurement("HBM bandwidth", 10.0, "GB/s", "m", 10, "bytes", 1e-6)
    monkeypatch.setattr(microbench, "hbm_bandwidth", lambda: measured)
    roof = microbench.roofline(peak_flops=1e12)
    assert roof.peak_flops == 1e12
    assert roof.bandwidth == pytest.approx(1e10)


def test_roofline_without_numbers_in_the_simulator():
    if not SIMULATOR:
        pytest.skip("the simulator's behaviour")
    roof = microbench.roofline()
    assert roof.peak_flops is None and roof.bandwidth is None and roof.ridge is None
    assert roof.attainable(1.0) is None
    assert "simulator" in roof.note


def test_main_prints_every_measurement(capsys):
    assert microbench.main() == 0
    out = capsys.readouterr().out
    for name in ("HBM bandwidth", "shared-memory bandwidth", "FP32 peak"):
        assert name in out


# ---------------------------------------------------------------------------- compile tier

_COMPILE_SCRIPT = textwrap.dedent(
    """
    import json, re
    from numba import types
    from flash_numba.tools import microbench as mb
    from flash_numba.compile_check import compile_ptx, ptxas_report
    from flash_numba.kernels._common import array_type
    f32 = array_type("float32", 1)
    sigs = {
        "copy": (mb.copy_kernel, (f32, f32)),
        "shared": (mb.shared_read_kernel, (f32, f32, types.int64, types.int64)),
        "fma": (mb.fma_kernel, (f32, types.float32, types.float32, types.int64)),
    }
    out = {}
    for cc in ((7, 5), (9, 0)):
        for name, (kernel, sig) in sigs.items():
            ptx = compile_ptx(kernel.py_func, sig, cc)
            rep = ptxas_report(ptx, cc)
            out[f"{name} {cc[0]}{cc[1]}"] = {
                "fma": len(re.findall(r"\\bfma\\.rn\\.f32", ptx)),
                "ld_shared": len(re.findall(r"\\bld\\.shared\\.f32", ptx)),
                "registers": rep.registers if rep else None,
                "shared": rep.shared_bytes if rep else None,
                "spills": (rep.spill_stores + rep.spill_loads + rep.stack_bytes) if rep else None,
            }
    print(json.dumps(out))
    """
)


@pytest.mark.compile
def test_kernels_compile_with_the_instruction_mix_they_measure():
    import json

    proc = subprocess.run(
        [sys.executable, "-c", _COMPILE_SCRIPT],
        env=dict(os.environ, NUMBA_ENABLE_CUDASIM="0"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for cc in ("75", "90"):
        # The FMA loop keeps all 16 rounds of 8 chains unrolled: 128 FMAs per loop-counter update.
        assert got[f"fma {cc}"]["fma"] >= microbench.FMA_PER_ITER
        # Every one of the 16 shared loads per iteration survives (none merged away).
        assert got[f"shared {cc}"]["ld_shared"] >= microbench.SMEM_UNROLL
        if compile_check.have_ptxas():
            assert got[f"shared {cc}"]["shared"] == microbench.SMEM_TILE * 4
            for name in ("copy", "shared", "fma"):
                rep = got[f"{name} {cc}"]
                assert rep["spills"] == 0, (name, cc, rep)
                # Few enough registers for a full SM: 65536 registers / 2048 threads on sm_90, / 1024 on a T4.
                assert 0 < rep["registers"] <= (64 if cc == "75" else 32), (name, cc, rep)


# ---------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_measurements_on_a_gpu():
    hbm, smem, fp32 = microbench.hbm_bandwidth(), microbench.shared_bandwidth(), microbench.fp32_peak()
    for m in (hbm, smem, fp32):
        assert m.value is not None and m.value > 0 and math.isfinite(m.value), m
        assert m.ms > 0 and m.note == ""
    roof = microbench.roofline(fp32.per_second, hbm.per_second)
    assert roof.ridge == pytest.approx(fp32.per_second / hbm.per_second)
