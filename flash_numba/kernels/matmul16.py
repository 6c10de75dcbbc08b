"""The 16 x 16 tiled matrix product: lesson 4's teaching kernel.

``C[bh] = alpha * op(A[bh]) @ op(B[bh])`` with one output element per thread and
two 16 x 16 shared-memory tiles per thread block (:func:`matmul_kernel`);
:func:`matmul` is its host wrapper.  Each thread block stages the K-strip of A
of its tile row and of B of its tile column, so A is read once per tile column
of C and B once per tile row: the re-reads a larger tile (or a register tile,
as in :mod:`flash_numba.kernels.standard`) cuts.  It was the first standard
attention's only matrix product; it is no longer part of any attention kernel.

Its grid is ``(ceil(N / 16), ceil(M / 16), BH)``: the batch sits on axis z, which
CUDA caps at 65,535, so :func:`matmul` takes at most 65,535 matrices per call
(:func:`grid` raises a ValueError beyond that; the attention kernels fold B*H into
axis x instead).

What the counters count.  Every in-bounds element of the A and B tiles each
thread block stages, and every element of C it writes;
:func:`flash_numba.iomodel.matmul16.matmul` gives the same numbers in closed form.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from .. import _inputs, _views
from ..device import jit
from ..hbm import Counters
from ._launch import launch
from ._common import COUNTER_TYPE, GRID_LIMITS, acc_nb_type, add_counts, array_type

#: Side of the square shared-memory tiles of the matrix product (16 x 16 threads per block).
TILE = 16

NEG_INF = -math.inf

# ---------------------------------------------------------------------------
# The tiled matrix product
# ---------------------------------------------------------------------------


@jit(device=True)
def stage(tile, tr, tc, src, bh, i, j, n_i, n_j):
    """``tile[tr, tc] = src[bh, i, j]``, or 0 past the edge of the (n_i, n_j) matrix.

    Returns the elements read from ``src``: 1 or 0.
    """
    if i < n_i and j < n_j:
        tile[tr, tc] = src[bh, i, j]
        return 1
    tile[tr, tc] = 0
    return 0


@functools.lru_cache(maxsize=None)
def matmul_kernel(dtype, trans_a: bool = False, trans_b: bool = False, causal: bool = False, count: bool = False):
    """The kernel ``C[bh] = alpha * op(A[bh]) @ op(B[bh])`` for every batch index ``bh``.

    ``op(A)`` is ``A`` (stored ``(BH, M, K)``) or, with ``trans_a``, ``A^T`` (``A``
    stored ``(BH, K, M)``); likewise ``op(B)`` is ``(K, N)``, stored ``(BH, K, N)`` or,
    with ``trans_b``, ``(BH, N, K)``.  ``C`` is ``(BH, M, N)``; A, B and C have the
    storage dtype ``dtype``, the sums run in float32 (float64 for float64).  With
    ``causal``, ``C[i, j] = -inf`` where ``j > i + (N - M)`` (the attention mask).

    Launch: ``kernel[(ceil(N/TILE), ceil(M/TILE), BH), (TILE, TILE)](a, b, c, alpha, counter)``
    with ``alpha`` of the accumulation dtype.  Thread ``(tx, ty)`` of block
    ``(bx, by, bh)`` owns ``C[bh, by*TILE + ty, bx*TILE + tx]``.  M, N and K come from
    the array shapes and need not be multiples of TILE.
    """
    ACC = acc_nb_type(dtype)
    E = np.dtype(dtype).itemsize  # bytes per element of A, B and C
    TRANS_A, TRANS_B, CAUSAL, COUNT = trans_a, trans_b, causal, count
    T = TILE
    T1 = TILE + 1  # padded row: a column of the tile then sits in 16 different banks

    @jit
    def kernel(a, b, c, alpha, counter):
        M = c.shape[1]
        N = c.shape[2]
        K = a.shape[1] if TRANS_A else a.shape[2]
        bh = cuda.blockIdx.z
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row0 = cuda.blockIdx.y * T  # first row of this block's C tile
        col0 = cuda.blockIdx.x * T  # first column
        row = row0 + ty
        col = col0 + tx

        a_tile = cuda.shared.array((T, T1), ACC)  # a_tile[r, kk] = op(A)[row0 + r, k0 + kk]
        b_tile = cuda.shared.array((T, T1), ACC)  # b_tile[kk, cc] = op(B)[k0 + kk, col0 + cc]
        acc = ACC(0)  # C[row, col] / alpha, summed over the K tiles
        nr = 0
        nw = 0

        for k0 in range(0, K, T):
            # Stage one (T, T) tile of op(A) and one of op(B).  Neighbouring threads (tx,
            # tx + 1) always load neighbouring addresses in memory (coalesced), so for a
            # transposed operand the thread stores into the tile transposed.  Elements
            # past the edge of the matrix are 0 and add nothing.
            if TRANS_A:  # A is (K, M): load A[k0 + ty, row0 + tx] = op(A)[row0 + tx, k0 + ty]
                n_read = stage(a_tile, tx, ty, a, bh, k0 + ty, row0 + tx, K, M)
            else:  # A is (M, K): load A[row, k0 + tx]
                n_read = stage(a_tile, ty, tx, a, bh, row, k0 + tx, M, K)
            if TRANS_B:  # B is (N, K): load B[col0 + ty, k0 + tx] = op(B)[k0 + tx, col0 + ty]
                n_read += stage(b_tile, tx, ty, b, bh, col0 + ty, k0 + tx, N, K)
            else:  # B is (K, N): load B[k0 + ty, col]
                n_read += stage(b_tile, ty, tx, b, bh, k0 + ty, col, K, N)
            if COUNT:
                nr += n_read * E
            cuda.syncthreads()  # both tiles complete before anyone reads them

            for kk in range(T):  # row `ty` of the A tile times column `tx` of the B tile
                acc += a_tile[ty, kk] * b_tile[kk, tx]
            cuda.syncthreads()  # everyone done with the tiles before the next k0 overwrites them

        if row < M and col < N:
            if CAUSAL and col > row + (N - M):  # key col is not visible to query row
                c[bh, row, col] = ACC(NEG_INF)
            else:
                c[bh, row, col] = alpha * acc
            if COUNT:
                nw += E
        if COUNT:
            add_counts(counter, nr, nw)

    return kernel


def grid(BH: int, M: int, N: int) -> tuple[int, int, int]:
    """The launch grid of a (BH, M, N) product; ``BH`` is limited to 65,535 (grid axis z)."""
    if BH > GRID_LIMITS[2]:
        raise ValueError(f"BH: matmul16 puts the batch on grid axis z, at most {GRID_LIMITS[2]} matrices, got {BH}")
    return (math.ceil(N / TILE), math.ceil(M / TILE), BH)


def _launch_matmul(a, b, c, alpha, counter, *, trans_a=False, trans_b=False, causal=False, count=False):
    """Run :func:`matmul_kernel` on device arrays ``a``, ``b`` into ``c`` (BH, M, N)."""
    dtype = np.dtype(c.dtype)
    BH, M, N = c.shape
    kernel = matmul_kernel(dtype, trans_a, trans_b, causal, count)
    launch(kernel, grid(BH, M, N), (TILE, TILE))(a, b, c, _inputs.acc_dtype(dtype).type(alpha), counter)


def matmul(a, b, *, trans_a=False, trans_b=False, alpha=1.0, count_hbm=False):
    """``alpha * op(a) @ op(b)`` with :func:`matmul_kernel`, batched over the first axis.

    ``a``: ``(BH, M, K)`` (``(BH, K, M)`` with ``trans_a``), ``b``: ``(BH, K, N)``
    (``(BH, N, K)`` with ``trans_b``); 2-D arrays are one batch.  Both NumPy (the
    result comes back as NumPy) or both device arrays (the result stays on the
    device), one storage dtype (float16, float32, float64).  Returns ``c`` with
    a's rank and dtype, or ``(c, hbm)`` with an :class:`~flash_numba.hbm.HBMCount`
    when ``count_hbm=True``.
    """
    if not isinstance(count_hbm, bool):
        raise TypeError(f"count_hbm: expected True or False, got {count_hbm!r}")
    real = isinstance(alpha, (int, float, np.integer, np.floating)) and not isinstance(alpha, bool)
    if not (real and math.isfinite(alpha)):
        raise TypeError(f"alpha: expected a finite real number, got {alpha!r}")
    (a, a_dev), (b, b_dev) = _inputs._as_array(a, "a"), _inputs._as_array(b, "b")
    if a_dev != b_dev:
        raise TypeError("a and b: give both as NumPy arrays or both as CUDA arrays")
    dtype = _inputs._check_dtype(a, "a")
    if _inputs._check_dtype(b, "b") != dtype:
        raise TypeError(f"b: dtype {np.dtype(b.dtype)} differs from a's {dtype}")
    if a.ndim not in (2, 3) or b.ndim != a.ndim:
        raise ValueError(f"a, b: expected two 2-D or two 3-D arrays, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    a3 = a.shape if a.ndim == 3 else (1,) + tuple(a.shape)
    b3 = b.shape if b.ndim == 3 else (1,) + tuple(b.shape)
    if a3[0] != b3[0]:
        raise ValueError(f"b: batch size {b3[0]} differs from a's {a3[0]}")
    M, K = (a3[2], a3[1]) if trans_a else (a3[1], a3[2])
    Kb, N = (b3[2], b3[1]) if trans_b else (b3[1], b3[2])
    if Kb != K:
        raise ValueError(f"b: inner dimension {Kb} of op(b) differs from op(a)'s {K}")
    if min(M, N, K, a3[0]) < 1:
        raise ValueError(f"a, b: empty matrices {tuple(a.shape)} and {tuple(b.shape)}")
    a_d = _views._to_device(a, a_dev, a3, "a")
    b_d = _views._to_device(b, b_dev, b3, "b")
    c = _inputs.empty((a3[0], M, N), dtype)
    counters = Counters(count_hbm)
    counter = counters.array("C = alpha*op(A)@op(B)")
    _launch_matmul(a_d, b_d, c, alpha, counter, trans_a=bool(trans_a), trans_b=bool(trans_b), count=count_hbm)
    shape = (a3[0], M, N) if a.ndim == 3 else (M, N)
    c = c.reshape(shape) if a_dev else c.copy_to_host().reshape(shape)
    return (c, counters.result()) if count_hbm else c


#: (trans_a, trans_b, causal) of the matrix products: the four transpose patterns
#: (the public :func:`matmul` takes any) and the causal ``Q K^T`` of S.
_MATMUL_VARIANTS = [(ta, tb, False) for ta in (False, True) for tb in (False, True)] + [(False, True, True)]


def compile_all(ccs, dtypes, ds):
    """PTX of :func:`matmul_kernel` in each of ``_MATMUL_VARIANTS``, per cc, dtype and
    counting flag, as ``[(label, ptx)]`` (the standard module's ``compile_all`` includes
    these, so the compile tier keeps checking lesson 4's kernel).  ``ds`` is unused."""
    from ..compile_check import compile_ptx

    out = []
    for cc in ccs:
        for dt in map(np.dtype, dtypes):
            s3, acc = array_type(dt, 3), acc_nb_type(dt)
            for count in (False, True):
                tag = f"{dt.name}{' count' if count else ''} cc{cc[0]}.{cc[1]}"
                for ta, tb, causal in _MATMUL_VARIANTS:
                    name = f"matmul16 A{'^T' if ta else ''}@B{'^T' if tb else ''}{' causal' if causal else ''}"
                    kernel = matmul_kernel(dt, ta, tb, causal, count)
                    out.append((f"{name} {tag}", compile_ptx(kernel.py_func, (s3, s3, s3, acc, COUNTER_TYPE), cc)))
    return out
