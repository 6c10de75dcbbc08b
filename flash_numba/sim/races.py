"""A happens-before race detector for shared memory, in Numba's CUDA simulator.

Threads of a block that share a tile must meet at a ``cuda.syncthreads()``
between one thread writing an element and another thread reading (or writing)
it.  Whether a missing barrier changes the result in the simulator depends on
how Python schedules its threads, so a checker that only re-runs a kernel and
compares outputs gives a verdict that depends on the machine.  This detector
does not: while :func:`race_check` is on, every ``cuda.shared.array`` the
simulator hands out is watched, and each element remembers, for the current
barrier epoch of its block (how many ``syncthreads`` the block has passed),
which thread wrote it and which threads read it.  A read of an element another
thread wrote in the same epoch, or a write to an element another thread read or
wrote in the same epoch, is a race, whatever order the threads ran in.

    with race_check() as races:
        kernel[grid, threads](...)
    races.first  # None, or the first Race: its str() names the array, the element, the two threads

Off by default: it makes every shared-memory access a Python call under a
lock.  Only static shared arrays (``cuda.shared.array`` with a shape) are
watched; an access through a slice (``K_j[c]``, then ``[x]``) counts as a read
of the whole slice, and a write through such a slice is not seen.  Warp
shuffles are block-wide barriers in this simulator (:mod:`flash_numba.sim.warps`),
so a race that only a shuffle separates is not reported.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from . import warps as _simwarp
from ..device import SIMULATOR


@dataclass(frozen=True)
class Race:
    """Two threads of one block touching one shared element with no ``syncthreads`` between them."""

    array: str  # the variable name in the function that made the second access
    index: tuple  # the element, as a multi-index
    first: int  # the thread (linear id, as the simulator numbers threads) that touched it first
    first_kind: str  # 'wrote' or 'read'
    second: int  # the thread whose access makes it a race
    second_kind: str
    block: tuple  # blockIdx (x, y, z)
    epoch: int  # how many syncthreads the block had passed

    def __str__(self) -> str:
        again = " again" if self.first_kind == self.second_kind == "wrote" else ""
        return (f"threads race on shared array {self.array} (thread {self.first} {self.first_kind} "
                f"{list(self.index)}, thread {self.second} {self.second_kind} it{again} before any syncthreads; "
                f"block {self.block}, after {self.epoch} syncthreads)")


@dataclass
class RaceLog:
    """The races seen while :func:`race_check` was on: the first one, and how many accesses raced."""

    first: Race | None = None
    count: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class _Watched:
    """A shared array whose element accesses are checked against the accesses of the other threads."""

    def __init__(self, ary: np.ndarray, log: RaceLog):
        self._ary = ary
        self._flat = np.arange(ary.size).reshape(ary.shape)
        self._log = log
        self._state: dict[int, list] = {}  # flat index -> [(block, epoch), writer or None, {readers}]

    def __getattr__(self, name):  # shape, dtype, size, ...
        return getattr(self._ary, name)

    def __len__(self) -> int:
        return len(self._ary)

    def __getitem__(self, idx):
        if isinstance(idx, slice) and self._ary.ndim == 1:  # a tile cut from one array (kernels/_smem.py): watched too
            start, stop, step = idx.indices(len(self._ary))
            if step == 1:
                return _WatchedTile(self, start, max(stop - start, 0))
        self._touch(idx, write=False)
        return self._ary[idx]

    def __setitem__(self, idx, val):
        self._touch(idx, write=True)
        self._ary[idx] = val

    def _touch(self, idx, write: bool) -> None:
        me = _simwarp.current_thread()
        tid = getattr(me, "thread_id", -1)
        when = (tuple(getattr(me, "blockIdx", (0, 0, 0))), getattr(me, _simwarp.BARRIERS, 0))
        wep = getattr(me, _simwarp.WARP_BARRIERS, 0)  # a warp operation orders the lanes of one warp only

        def unordered(other_tid, other_wep):
            return other_tid != tid and (other_tid // 32 != tid // 32 or other_wep == wep)

        log = self._log
        with log._lock:
            for f in np.atleast_1d(self._flat[idx]).ravel():
                f = int(f)
                st = self._state.get(f)
                if st is None or st[0] != when:
                    st = self._state[f] = [when, None, {}]  # (block, epoch), (writer, its warp epoch), readers
                writer, readers = st[1], st[2]
                other = None
                if writer is not None and unordered(*writer):
                    other = (writer[0], "wrote")
                elif write:
                    racing = [r for r, e in readers.items() if unordered(r, e)]
                    if racing:
                        other = (min(racing), "read")
                if other is not None:
                    log.count += 1
                    if log.first is None:
                        log.first = Race(_name_of(self, sys._getframe(2)), tuple(int(i) for i in np.unravel_index(
                            f, self._ary.shape)), other[0], other[1], tid, "wrote" if write else "read", *when)
                if write:
                    st[1] = (tid, wep)
                else:
                    readers[tid] = wep


class _WatchedTile:
    """``tiles[start:start + n]`` of a watched 1-D array: its accesses are the array's (the slices that
    :func:`flash_numba.kernels._smem.tiles` cuts in the simulator)."""

    def __init__(self, base: _Watched, start: int, n: int):
        self._base, self._start, self._n = base, start, n

    def __len__(self) -> int:
        return self._n

    def __getattr__(self, name):  # dtype, ...
        return getattr(self._base._ary[self._start:self._start + self._n], name)

    def _at(self, idx):
        if isinstance(idx, slice):
            start, stop, step = idx.indices(self._n)
            return slice(self._start + start, self._start + stop, step)
        return self._start + int(idx)

    def __getitem__(self, idx):
        return self._base[self._at(idx)]

    def __setitem__(self, idx, val):
        self._base[self._at(idx)] = val


def _name_of(watched: _Watched, frame) -> str:
    """The name the array has in ``frame`` (the kernel or device function that touched it), else '?'."""
    for name, value in frame.f_locals.items():
        if value is watched:
            return name
    return "?"


@contextmanager
def race_check():
    """Watch every static shared array the simulator allocates inside the block for races; yields a RaceLog."""
    if not SIMULATOR:
        raise RuntimeError("race_check: shared-memory accesses can only be watched in Numba's CUDA simulator")
    log = RaceLog()
    before = _simwarp.WATCH
    _simwarp.WATCH = lambda ary: _Watched(ary, log)
    try:
        yield log
    finally:
        _simwarp.WATCH = before
