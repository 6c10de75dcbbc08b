"""Warp shuffles for Numba's CUDA simulator.

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
"""

from __future__ import annotations

import threading


def install() -> None:
    from numba.cuda.simulator import kernelapi

    mod = kernelapi.FakeCUDAModule
    if getattr(mod, "_flash_numba_shuffles", False):
        return

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

    mod.shfl_sync = shfl_sync
    mod.shfl_xor_sync = shfl_xor_sync
    mod.shfl_down_sync = shfl_down_sync
    mod.shfl_up_sync = shfl_up_sync
    if not hasattr(mod, "syncwarp"):
        mod.syncwarp = syncwarp
    mod._flash_numba_shuffles = True
