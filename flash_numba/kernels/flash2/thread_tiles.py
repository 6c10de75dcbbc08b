"""flash2's device functions: tile loads by the 128 threads, and a thread's share of the block products.

Thread (ty, tx) of the 8 x 16 grid holds the entries (ty + 8a, tx + 16b) of a (rows x columns) tile
and the columns tx + 16 xb of a (rows x d) accumulator (see :mod:`flash_numba.kernels.flash2`).
Factories return ``@jit(device=True, forceinline=True)`` functions specialised on their register
tile's shape (closure constants): inlined, their local arrays become registers of the calling kernel.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from ...device import jit
from .. import _dropout
from .._common import acc_nb_type, add_counts, exp_ieee, rounded_mul
from .._tile_ops import load_rows, load_vector
from ..causal import visible_dev as visible
from .layout import NT, TX, TY


@jit(device=True, forceinline=True)
def load_pair(A, B, a, b, bh, row0, n_rows, d, t):
    """Rows row0, ... of ``a[bh]`` and ``b[bh]`` (d columns) into the shared tiles A and B (zeros past n_rows).

    ``d`` is the kernel's compile-time head dim: with it the index arithmetic divides by a constant.
    """
    return load_rows(A, a, bh, row0, n_rows, d, t, NT) + load_rows(B, b, bh, row0, n_rows, d, t, NT)


@jit(device=True, forceinline=True)
def load_query_side(Q_i, dO_i, L_i, D_i, q, do, lse, D, bh, i0, Nq, d, t):
    """Q_i, dO_i (tiles) and L_i, D_i (vectors) of the query block at row i0: (elements of q and dO, of L and D)."""
    n_vec = load_vector(L_i, lse, bh, i0, Nq, t, NT) + load_vector(D_i, D, bh, i0, Nq, t, NT)
    return load_pair(Q_i, dO_i, q, do, bh, i0, Nq, d, t), n_vec


@functools.lru_cache(maxsize=None)
def two_products(RA: int, CB: int, acc_name: str):
    """Device function ``(S, dP, A1, A2, B1, B2, ty, tx, nA, nB, d)``: a thread's S = A1 B1^T and dP = A2 B2^T.

    Thread (ty, tx) computes entries (ty + 8a, tx + 16b) (rows of A past nA, of B past nB
    repeat the last one: those entries are never stored) over d columns.  The dK/dV
    kernel calls it with A = K_j, V_j and B = Q_i, dO_i (S^T, dP^T); the dQ kernel with
    A = Q_i, dO_i and B = K_j, V_j.
    """
    ACC = acc_nb_type(np.dtype(acc_name))
    ZERO = np.dtype(acc_name).type(0)

    @jit(device=True, forceinline=True)
    def products(S, dP, A1, A2, B1, B2, ty, tx, nA, nB, d):
        b1 = cuda.local.array(CB, ACC)
        b2 = cuda.local.array(CB, ACC)
        for a in range(RA):
            for b in range(CB):
                S[a, b] = ZERO
                dP[a, b] = ZERO
        for x in range(d):
            for b in range(CB):
                r = min(tx + TX * b, nB - 1)
                b1[b] = B1[r, x]
                b2[b] = B2[r, x]
            for a in range(RA):
                r = min(ty + TY * a, nA - 1)
                a1 = A1[r, x]
                a2 = A2[r, x]
                for b in range(CB):
                    S[a, b] += a1 * b1[b]
                    dP[a, b] += a2 * b2[b]

    return products


@functools.lru_cache(maxsize=None)
def p_and_ds(acc_name: str):
    """Device function ``(s, dp, L, D, scale, visible, zs) -> (Zs P, dS)``: P = exp(scale s - L),
    dS = P (Zs dP - D), with Zs dropout's factor (1 without dropout; the paper's Algorithm 4).

    Both are 0 where the key is masked (``visible`` False), whatever s and dp; elsewhere P uses
    the given L, unclamped (exp overflows to +inf for an L far below the scores).
    """
    ZERO = np.dtype(acc_name).type(0)
    MUL_RN = rounded_mul(acc_name)  # scale * s rounded as the forward rounds it (see rounded_mul)

    @jit(device=True, forceinline=True)
    def p_and_ds(s, dp, L, D, scale, visible, zs):
        if not visible:
            return ZERO, ZERO
        p = exp_ieee(MUL_RN(scale, s) - L)
        return p * zs, p * (zs * dp - D)

    return p_and_ds


@functools.lru_cache(maxsize=None)
def p_ds_tile(RA: int, CB: int, Br: int, Bc: int, transposed: bool, causal: bool, dropout: bool, acc_name: str):
    """Device function ``(P, dS, S, dP, L_i, D_i, ty, tx, i0, j0, Nq, Nk, bh, scale, seed, threshold, inv_keep)``.

    From a thread's RA x CB entries of S_ij and dP_ij (:func:`two_products`), P_ij and dS_ij by
    :func:`p_and_ds` (0 where masked; Zs the dropout mask regenerated) into the shared tiles, for the
    entries inside the (Br x Bc) block.  ``transposed`` (the dK, dV kernel): the thread's rows are keys,
    S and dP hold S_ij^T and dP_ij^T, and Zs P_ij^T goes to P and dS_ij^T to dS (both (Bc, Br));
    otherwise (the dQ kernel) rows are queries and only dS_ij goes to dS (Br, Bc).
    """
    TRANSPOSED, CAUSAL = transposed, causal
    NU, NV = (Bc, Br) if transposed else (Br, Bc)  # rows, columns of the tile
    ds_of = p_and_ds(acc_name)
    drop_head, drop_row, drop = _dropout.factor(dropout, acc_name)

    @jit(device=True, forceinline=True)
    def tile(P, dS, S, dP, L_i, D_i, ty, tx, i0, j0, Nq, Nk, bh, scale, seed, threshold, inv_keep):
        for a in range(RA):
            u = ty + TY * a
            for b in range(CB):
                v = tx + TX * b
                if u < NU and v < NV:
                    r, c = (v, u) if TRANSPOSED else (u, v)  # query row, key column
                    seen = visible(i0 + r, j0 + c, Nq, Nk, CAUSAL)
                    zs = drop(drop_row(drop_head(seed, bh), i0 + r), j0 + c, threshold, inv_keep)
                    p, ds = ds_of(S[a, b], dP[a, b], L_i[r], D_i[r], scale, seen, zs)
                    if TRANSPOSED:
                        P[u, v] = p
                    dS[u, v] = ds

    return tile


@functools.lru_cache(maxsize=None)
def accumulate(RA: int, XB: int, pair: bool, acc_name: str):
    """Device function ``(acc1, acc2, A1, A2, B1, B2, n, masked, i0, j0, Nq, Nk, ty, tx, nA, d)``: acc1 += A1 B1
    (acc2 += A2 B2).

    A thread's RA x XB entries (rows ty + 8a, columns tx + 16 xb) of a (rows x d) accumulator,
    summed over k < n: ``A[row, k] * B[k, column]`` (rows of A past nA and columns past d repeat the
    last one: those entries are never stored).  With ``pair`` (the dK, dV kernel: dV_j += P_ij^T dO_i,
    dK_j += dS_ij^T Q_i; A's rows are keys j0 + row, k the queries i0 + k) two accumulators in one loop,
    otherwise only acc1 (dQ_i += dS_ij K_j; A's rows are queries i0 + row, k the keys j0 + k).  With ``masked``
    (uniform over the block: it holds masked entries), an entry whose query does not see its key adds nothing,
    even against Inf or NaN in B; every visible entry multiplies, 0 or not (IEEE: 0 * Inf = NaN).
    """
    ACC = acc_nb_type(np.dtype(acc_name))
    PAIR = pair

    @jit(device=True, forceinline=True)
    def acc_product(acc1, acc2, A1, A2, B1, B2, n, masked, i0, j0, Nq, Nk, ty, tx, nA, d):
        b1 = cuda.local.array(XB, ACC)
        b2 = cuda.local.array(XB, ACC)
        for k in range(n):
            for xb in range(XB):
                x = min(tx + TX * xb, d - 1)
                b1[xb] = B1[k, x]
                if PAIR:
                    b2[xb] = B2[k, x]
            for a in range(RA):
                u = min(ty + TY * a, nA - 1)
                a1 = A1[u, k]
                a2 = A2[u, k]  # unused without pair
                r, c = (k, ty + TY * a) if PAIR else (ty + TY * a, k)  # query row, key column of the entry
                if not masked or visible(i0 + r, j0 + c, Nq, Nk, True):  # a masked entry adds nothing
                    for xb in range(XB):
                        acc1[a, xb] += a1 * b1[xb]
                        if PAIR:
                            acc2[a, xb] += a2 * b2[xb]

    return acc_product


@functools.lru_cache(maxsize=None)
def store_rows(RA: int, XB: int, pair: bool, count: bool, item_bytes: int):
    """Device function ``(out1, acc1, out2, acc2, scale, bh, r0, nU, n, ty, tx, d, counter, nr)``: a kernel's end.

    A thread's entries of a (rows x d) accumulator tile (rows ty + 8a < nU, columns tx + 16 xb < d)
    to rows r0 + ty + 8a < n of ``out1[bh]``: ``scale * acc1`` (and, with ``pair``, ``acc2`` unscaled
    to ``out2[bh]``).  With ``count``, then adds the thread's bytes to ``counter``: ``nr`` read, and
    ``item_bytes`` per element written (:func:`~flash_numba.kernels._common.add_counts`).
    """
    PAIR, COUNT, IN_BYTES = pair, count, item_bytes

    @jit(device=True, forceinline=True)
    def store(out1, acc1, out2, acc2, scale, bh, r0, nU, n, ty, tx, d, counter, nr):
        put = 0
        for a in range(RA):
            u = ty + TY * a
            if u < nU and r0 + u < n:
                for xb in range(XB):
                    x = tx + TX * xb
                    if x < d:
                        out1[bh, r0 + u, x] = scale * acc1[a, xb]
                        if PAIR:
                            out2[bh, r0 + u, x] = acc2[a, xb]
                        if COUNT:
                            put += 1 + PAIR
        if COUNT:
            add_counts(counter, nr, put * IN_BYTES)

    return store
