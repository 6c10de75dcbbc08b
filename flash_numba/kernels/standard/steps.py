"""Device functions that standard's tiled kernels share: where a thread and its block start, and the
steps of the two product kernels.

* :func:`thread_tile`: a thread's index and its place (ty, tx) in the TY x TX thread grid.
* :func:`query_block`: a query-block kernel's block (r0, bh), its key/value head and how many key
  blocks it visits (``scores_kernel``, ``grad_scores_kernel``, ``rowprod_kernel``).
* :func:`product_plan`: ``C = alpha * sum of tile products A B`` in registers, the steps shared by
  ``rowprod_kernel`` (forward.py: C_i = alpha sum_j A_ij B_j, for O = P V and dQ = scale dS K) and
  ``colprod_kernel`` (backward.py: C_j = alpha sum_i A_ij^T B_i, for dV = P^T dO and dK = scale dS^T Q).

Each is inlined into its kernel by Numba (``inline="always"``, in Numba's IR), so a kernel compiles as if
the steps were written out in it, with its own fastmath flags.  ptxas then gives scores, grad_scores and
colprod the registers they had with the steps written out; rowprod's count depends on what the process
compiled before it (unchanged in a process that compiles rowprod alone, +17 / -30 in the compile tier;
LLVM-level ``forceinline`` moved rowprod, colprod and scores).
"""

from __future__ import annotations

from functools import lru_cache
from types import SimpleNamespace

import numpy as np
from numba import cuda

from ...device import jit
from .._common import acc_nb_type, add_counts, kv_head
from .._tile_ops import NT, TX, last_tile_first, micro_product, tile_loader, tile_store
from ..causal import crosses_diagonal_dev as crosses_diagonal
from .layout import _align, _consts, _n_visible, geometry


@jit(device=True, inline="always")
def thread_tile():
    """``(tid, ty, tx)``: this thread's index in the block and its row ty, column tx of the TY x TX grid."""
    tid = cuda.threadIdx.x
    return tid, tid // TX, tid % TX


@lru_cache(maxsize=None)
def query_block(Br: int, Bc: int, causal: bool):
    """Device function ``(Nq, Nk, G) -> (r0, bh, hkv, n_j)`` of a 1-D grid of Tr * BH query blocks.

    r0: the block's first query row, the last query block of every head first (the longest when
    causal, :func:`~.._tile_ops.last_tile_first`); bh: its head; hkv = bh // G: its key/value head;
    n_j: the key blocks it visits (all Tc, or up to the last visible one when causal).
    """
    CAUSAL = causal

    @jit(device=True, inline="always")
    def start(Nq, Nk, G):
        r0, bh = last_tile_first(Nq, Br)
        n_j = (Nk + Bc - 1) // Bc
        if CAUSAL:
            n_j = _n_visible(r0, Br, Bc, Nq, Nk)
        return r0, bh, kv_head(bh, G), n_j

    return start


@lru_cache(maxsize=None)
def product_plan(d: int, Br: int, Bc: int, dtype_name: str, causal: bool, count: bool, by_rows: bool):
    """Constants and device functions of a product kernel ``C = alpha * sum A B``, one thread block per C tile.

    ``by_rows`` (rowprod): C_i, the K = Bc keys of block j per step, A_ij^T in shared memory (row
    stride AS = QS), B_j; a thread owns TM = Br / 8 rows of C_i.  Otherwise (colprod): C_j, the K = Br
    queries of block i per step, A_ij (row stride AS = KS), B_i; a thread owns TM = TMc = Bc / 8 rows
    of C_j.  B's tile is padded to DP columns.  Fields: ``TM, TD, AS, ACC, SB, ALIGN``, the shared sizes
    ``A_SIZE, B_SIZE`` and the device functions

    * ``start(Bs, acc, tid)``: B's padding columns d..DP and the thread's C micro-tile to 0;
    * ``load(a_in, b_in, h_a, h_b, r0, c0, Nq, Nk, A, Bs, tid) -> elements``: after a barrier, tile
      (r0, c0) of head h_a of ``a_in`` and the rows of head h_b of ``b_in`` that it multiplies, then a barrier;
    * ``accumulate(A, Bs, acc, ty, tx, r0, c0, Nq, Nk)``: acc += the thread's part of the product;
      on a tile that the diagonal crosses (causal) a masked entry of A adds nothing, Inf or NaN in B or not,
      and a visible one multiplies, 0 or not (IEEE, as the reference);
    * ``finish(c_out, h, row0, n_rows, ty, tx, alpha, acc, counter, nr, nw)``: acc *= alpha, stored at
      rows row0 + ty*TM .. of head h (n_rows rows in all), and the bytes counted when ``count``.
    """
    dtype = np.dtype(dtype_name)
    g = geometry(Br, Bc, d, dtype)
    TM, TD, DP = (g["TM"], g["TD"], g["DP"]) if by_rows else (g["TMc"], g["TD"], g["DP"])
    AS, K = (g["QS"], Bc) if by_rows else (g["KS"], Br)
    ACC = acc_nb_type(dtype)
    acc_name = str(ACC)
    SB = dtype.itemsize
    _, _, ZERO = _consts(dtype)
    BY_ROWS, CAUSAL, COUNT, PAD = by_rows, causal, count, DP - d
    # A_ij -> A[c * AS + r] (transposed) or A[r * AS + c]; B -> Bs[k * DP + x]
    load_a = tile_loader(Br, Bc, 1, AS, acc_name) if by_rows else tile_loader(Br, Bc, AS, 1, acc_name)
    load_b = tile_loader(K, d, DP, 1, acc_name)
    product = micro_product(TM, TD, K, AS, DP, acc_name)
    # on a tile the diagonal crosses, a masked entry adds nothing (A_ij^T: k over keys; A_ij: k over queries)
    product_masked = micro_product(TM, TD, K, AS, DP, acc_name, "keys" if by_rows else "queries")
    store = tile_store(TM, TD, dtype.name)

    @jit(device=True, inline="always")
    def start(Bs, acc, tid):
        for e in range(tid, PAD * K, NT):  # padding columns d..DP of B stay 0
            Bs[(e // PAD) * DP + d + e % PAD] = ZERO
        for u in range(TM):
            for x in range(TD):
                acc[u, x] = ZERO

    @jit(device=True, inline="always")
    def load(a_in, b_in, h_a, h_b, r0, c0, Nq, Nk, A, Bs, tid):
        cuda.syncthreads()  # everyone is done with the previous tiles
        n = load_a(a_in, h_a, r0, c0, Nq - r0, Nk - c0, A, tid)
        if BY_ROWS:
            n += load_b(b_in, h_b, c0, 0, Nk - c0, d, Bs, tid)  # B_j
        else:
            n += load_b(b_in, h_b, r0, 0, Nq - r0, d, Bs, tid)  # B_i
        cuda.syncthreads()
        return n

    @jit(device=True, inline="always")
    def accumulate(A, Bs, acc, ty, tx, r0, c0, Nq, Nk):
        if CAUSAL and crosses_diagonal(r0, c0, Bc, Nq, Nk):  # masked entries add nothing, Inf/NaN or not
            product_masked(A, ty * TM, Bs, tx * TD, acc, r0 + (Nk - Nq) - c0, ty)
        else:
            product(A, ty * TM, Bs, tx * TD, acc)

    @jit(device=True, inline="always")
    def finish(c_out, h, row0, n_rows, ty, tx, alpha, acc, counter, nr, nw):
        for u in range(TM):
            for x in range(TD):
                acc[u, x] *= alpha
        rt = row0 + ty * TM
        n = store(c_out, h, rt, tx * TD, n_rows - rt, d - tx * TD, acc)
        if COUNT:
            nw += n * SB
            add_counts(counter, nr, nw)

    return SimpleNamespace(TM=TM, TD=TD, AS=AS, ACC=ACC, SB=SB, ALIGN=_align(), A_SIZE=K * AS, B_SIZE=K * DP,
                           start=start, load=load, accumulate=accumulate, finish=finish)
