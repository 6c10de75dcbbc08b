"""flash2's forward kernel (FA2's Algorithm 1): O_i and L_i for one query block per thread block.

The block loads Q_i once, walks over the visible K/V blocks, keeps m_i, l_i and O_i on chip (registers)
and writes O_i / l_i and L_i = m_i + log(l_i) once; the thread grid and the row reductions are described
in :mod:`flash_numba.kernels.flash2`.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from ...device import jit
from .. import _dropout
from .._common import add_counts, heavy_first_block, kv_head, nan_max, rounded_mul
from .._tile_ops import load_rows
from ..causal import crosses_diagonal_dev as crosses_diagonal
from ..causal import sees_no_key_dev as sees_no_key
from ..causal import visible_dev as visible
from ..causal import visible_kv_blocks_dev as visible_kv_blocks
from .layout import NT, TX, TY, cdiv, kernel_constants
from .thread_tiles import load_pair


@functools.lru_cache(maxsize=None)
def _forward_kernel(d, Br, Bc, dtype, causal, count, dropout=False, grouped=False):
    """The forward kernel for head dim d, blocks (Br, Bc), storage ``dtype`` (``dropout``: with attention dropout;
    ``grouped``: grouped-query attention, G > 1)."""
    ACC, acc, IN_BYTES, L_BYTES = kernel_constants(dtype)
    NEG_INF, ZERO, ONE, NAN = acc(-math.inf), acc(0), acc(1), acc(math.nan)
    MUL_RN = rounded_mul(acc)
    RA, CB, XB = cdiv(Br, TY), cdiv(Bc, TX), cdiv(d, TX)  # rows, S columns, O columns per thread
    KS = d | 1  # odd row stride of K_j: the 16 threads of a row read 16 banks
    Q_TILE, K_TILE, V_TILE, P_TILE, PART = (Br, d), (Bc, KS), (Bc, d), (Br, Bc), (Br, TX)
    S_REGS, O_REGS = (RA, CB), (RA, XB)
    CAUSAL, COUNT, GROUPED = causal, count, grouped
    drop_head, drop_row, drop = _dropout.factor(dropout, np.dtype(acc).name)

    @jit
    def flash2_forward(q, k, v, o, lse, counter, Nq, Nk, G, scale, seed, threshold, inv_keep):
        t = cuda.threadIdx.x
        ty, tx = t // TX, t % TX
        bh, i0 = cuda.blockIdx.x, heavy_first_block(Br)  # (batch, head) and the first query row of Q_i
        # its key/value head; G = 1 compiled apart: kv_head's result would stay live across the loop (+3 registers)
        hkv = kv_head(bh, G) if GROUPED else bh
        nr = 0
        nw = 0

        Q_i = cuda.shared.array(Q_TILE, ACC)
        K_j = cuda.shared.array(K_TILE, ACC)
        V_j = cuda.shared.array(V_TILE, ACC)
        P_ij = cuda.shared.array(P_TILE, ACC)
        part = cuda.shared.array(PART, ACC)  # per-row partial maxima (sums at the end), one per thread
        S = cuda.local.array(S_REGS, ACC)  # this thread's entries of S_ij
        O = cuda.local.array(O_REGS, ACC)  # this thread's entries of O_i (not yet divided by l_i)
        m = cuda.local.array(RA, ACC)  # m_i for this thread's rows
        l = cuda.local.array(RA, ACC)  # l_i for this thread's rows
        k_col = cuda.local.array(CB, ACC)
        v_row = cuda.local.array(XB, ACC)

        # FA2 Algorithm 1, line 4: load Q_i.  Line 5: O_i = 0, l_i = 0, m_i = -inf.
        n = load_rows(Q_i, q, bh, i0, Nq, d, t, NT)
        if COUNT:
            nr += n * IN_BYTES
        for a in range(RA):
            m[a] = NEG_INF
            l[a] = ZERO
            for xb in range(XB):
                O[a, xb] = ZERO

        # Line 6: for each K/V block j that the block's rows see
        for j in range(visible_kv_blocks(i0, Br, Bc, Nq, Nk, CAUSAL)):
            j0 = j * Bc
            cuda.syncthreads()  # the previous step has finished reading K_j, V_j, P_ij
            # Line 7: load K_j, V_j
            n = load_pair(K_j, V_j, k, v, hkv, j0, Nk, d, t)
            if COUNT:
                nr += n * IN_BYTES
            cuda.syncthreads()

            # Line 8: S_ij = Q_i K_j^T, this thread's RA x CB entries (scaled below)
            for a in range(RA):
                for b in range(CB):
                    S[a, b] = ZERO
            for x in range(d):
                for b in range(CB):
                    k_col[b] = K_j[min(tx + TX * b, Bc - 1), x]
                for a in range(RA):
                    q_ax = Q_i[min(ty + TY * a, Br - 1), x]
                    for b in range(CB):
                        S[a, b] += q_ax * k_col[b]

            # S_ij *= scale, -inf where the key is masked or past the tile; partial row maxima
            for a in range(RA):
                r = ty + TY * a
                m_part = NEG_INF
                for b in range(CB):
                    c = tx + TX * b
                    if c < Bc and visible(i0 + r, j0 + c, Nq, Nk, CAUSAL):
                        S[a, b] = MUL_RN(scale, S[a, b])  # rounded, as the backward's P recomputes it
                        m_part = nan_max(m_part, S[a, b])
                    else:
                        S[a, b] = NEG_INF
                if r < Br:
                    part[r, tx] = m_part
            cuda.syncthreads()

            # Line 9: m_new = max(m_i, rowmax(S_ij)), P~_ij = exp(S_ij - m_new),
            #         l_i = exp(m_i - m_new) l_i + rowsum(P~_ij)
            for a in range(RA):
                r = ty + TY * a
                m_new = m[a]
                for u in range(TX):
                    m_new = nan_max(m_new, part[min(r, Br - 1), u])
                # a row whose scores so far are all -inf keeps m = -inf: subtract 0 instead (P = alpha = 0, no NaN)
                m_ref = m_new if m_new != NEG_INF else ZERO
                alpha = math.exp(m[a] - m_ref)
                l_ij = ZERO
                rk = drop_row(drop_head(seed, bh), i0 + r)  # dropout's hash of the row
                for b in range(CB):
                    p = math.exp(S[a, b] - m_ref)
                    l_ij += p
                    c = tx + TX * b
                    if r < Br and c < Bc:  # dropout (Algorithm 2, line 11) after l_i: l and L stay undropped
                        P_ij[r, c] = p * drop(rk, j0 + c, threshold, inv_keep)
                # l[a] is this thread's share of l_i (its columns): all shares are rescaled
                # by the same alpha, so they are added up once, at the end
                l[a] = alpha * l[a] + l_ij
                m[a] = m_new
                # Line 10, first half: O_i = diag(exp(m_i - m_new)) O_i
                for xb in range(XB):
                    O[a, xb] *= alpha
            cuda.syncthreads()

            # Line 10: O_i += P~_ij V_j (over the keys that exist: the last block may be partial);
            # a masked key adds nothing, even where V_j holds Inf or NaN, and a visible key's P~ multiplies
            # even where it is 0 (IEEE: 0 * Inf = NaN).  Only blocks on the diagonal hold masked keys:
            # the test is uniform over the block, and constant False without a causal mask
            masked = CAUSAL and crosses_diagonal(i0, j0, Bc, Nq, Nk)
            for c in range(min(Bc, Nk - j0)):
                for xb in range(XB):
                    v_row[xb] = V_j[c, min(tx + TX * xb, d - 1)]
                for a in range(RA):
                    p = P_ij[min(ty + TY * a, Br - 1), c]
                    if not masked or visible(i0 + ty + TY * a, j0 + c, Nq, Nk, CAUSAL):
                        for xb in range(XB):
                            O[a, xb] += p * v_row[xb]

        # l_i: add up the row's 16 shares (the last reads of the maxima came before the last barrier)
        for a in range(RA):
            r = ty + TY * a
            if r < Br:
                part[r, tx] = l[a]
        cuda.syncthreads()
        # Lines 12-15: O_i = diag(l_i)^-1 O_i, L_i = m_i + log(l_i), written once.
        # A row with no visible key (causal): O = 0, L = -inf.  A row whose scores are all -inf: l_i = 0, O = L = NaN.
        for a in range(RA):
            r = ty + TY * a
            if r < Br and i0 + r < Nq:
                l_i = ZERO
                for u in range(TX):
                    l_i += part[r, u]
                hidden = sees_no_key(i0 + r, Nq, Nk, CAUSAL)
                inv_l = ZERO if hidden else ONE / l_i
                for xb in range(XB):
                    x = tx + TX * xb
                    if x < d:
                        o[bh, i0 + r, x] = O[a, xb] * inv_l
                        if COUNT:
                            nw += IN_BYTES
                if tx == 0:
                    lse[bh, i0 + r] = NEG_INF if hidden else (m[a] + math.log(l_i) if l_i != ZERO else NAN)
                    if COUNT:
                        nw += L_BYTES
        if COUNT:
            add_counts(counter, nr, nw)

    return flash2_forward
