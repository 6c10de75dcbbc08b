"""Warp shuffles, poisoned shared/local memory and a faster block scheduler, for Numba's CUDA simulator.

numba-cuda 0.30.4's simulator has no ``cuda.shfl_*_sync``: a kernel that reduces
a row with warp shuffles (as fast kernels do) raises AttributeError there.  This
module adds ``shfl_sync``, ``shfl_xor_sync``, ``shfl_down_sync`` and
``shfl_up_sync`` to the simulator's fake ``cuda`` module.

How: every thread of the block posts its value, waits at a block-wide barrier,
reads its partner's value, and waits again.  That is exact for the way our
kernels use shuffles (every thread of the block calls the same shuffle, in
uniform control flow, with a full mask), and it deadlocks, exactly like a
misplaced ``syncthreads`` in the simulator, if only some threads call it.
A lane outside the block (a partial last warp) reads its own value.

Poisoned memory.  On a GPU, shared and local arrays start with whatever was
there; the simulator hands out ``np.empty`` arrays, which are usually zeros, so
a kernel that reads an element it never wrote passes there and fails on the GPU.
:func:`install` makes the simulator fill float shared and local arrays with NaN
(integers with a large sentinel), so such a read shows up as NaN in the results.
It also accepts (and ignores) ``alignment=``, so one kernel source serves both.

A scheduler without OS threads.  The simulator runs a block as one Python thread
per CUDA thread and a main thread that polls them (who waits at ``syncthreads``,
who is still alive): every switch between threads is a hand-over of the GIL.
:func:`install` runs the CUDA threads as greenlets instead, in the caller's
thread: each runs until it reaches ``syncthreads`` (or ends), and when every
thread still running waits there, the next round releases them, which is the
simulator's barrier rule.  It also keeps a module's ``cuda`` swapped for the
fake one for the whole launch, where the simulator swaps it back and forth at
every device-function call.  Same kernels, same barriers, same results; a small
kernel runs about 6x faster than with the simulator's own scheduler (flash2_fast
at N = 3: 4.2 s -> 0.7 s on our CI machine).  One difference: the threads take
turns in a fixed order, so a kernel whose thread spins waiting for another
thread's write (a spin lock) never ends here; none of ours does.

Barrier epochs and watched arrays, for :mod:`flash_numba.sim.races`.  Each
simulated thread counts the ``syncthreads`` it has passed (its attribute
``BARRIERS``), and a static shared array is handed to ``WATCH`` (when it is not
None) as it is allocated, so the race detector can wrap it.
"""

from __future__ import annotations

import threading

import numpy as np

#: The attribute of a simulated thread that counts the syncthreads it has passed (its barrier epoch).
BARRIERS = "_flash_numba_barriers"

#: The attribute that counts the barriers its warp has passed: every syncthreads, and every warp operation (a
#: shuffle, an mma or ldmatrix stand-in), which on a GPU orders the lanes of one warp but not the warps of a block.
WARP_BARRIERS = "_flash_numba_warp_barriers"


def warp_sync(me) -> None:
    """The barrier of a warp operation in this simulator: every thread of the block waits (the stand-ins need all
    lanes' values), but only the warp's epoch moves on (:mod:`flash_numba.sim.races` treats the warps of a block as
    unordered by it, as a GPU does)."""
    me.uncounted_syncthreads()
    setattr(me, WARP_BARRIERS, getattr(me, WARP_BARRIERS, 0) + 1)

#: None, or a function that wraps each new static shared array (set by flash_numba.sim.races.race_check).
WATCH = None


def install() -> None:
    from numba.cuda.simulator import kernel, kernelapi

    kernel.BlockManager.run = _run_block
    kernelapi.threading = _ThreadingForTheSimulator()
    _swap_once_per_launch(kernel)

    mod = kernelapi.FakeCUDAModule
    if getattr(mod, "_flash_numba_shuffles", False):
        return
    _count_barriers(_GreenThread)

    def _exchange(value, partner_of):
        me = current_thread()
        manager = me._manager
        store = manager.__dict__.setdefault("_flash_numba_shfl", {})
        tid = me.thread_id
        store[tid] = value
        warp_sync(me)
        warp_base = tid - tid % 32
        lane = partner_of(tid % 32)
        src = warp_base + lane
        out = store.get(src, value) if 0 <= lane < 32 else value
        warp_sync(me)
        return out

    def shfl_sync(self, mask, value, src_lane):
        return _exchange(value, lambda lane: src_lane % 32)

    def shfl_xor_sync(self, mask, value, lane_mask):
        return _exchange(value, lambda lane: lane ^ lane_mask)

    def shfl_down_sync(self, mask, value, delta):
        return _exchange(value, lambda lane: lane + delta if lane + delta < 32 else lane)

    def shfl_up_sync(self, mask, value, delta):
        return _exchange(value, lambda lane: lane - delta if lane - delta >= 0 else lane)

    def syncwarp(self, mask=0xFFFFFFFF):
        return None

    _install_poisoned_arrays(kernelapi)
    mod.shfl_sync = shfl_sync
    mod.shfl_xor_sync = shfl_xor_sync
    mod.shfl_down_sync = shfl_down_sync
    mod.shfl_up_sync = shfl_up_sync
    if not hasattr(mod, "syncwarp"):
        mod.syncwarp = syncwarp
    mod._flash_numba_shuffles = True


_LAUNCH = threading.local()  # .swaps: {id(module globals): the open swapped_cuda_module} while a kernel runs


def _swap_once_per_launch(kernel) -> None:
    """Device-function calls inside a kernel swap their module's ``cuda`` for the fake one once per launch.

    The simulator's ``FakeCUDAKernel.__call__`` enters ``swapped_cuda_module`` at every
    device-function call (a lock, an import, and a scan of the module's globals when no
    other call holds them): most of a small kernel's time.  Here the first call from a
    module swaps it and keeps it swapped until the launch ends; the others call the
    Python function directly.  The same fake module, the same results.
    """
    call = kernel.FakeCUDAKernel.__call__

    def fast_call(self, *args):
        swaps = getattr(_LAUNCH, "swaps", None)
        if self._device or kernel._kernel_context:  # a device function, called from a kernel
            if swaps is None:
                return call(self, *args)
            key = id(self.fn.__globals__)
            if key not in swaps:
                swap = kernelapi_swapped(self.fn, kernel._get_kernel_context())
                swap.__enter__()
                swaps[key] = swap
            return self.fn(*args)
        _LAUNCH.swaps = {}  # a launch: hold the swaps its device functions make, release them at its end
        try:
            return call(self, *args)
        finally:
            for swap in reversed(list(_LAUNCH.swaps.values())):
                swap.__exit__(None, None, None)
            _LAUNCH.swaps = None

    from numba.cuda.simulator.kernelapi import swapped_cuda_module as kernelapi_swapped

    kernel.FakeCUDAKernel.__call__ = fast_call


def _count_barriers(thread_class) -> None:
    syncthreads = thread_class.syncthreads

    def counted(self):
        syncthreads(self)
        setattr(self, BARRIERS, getattr(self, BARRIERS, 0) + 1)
        setattr(self, WARP_BARRIERS, getattr(self, WARP_BARRIERS, 0) + 1)

    thread_class.uncounted_syncthreads = syncthreads
    thread_class.syncthreads = counted


def _poisoned(shape, dtype):
    import numpy as np

    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.full(shape, np.nan, dtype)
    if dtype.kind in "iu":
        return np.full(shape, np.iinfo(dtype).max // 2, dtype)
    return np.empty(shape, dtype)


_ALLOC_LOCK = threading.Lock()


def _install_poisoned_arrays(kernelapi) -> None:
    import sys
    import traceback

    from numba.core import types
    from numba.np import numpy_support

    def _dtype(dtype):
        return numpy_support.as_dtype(dtype) if isinstance(dtype, types.Type) else dtype

    def shared_array(self, shape, dtype, alignment=None):
        dtype = _dtype(dtype)
        if shape == 0:  # dynamic shared memory: one buffer, as in the simulator
            import numpy as np

            count = self._dynshared_size // dtype.itemsize
            return np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
        # one allocation per source line, as in the simulator (the caller's frame is the key)
        # (under a lock: the simulator's own version lets two threads that arrive together
        # each create an array, so one thread's writes are lost to the others)
        caller = traceback.extract_stack(sys._getframe())[-2][0:2]
        with _ALLOC_LOCK:
            res = self._allocations.get(caller)
            if res is None:
                res = _poisoned(shape, dtype)
                if WATCH is not None:
                    res = WATCH(res)
                self._allocations[caller] = res
        return res

    def local_array(self, shape, dtype, alignment=None):
        return _poisoned(shape, _dtype(dtype))

    kernelapi.FakeCUDAShared.array = shared_array
    kernelapi.FakeCUDALocal.array = local_array


class _GreenThread:
    """One simulated CUDA thread, run as a greenlet: what the simulator's ``BlockThread`` offers the fake ``cuda``
    module (threadIdx, blockIdx, thread_id, syncthreads and its count/and/or forms), without an OS thread."""

    def __init__(self, manager, block_idx, thread_idx, run):
        from greenlet import greenlet
        from numba.cuda.simulator.kernel import Dim3

        self._manager = manager
        self.blockIdx = Dim3(*block_idx)
        self.threadIdx = Dim3(*thread_idx)
        bx, by, _ = manager._block_dim
        self.thread_id = self.threadIdx.x + bx * (self.threadIdx.y + by * self.threadIdx.z)
        self.greenlet = greenlet(run)

    def syncthreads(self):
        self.greenlet.parent.switch()  # back to the scheduler, which resumes us once every live thread is here

    def _block_vote(self, value):
        self._manager.block_state[self.threadIdx.x, self.threadIdx.y, self.threadIdx.z] = value
        self.syncthreads()
        state = self._manager.block_state.copy()
        self.syncthreads()
        return state

    def syncthreads_count(self, value):
        return int(np.count_nonzero(self._block_vote(value)))

    def syncthreads_and(self, value):
        return 1 if np.all(self._block_vote(value)) else 0

    def syncthreads_or(self, value):
        return 1 if np.any(self._block_vote(value)) else 0

    def __str__(self):
        return f"Thread <<<{self.blockIdx}, {self.threadIdx}>>>"


#: The simulated thread that runs now (None outside a kernel): the scheduler runs one at a time.
_CURRENT = None


def current_thread():
    """The simulated CUDA thread that is running (``threading.current_thread()`` outside a kernel)."""
    return _CURRENT if _CURRENT is not None else threading.current_thread()


class _ThreadingForTheSimulator:
    """What the simulator's ``kernelapi`` module sees as ``threading``: the real module, but for
    ``current_thread``, which answers the simulated thread (threadIdx, syncthreads, ...)."""

    current_thread = staticmethod(current_thread)

    def __getattr__(self, name):
        return getattr(threading, name)


def _run_block(self, grid_point, *args):
    """numba-cuda 0.30.4's ``BlockManager.run`` (one block), with greenlets for the CUDA threads.

    Runs the block's threads in turn, each until it reaches ``syncthreads`` or ends;
    when every thread still running waits at the barrier (after each round), the
    next round releases them.  That is the simulator's rule (a barrier opens when
    every live thread has reached it).  An exception in a thread is re-raised with
    the thread's position in its message, as the simulator does.
    """
    global _CURRENT
    import numpy as np

    f = self._f
    if self._debug:
        def f(*a, _f=self._f):
            np.seterr(divide="raise")
            _f(*a)

    threads = [_GreenThread(self, grid_point, point, f) for point in np.ndindex(*self._block_dim)]
    first = True
    while threads:
        waiting = []
        for t in threads:
            _CURRENT = t
            try:
                t.greenlet.switch(*args) if first else t.greenlet.switch()
            except Exception as e:
                where = f"tid={list(t.threadIdx)} ctaid={list(t.blockIdx)}"
                raise type(e)(f"{where}: {e}" if str(e) else where).with_traceback(e.__traceback__) from None
            finally:
                _CURRENT = None
            if not t.greenlet.dead:
                waiting.append(t)
        threads, first = waiting, False
