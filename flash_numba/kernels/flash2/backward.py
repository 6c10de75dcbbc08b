"""flash2's backward kernels 2 and 3 (after D = rowsum(dO*O)): dK_j, dV_j per key block, dQ_i per query block.

Both recompute S_ij = Q_i K_j^T and dP_ij = dO_i V_j^T (:func:`.thread_tiles.two_products`), then
P_ij = exp(scale S_ij - L_i) and dS_ij = P_ij * (dP_ij - D_i) (:func:`.thread_tiles.p_ds_tile`) and add
their products into accumulators held in registers (:func:`.thread_tiles.accumulate`), which are
written once at the end.  The dK, dV kernel computes its tiles transposed (its thread rows are keys).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from ...device import jit
from .._common import acc_nb_type, group_step, heavy_first_block, kv_head
from ..causal import crosses_diagonal_dev as crosses_diagonal
from ..causal import first_visible_q_block_dev as first_visible_q_block
from ..causal import visible_kv_blocks_dev as visible_kv_blocks
from .layout import TX, TY, cdiv, kernel_constants
from .thread_tiles import accumulate, load_pair, load_query_side, p_ds_tile, store_rows, two_products


@functools.lru_cache(maxsize=None)
def _block_step(d: int, Br: int, Bc: int, transposed: bool, causal: bool, dropout: bool, acc_name: str):
    """Device function ``(acc1, acc2, Q_i, dO_i, K_j, V_j, P, dS, L_i, D_i, ty, tx, i0, j0, Nq, Nk, bh, scale,
    seed, threshold, inv_keep)``: one (query block i, key block j) step of a backward kernel, its tiles loaded.

    This thread's entries of S_ij = Q_i K_j^T and dP_ij = dO_i V_j^T, then P_ij = exp(scale S_ij - L_i)
    and dS_ij = P_ij * (Zs dP_ij - D_i) (0 where masked; Zs the dropout mask regenerated, 1 without
    dropout) into the shared tiles, a barrier, and the products into the accumulators (a masked entry
    adds nothing, even against Inf or NaN; a visible one multiplies, 0 or not).  ``transposed`` (the dK, dV
    kernel: its thread rows are the keys): S^T, dP^T; Zs P_ij^T into P, dS_ij^T into dS; acc1 = dV_j +=
    P_ij^T dO_i and acc2 = dK_j += dS_ij^T Q_i over the query rows that exist.  Otherwise (the dQ kernel):
    dS_ij into dS and acc1 = dQ_i += dS_ij K_j over the keys that exist (acc2 and P unused).
    """
    TRANSPOSED, CAUSAL = transposed, causal
    ACC = acc_nb_type(np.dtype(acc_name))
    rows, cols = (Bc, Br) if transposed else (Br, Bc)  # of the S tile: keys x queries when transposed
    RA, CB, XB = cdiv(rows, TY), cdiv(cols, TX), cdiv(d, TX)
    S_REGS = (RA, CB)
    products, p_ds = two_products(RA, CB, acc_name), p_ds_tile(RA, CB, Br, Bc, transposed, causal, dropout, acc_name)
    add_products = accumulate(RA, XB, transposed, acc_name)

    @jit(device=True, forceinline=True)
    def step(acc1, acc2, Q_i, dO_i, K_j, V_j, P, dS, L_i, D_i, ty, tx, i0, j0, Nq, Nk, bh, scale, seed, threshold,
             inv_keep):
        S = cuda.local.array(S_REGS, ACC)  # this thread's entries of S_ij (S_ij^T when transposed)
        dP = cuda.local.array(S_REGS, ACC)  # ... of dP_ij
        if TRANSPOSED:
            products(S, dP, K_j, V_j, Q_i, dO_i, ty, tx, Bc, Br, d)
        else:
            products(S, dP, Q_i, dO_i, K_j, V_j, ty, tx, Br, Bc, d)
        p_ds(P, dS, S, dP, L_i, D_i, ty, tx, i0, j0, Nq, Nk, bh, scale, seed, threshold, inv_keep)
        cuda.syncthreads()
        masked = CAUSAL and crosses_diagonal(i0, j0, Bc, Nq, Nk)  # uniform; False without a mask
        if TRANSPOSED:
            add_products(acc1, acc2, P, dS, dO_i, Q_i, min(Br, Nq - i0), masked, i0, j0, Nq, Nk, ty, tx, Bc, d)
        else:
            add_products(acc1, acc1, dS, dS, K_j, K_j, min(Bc, Nk - j0), masked, i0, j0, Nq, Nk, ty, tx, Br, d)

    return step


@functools.lru_cache(maxsize=None)
def _backward_kernels(d, Br, Bc, dtype, causal, count, dropout, grouped):
    """Kernels 2 and 3 of the backward, ``(dK, dV kernel, dQ kernel)``, for head dim d, blocks (Br, Bc), ``dtype``;
    ``grouped`` (grouped-query attention, G > 1) specialises the dQ kernel only (see :func:`_dkdv_kernel`).

    A block keeps the side it owns in shared memory (row-major) and its accumulators in registers, and
    loads the other side's blocks with an odd row stride (d | 1), as the 16 threads of a row read them down
    a column (16 banks).  The dK, dV block owns key rows, so its thread grid deals out key rows c over ty and
    query rows r over tx: S_ij is computed transposed, and the thread that holds S_ij^T[c, :] holds dK_j[c, :].
    """
    ACC, acc, IN_BYTES, L_BYTES = kernel_constants(dtype)
    ZERO = acc(0)
    CA, RA, XB = cdiv(Bc, TY), cdiv(Br, TY), cdiv(d, TX)  # key rows, query rows, columns of d per thread
    KV_HELD, Q_HELD, KV_STREAMED, Q_STREAMED = (Bc, d), (Br, d), (Bc, d | 1), (Br, d | 1)
    PT_TILE, DS_TILE, KV_REGS, Q_REGS = (Bc, Br), (Br, Bc), (CA, XB), (RA, XB)
    CAUSAL, COUNT, GROUPED = causal, count, grouped
    dkdv_step, dq_step = (_block_step(d, Br, Bc, keys, causal, dropout, np.dtype(acc).name) for keys in (True, False))
    store_kv, store_q = (store_rows(rows, XB, pair, count, IN_BYTES) for rows, pair in ((CA, True), (RA, False)))

    @jit
    def flash2_dkdv(q, k, v, do, lse, D, dk, dv, counter, Nq, Nk, G, scale, seed, threshold, inv_keep):
        t = cuda.threadIdx.x
        ty, tx = t // TX, t % TX
        hkv, j0 = cuda.blockIdx.x, cuda.blockIdx.y * Bc  # key/value head and the first key row of K_j
        nr = 0

        K_j = cuda.shared.array(KV_HELD, ACC)
        V_j = cuda.shared.array(KV_HELD, ACC)
        Q_i = cuda.shared.array(Q_STREAMED, ACC)
        dO_i = cuda.shared.array(Q_STREAMED, ACC)
        PT = cuda.shared.array(PT_TILE, ACC)  # P_ij^T
        dST = cuda.shared.array(PT_TILE, ACC)  # dS_ij^T
        L_i = cuda.shared.array(Br, ACC)
        D_i = cuda.shared.array(Br, ACC)
        dK = cuda.local.array(KV_REGS, ACC)  # this thread's entries of dK_j (without the factor scale)
        dV = cuda.local.array(KV_REGS, ACC)  # ... of dV_j

        # Load K_j, V_j; dK_j = 0, dV_j = 0 on chip.
        n = load_pair(K_j, V_j, k, v, hkv, j0, Nk, d, t)
        if COUNT:
            nr += n * IN_BYTES
        for a in range(CA):
            for xb in range(XB):
                dK[a, xb] = ZERO
                dV[a, xb] = ZERO

        # The query blocks i: all, or (causal) from the one holding the first query that sees key j0,
        # of each query head bh of the group (grouped-query attention: G of them) in turn.
        Tr = (Nq + Br - 1) // Br
        i_first = first_visible_q_block(j0, Br, Nq, Nk, CAUSAL)
        for step in range(G * (Tr - i_first)):
            bh, i = group_step(step, Tr - i_first, i_first, hkv, G)
            i0 = i * Br
            cuda.syncthreads()  # the previous step has finished reading Q_i, dO_i, P^T, dS^T
            # Load Q_i, dO_i, L_i, D_i.
            n, n_vec = load_query_side(Q_i, dO_i, L_i, D_i, q, do, lse, D, bh, i0, Nq, d, t)
            if COUNT:
                nr += n * IN_BYTES + n_vec * L_BYTES
            cuda.syncthreads()

            # S_ij^T, dP_ij^T recomputed, P_ij^T and dS_ij^T into PT, dST; dV_j += P_ij^T dO_i, dK_j += dS_ij^T Q_i
            dkdv_step(dV, dK, Q_i, dO_i, K_j, V_j, PT, dST, L_i, D_i, ty, tx, i0, j0, Nq, Nk, bh, scale, seed,
                      threshold, inv_keep)

        # Write dK_j = scale * sum_i dS_ij^T Q_i and dV_j once (and, counting, add this thread's bytes).
        store_kv(dk, dK, dv, dV, scale, hkv, j0, Bc, Nk, ty, tx, d, counter, nr)

    @jit
    def flash2_dq(q, k, v, do, lse, D, dq, counter, Nq, Nk, G, scale, seed, threshold, inv_keep):
        t = cuda.threadIdx.x
        ty, tx = t // TX, t % TX
        bh, i0 = cuda.blockIdx.x, heavy_first_block(Br)
        # G = 1 compiled apart: kv_head's result would stay live across the loop (98 -> 96 registers, 4 -> 5 blocks/SM)
        hkv = kv_head(bh, G) if GROUPED else bh
        nr = 0

        Q_i = cuda.shared.array(Q_HELD, ACC)
        dO_i = cuda.shared.array(Q_HELD, ACC)
        K_j = cuda.shared.array(KV_STREAMED, ACC)
        V_j = cuda.shared.array(KV_STREAMED, ACC)
        dS_ij = cuda.shared.array(DS_TILE, ACC)
        L_i = cuda.shared.array(Br, ACC)
        D_i = cuda.shared.array(Br, ACC)
        dQ = cuda.local.array(Q_REGS, ACC)  # this thread's entries of dQ_i (without the factor scale)

        # Load Q_i, dO_i, L_i, D_i once; dQ_i = 0 on chip.
        n, n_vec = load_query_side(Q_i, dO_i, L_i, D_i, q, do, lse, D, bh, i0, Nq, d, t)
        if COUNT:
            nr += n * IN_BYTES + n_vec * L_BYTES
        for a in range(RA):
            for xb in range(XB):
                dQ[a, xb] = ZERO

        for j in range(visible_kv_blocks(i0, Br, Bc, Nq, Nk, CAUSAL)):
            j0 = j * Bc
            cuda.syncthreads()  # the previous step has finished reading K_j, dS_ij
            n = load_pair(K_j, V_j, k, v, hkv, j0, Nk, d, t)
            if COUNT:
                nr += n * IN_BYTES
            cuda.syncthreads()

            # S_ij, dP_ij recomputed, dS_ij into the shared tile; dQ_i += dS_ij K_j
            dq_step(dQ, dQ, Q_i, dO_i, K_j, V_j, dS_ij, dS_ij, L_i, D_i, ty, tx, i0, j0, Nq, Nk, bh, scale, seed,
                    threshold, inv_keep)

        # Write dQ_i = scale * sum_j dS_ij K_j once (and, counting, add this thread's bytes).
        store_q(dq, dQ, dq, dQ, scale, bh, i0, Br, Nq, ty, tx, d, counter, nr)

    return flash2_dkdv, flash2_dq


def _dkdv_kernel(d, Br, Bc, dtype, causal, count, dropout=False):
    """Kernel 2 of the backward: dK_j, dV_j for one key block per thread block, for any G.

    Not specialised on G = 1: compiled with ``bh = hkv`` and no group loop, ptxas gives it 4-6 registers fewer at
    d = 64 but the same 4 blocks per SM (sm_90), and elsewhere as many blocks lost as gained.
    """
    return _backward_kernels(d, Br, Bc, dtype, causal, count, dropout, False)[0]


def _dq_kernel(d, Br, Bc, dtype, causal, count, dropout=False, grouped=False):
    """Kernel 3 of the backward: dQ_i for one query block per thread block."""
    return _backward_kernels(d, Br, Bc, dtype, causal, count, dropout, grouped)[1]
