"""flash2_fast's forward as it was before the load-loop and Q-prescaling change (issue 4 A/B baseline)."""
# ruff: noqa: E501

import math
from functools import lru_cache

import numpy as np
from numba import cuda, uint32

from flash_numba.device import SIMULATOR
from flash_numba.kernels._common import acc_nb_type
from flash_numba.kernels.flash2_fast import FASTMATH, FULL_MASK, LN2, NT, TX, _typed, geometry


@lru_cache(maxsize=None)
def forward_kernel(d: int, TM: int, TN: int, dtype_name: str, causal: bool, count: bool):
    dtype = np.dtype(dtype_name)
    g = geometry(d, TM, TN, dtype)
    Br, Bc, TD, DP, QS, KS, PS = (g[x] for x in ("Br", "Bc", "TD", "DP", "QS", "KS", "PS"))
    ACC = acc_nb_type(dtype)
    STORE_BYTES = dtype.itemsize
    ACC_BYTES = 8 if dtype == np.float64 else 4
    ALIGN = None if SIMULATOR else 16
    CAUSAL, COUNT = causal, count
    # typed: a Python float (-math.inf) would turn every use into float64 math
    NEG_INF, _, ZERO, _ = _typed(dtype)
    ONE = np.float64(1) if dtype == np.float64 else np.float32(1)
    LN2_ACC = np.float64(LN2) if dtype == np.float64 else np.float32(LN2)
    PAD = DP - d
    QT_SIZE, KT_SIZE, V_SIZE, PT_SIZE = DP * QS, DP * KS, Bc * DP, Bc * PS
    DP_U, BC_U, QS_U, KS_U, PS_U, ONE_U = (np.uint32(x) for x in (DP, Bc, QS, KS, PS, 1))

    def kernel(q, k, v, o, lse, Nq, Nk, scale_log2, counter):
        QT = cuda.shared.array(QT_SIZE, ACC, alignment=ALIGN)  # Q_i^T  (DP, QS) flattened
        KT = cuda.shared.array(KT_SIZE, ACC, alignment=ALIGN)  # K_j^T  (DP, KS)
        Vs = cuda.shared.array(V_SIZE, ACC, alignment=ALIGN)  # V_j    (Bc, DP)
        PT = cuda.shared.array(PT_SIZE, ACC, alignment=ALIGN)  # P_ij^T (Bc, PS)
        s = cuda.local.array((TM, TN), ACC)
        acc = cuda.local.array((TM, TD), ACC)
        m = cuda.local.array(TM, ACC)
        l = cuda.local.array(TM, ACC)
        qv = cuda.local.array(TM, ACC)
        kv = cuda.local.array(TN, ACC)
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
            last = row0 + Br - 1 + off  # last key visible to the block's last row
            n_j = 0 if last < 0 else min(Tc, last // Bc + 1)

        # Q_i -> QT (transposed, zero-padded beyond d and beyond Nq)
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
                KT[(d + e // Bc) * KS + e % Bc] = ZERO
                Vs[(e % Bc) * DP + d + e // Bc] = ZERO

        for a in range(TM):
            m[a] = NEG_INF
            l[a] = ZERO
            for x in range(TD):
                acc[a, x] = ZERO

        for j in range(n_j):
            col0 = j * Bc
            cuda.syncthreads()  # everyone is done with the previous KT, Vs, PT
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
                KT[kk * KS + c] = kval
                Vs[c * DP + kk] = vval
            cuda.syncthreads()

            # S_ij = Q_i K_j^T, one TM x TN micro-tile per thread
            for a in range(TM):
                for b in range(TN):
                    s[a, b] = ZERO
            # The loop is written as a while over uint32 offsets that step by a
            # row of the tile: NVVM then unrolls it and every load is a plain
            # 16-byte LDS at a constant offset (a Python range loop kept a 64-bit
            # counter and an address multiply per step: ~50% overhead).
            qi = uint32(ty * TM)
            ki = uint32(tx * TN)
            kk = uint32(0)
            while kk < DP_U:
                for a in range(TM):
                    qv[a] = QT[qi + uint32(a)]
                for b in range(TN):
                    kv[b] = KT[ki + uint32(b)]
                for a in range(TM):
                    for b in range(TN):
                        s[a, b] += qv[a] * kv[b]
                qi += QS_U
                ki += KS_U
                kk += ONE_U

            # online softmax in base 2 (log2(e) folded into the scale)
            for a in range(TM):
                for b in range(TN):
                    s[a, b] *= scale_log2
            # only the last block (past Nk) and, when causal, blocks that cross the
            # diagonal need a mask; the test is uniform over the block
            if col0 + Bc > Nk or (CAUSAL and col0 + Bc - 1 > row0 + off):
                cb = col0 + tx * TN  # this thread's first key
                for a in range(TM):
                    lim = Nk - 1 - cb  # keys cb + b with b <= lim are visible
                    if CAUSAL:
                        lim = min(lim, row0 + ty * TM + a + off - cb)
                    for b in range(TN):
                        if b > lim:
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
                    PT[(tx * TN + b) * PS + ty * TM + a] = p
            cuda.syncthreads()

            # O_i += P_ij V_j
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

        # finish: l_i summed over the 16 lanes of the row, O_i / l_i, L_i = m_i + log l_i
        for a in range(TM):
            lt = l[a]
            lt += cuda.shfl_xor_sync(FULL_MASK, lt, 8)
            lt += cuda.shfl_xor_sync(FULL_MASK, lt, 4)
            lt += cuda.shfl_xor_sync(FULL_MASK, lt, 2)
            lt += cuda.shfl_xor_sync(FULL_MASK, lt, 1)
            row = row0 + ty * TM + a
            if row < Nq:
                inv = ONE / lt if lt != 0 else ZERO  # != 0, not > 0: a NaN row stays NaN
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

    kernel._fastmath = FASTMATH  # read by compile_check.compile_ptx
    return cuda.jit(fastmath=FASTMATH)(kernel), g




