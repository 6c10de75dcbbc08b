"""Which thread read or wrote which element of a global array: a trace taken in Numba's CUDA simulator.

A kernel's own counters (the ``nr``/``nw`` pattern of :mod:`flash_numba.kernels._common`)
say how many bytes its code *says* it moved.  In the simulator every element
access of a device array is a Python call, so this module can watch them
directly: :func:`traced` wraps a NumPy array in a simulator device array that
records each element read and write, with the block and thread that made it,
into an :class:`AccessLog`.  The exercise checkers use it to tell a tile re-read
from HBM (more reads of ``k`` than the IO model allows) from a counter that
forgot a load (the trace disagrees with the kernel's own count); the pictures
use it to draw GPU-Puzzles-style access maps.

Only in the simulator (``flash_numba.device.SIMULATOR``): on a GPU nothing sees
individual loads, and :func:`traced` raises.  An access through a slice
(``q[row]``, then ``[x]``) is recorded once per element of the slice, when the
slice is taken.  ``x[i] += y`` is a read and a write, as on the GPU.

    log = AccessLog()
    q_d = traced(q, "q", log)           # pass q_d to the kernel instead of cuda.to_device(q)
    kernel[grid, threads](q_d, ...)
    log.elements("q", "r")              # element reads of q
    log.touch_map("q", "r", q.shape)    # (Nq, d) array: the thread that first read each element
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import warps as _simwarp
from ..device import SIMULATOR


@dataclass
class AccessLog:
    """Every traced access: ``(array name, 'r' or 'w', flat index, block (x, y, z), thread (x, y, z))``."""

    events: list = field(default_factory=list)
    itemsize: dict = field(default_factory=dict)  # array name -> bytes per element

    def elements(self, name: str, kind: str) -> int:
        """How many element reads (``kind='r'``) or writes (``'w'``) of array ``name``."""
        return sum(1 for e in self.events if e[0] == name and e[1] == kind)

    def bytes(self, kind: str) -> int:
        """Bytes read (``'r'``) or written (``'w'``) over all traced arrays."""
        return sum(self.itemsize[e[0]] for e in self.events if e[1] == kind)

    def per_array(self) -> dict[str, tuple[int, int]]:
        """``{name: (element reads, element writes)}`` for every traced array, in the order they were made."""
        return {name: (self.elements(name, "r"), self.elements(name, "w")) for name in self.itemsize}

    def touch_map(self, name: str, kind: str, shape, block=None) -> np.ndarray:
        """Array of ``shape``: the linear thread index (x + y * blockDim.x ... as the simulator numbers
        threads) that first made a ``kind`` access to each element, -1 where none did; ``block``
        (a tuple) keeps only the accesses of that block."""
        out = np.full(int(np.prod(shape)), -1, dtype=np.int64)
        for n, k, flat, blk, thread in self.events:
            if n == name and k == kind and (block is None or blk == tuple(block)) and out[flat] < 0:
                out[flat] = thread
        return out.reshape(shape)

    def count_map(self, name: str, kind: str, shape) -> np.ndarray:
        """Array of ``shape``: how many ``kind`` accesses each element received."""
        out = np.zeros(int(np.prod(shape)), dtype=np.int64)
        for n, k, flat, _, _ in self.events:
            if n == name and k == kind:
                out[flat] += 1
        return out.reshape(shape)


def _record(log: AccessLog, name: str, kind: str, flat) -> None:
    me = _simwarp.current_thread()
    block = tuple(getattr(me, "blockIdx", (0, 0, 0)))
    thread = getattr(me, "thread_id", -1)
    for f in np.atleast_1d(flat).ravel():
        log.events.append((name, kind, int(f), block, thread))  # list.append is atomic under the GIL


def traced(ary: np.ndarray, name: str, log: AccessLog):
    """A simulator device array holding a copy of ``ary`` that records its element accesses in ``log``."""
    if not SIMULATOR:
        raise RuntimeError("traced: element accesses can only be watched in Numba's CUDA simulator")
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    class Traced(FakeCUDAArray):
        def __getitem__(self, idx):
            _record(log, name, "r", flat[idx])
            return super().__getitem__(idx)

        def __setitem__(self, idx, val):
            _record(log, name, "w", flat[idx])
            return super().__setitem__(idx, val)

    ary = np.ascontiguousarray(ary).copy()
    flat = np.arange(ary.size).reshape(ary.shape)
    log.itemsize[name] = ary.dtype.itemsize
    return Traced(ary)


def run(kernel, grid, threads, arrays, *scalars) -> tuple[dict, AccessLog]:
    """Launch ``kernel[grid, threads](*traced arrays, *scalars)``; ``arrays`` is ``[(name, NumPy array)]``.

    Returns ({name: the array's contents after the launch}, the :class:`AccessLog`).
    """
    log = AccessLog()
    devs = [traced(a, n, log) for n, a in arrays]
    kernel[grid, threads](*devs, *scalars)
    return {n: d.copy_to_host() for (n, _), d in zip(arrays, devs)}, log
