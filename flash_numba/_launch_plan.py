"""Launch plans: a call's kernel launches on PyTorch CUDA tensors, recorded once, replayed without Numba's dispatcher.

Why.  A call's host work is the same every time for tensors of the same shapes,
strides and dtype: check the arguments, view them as Numba arrays, pick the
blocks, let Numba's dispatcher type every argument and flatten it into kernel
parameters, allocate the outputs.  At N = 128 that is 0.4 ms of Python for a
forward whose kernel takes 0.02 ms.  What changes from call to call is only the
data pointers of the inputs and of the new buffers.

How.  The first call of a signature (:func:`key`) runs the normal path with a
recorder on: it notes each buffer the call allocates (shape, dtype, fill) and each
kernel launch as Numba makes it (the compiled function, grid, block, stream and
the flattened parameters).  Each array parameter's data pointer is matched to an
input tensor (the same pointer), a buffer of the call (a pointer inside it), or a
buffer that lives as long as the CUDA context (:func:`persistent`).  If every
pointer is accounted for, the call becomes a :class:`Plan`; a later call with the
same key allocates the buffers, writes the new pointers into the recorded
parameters (packed once, :class:`_Launch`) and launches the same functions with
the driver's ``cuLaunchKernel``, in the recorded CUDA context (made current for the
launches where the calling thread has another or none).  A small buffer that the call
uses only inside (the backward's D) is kept by the plan and reused (:func:`_scratch`).
A pointer that matches nothing (a copy made inside the call) makes the key
uncacheable: those calls keep the normal path.

Which calls: PyTorch CUDA tensors only (q, k, v and, for the backward, o, lse, do),
without ``count_hbm`` and without dropout.  The key holds everything the normal
path's choices depend on: the kernel, the pass, every tensor's shape, strides,
dtype and device, which inputs share a data pointer, where each data pointer sits within 16 bytes (with the
strides, whether rows allow 16-byte loads), causal, scale, block and the
backward's ``deterministic``, the output poisoning of the tests.  Errors are the normal path's: a call whose
arguments are bad never gets a plan (its first run raised), and the key of a good
call cannot match a bad one.  The key holds the stream of the call (PyTorch's current stream,
:mod:`flash_numba._stream`), and a plan replays its launches on that stream, as the normal path would;
replays of one plan take a lock (they share the packed parameters).
Replay runs on a GPU only (the simulator has no compiled functions);
``FLASH_NUMBA_LAUNCH_PLANS=0`` turns it off.
"""

from __future__ import annotations

import contextvars
import os
import sys
import threading
from dataclasses import dataclass, field

from . import _stream
from .device import SIMULATOR

#: Replay recorded launches (GPU only; set FLASH_NUMBA_LAUNCH_PLANS=0 to always take the normal path).
ENABLED = not SIMULATOR and os.environ.get("FLASH_NUMBA_LAUNCH_PLANS", "1") != "0"

#: Plans kept at most (all are dropped when the table is full: shapes in a real model repeat).
MAX_PLANS = 256

#: Bytes of scratch a plan may keep: buffers a call allocates unfilled and does not return (the backward's D)
#: are reused by every replay up to this size in all, instead of allocated per call (a torch.empty is ~3 us).
SCRATCH_BYTES = 1 << 20

_PLANS: dict = {}  # key -> Plan, or None for a key that cannot be replayed
_PERSISTENT: dict = {}  # data pointer -> array, for buffers that live as long as the CUDA context
_RECORDER = contextvars.ContextVar("flash_numba_launch_recorder", default=None)


def persistent(arr):
    """Mark a device array that lives as long as its CUDA context (a dummy argument): plans may pass it as is."""
    if ENABLED:
        _PERSISTENT[_pointer(arr)] = arr
    return arr


def _pointer(arr) -> int:
    return int(arr.__cuda_array_interface__["data"][0])


def key(pass_: str, kernel: str, tensors: tuple, options: tuple):
    """The plan key of a call, or None if the call is not one plans serve (see the module's docstring).

    ``options``: the call's other arguments; each enters the key with its type (True and 1
    are equal keys of a dict, but only one of them is a valid ``causal``).
    """
    if not ENABLED:
        return None
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    parts = [pass_, kernel]
    ptrs = []
    tensor = torch.Tensor
    for t in tensors:
        if type(t) is not tensor:
            return None
        gpu = t.get_device()  # -1 on the CPU (an int: cheaper than t.device, a new object per call)
        if gpu < 0:
            return None
        p = t.data_ptr()
        # p % 16: with the strides, whether every row starts on 16 bytes, which picks flash2_fast's 16-byte loads
        parts += (t.shape, t.stride(), t.dtype, gpu, ptrs.index(p) if p in ptrs else -1, p % 16)
        ptrs.append(p)
    typed = tuple((type(o), o) for o in options)
    try:
        hash(typed)
    except TypeError:  # a list for block, say: the normal path takes it or says why not
        return None
    parts.append(typed)
    return tuple(parts)


class _Launch:
    """One recorded launch, its parameters packed once for ``cuLaunchKernel``.

    Each parameter lives in its own ctypes value; an array of their addresses is the
    ``kernelParams`` the driver copies from at launch.  Replay writes the new data
    pointers into the values named by ``slots`` and calls the driver: no Python object
    per parameter is built or converted per call (``cuda.core``'s ``launch``, which
    Numba calls, converts all of them every time: 20-25 microseconds for 67 parameters).
    What is left is the driver's own work, about 8 microseconds a launch on the H200's host
    (calling it through ctypes instead of ``cuda.bindings`` measured the same: 2026-12-01, commit f7b2f19,
    ``benchmarks/results/h200-2026-12-01-s12/B/``).
    """

    def __init__(self, function, griddim, blockdim, sharedmem, stream, params, slots):
        import ctypes

        from cuda.bindings import driver

        values = [ctypes.c_int64(p) if isinstance(p, int) else type(p)(p.value) for p in params]
        self._values = values  # keeps the memory the addresses below point to
        self._addresses = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        self.slots = [(values[i], src, off) for i, src, off in slots]  # (value, source, byte offset)
        grid, block = (tuple(dims) + (1,) * (3 - len(dims)) for dims in (_dims(griddim), _dims(blockdim)))
        self.args = (function.handle, *grid, *block, int(sharedmem), _stream.handle(stream),
                     ctypes.addressof(self._addresses), 0)
        self._launch, self._ok = driver.cuLaunchKernel, driver.CUresult.CUDA_SUCCESS

    def run(self, bases, buffer_bases) -> None:
        for value, src, off in self.slots:
            value.value = (bases[src] if src >= 0 else buffer_bases[~src]) + off
        err, = self._launch(*self.args)
        if err != self._ok:
            raise RuntimeError(f"flash_numba: cuLaunchKernel failed ({err.name}) replaying a launch plan")


def _dims(dims) -> tuple:
    return (int(dims),) if isinstance(dims, int) else tuple(int(x) for x in dims)


def _as_int(handle) -> int:
    """A driver handle (a ``cuda.bindings`` object, a ctypes pointer, an int or None) as the integer it holds."""
    if handle is None:
        return 0
    value = getattr(handle, "value", handle)  # ctypes.c_void_p
    return int(value or 0)


@dataclass
class Plan:
    """A recorded call: the buffers it allocates (shape, torch dtype, fill or None), its launches, and which
    buffers it returns (allocated in the shape returned)."""

    device: object
    buffers: list
    launches: list
    results: list  # index in buffers of each result, in order
    block: object = None  # the (Br, Bc) the recorded call used
    kept: list = field(default_factory=list)  # scratch reused by every replay (its pointers stay in the launches)
    context: int = 0  # the CUDA context the launches were recorded in (0: not known, left as the thread has it)
    lock: object = field(default_factory=threading.Lock)  # replays share the packed parameters

    def replay(self, tensors: tuple) -> list:
        """Run the recorded launches on ``tensors`` (those of the key); the results as tensors."""
        import torch

        dev = self.device
        bufs = [torch.empty(shape, dtype=dt, device=dev) if fill is None else
                torch.full(shape, fill, dtype=dt, device=dev) for shape, dt, fill in self.buffers]
        bases = [t.data_ptr() for t in tensors]
        buffer_bases = [b.data_ptr() for b in bufs]
        with self.lock, _current(self.context):
            for launch in self.launches:
                launch.run(bases, buffer_bases)
        return [bufs[i] for i in self.results]


class _current:
    """``with _current(ctx):`` the launches inside run in CUDA context ``ctx`` (an int handle; 0: as they are).

    A launch runs in the calling thread's current context.  Numba's normal path makes the context of the
    tensors' device current; a replay that skips it could find none (a thread that never used CUDA through
    the driver: cuLaunchKernel fails with CUDA_ERROR_INVALID_CONTEXT) or another device's.  So the recorded
    context is pushed for the launches where it is not the current one, and popped after: one driver query
    per replay otherwise.
    """

    __slots__ = ("ctx", "pushed")

    def __init__(self, ctx: int):
        self.ctx, self.pushed = ctx, False

    def __enter__(self):
        if self.ctx:
            from cuda.bindings import driver

            err, cur = driver.cuCtxGetCurrent()
            if _as_int(cur) != self.ctx:
                err, = driver.cuCtxPushCurrent(driver.CUcontext(self.ctx))
                if err != driver.CUresult.CUDA_SUCCESS:
                    raise RuntimeError(f"flash_numba: cuCtxPushCurrent failed ({err.name}) replaying a launch plan")
                self.pushed = True
        return self

    def __exit__(self, *exc):
        if self.pushed:
            from cuda.bindings import driver

            driver.cuCtxPopCurrent()
        return False


@dataclass
class _Recorder:
    buffers: list = field(default_factory=list)  # (shape, torch dtype, fill, tensor)
    # (function, griddim, blockdim, sharedmem, stream, params, [(index in params, data pointer)])
    launches: list = field(default_factory=list)
    context: int = 0  # the CUDA context current at the launches (the tensors' device; -1: more than one)


def lookup(k):
    """The plan of key ``k``: a Plan, None (record it: run the normal path under :func:`recording`), or False
    (a key that cannot be replayed)."""
    if k is None:
        return False
    plan = _PLANS.get(k, None)
    if plan is None and k in _PLANS:
        return False
    return plan


class recording:
    """``with recording(k, tensors) as rec: results = normal_path(...); rec.finish(results)`` stores k's plan."""

    def __init__(self, k, tensors):
        self.key, self.tensors = k, tensors
        self.rec = None

    def __enter__(self):
        if self.key is not None:
            _install()
            self.rec = _Recorder()
            self._token = _RECORDER.set(self.rec)
        return self

    def __exit__(self, *exc):
        if self.rec is not None:
            _RECORDER.reset(self._token)
        return False

    def finish(self, results, block) -> None:
        """Store the key's plan (None: not replayable): ``results`` the tensors returned, ``block`` the blocks."""
        if self.rec is None:
            return
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        plan = _build(self.rec, self.tensors, results)
        if plan is not None:
            plan.block = block
        _PLANS[self.key] = plan


def _build(rec: _Recorder, tensors, results):
    if rec.context == -1:
        return None  # launches in two CUDA contexts: a plan replays in one
    inputs = [t.data_ptr() for t in tensors]
    spans = [(b.data_ptr(), b.data_ptr() + b.numel() * b.element_size()) for *_, b in rec.buffers]

    def source(ptr):
        if ptr in inputs:
            return inputs.index(ptr), 0
        for j, (lo, hi) in enumerate(spans):
            if lo <= ptr < hi or ptr == lo:  # (== lo: an empty buffer)
                return ~j, ptr - lo
        return None

    buffers = [[shape, dt, fill] for shape, dt, fill, _ in rec.buffers]
    outs = []
    for r in results:
        src = source(r.data_ptr())
        j = None if src is None or src[0] >= 0 or src[1] != 0 else ~src[0]
        if j is None or not r.is_contiguous() or r.numel() != rec.buffers[j][3].numel():
            return None  # a result that is not a whole fresh buffer
        buffers[j][0] = tuple(r.shape)  # allocated in the shape returned: no view per call
        outs.append(j)
    kept = _scratch(rec, outs)
    fresh = [j for j in range(len(buffers)) if j not in kept]  # the buffers a replay allocates, renumbered
    index = {j: n for n, j in enumerate(fresh)}
    launches = []
    for function, griddim, blockdim, sharedmem, stream, params, arrays in rec.launches:
        slots = []
        for i, ptr in arrays:
            src = source(ptr)
            if src is None:
                if ptr in _PERSISTENT:
                    continue  # a context-long buffer: its pointer stays in params
                return None  # a buffer we did not see allocated (a copy): not replayable
            where, off = src
            if where < 0 and ~where in kept:
                continue  # scratch the plan keeps: its pointer stays in params
            slots.append((i, where if where >= 0 else ~index[~where], off))
        launches.append(_Launch(function, griddim, blockdim, sharedmem, stream, params, slots))
    device = rec.buffers[0][3].device if rec.buffers else tensors[0].device
    return Plan(device, [tuple(buffers[j]) for j in fresh], launches, [index[j] for j in outs],
                kept=[rec.buffers[j][3] for j in sorted(kept)], context=rec.context)


def _scratch(rec: _Recorder, outs) -> set:
    """Indices of the recorded buffers a plan keeps and reuses: unfilled, not returned, SCRATCH_BYTES in all.

    Only where every launch ran on one stream (the plan's key holds it, so every replay runs there too):
    then each replay's kernels run after the previous replay's, from any thread, and one buffer serves
    them all (as PyTorch's caching allocator hands a freed block to the next allocation on its stream).
    With per-thread default streams, Numba's stream 0 is another stream in each thread, and two threads'
    replays could overlap, so nothing is kept.
    """
    from numba.core import config

    streams = {_stream.handle(launch[4]) for launch in rec.launches}
    if len(streams) > 1 or (streams == {0} and getattr(config, "CUDA_PER_THREAD_DEFAULT_STREAM", 0)):
        return set()
    kept, total = set(), 0
    for j, (_, _, fill, t) in enumerate(rec.buffers):
        nbytes = t.numel() * t.element_size()
        if j not in outs and fill is None and total + nbytes <= SCRATCH_BYTES:
            kept.add(j)
            total += nbytes
    return kept


def note_buffer(shape, dtype, fill, tensor) -> None:
    """Called by :func:`flash_numba._inputs.empty` and friends for each torch buffer of a call."""
    rec = _RECORDER.get()
    if rec is not None:
        rec.buffers.append((tuple(shape), dtype, fill, tensor))


_INSTALLED = False
_LAUNCH = None  # cuda.core's launch(stream, config, kernel, *params): what Numba's _Kernel.launch calls last


def _config(griddim, blockdim, sharedmem, cooperative):
    """cuda.core's LaunchConfig as numba-cuda 0.30.4 builds it (its keyword changed in cuda.core 1.0)."""
    from cuda.core import LaunchConfig
    from numba.cuda._compat import CUDA_CORE_GE_1_0

    flag = "is_cooperative" if CUDA_CORE_GE_1_0 else "cooperative_launch"
    return LaunchConfig(grid=griddim, block=blockdim, shmem_size=sharedmem, **{flag: cooperative})


def _install() -> None:
    """Wrap Numba's kernel launch (``_Kernel.launch``) so that a recording call notes each launch."""
    global _INSTALLED, _LAUNCH
    if _INSTALLED:
        return
    from cuda.core import launch
    from numba import cuda
    from numba.cuda import dispatcher, types

    _LAUNCH = launch

    original = dispatcher._Kernel.launch

    def recorded_launch(self, args, griddim, blockdim, stream=0, sharedmem=0):
        rec = _RECORDER.get()
        if rec is None or self.debug:
            return original(self, args, griddim, blockdim, stream, sharedmem)
        cufunc = self._codelibrary.get_cufunc()
        retr, params, arrays = [], [], []
        for ty, val in zip(self.argument_types, args):
            start = len(params)
            self._prepare_args(ty, val, stream, retr, params)
            if isinstance(ty, types.Array):
                arrays.append((start + 4, int(params[start + 4])))  # meminfo, parent, size, itemsize, data, ...
        config = _config(griddim, blockdim, sharedmem, self.cooperative)
        _LAUNCH(stream, config, cufunc.kernel, *params)
        for writeback in retr:
            writeback()
        rec.launches.append((cufunc.kernel, griddim, blockdim, sharedmem, stream, params, arrays))
        context = _as_int(cuda.current_context().handle)
        rec.context = context if rec.context in (0, context) else -1  # -1: two contexts, not replayable

    dispatcher._Kernel.launch = recorded_launch
    _INSTALLED = True
