"""Standard attention's forward kernels: S = scale Q K^T (with m, l, L), P = softmax(S), O = P V."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda, uint32

from ... import _inputs
from .. import _bf16, _dropout
from .._common import acc_nb_type, add_counts, nan_max, nb_type, rounded_mul
from .._tile_ops import half_warp_max, half_warp_sum
from .._tile_ops import NT, fast_kernel, micro_product, tile_loader, tile_store
from ..causal import crosses_diagonal_dev as crosses_diagonal
from ..causal import sees_no_key_dev as sees_no_key
from .layout import FULL_MASK, SOFTMAX_ROWS, _align, _consts, _n_visible, geometry
from .steps import product_plan, query_block, thread_tile


@lru_cache(maxsize=None)
def scores_kernel(d: int, Br: int, Bc: int, dtype_name: str, causal: bool, count: bool):
    """``S = scale * Q K^T`` for the visible tiles, its row statistics m, l and ``L = m + log l``,
    one query block per thread block.

    Launch ``kernel[Tr * BH, 128](q, k, s, lse, ml, Nq, Nk, scale, counter)``; ``ml`` is
    ``(BH, 2, Nq)``: m_i and l_i for the softmax, which normalises with them (with
    L alone, rounded to float32, the rows of P would sum to 1 + 5e-4 at |L| = 1e4:
    O would carry that factor and D = rowsum(dO O) would no longer cancel it in the
    backward).  The statistics are kept online (rescaled as a new maximum appears)
    and are those of S as stored: for float16 S is rounded to float16 first.
    """
    dtype = np.dtype(dtype_name)
    g = geometry(Br, Bc, d, dtype)
    TM, TN, DP, QS, KS = g["TM"], g["TN"], g["DP"], g["QS"], g["KS"]
    ACC, ST = acc_nb_type(dtype), nb_type(dtype)
    acc_name = str(ACC)
    SB, AB = dtype.itemsize, _inputs.acc_dtype(dtype).itemsize
    ROUND = SB < AB
    NEG_INF, _, ZERO = _consts(dtype)
    NAN = _inputs.acc_dtype(dtype).type(np.nan)
    CAUSAL, COUNT, ALIGN, PAD = causal, count, _align(), DP - d
    MUL_RN = rounded_mul(_inputs.acc_dtype(dtype))
    block_start = query_block(Br, Bc, causal)
    load_q = tile_loader(Br, d, 1, QS, acc_name)  # Q_i -> QT[x * QS + r]
    load_k = tile_loader(Bc, d, 1, KS, acc_name)  # K_j -> KT[x * KS + c]
    product = micro_product(TM, TN, DP, QS, KS, acc_name)
    store = tile_store(TM, TN, dtype.name)

    QT_SIZE, KT_SIZE = DP * QS, DP * KS  # shared-array sizes must be constants
    def kernel(q, k, s_out, lse, ml, Nq, Nk, G, scale, counter):
        QT = cuda.shared.array(QT_SIZE, ACC, alignment=ALIGN)  # Q_i^T (DP, QS)
        KT = cuda.shared.array(KT_SIZE, ACC, alignment=ALIGN)  # K_j^T (DP, KS)
        s = cuda.local.array((TM, TN), ACC)
        m = cuda.local.array(TM, ACC)
        l = cuda.local.array(TM, ACC)
        tid, ty, tx = thread_tile()
        r0, bh, hkv, n_j = block_start(Nq, Nk, G)  # the last (longest when causal) query block of every head first
        off = Nk - Nq
        nr = 0
        nw = 0

        n = load_q(q, bh, r0, 0, Nq - r0, d, QT, tid)
        if COUNT:
            nr += n * SB
        for e in range(tid, PAD * QS, NT):  # padding rows d..DP of Q^T and K^T stay 0
            QT[d * QS + e] = ZERO
        for e in range(tid, PAD * KS, NT):
            KT[d * KS + e] = ZERO
        for a in range(TM):
            m[a] = NEG_INF
            l[a] = ZERO
        rt = r0 + ty * TM  # this thread's first row
        for j in range(n_j):
            c0 = j * Bc
            cuda.syncthreads()  # everyone is done with the previous K_j
            n = load_k(k, hkv, c0, 0, Nk - c0, d, KT, tid)
            if COUNT:
                nr += n * SB
            cuda.syncthreads()
            for a in range(TM):
                for b in range(TN):
                    s[a, b] = ZERO
            product(QT, ty * TM, KT, tx * TN, s)
            for a in range(TM):
                for b in range(TN):
                    x = MUL_RN(scale, s[a, b])  # rounded: the backward recomputes it so (rounded_mul)
                    s[a, b] = ACC(ST(x)) if ROUND else x
            ct = c0 + tx * TN  # this thread's first key
            if c0 + Bc > Nk or (CAUSAL and crosses_diagonal(r0, c0, Bc, Nq, Nk)):  # uniform over the block
                for a in range(TM):
                    lim = Nk - 1 - ct  # keys ct + b with b <= lim exist and are visible
                    if CAUSAL:
                        lim = min(lim, rt + a + off - ct)
                    for b in range(TN):
                        if b > lim:
                            s[a, b] = NEG_INF
            for a in range(TM):  # online row max and sum (the 16 threads of a row are a half warp)
                mx = NEG_INF
                for b in range(TN):
                    mx = nan_max(mx, s[a, b])
                mx = half_warp_max(mx)
                m_new = nan_max(m[a], mx)
                m_use = ZERO if m_new == NEG_INF else m_new  # all -inf so far: exp(-inf - 0) = 0, not NaN
                l[a] *= math.exp(m[a] - m_use)
                for b in range(TN):
                    l[a] += math.exp(s[a, b] - m_use)
                m[a] = m_new
            n = store(s_out, bh, rt, ct, Nq - rt, Nk - ct, s)
            if COUNT:
                nw += n * SB

        # L_i = m_i + log l_i, l_i summed over the 16 threads of the row; -inf for a row that sees no
        # key (causal), NaN for one whose scores are all -inf (l_i = 0)
        for a in range(TM):
            lt = l[a]
            lt = half_warp_sum(lt)
            if tx == 0 and rt + a < Nq:
                hidden = sees_no_key(rt + a, Nq, Nk, CAUSAL)
                lse[bh, rt + a] = NEG_INF if hidden else (m[a] + math.log(lt) if lt != 0 else NAN)
                ml[bh, 0, rt + a] = m[a]
                ml[bh, 1, rt + a] = lt
                if COUNT:
                    nw += 3 * AB
        if COUNT:
            add_counts(counter, nr, nw)

    return fast_kernel(kernel)


@lru_cache(maxsize=None)
def softmax_kernel(Br: int, Bc: int, dtype_name: str, causal: bool, count: bool):
    """``P = exp(S - m) / l``: the softmax of each row of S in one pass (m, l from :func:`scores_kernel`).

    One warp per row, ``SOFTMAX_ROWS`` rows per block: launch
    ``kernel[ceil(BH * Nq / SOFTMAX_ROWS), 128](s, ml, p, Nq, Nk, counter)``.  A row
    of query block i reads and writes the keys of the tiles that block visits
    (all Nk, or fewer when causal); a row with no visible key (causal) gets P = 0, one whose
    scores are all -inf (m = -inf, l = 0) P = NaN.
    """
    BF16 = dtype_name == "bfloat16"  # stored as uint16 words (the tensor-core forward's S and P)
    dtype = np.dtype(np.uint16 if BF16 else dtype_name)
    ACC, ST = acc_nb_type(dtype), (None if BF16 else nb_type(dtype))
    LOAD, STORE = (_bf16.bf16_to_f32, _bf16.f32_to_bf16) if BF16 else (ACC, ST)  # an S, a P element
    SB, AB = dtype.itemsize, _inputs.acc_dtype(dtype).itemsize
    NEG_INF, _, ZERO = _consts(dtype)
    ONE = ZERO + 1
    CAUSAL, COUNT = causal, count
    W, W2, W3, W4 = (np.uint32(32 * u) for u in (1, 2, 3, 4))

    def kernel(s, ml, p, Nq, Nk, counter):
        lane = cuda.threadIdx.x % 32
        w = cuda.blockIdx.x * SOFTMAX_ROWS + cuda.threadIdx.x // 32  # global row index
        nr = 0
        nw = 0
        if w < s.shape[0] * Nq:
            bh = uint32(w // Nq)
            row = uint32(w % Nq)
            n = Nk
            if CAUSAL:
                r0 = (w % Nq) // Br * Br
                n = min(_n_visible(r0, Br, Bc, Nq, Nk) * Bc, Nk)
            m = ZERO
            l = ZERO
            if lane == 0:
                m = ACC(ml[bh, 0, row])
                l = ACC(ml[bh, 1, row])
                if COUNT:
                    nr += 2 * AB
            m = cuda.shfl_sync(FULL_MASK, m, 0)
            l = cuda.shfl_sync(FULL_MASK, l, 0)
            if m == NEG_INF:  # no finite score: exp(-inf - 0) = 0, not exp(-inf + inf) = NaN
                m = ZERO
            inv = ZERO if sees_no_key(w % Nq, Nq, Nk, CAUSAL) else ONE / l  # l = 0 (all -inf): 0 * inf = NaN
            n_u = uint32(n)
            c = uint32(lane)
            while c + W3 < n_u:  # four loads in flight per thread, then four stores
                x0 = LOAD(s[bh, row, c])
                x1 = LOAD(s[bh, row, c + W])
                x2 = LOAD(s[bh, row, c + W2])
                x3 = LOAD(s[bh, row, c + W3])
                p[bh, row, c] = STORE(math.exp(x0 - m) * inv)
                p[bh, row, c + W] = STORE(math.exp(x1 - m) * inv)
                p[bh, row, c + W2] = STORE(math.exp(x2 - m) * inv)
                p[bh, row, c + W3] = STORE(math.exp(x3 - m) * inv)
                if COUNT:
                    nr += 4 * SB
                    nw += 4 * SB
                c += W4
            while c < n_u:
                x0 = LOAD(s[bh, row, c])
                p[bh, row, c] = STORE(math.exp(x0 - m) * inv)
                if COUNT:
                    nr += SB
                    nw += SB
                c += W
        if COUNT:
            add_counts(counter, nr, nw)

    return fast_kernel(kernel)


@lru_cache(maxsize=None)
def rowprod_kernel(d: int, Br: int, Bc: int, dtype_name: str, causal: bool, count: bool, dropout: bool = False):
    """``C_i = alpha * sum_j A_ij B_j`` (``O = P V``; ``dQ = scale dS K``), one query block per thread block.

    ``a``: (BH, Nq, Nk) storage dtype, read in the visible tiles only; ``b``: (BH / G, Nk, d), head bh // G
    for row head bh (grouped-query attention); ``c``: (BH, Nq, d).  With ``dropout`` (O = P V only), each
    A_ij tile is multiplied on chip by dropout's factor Zs (0 or 1 / (1 - p), regenerated from the seed):
    O = (Zs P) V while P in HBM stays the softmax.
    Launch ``kernel[Tr * BH, 128](a, b, c, Nq, Nk, G, alpha, counter, seed, threshold, inv_keep)``
    (the last three: dropout's, used iff ``dropout``).
    Thread (ty, tx) owns rows ``ty*TM ..`` and columns ``tx*TD ..`` of C_i.
    """
    dtype = np.dtype(dtype_name)
    p = product_plan(d, Br, Bc, dtype_name, causal, count, by_rows=True)
    TM, TD, AS, ACC, SB, ALIGN = p.TM, p.TD, p.AS, p.ACC, p.SB, p.ALIGN
    start, load, accumulate, finish = p.start, p.load, p.accumulate, p.finish
    block_start = query_block(Br, Bc, causal)
    COUNT, DROPOUT = count, dropout
    drop_head, drop_row, drop = _dropout.factor(dropout, _inputs.acc_dtype(dtype).name)

    AT_SIZE, B_SIZE = p.A_SIZE, p.B_SIZE  # shared-array sizes must be constants
    def kernel(a_in, b_in, c_out, Nq, Nk, G, alpha, counter, seed, threshold, inv_keep):
        AT = cuda.shared.array(AT_SIZE, ACC, alignment=ALIGN)  # A_ij^T (Bc, AS)
        Bs = cuda.shared.array(B_SIZE, ACC, alignment=ALIGN)  # B_j (Bc, DP)
        acc = cuda.local.array((TM, TD), ACC)
        tid, ty, tx = thread_tile()
        r0, bh, hkv, n_j = block_start(Nq, Nk, G)
        nr = 0
        nw = 0
        start(Bs, acc, tid)
        for j in range(n_j):
            c0 = j * Bc
            n = load(a_in, b_in, bh, hkv, r0, c0, Nq, Nk, AT, Bs, tid)  # A_ij (P_ij, dS_ij), B_j (V_j, K_j)
            if COUNT:
                nr += n * SB
            if DROPOUT:  # A_ij = P_ij: dropout's mask, regenerated (zeros past Nq and Nk stay 0)
                for e in range(tid, Br * Bc, NT):
                    c, r = e // Br, e % Br
                    AT[c * AS + r] *= drop(drop_row(drop_head(seed, bh), r0 + r), c0 + c, threshold, inv_keep)
                cuda.syncthreads()
            accumulate(AT, Bs, acc, ty, tx, r0, c0, Nq, Nk)
        finish(c_out, bh, r0, Nq, ty, tx, alpha, acc, counter, nr, nw)

    return fast_kernel(kernel)
