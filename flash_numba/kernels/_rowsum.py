"""D = rowsum(dO * O): the first launch of the flash2 and flash2_fast backward passes.

D_i is the dot product of row i of dO with row i of O (FA2's Algorithm 2, line 4;
the paper's dS = P * (dP - D) needs it per query row).  TY = 8 rows per block, TX = 16
threads per row, each summing every 16th column; the row's 16 partial sums are added
in shared memory, in a fixed order (the result is deterministic).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, types

from .. import _inputs
from ..device import jit
from ._launch import launch
from ._common import GRID_LIMITS, COUNTER_TYPE, acc_nb_type, add_counts, array_type, batch_head, head_grid_2d
from ._common import input_type

NAME = "D = rowsum(dO*O)"
TY, TX = 8, 16
NT = TY * TX


@functools.lru_cache(maxsize=None)
def rowsum_kernel(d: int, dtype, count: bool):
    """The kernel for head dim d and storage ``dtype``; a :func:`grid` of blocks of 128 threads."""
    dtype = np.dtype(dtype)
    ACC = acc_nb_type(dtype)
    ZERO = _inputs.acc_dtype(dtype).type(0)
    IN_BYTES, L_BYTES = dtype.itemsize, _inputs.acc_dtype(dtype).itemsize
    PART = (TY, TX)
    COUNT = count

    @jit
    def flash2_rowsum(o, do, D, counter, Nq):
        t = cuda.threadIdx.x
        ty, tx = t // TX, t % TX
        bh = cuda.blockIdx.x  # the head: axis x holds any B*H
        r = (cuda.blockIdx.z * cuda.gridDim.y + cuda.blockIdx.y) * TY + ty  # this thread's row (see grid)
        b, h = batch_head(do, bh)  # once per thread, for o and do (shaped alike)
        nr = 0
        nw = 0
        part = cuda.shared.array(PART, ACC)  # per-row partial sums, one per thread
        D_part = ZERO
        if r < Nq:
            for x in range(tx, d, TX):
                D_part += ACC(do[b, h, r, x]) * ACC(o[b, h, r, x])
                if COUNT:
                    nr += 2 * IN_BYTES
        part[ty, tx] = D_part
        cuda.syncthreads()
        if r < Nq and tx == 0:
            D_r = ZERO
            for u in range(TX):
                D_r += part[ty, u]
            D[bh, r] = D_r
            if COUNT:
                nw += L_BYTES
        if COUNT:
            add_counts(counter, nr, nw)

    return flash2_rowsum


def rowsum(prob, o, do, counters):
    """D (B*H, Nq) in the accumulation dtype, counted under :data:`NAME`."""
    D = _inputs.empty((prob.BH, prob.Nq), prob.acc)
    kernel = rowsum_kernel(prob.d, prob.dtype, counters.enabled)
    launch(kernel, grid(prob), NT)(o, do, D, counters.array(NAME), prob.Nq)
    return D


def grid(prob) -> tuple[int, int, int]:
    """The launch grid ``(B*H, Y, Z)``: a block per 8 rows of a head, row block ``blockIdx.z * Y + blockIdx.y``.

    Y = min(row blocks, 65,535) and Z = ceil(row blocks / Y) (CUDA's limit of 65,535 on axes y and z, so any
    length up to 2^35 rows); the kernel reads its head and rows from ``blockIdx`` without a division (the
    1-D grid ``ceil(Nq / 8) * B*H`` that divided by the blocks per head took 0.77 ms at N = 4096, B*H = 32,
    d = 64 on the H200, against 0.23 ms for the grid ``(Tr, B*H)`` before it: 2026-11-30,
    ``benchmarks/results/h200-2026-11-30-s6/E/kt_*.txt``; benchmarks/results/LOG.md).
    """
    blocks = -(-prob.Nq // TY)
    y = min(blocks, GRID_LIMITS[1])
    bh, _ = head_grid_2d(1, prob.BH)  # checks B*H against axis x
    return bh, y, -(-blocks // y)


def signature(dtype) -> tuple:
    """Argument types of :func:`rowsum_kernel` for the compile tier."""
    dt = np.dtype(dtype)
    return (input_type(dt), input_type(dt), array_type(_inputs.acc_dtype(dt), 2), COUNTER_TYPE, types.int64)
