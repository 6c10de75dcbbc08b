"""Candidate for flash2_fast's forward (issue 4): K_j row-major, keys strided over threads.

What changes against flash2_fast.forward_kernel, and why (prediction before measuring):

* K_j is stored row-major (Bc, KR), KR = DP + 4, as it arrives from HBM.  The old
  transposed store K_j^T[kk * KS + c] put consecutive threads (consecutive kk) KS = 36
  words apart: an 8-way bank conflict on every one of the 16 K stores per thread per step.
* Thread tx owns keys tx, tx + 16, ... (strided), so the 8 threads of a quarter-warp read
  rows KR apart (KR = 4 mod 32 words for DP = 64): ``LDS.128`` of four consecutive kk
  values per key, conflict-free.  The S loop runs over kk in steps of 4: per 4 steps,
  2 K loads and 8 Q^T loads for 64 FMAs (was 4 + 8).
* P_ij^T is written after the softmax as TM consecutive rows per key (vectorisable
  stores; PS = Br + 4 = 4 mod 32 words: the 8 threads of a quarter-warp hit distinct banks).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda, uint32

from flash_numba import _inputs
from flash_numba.device import SIMULATOR
from flash_numba.kernels._common import acc_nb_type
from flash_numba.kernels.flash2_fast import FASTMATH, FULL_MASK, LN2, NT, TX, TY, _typed


def geometry(d: int, TM: int, TN: int, dtype) -> dict:
    acc_item = _inputs.acc_dtype(dtype).itemsize
    vec = 16 // acc_item
    TD = -(-d // TX)
    DP = TD * TX
    Br, Bc = TY * TM, TX * TN
    QS, KR, PS = Br + vec, DP + vec, Br + vec
    smem = acc_item * (DP * QS + Bc * KR + Bc * DP + Bc * PS)
    return dict(Br=Br, Bc=Bc, TD=TD, DP=DP, QS=QS, KR=KR, PS=PS, smem=smem)


@lru_cache(maxsize=None)
def forward_kernel(d: int, TM: int, TN: int, dtype_name: str, causal: bool, count: bool):
    dtype = np.dtype(dtype_name)
    g = geometry(d, TM, TN, dtype)
    Br, Bc, TD, DP, QS, KR, PS = (g[x] for x in ("Br", "Bc", "TD", "DP", "QS", "KR", "PS"))
    ACC = acc_nb_type(dtype)
    STORE_BYTES = dtype.itemsize
    ACC_BYTES = 8 if dtype == np.float64 else 4
    ALIGN = None if SIMULATOR else 16
    CAUSAL, COUNT = causal, count
    NEG_INF, _, ZERO, _ = _typed(dtype)
    ONE = np.float64(1) if dtype == np.float64 else np.float32(1)
    LN2_ACC = np.float64(LN2) if dtype == np.float64 else np.float32(LN2)
    PAD = DP - d
    QT_SIZE, K_SIZE, V_SIZE, PT_SIZE = DP * QS, Bc * KR, Bc * DP, Bc * PS
    DP_U, BC_U, QS_U, PS_U, ONE_U, FOUR_U = (np.uint32(x) for x in (DP, Bc, QS, PS, 1, 4))
    KSTEP_U = np.uint32(TX * KR)  # from one of a thread's keys to the next
    PSTEP_U = np.uint32(TX * PS)

    def kernel(q, k, v, o, lse, Nq, Nk, scale_log2, counter):
        QT = cuda.shared.array(QT_SIZE, ACC, alignment=ALIGN)  # Q_i^T (DP, QS)
        Ks = cuda.shared.array(K_SIZE, ACC, alignment=ALIGN)  # K_j   (Bc, KR)
        Vs = cuda.shared.array(V_SIZE, ACC, alignment=ALIGN)  # V_j   (Bc, DP)
        PT = cuda.shared.array(PT_SIZE, ACC, alignment=ALIGN)  # P_ij^T (Bc, PS)
        s = cuda.local.array((TM, TN), ACC)
        acc = cuda.local.array((TM, TD), ACC)
        m = cuda.local.array(TM, ACC)
        l = cuda.local.array(TM, ACC)
        qv = cuda.local.array(TM, ACC)
        k4 = cuda.local.array((TN, 4), ACC)
        vv = cuda.local.array(TD, ACC)

        tid = cuda.threadIdx.x
        ty = tid // TX
        tx = tid % TX
        bh = cuda.blockIdx.y
        i_blk = cuda.gridDim.x - 1 - cuda.blockIdx.x  # longest (causal) rows first
        row0 = i_blk * Br
        off = Nk - Nq
        nr = 0
        nw = 0

        Tc = (Nk + Bc - 1) // Bc
        n_j = Tc
        if CAUSAL:
            last = row0 + Br - 1 + off
            n_j = 0 if last < 0 else min(Tc, last // Bc + 1)

        for e in range(tid, Br * DP, NT):
            r = e // DP
            kk = e % DP
            val = ZERO
            if kk < d and row0 + r < Nq:
                val = ACC(q[bh, row0 + r, kk])
                if COUNT:
                    nr += STORE_BYTES
            QT[kk * QS + r] = val
        if PAD > 0:
            for e in range(tid, PAD * Bc, NT):
                Ks[(e % Bc) * KR + d + e // Bc] = ZERO
                Vs[(e % Bc) * DP + d + e // Bc] = ZERO

        for a in range(TM):
            m[a] = NEG_INF
            l[a] = ZERO
            for x in range(TD):
                acc[a, x] = ZERO

        for j in range(n_j):
            col0 = j * Bc
            cuda.syncthreads()
            for e in range(tid, Bc * d, NT):
                c = e // d
                kk = e % d
                kval = ZERO
                vval = ZERO
                if col0 + c < Nk:
                    kval = ACC(k[bh, col0 + c, kk])
                    vval = ACC(v[bh, col0 + c, kk])
                    if COUNT:
                        nr += 2 * STORE_BYTES
                Ks[c * KR + kk] = kval
                Vs[c * DP + kk] = vval
            cuda.syncthreads()

            for a in range(TM):
                for b in range(TN):
                    s[a, b] = ZERO
            qi = uint32(ty * TM)
            ki = uint32(tx * KR)
            kk = uint32(0)
            while kk < DP_U:
                for b in range(TN):
                    for u in range(4):
                        k4[b, u] = Ks[ki + uint32(b) * KSTEP_U + uint32(u)]
                for u in range(4):
                    for a in range(TM):
                        qv[a] = QT[qi + uint32(a)]
                    for a in range(TM):
                        for b in range(TN):
                            s[a, b] += qv[a] * k4[b, u]
                    qi += QS_U
                ki += FOUR_U
                kk += FOUR_U

            for a in range(TM):
                for b in range(TN):
                    s[a, b] *= scale_log2
            if col0 + Bc > Nk or (CAUSAL and col0 + Bc - 1 > row0 + off):
                for a in range(TM):
                    lim = Nk - 1 - col0 - tx  # key col0 + tx + 16 b is visible iff 16 b <= lim
                    if CAUSAL:
                        lim = min(lim, row0 + ty * TM + a + off - col0 - tx)
                    for b in range(TN):
                        if b * TX > lim:
                            s[a, b] = NEG_INF
            for a in range(TM):
                mx = NEG_INF
                for b in range(TN):
                    mx = max(mx, s[a, b])
                mx = max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 8))
                mx = max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 4))
                mx = max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 2))
                mx = max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 1))
                m_new = max(m[a], mx)
                m_use = ZERO if m_new == NEG_INF else m_new
                alpha = math.exp2(m[a] - m_use)
                m[a] = m_new
                l[a] *= alpha
                for x in range(TD):
                    acc[a, x] *= alpha
                for b in range(TN):
                    p = math.exp2(s[a, b] - m_use)
                    l[a] += p
                    s[a, b] = p
            pw = uint32(tx * PS + ty * TM)
            for b in range(TN):
                for a in range(TM):
                    PT[pw + uint32(b) * PSTEP_U + uint32(a)] = s[a, b]
            cuda.syncthreads()

            pi = uint32(ty * TM)
            vi = uint32(tx * TD)
            c = uint32(0)
            while c < BC_U:
                for a in range(TM):
                    qv[a] = PT[pi + uint32(a)]
                for x in range(TD):
                    vv[x] = Vs[vi + uint32(x)]
                for a in range(TM):
                    for x in range(TD):
                        acc[a, x] += qv[a] * vv[x]
                pi += PS_U
                vi += DP_U
                c += ONE_U

        for a in range(TM):
            lt = l[a]
            lt += cuda.shfl_xor_sync(FULL_MASK, lt, 8)
            lt += cuda.shfl_xor_sync(FULL_MASK, lt, 4)
            lt += cuda.shfl_xor_sync(FULL_MASK, lt, 2)
            lt += cuda.shfl_xor_sync(FULL_MASK, lt, 1)
            row = row0 + ty * TM + a
            if row < Nq:
                inv = ONE / lt if lt != 0 else ZERO
                for x in range(TD):
                    col = tx * TD + x
                    if col < d:
                        o[bh, row, col] = acc[a, x] * inv
                        if COUNT:
                            nw += STORE_BYTES
                if tx == 0:
                    lse[bh, row] = m[a] * LN2_ACC + math.log(lt) if lt != 0 else NEG_INF
                    if COUNT:
                        nw += ACC_BYTES
        if COUNT:
            cuda.atomic.add(counter, 0, nr)
            cuda.atomic.add(counter, 1, nw)

    kernel._fastmath = FASTMATH
    return cuda.jit(fastmath=FASTMATH)(kernel), g
