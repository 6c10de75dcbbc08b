"""Warp shuffles, poisoned shared/local memory and a block scheduler that yields, for Numba's CUDA simulator.

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

A scheduler that yields.  The simulator runs a block as one Python thread per
CUDA thread; the main thread polls them in a loop (who waits at
``syncthreads``, who is still alive) that never sleeps, so it takes the GIL
from the threads doing the work at every switch.  :func:`install` replaces that
loop with the same loop plus ``time.sleep(0)`` per round, which hands the GIL
to the CUDA threads: the same threads, barriers and results, about 2-5x faster
kernels in the simulator (flash1 5x, flash2_fast 3x, standard 2x).

Barrier epochs and watched arrays, for :mod:`flash_numba.simrace`.  Each
simulated thread counts the ``syncthreads`` it has passed (its attribute
``BARRIERS``), and a static shared array is handed to ``WATCH`` (when it is not
None) as it is allocated, so the race detector can wrap it.
"""

from __future__ import annotations

import threading

#: The attribute of a simulated thread that counts the syncthreads it has passed (its barrier epoch).
BARRIERS = "_flash_numba_barriers"

#: None, or a function that wraps each new static shared array (set by simrace.race_check).
WATCH = None


def install() -> None:
    from numba.cuda.simulator import kernel, kernelapi

    kernel.BlockManager.run = _run_block

    mod = kernelapi.FakeCUDAModule
    if getattr(mod, "_flash_numba_shuffles", False):
        return
    _count_barriers(kernel.BlockThread)

    def _exchange(value, partner_of):
        me = threading.current_thread()
        manager = me._manager
        store = manager.__dict__.setdefault("_flash_numba_shfl", {})
        tid = me.thread_id
        store[tid] = value
        me.syncthreads()
        warp_base = tid - tid % 32
        lane = partner_of(tid % 32)
        src = warp_base + lane
        out = store.get(src, value) if 0 <= lane < 32 else value
        me.syncthreads()
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


def _count_barriers(thread_class) -> None:
    syncthreads = thread_class.syncthreads

    def counted(self):
        syncthreads(self)
        setattr(self, BARRIERS, getattr(self, BARRIERS, 0) + 1)

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


def _run_block(self, grid_point, *args):
    """numba-cuda 0.30.4's ``BlockManager.run`` (one block), with ``time.sleep(0)`` in its polling loop.

    Starts one thread per CUDA thread; releases the threads waiting at
    ``syncthreads`` once every thread still alive waits there; re-raises the
    first exception a thread raised (after aborting the others).
    """
    import time

    import numpy as np
    from numba.cuda.simulator.kernel import BlockThread

    threads, livethreads, blockedthreads = set(), set(), set()
    for block_point in np.ndindex(*self._block_dim):

        def target():
            self._f(*args)

        t = BlockThread(target, self, grid_point, block_point, self._debug)
        t.start()
        threads.add(t)
        livethreads.add(t)
    while livethreads:
        for t in livethreads:
            if t.syncthreads_blocked:
                blockedthreads.add(t)
            elif t.exception:  # abort every other thread, then raise
                for t_other in threads:
                    t_other.abort = True
                    t_other.syncthreads_blocked = False
                    t_other.syncthreads_event.set()
                raise t.exception[0].with_traceback(t.exception[1])
        if livethreads == blockedthreads:
            for t in blockedthreads:
                t.syncthreads_blocked = False
                t.syncthreads_event.set()
            blockedthreads = set()
        livethreads = {t for t in livethreads if t.is_alive()}
        time.sleep(0)  # the one change: let the CUDA threads have the GIL
    for t in threads:  # an exception set just before its thread finished
        if t.exception:
            raise t.exception[0].with_traceback(t.exception[1])
