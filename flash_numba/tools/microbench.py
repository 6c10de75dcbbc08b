"""Micro-benchmarks: this GPU's ceilings, each measured by one small Numba kernel.

Lesson 1 (the memory hierarchy) and the roofline figure use these numbers:

* :func:`hbm_bandwidth`: bytes per second between HBM and the SMs, from a
  device-to-device copy through buffers far larger than the L2 cache.
* :func:`shared_bandwidth`: bytes per second read from shared memory, summed
  over all SMs, from conflict-free reads of a tile held in shared memory.
* :func:`fp32_peak`: float32 operations per second, from independent chains of
  fused multiply-adds (one FMA = 2 FLOPs).
* :func:`roofline`: the two ceilings of the roofline model and
  ``attainable(intensity) = min(peak, bandwidth * intensity)``.

Each function launches its kernel once and checks the result on the host (a
kernel that the compiler hollowed out would fail the check), then times it with
CUDA events: the median of ``repeats`` launches after 3 warm-up launches.  It
returns a :class:`Measurement` holding the rate, the work of one launch and the
median time.  In the simulator the kernel runs on a tiny size and is checked
the same way, but nothing is timed: ``value`` and ``ms`` are ``None`` and
``note`` says why.

    python -m flash_numba.tools.microbench  # measure all three and print the roofline
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32

from ..device import SIMULATOR, CudaTimer, describe, info, jit, time_ms

#: Warm-up launches before the timed ones.
WARMUP = 3

_SIM_NOTE = "not timed: " + CudaTimer.note + "; the kernel ran on a tiny size and its result was checked"


@dataclass(frozen=True)
class Measurement:
    """One measured ceiling.

    ``value`` is in ``unit`` (``"GB/s"`` = 1e9 bytes/s, ``"TFLOP/s"`` = 1e12
    FLOP/s); ``work`` is what one launch moves or computes, in ``work_unit``
    (``"bytes"`` or ``"FLOP"``); ``ms`` is the median time of one launch.  In
    the simulator ``value`` and ``ms`` are ``None`` and ``note`` says why.
    """

    name: str
    value: float | None
    unit: str
    method: str
    work: int
    work_unit: str
    ms: float | None
    note: str = ""

    @property
    def per_second(self) -> float | None:
        """The rate in base units: bytes/s or FLOP/s (``None`` when not timed)."""
        return None if self.ms is None else self.work / (self.ms * 1e-3)

    def __str__(self) -> str:
        if self.value is None:
            return f"{self.name}: n/a ({self.note})"
        return f"{self.name}: {self.value:,.1f} {self.unit} ({self.work:,} {self.work_unit} in {self.ms:.3f} ms)"


_UNIT_SCALE = {"GB/s": 1e9, "TFLOP/s": 1e12}


def _measure(name, unit, method, work, work_unit, launch, repeats) -> Measurement:
    """Time ``launch`` (already run once and checked) and wrap the numbers up."""
    times = time_ms(launch, warmup=WARMUP, repeats=repeats)
    if times is None:
        return Measurement(name, None, unit, method, work, work_unit, None, _SIM_NOTE)
    ms = statistics.median(times)
    value = work / (ms * 1e-3) / _UNIT_SCALE[unit]
    return Measurement(name, value, unit, method, work, work_unit, ms)


def l2_cache_bytes() -> int | None:
    """Size of the device's L2 cache in bytes (``None`` in the simulator)."""
    if SIMULATOR:
        return None
    return int(cuda.get_current_device().L2_CACHE_SIZE)


def _full_wave(threads: int) -> int:
    """Blocks of ``threads`` that fill every SM once (1 in the simulator).

    A grid-stride kernel launched with exactly one wave has no second wave of
    blocks waiting behind the first and no SM idling at the end.
    """
    if SIMULATOR:
        return 1
    per_sm = int(cuda.get_current_device().MAX_THREADS_PER_MULTIPROCESSOR) // threads
    return info().sm_count * max(per_sm, 1)


# ---------------------------------------------------------------------------- HBM


COPY_THREADS = 256


@jit
def copy_kernel(src, dst):
    """``dst[:] = src[:]`` in a grid-stride loop, four loads in flight per thread.

    Thread ``t`` copies elements ``t, t + stride, t + 2 stride, ...`` with
    ``stride`` = threads in the grid: neighbouring threads touch neighbouring
    addresses (coalesced).  It issues four loads before storing anything, so
    enough bytes are in flight to cover the HBM latency.
    """
    n = src.size
    stride = cuda.gridsize(1)
    i = cuda.grid(1)
    while i + 3 * stride < n:  # four elements of this thread left: load all four, then store
        a0 = src[i]
        a1 = src[i + stride]
        a2 = src[i + 2 * stride]
        a3 = src[i + 3 * stride]
        dst[i] = a0
        dst[i + stride] = a1
        dst[i + 2 * stride] = a2
        dst[i + 3 * stride] = a3
        i += 4 * stride
    while i < n:  # the last 0 to 3 elements of this thread
        dst[i] = src[i]
        i += stride


def hbm_bandwidth(nbytes: int = 2**30, repeats: int = 20) -> Measurement:
    """HBM bandwidth: bytes read + written per second by :func:`copy_kernel`.

    Copies one float32 buffer of ``nbytes`` into another, so one launch moves
    ``2 * nbytes``.  Each buffer must be at least 4x the L2 cache (60 MB on an
    H200), so that the copy streams from HBM and not from L2; ValueError
    otherwise.  The simulator copies 1000 elements instead.
    """
    if SIMULATOR:
        n, blocks, threads = 1000, 2, 32
    else:
        l2 = l2_cache_bytes()
        if nbytes < 4 * l2:
            raise ValueError(f"nbytes: {nbytes:,} bytes is less than 4x this GPU's {l2:,}-byte L2 cache")
        n, blocks, threads = nbytes // 4, _full_wave(COPY_THREADS), COPY_THREADS
    host = np.arange(n, dtype=np.float32)
    src = cuda.to_device(host)
    dst = cuda.to_device(np.full(n, np.nan, dtype=np.float32))  # poisoned: an element not copied stays NaN

    def launch():
        copy_kernel[blocks, threads](src, dst)

    launch()
    if not np.array_equal(dst.copy_to_host(), host):
        raise RuntimeError("copy_kernel did not copy its input exactly")
    moved = 2 * n * 4  # every element read once and written once
    method = (
        f"copy of {n:,} float32 ({n * 4 / 1e6:,.1f} MB per buffer) by {blocks} x {threads} threads in a "
        f"grid-stride loop, 4 loads in flight per thread; bytes read + written over the median of "
        f"{repeats} launches"
    )
    return _measure("HBM bandwidth", "GB/s", method, moved, "bytes", launch, repeats)


# ---------------------------------------------------------------------------- shared memory


SMEM_THREADS = 256
#: Reads per thread per loop iteration: a warp reads SMEM_UNROLL rows of 32 consecutive floats.
SMEM_UNROLL = 16
#: Floats one warp reads in one iteration (a "window" of the tile).
SMEM_WINDOW = SMEM_UNROLL * 32
#: Windows in the tile: 4 windows of 512 floats, 8 KB of shared memory per block.
SMEM_WINDOWS = 4
SMEM_TILE = SMEM_WINDOWS * SMEM_WINDOW


@jit
def shared_read_kernel(src, out, iters, window_mask):
    """Stream reads from a shared-memory tile: ``iters * SMEM_UNROLL`` loads per thread.

    The block copies ``src`` (SMEM_TILE floats) into its tile, viewed as
    ``(SMEM_WINDOWS, SMEM_UNROLL, 32)``.  In iteration ``it`` every warp reads
    window ``w = it & window_mask``: SMEM_UNROLL rows of 32 consecutive floats,
    lane ``l`` reading column ``l``, one bank per lane, so no load has a bank
    conflict.  The loads do not depend on each other, only the sum does.
    ``window_mask`` (= SMEM_WINDOWS - 1) is a kernel argument so that the
    compiler cannot see that the windows repeat and merge loads of the same
    address across iterations.  ``out[thread]`` gets the sum of what it read.
    """
    tile = cuda.shared.array((SMEM_WINDOWS, SMEM_UNROLL, 32), float32)  # 8 KB
    t = cuda.threadIdx.x
    for i in range(t, SMEM_TILE, cuda.blockDim.x):
        tile[i // SMEM_WINDOW, (i // 32) % SMEM_UNROLL, i % 32] = src[i]
    cuda.syncthreads()  # the tile is complete before anyone reads it

    lane = t % 32
    acc = float32(0)
    for it in range(iters):
        w = it & window_mask
        for u in range(SMEM_UNROLL):  # unrolled: one address per iteration, constant offsets
            acc += tile[w, u, lane]
    out[cuda.grid(1)] = acc


def _expected_shared_sums(tile, iters, threads) -> np.ndarray:
    """What :func:`shared_read_kernel` leaves in ``out`` for one block, computed on the host."""
    windows = tile.reshape(SMEM_WINDOWS, SMEM_UNROLL, 32).astype(np.float64)  # (window, u, lane)
    visits = np.bincount(np.arange(iters) & (SMEM_WINDOWS - 1), minlength=SMEM_WINDOWS)  # iterations per window
    per_lane = (visits[:, None] * windows.sum(axis=1)).sum(axis=0)  # (32,)
    return per_lane[np.arange(threads) % 32]


def shared_bandwidth(iters: int = 8192, repeats: int = 20) -> Measurement:
    """Shared-memory bandwidth of the whole GPU: bytes read per second by :func:`shared_read_kernel`.

    One full wave of 256-thread blocks, each reading ``iters * 16`` floats per
    thread from its 8 KB tile.  The tile holds small integers, so every sum is
    exact in float32 and the check is exact.  The simulator runs 4 iterations
    of one 32-thread block instead.
    """
    if SIMULATOR:
        iters, blocks, threads = 4, 1, 32
    else:
        blocks, threads = _full_wave(SMEM_THREADS), SMEM_THREADS
    tile = (np.arange(SMEM_TILE) % 8).astype(np.float32)
    src = cuda.to_device(tile)
    out = cuda.to_device(np.full(blocks * threads, np.nan, dtype=np.float32))  # poisoned output

    def launch():
        shared_read_kernel[blocks, threads](src, out, iters, SMEM_WINDOWS - 1)

    launch()
    want = np.tile(_expected_shared_sums(tile, iters, threads), blocks)
    if not np.array_equal(out.copy_to_host(), want):
        raise RuntimeError("shared_read_kernel did not sum the tile as expected")
    read = blocks * threads * iters * SMEM_UNROLL * 4
    method = (
        f"{blocks} blocks x {threads} threads, each thread {iters * SMEM_UNROLL:,} conflict-free 4-byte "
        f"loads from an 8 KB shared-memory tile; bytes read over the median of {repeats} launches"
    )
    return _measure("shared-memory bandwidth", "GB/s", method, read, "bytes", launch, repeats)


# ---------------------------------------------------------------------------- FP32


FMA_THREADS = 256
#: Rounds of the 8 FMAs in one loop iteration (more work per loop-counter update).
FMA_UNROLL = 16
#: FMAs per thread per loop iteration: 8 independent chains x FMA_UNROLL rounds.
FMA_PER_ITER = 8 * FMA_UNROLL


@jit
def fma_kernel(out, x, y, iters):
    """``a = a * x + y`` on 8 independent accumulators, ``iters * FMA_PER_ITER`` FMAs per thread.

    One chain would stall on each FMA's latency (about 4 cycles); 8 chains let
    a warp issue an FMA every cycle.  ``x`` and ``y`` are arguments, so the
    compiler cannot fold the arithmetic away.  ``out[thread]`` gets the sum of
    the 8 accumulators.
    """
    a0 = float32(0)
    a1 = float32(1)
    a2 = float32(2)
    a3 = float32(3)
    a4 = float32(4)
    a5 = float32(5)
    a6 = float32(6)
    a7 = float32(7)
    for it in range(iters):
        for r in range(FMA_UNROLL):
            a0 = cuda.fma(a0, x, y)
            a1 = cuda.fma(a1, x, y)
            a2 = cuda.fma(a2, x, y)
            a3 = cuda.fma(a3, x, y)
            a4 = cuda.fma(a4, x, y)
            a5 = cuda.fma(a5, x, y)
            a6 = cuda.fma(a6, x, y)
            a7 = cuda.fma(a7, x, y)
    out[cuda.grid(1)] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7


def fp32_peak(iters: int = 4096, repeats: int = 20) -> Measurement:
    """Float32 throughput of the whole GPU: FLOPs per second of :func:`fma_kernel`, 2 per FMA.

    One full wave of 256-thread blocks.  With ``x = y = 1`` each accumulator
    ends at its start value plus the number of FMAs, an integer that float32
    holds exactly, so the check is exact.  The simulator runs 2 iterations of
    one 32-thread block instead.
    """
    if SIMULATOR:
        iters, blocks, threads = 2, 1, 32
    else:
        blocks, threads = _full_wave(FMA_THREADS), FMA_THREADS
    out = cuda.to_device(np.full(blocks * threads, np.nan, dtype=np.float32))  # poisoned output

    def launch():
        fma_kernel[blocks, threads](out, np.float32(1), np.float32(1), iters)

    launch()
    per_chain = iters * FMA_UNROLL
    want = sum(range(8)) + 8 * per_chain  # accumulator c ends at c + per_chain
    if not np.all(out.copy_to_host() == want):
        raise RuntimeError("fma_kernel did not compute its FMA chains as expected")
    flops = 2 * blocks * threads * iters * FMA_PER_ITER
    method = (
        f"{blocks} blocks x {threads} threads, each {iters * FMA_PER_ITER:,} float32 FMAs on 8 independent "
        f"chains; 2 FLOPs per FMA over the median of {repeats} launches"
    )
    return _measure("FP32 peak", "TFLOP/s", method, flops, "FLOP", launch, repeats)


# ---------------------------------------------------------------------------- roofline


@dataclass(frozen=True)
class Roofline:
    """The roofline model of one GPU: ``attainable(I) = min(peak_flops, bandwidth * I)``.

    ``peak_flops`` in FLOP/s, ``bandwidth`` (HBM) in bytes/s; both ``None``
    when unknown (the simulator measures nothing), and then ``attainable``
    returns ``None``.
    """

    peak_flops: float | None
    bandwidth: float | None
    note: str = ""

    @property
    def ridge(self) -> float | None:
        """Arithmetic intensity (FLOP/byte) where the two ceilings meet."""
        if self.peak_flops is None or self.bandwidth is None:
            return None
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity):
        """FLOP/s a kernel of ``intensity`` FLOP/byte can reach (a number or an array)."""
        if self.peak_flops is None or self.bandwidth is None:
            return None
        return np.minimum(self.peak_flops, self.bandwidth * np.asarray(intensity, dtype=np.float64))


def roofline(peak_flops: float | None = None, bandwidth: float | None = None) -> Roofline:
    """The two ceilings: ``peak_flops`` (FLOP/s) and HBM ``bandwidth`` (bytes/s).

    A ceiling not given is measured with :func:`fp32_peak` or
    :func:`hbm_bandwidth`.
    """
    notes = []
    if peak_flops is None:
        m = fp32_peak()
        peak_flops = m.per_second
        notes.append(m.note if m.ms is None else f"peak: {m.method}")
    if bandwidth is None:
        m = hbm_bandwidth()
        bandwidth = m.per_second
        notes.append(m.note if m.ms is None else f"bandwidth: {m.method}")
    return Roofline(peak_flops, bandwidth, "; ".join(dict.fromkeys(notes)))


def main() -> int:
    """Print the three measurements and the roofline's ridge point."""
    print(describe())
    hbm, smem, fp32 = hbm_bandwidth(), shared_bandwidth(), fp32_peak()
    for m in (hbm, smem, fp32):
        print(m)
        print(f"  method: {m.method}")
    roof = Roofline(fp32.per_second, hbm.per_second)
    if roof.ridge is not None:
        print(f"roofline ridge point: {roof.ridge:.1f} FLOP/byte (below it a kernel is bound by HBM bandwidth)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
