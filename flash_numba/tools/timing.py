"""GPU clocks and device memory, as the tools read them.

* :func:`median_ms`: the median time of a call, CUDA events around it.
* :func:`torch_median_ms`: the same with PyTorch's events, a fixed number of calls (benchmarks on PyTorch tensors).
* :class:`LaunchTimer`, :func:`launch_times`: the time of each kernel launch of a pass.
* :func:`time_passes`: forward and backward times of a kernel, B*H halved while out of memory.
* :func:`peak_memory`: device bytes held at the peak of forward + backward.
* :func:`free_pending`, :func:`free_bytes`, :func:`out_of_memory`: Numba's lazy frees and CUDA's
  out-of-memory errors.
* :func:`torch_cuda`: PyTorch, when it is importable and has a GPU.

Nothing here has a clock in the simulator (see :class:`flash_numba.device.CudaTimer`).
"""

from __future__ import annotations

import statistics

from .. import device
from ..hbm import Counters
from . import passes

#: Timed passes per :func:`launch_times` (after one untimed pass).
LAUNCH_REPEATS = 3


def median_ms(fn) -> float:
    """Median GPU time of ``fn()`` in ms: one untimed call, then 3 to 10 timed ones (about a second)."""
    fn()
    device.synchronize()
    times = []
    while len(times) < 3 or (len(times) < 10 and sum(times) < 1000.0):
        with device.CudaTimer() as t:
            fn()
        times.append(t.ms)
    return statistics.median(times)


def torch_median_ms(call, repeats: int = 10, warmup: int = 2) -> float:
    """Median time of ``call()`` in ms over ``repeats`` calls after ``warmup`` untimed ones, PyTorch CUDA events
    around each (PyTorch and Numba's kernels share the default stream)."""
    import torch

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


class LaunchTimer(Counters):
    """Stands in for :class:`~flash_numba.hbm.Counters` to time each kernel launch.

    Every kernel module asks ``counters.array(name)`` once per launch, for the counter of launch
    ``name``, in launch order (it may ask for several before launching them: the standard forward
    does); that gives the names.  Inside ``with timer:`` every Numba kernel launch is bracketed by
    two CUDA events on the default stream, so the i-th launch's time leaves out the host's work before the
    launch (an event per ``array()`` call timed that too: benchmarks/results/LOG.md, 2026-12-01, figures 5b and 6).
    Not the host's work inside it: the start event is recorded before Numba's ``_Kernel.launch`` packs the
    arguments, and a GPU with nothing else queued reaches it at once and waits for the launch, so that packing
    (tens of microseconds a launch, more with many arguments) counts as the kernel's time.  For kernels of a
    millisecond and more that is a few percent; for short ones time calls queued back to back instead
    (:func:`flash_numba.tools.bench_decode.queued_ms`: 0.09-0.26 ms of a decode step's 0.05-1 ms were host work,
    benchmarks/results/h200-2026-12-02-decode).  The kernels run uncounted; launches from other threads inside the
    block are timed too (a benchmark tool).
    """

    def __init__(self) -> None:
        super().__init__(False)
        self.names: list[str] = []
        self._pairs = []  # (start, end) events of each launch, in order
        self._restore = None

    def array(self, name: str):
        self.names.append(name)
        return super().array(name)

    def __enter__(self):
        if not device.SIMULATOR:  # the simulator has no clock (see device.CudaTimer)
            from numba import cuda
            from numba.cuda import dispatcher

            original = dispatcher._Kernel.launch
            pairs = self._pairs

            def timed_launch(kernel, *args, **kwargs):
                start, end = cuda.event(timing=True), cuda.event(timing=True)
                start.record()
                try:
                    return original(kernel, *args, **kwargs)
                finally:
                    end.record()
                    pairs.append((start, end))

            self._restore = original
            dispatcher._Kernel.launch = timed_launch
        return self

    def __exit__(self, *exc):
        if self._restore is not None:
            from numba.cuda import dispatcher

            dispatcher._Kernel.launch, self._restore = self._restore, None
        return False

    def stop(self) -> dict | None:
        """Milliseconds per launch name, a name's launches summed (None in the simulator)."""
        if device.SIMULATOR:
            return None
        from numba import cuda

        if len(self._pairs) != len(self.names):
            raise RuntimeError(f"LaunchTimer: {len(self._pairs)} launches timed for {len(self.names)} counters "
                               f"asked for ({self.names}): a launch without its counter, or outside 'with timer:'")
        if self._pairs:
            self._pairs[-1][1].synchronize()
        ms = {}
        for name, (a, b) in zip(self.names, self._pairs):
            ms[name] = ms.get(name, 0.0) + cuda.event_elapsed_time(a, b)
        return ms


def launch_times(kernel: str, pass_: str, arrays: dict):
    """``(names, ms per name)``: each launch of one pass timed with :class:`LaunchTimer`
    (median of :data:`LAUNCH_REPEATS` passes after an untimed one); ms is None in the simulator.

    ``names`` in the order they first launched, each once: a name launched several times (the split
    backward's rounds) is one entry, its time the sum of its launches, as the counters sum its bytes.
    """
    passes.run_pass(kernel, pass_, arrays, Counters(False))
    samples = []
    for _ in range(LAUNCH_REPEATS):
        with LaunchTimer() as timer:
            passes.run_pass(kernel, pass_, arrays, timer)
        samples.append(timer.stop())
    names = list(dict.fromkeys(timer.names))
    if samples[0] is None:
        return names, None
    return names, {n: statistics.median(s[n] for s in samples) for n in names}


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a CUDA out-of-memory error (Numba's or PyTorch's) or a MemoryError."""
    text = f"{type(exc).__name__} {exc}".upper().replace(" ", "_")
    return isinstance(exc, MemoryError) or "OUT_OF_MEMORY" in text or "OUTOFMEMORY" in text


def free_pending() -> None:
    """Free now what Numba has queued for freeing (it frees lazily), then synchronise.

    The simulator frees at once and keeps no queues.
    """
    from numba import cuda

    ctx = cuda.current_context()
    for queue in (getattr(ctx, "deallocations", None),  # streams, events, modules
                  getattr(getattr(ctx, "memory_manager", None), "deallocations", None)):  # device memory
        if queue is not None:
            queue.clear()
    cuda.synchronize()


def free_bytes() -> int:
    """Free device memory as seen by this process: Numba's own table where it keeps one (so other
    processes on the GPU do not disturb it, see :func:`device.numba_device_bytes`), else the GPU's."""
    from numba import cuda

    held = device.numba_device_bytes()
    if held is not None:
        return -held
    return cuda.current_context().get_memory_info().free


def peak_memory(kernel: str, BH: int, N: int, d: int, deterministic: bool = True) -> int:
    """Device bytes in use at the peak of forward + backward, inputs included (``deterministic``: the backward's
    option, see :func:`flash_numba.attention_backward`).

    Numba frees device arrays lazily; inside ``cuda.defer_cleanup()`` it frees
    none, so the free memory just after a pass, against a baseline taken before
    the inputs were allocated, counts every buffer the pass held.  The forward's
    temporaries (S and P for the standard path) are freed before the backward;
    O and L stay, as they would for training.
    """
    from numba import cuda

    free_pending()
    free0 = free_bytes()
    q, k, v, do = passes.random_inputs(BH, N, d)
    with cuda.defer_cleanup():
        f = passes.forward(kernel, q, k, v)
        device.synchronize()
        peak = free0 - free_bytes()
    free_pending()
    with cuda.defer_cleanup():
        passes.backward(kernel, q, k, v, f.o, f.lse, do, deterministic=deterministic)
        device.synchronize()
        peak = max(peak, free0 - free_bytes())
    del q, k, v, do, f
    free_pending()
    return peak


def time_passes(kernel: str, BH: int, N: int, d: int, shrink: bool = True, torch=None):
    """((forward ms, backward ms) scaled to B*H, B*H timed); ``shrink``: halve B*H while out of memory.

    ``torch``: the module (:func:`torch_cuda`) to call the kernels on PyTorch CUDA tensors, as a PyTorch user
    does (a call then replays its launch plan: tens of microseconds of host time); None: on Numba device arrays
    (a call's host work, 0.5-1 ms on the H200's host, is then inside its time)."""
    BHt = BH
    while True:
        try:
            q, k, v, do = passes.random_inputs(BHt, N, d)
            if torch is not None:
                q, k, v, do = (torch.as_tensor(x.copy_to_host(), device="cuda") for x in (q, k, v, do))
            f = passes.forward(kernel, q, k, v)
            t_fwd = median_ms(lambda: passes.forward(kernel, q, k, v))
            t_bwd = median_ms(lambda: passes.backward(kernel, q, k, v, f.o, f.lse, do))
            return (t_fwd * BH / BHt, t_bwd * BH / BHt), BHt
        except Exception as exc:  # only out of memory is caught, and only while B*H can shrink
            if not (shrink and out_of_memory(exc)) or BHt == 1:
                raise
            q = k = v = do = f = None
            free_pending()
            BHt //= 2


def torch_cuda():
    """PyTorch when it is importable and has a CUDA device (and we are not in the simulator), else None."""
    if device.SIMULATOR:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None
