"""Standard attention's backward kernels: P and dS = P (dP - D) per tile, from Q and K or from the forward's S;
C_j = alpha A^T B (dV, dK)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda, uint32

from ... import _inputs
from .. import _dropout
from ..causal import crosses_diagonal_dev as crosses_diagonal
from ...device import jit
from .._common import acc_nb_type, add_counts, exp_ieee, group_step, nb_type, rounded_mul
from .._tile_ops import fast_kernel, NT, micro_product, tile_loader, tile_store
from .layout import _align, _consts, geometry
from .steps import product_plan, query_block, thread_tile


@lru_cache(maxsize=None)
def colprod_kernel(d: int, Br: int, Bc: int, dtype_name: str, causal: bool, count: bool):
    """``C_j = alpha * sum_i A_ij^T B_i`` (``dV = P^T dO``; ``dK = scale dS^T Q``), one key block per thread block.

    ``a``: (BH, Nq, Nk) storage dtype, read in the visible tiles only; ``b``: (BH, Nq, d);
    ``c``: (BH / G, Nk, d), head hkv the sum over the G row heads hkv*G .. of its group (grouped-query
    attention).  Launch ``kernel[Tc * BH / G, 128](a, b, c, Nq, Nk, G, alpha, counter)``.
    Thread (ty, tx) owns keys ``ty*TMc ..`` (TMc = Bc / 8) and columns ``tx*TD ..`` of C_j.
    """
    p = product_plan(d, Br, Bc, dtype_name, causal, count, by_rows=False)
    TMc, TD, ACC, SB, ALIGN, A_SIZE, B_SIZE = p.TM, p.TD, p.ACC, p.SB, p.ALIGN, p.A_SIZE, p.B_SIZE
    start, load, accumulate, finish = p.start, p.load, p.accumulate, p.finish
    CAUSAL, COUNT = causal, count

    def kernel(a_in, b_in, c_out, Nq, Nk, G, alpha, counter):
        As = cuda.shared.array(A_SIZE, ACC, alignment=ALIGN)  # A_ij (Br, AS)
        Bs = cuda.shared.array(B_SIZE, ACC, alignment=ALIGN)  # B_i (Br, DP)
        acc = cuda.local.array((TMc, TD), ACC)
        tid, ty, tx = thread_tile()
        # 1-D grid, key block after key block for every head; the first key blocks are
        # the longest when causal (every query block sees them), so they start first
        Tc = (Nk + Bc - 1) // Bc
        BHkv = cuda.gridDim.x // Tc
        c0 = (cuda.blockIdx.x // BHkv) * Bc
        hkv = cuda.blockIdx.x % BHkv  # the key/value head
        nr = 0
        nw = 0
        Tr = (Nq + Br - 1) // Br
        i0 = 0
        if CAUSAL:  # the first query row that sees key c0 is c0 - (Nk - Nq)
            first = c0 - (Nk - Nq)
            i0 = 0 if first <= 0 else min(first // Br, Tr)
        start(Bs, acc, tid)
        for step in range(G * (Tr - i0)):  # the query blocks of each row head bh of the group in turn
            bh, i = group_step(step, Tr - i0, i0, hkv, G)
            r0 = i * Br
            n = load(a_in, b_in, bh, bh, r0, c0, Nq, Nk, As, Bs, tid)  # A_ij (P_ij, dS_ij), B_i (dO_i, Q_i)
            if COUNT:
                nr += n * SB
            accumulate(As, Bs, acc, ty, tx, r0, c0, Nq, Nk)
        finish(c_out, hkv, c0, Nk, ty, tx, alpha, acc, counter, nr, nw)

    return fast_kernel(kernel)


@lru_cache(maxsize=None)
def row_stats(Br: int, TM: int, dtype_name: str, count: bool):
    """``stage(lse, D, bh, r0, Nq, tid, ty, Ls, Ds, Lr, Dr) -> bytes read``: the block's Br rows of L and D
    (from ``r0``; +inf and 0 past Nq) into the shared ``Ls``, ``Ds``, a barrier, then the thread's TM rows of them
    (from ``ty * TM``) into its ``Lr``, ``Dr``: the start of both P and dS kernels.  The bytes when counting, else 0."""
    dtype = np.dtype(dtype_name)
    _, POS_INF, ZERO = _consts(dtype)
    AB, COUNT = _inputs.acc_dtype(dtype).itemsize, count

    @jit(device=True)
    def stage(lse, D, bh, r0, Nq, tid, ty, Ls, Ds, Lr, Dr):
        nr = 0
        if tid < Br:
            Lv = POS_INF
            Dv = ZERO
            if r0 + tid < Nq:
                Lv = lse[bh, r0 + tid]
                Dv = D[bh, r0 + tid]
                if COUNT:
                    nr += 2 * AB
            Ls[tid] = Lv
            Ds[tid] = Dv
        cuda.syncthreads()
        for a in range(TM):
            Lr[a] = Ls[ty * TM + a]
            Dr[a] = Ds[ty * TM + a]
        return nr

    return stage


@lru_cache(maxsize=None)
def grad_scores_kernel(d: int, Br: int, Bc: int, dtype_name: str, causal: bool, count: bool, dropout: bool = False):
    """``P = exp(S - L)`` and ``dS = P * (dP - D)``, ``dP = dO V^T``, for the visible tiles, one query block per
    thread block; P and dS are written to HBM, dP never leaves the registers.  With ``dropout`` (the paper's
    Algorithm 4, Zs: dropout's factor regenerated from the seed): dS = P * (Zs dP - D), and the P written
    is Zs P, the matrix dV = P^T dO needs.

    Launch ``kernel[Tr * BH, 128](q, k, v, do, lse, D, p, ds, Nq, Nk, G, scale, counter, seed, threshold,
    inv_keep)`` (k, v: head bh // G; the last three: dropout's, used iff ``dropout``).
    Q_i and dO_i stay in shared memory; V_j, then K_j pass through one buffer.  P is
    ``exp(S - L)`` of exactly the S the forward stored (the same products in the same
    order, the same scale, rounded to the storage dtype), so it differs from the
    forward's P only by a factor per row (L's rounding), which D = rowsum(dO O)
    cancels: with scores of 1e4 a differently rounded S would put noise of ~1e-3
    into each P_ij, which the sum dS K no longer cancels.  Where the forward computes S
    on tensor cores (float16 from compute capability 7.5) this kernel's float32 sum
    would round, now and then, to the neighbouring float16 value (one ulp: 0.5 at
    |S| = 1e3, P off by e^0.5): there the backward runs the forward's S launch again
    and :func:`grad_scores_from_s_kernel` instead.
    """
    dtype = np.dtype(dtype_name)
    g = geometry(Br, Bc, d, dtype)
    TM, TN, DP, QS, KS = g["TM"], g["TN"], g["DP"], g["QS"], g["KS"]
    ACC = acc_nb_type(dtype)
    acc_name = str(ACC)
    SB, AB = dtype.itemsize, _inputs.acc_dtype(dtype).itemsize
    ZERO = _consts(dtype)[2]
    ST = nb_type(dtype)
    ROUND = SB < AB
    MUL_RN = rounded_mul(_inputs.acc_dtype(dtype))
    CAUSAL, COUNT, ALIGN, PAD = causal, count, _align(), DP - d
    block_start = query_block(Br, Bc, causal)
    load_q = tile_loader(Br, d, 1, QS, acc_name)  # Q_i, dO_i -> (DP, QS) transposed
    load_k = tile_loader(Bc, d, 1, KS, acc_name)  # K_j, V_j -> (DP, KS) transposed
    product = micro_product(TM, TN, DP, QS, KS, acc_name)
    store = tile_store(TM, TN, dtype.name)
    drop_head, drop_row, drop = _dropout.factor(dropout, _inputs.acc_dtype(dtype).name)
    stage_rows = row_stats(Br, TM, dtype.name, count)

    QT_SIZE, KT_SIZE = DP * QS, DP * KS  # shared-array sizes must be constants
    def kernel(q, k, v, do, lse, D, p_out, ds_out, Nq, Nk, G, scale, counter, seed, threshold, inv_keep):
        QT = cuda.shared.array(QT_SIZE, ACC, alignment=ALIGN)  # Q_i^T (DP, QS)
        dOT = cuda.shared.array(QT_SIZE, ACC, alignment=ALIGN)  # dO_i^T (DP, QS)
        XT = cuda.shared.array(KT_SIZE, ACC, alignment=ALIGN)  # V_j^T, then K_j^T (DP, KS)
        Ls = cuda.shared.array(Br, ACC)  # L_i as given (+inf past Nq)
        Ds = cuda.shared.array(Br, ACC)  # D_i
        s = cuda.local.array((TM, TN), ACC)  # S, then P
        dp = cuda.local.array((TM, TN), ACC)  # dP, then dS
        Lr = cuda.local.array(TM, ACC)
        Dr = cuda.local.array(TM, ACC)
        tid, ty, tx = thread_tile()
        r0, bh, hkv, n_j = block_start(Nq, Nk, G)
        off = Nk - Nq
        nr = 0
        nw = 0

        n = load_q(q, bh, r0, 0, Nq - r0, d, QT, tid)
        n += load_q(do, bh, r0, 0, Nq - r0, d, dOT, tid)
        if COUNT:
            nr += n * SB
        for e in range(tid, PAD * QS, NT):  # padding rows d..DP stay 0
            QT[d * QS + e] = ZERO
            dOT[d * QS + e] = ZERO
        for e in range(tid, PAD * KS, NT):
            XT[d * KS + e] = ZERO
        nr += stage_rows(lse, D, bh, r0, Nq, tid, ty, Ls, Ds, Lr, Dr)
        rt = r0 + ty * TM
        for j in range(n_j):
            c0 = j * Bc
            ct = c0 + tx * TN
            cuda.syncthreads()  # everyone is done with the previous K_j
            n = load_k(v, hkv, c0, 0, Nk - c0, d, XT, tid)
            cuda.syncthreads()
            for a in range(TM):
                for b in range(TN):
                    s[a, b] = ZERO
                    dp[a, b] = ZERO
            product(dOT, ty * TM, XT, tx * TN, dp)  # dP = dO_i V_j^T
            cuda.syncthreads()  # everyone is done with V_j
            n += load_k(k, hkv, c0, 0, Nk - c0, d, XT, tid)
            if COUNT:
                nr += n * SB
            cuda.syncthreads()
            product(QT, ty * TM, XT, tx * TN, s)  # S = Q_i K_j^T (unscaled)
            edge = c0 + Bc > Nk or (CAUSAL and crosses_diagonal(r0, c0, Bc, Nq, Nk))  # uniform over the block
            for a in range(TM):
                lim = Nk - 1 - ct  # keys ct + b with b <= lim exist and are visible
                if CAUSAL:
                    lim = min(lim, rt + a + off - ct)
                rk = drop_row(drop_head(seed, bh), rt + a)  # dropout's hash of the row
                for b in range(TN):
                    x = MUL_RN(scale, s[a, b])  # S as the forward stored it (rounded_mul: not fused)
                    if ROUND:
                        x = ACC(ST(x))
                    pv = ZERO  # masked, or past Nk: P = dS = 0, whatever S, dP and L
                    ds = ZERO
                    if not (edge and b > lim):
                        pv = exp_ieee(x - Lr[a])  # the given L, unclamped
                        zs = drop(rk, ct + b, threshold, inv_keep)
                        ds = pv * (zs * dp[a, b] - Dr[a])
                        pv *= zs
                    s[a, b] = pv
                    dp[a, b] = ds
            n = store(p_out, bh, rt, ct, Nq - rt, Nk - ct, s)
            n += store(ds_out, bh, rt, ct, Nq - rt, Nk - ct, dp)
            if COUNT:
                nw += n * SB
        if COUNT:
            add_counts(counter, nr, nw)

    return fast_kernel(kernel)


@lru_cache(maxsize=None)
def grad_scores_from_s_kernel(d: int, Br: int, Bc: int, dtype_name: str, causal: bool, count: bool,
                              dropout: bool = False):
    """:func:`grad_scores_kernel` with S read from HBM: ``P = exp(S - L)`` and ``dS = P * (dP - D)``,
    ``dP = dO V^T``, for the visible tiles, one query block per thread block, from the S that the forward's own
    S launch wrote (float16 on tensor cores: the backward runs that launch first, at any block of its own), so that
    P is exp(S - L) of the forward's S bit for bit and D = rowsum(dO O) cancels its rows' factor exactly.

    Launch ``kernel[Tr * BH, 128](s, v, do, lse, D, p, ds, Nq, Nk, G, counter, seed, threshold, inv_keep)``
    (v: head bh // G; the last three: dropout's, as there).  ``s`` (BH, Nq, Nk) is read at the visible entries
    only (every one of them lies in a tile the S launch wrote, whatever its block; a masked entry gives P = dS = 0
    unread); ``p`` may be ``s`` itself: each thread reads its entries of S before it writes P over them, and no
    other thread reads them.  dO_i stays in shared memory; the V_j pass through one buffer.
    """
    dtype = np.dtype(dtype_name)
    g = geometry(Br, Bc, d, dtype)
    TM, TN, DP, QS, KS = g["TM"], g["TN"], g["DP"], g["QS"], g["KS"]
    ACC = acc_nb_type(dtype)
    acc_name = str(ACC)
    SB = dtype.itemsize
    ZERO = _consts(dtype)[2]
    CAUSAL, COUNT, ALIGN, PAD = causal, count, _align(), DP - d
    block_start = query_block(Br, Bc, causal)
    load_do = tile_loader(Br, d, 1, QS, acc_name)  # dO_i -> (DP, QS) transposed
    load_v = tile_loader(Bc, d, 1, KS, acc_name)  # V_j -> (DP, KS) transposed
    product = micro_product(TM, TN, DP, QS, KS, acc_name)
    store = tile_store(TM, TN, dtype.name)
    drop_head, drop_row, drop = _dropout.factor(dropout, _inputs.acc_dtype(dtype).name)
    stage_rows = row_stats(Br, TM, dtype.name, count)

    QT_SIZE, KT_SIZE = DP * QS, DP * KS  # shared-array sizes must be constants
    def kernel(s_in, v, do, lse, D, p_out, ds_out, Nq, Nk, G, counter, seed, threshold, inv_keep):
        dOT = cuda.shared.array(QT_SIZE, ACC, alignment=ALIGN)  # dO_i^T (DP, QS)
        VT = cuda.shared.array(KT_SIZE, ACC, alignment=ALIGN)  # V_j^T (DP, KS)
        Ls = cuda.shared.array(Br, ACC)  # L_i as given (+inf past Nq)
        Ds = cuda.shared.array(Br, ACC)  # D_i
        s = cuda.local.array((TM, TN), ACC)  # P
        dp = cuda.local.array((TM, TN), ACC)  # dP, then dS
        Lr = cuda.local.array(TM, ACC)
        Dr = cuda.local.array(TM, ACC)
        tid, ty, tx = thread_tile()
        r0, bh, hkv, n_j = block_start(Nq, Nk, G)
        off = Nk - Nq
        nr = 0
        nw = 0

        n = load_do(do, bh, r0, 0, Nq - r0, d, dOT, tid)
        if COUNT:
            nr += n * SB
        for e in range(tid, PAD * QS, NT):  # padding rows d..DP stay 0
            dOT[d * QS + e] = ZERO
        for e in range(tid, PAD * KS, NT):
            VT[d * KS + e] = ZERO
        nr += stage_rows(lse, D, bh, r0, Nq, tid, ty, Ls, Ds, Lr, Dr)
        rt = r0 + ty * TM
        bh_u = uint32(bh)
        for j in range(n_j):
            c0 = j * Bc
            ct = c0 + tx * TN
            cuda.syncthreads()  # everyone is done with the previous V_j
            n = load_v(v, hkv, c0, 0, Nk - c0, d, VT, tid)
            if COUNT:
                nr += n * SB
            cuda.syncthreads()
            for a in range(TM):
                for b in range(TN):
                    dp[a, b] = ZERO
            product(dOT, ty * TM, VT, tx * TN, dp)  # dP = dO_i V_j^T
            for a in range(TM):
                lim = Nk - 1 - ct  # keys ct + b with b <= lim exist and are visible to row rt + a
                if CAUSAL:
                    lim = min(lim, rt + a + off - ct)
                if rt + a >= Nq:
                    lim = -1  # past Nq: nothing to read (the stores leave those rows out)
                rk = drop_row(drop_head(seed, bh), rt + a)  # dropout's hash of the row
                for b in range(TN):
                    pv = ZERO  # masked, or past Nq or Nk: P = dS = 0, S unread
                    ds = ZERO
                    if b <= lim:
                        x = ACC(s_in[bh_u, uint32(rt + a), uint32(ct + b)])  # the forward's S, as it stored it
                        if COUNT:
                            nr += SB
                        pv = exp_ieee(x - Lr[a])  # the given L, unclamped
                        zs = drop(rk, ct + b, threshold, inv_keep)
                        ds = pv * (zs * dp[a, b] - Dr[a])
                        pv *= zs
                    s[a, b] = pv
                    dp[a, b] = ds
            n = store(p_out, bh, rt, ct, Nq - rt, Nk - ct, s)
            n += store(ds_out, bh, rt, ct, Nq - rt, Nk - ct, dp)
            if COUNT:
                nw += n * SB
        if COUNT:
            add_counts(counter, nr, nw)

    return fast_kernel(kernel)
