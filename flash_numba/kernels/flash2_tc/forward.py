"""The flash2_tc forward kernel: FlashAttention-2 on mma.sync, one warp per 16 query rows.

A block of 4 warps owns Br = 64 query rows; warp w owns rows 16w .. 16w + 15 of the block, and every
product a warp computes is a 16-row mma tile (m16).  Per K/V block j (Bc = 64 keys):

    S_ij   = Q_i K_j^T                 8 n8-tiles of 16 x 8, d/16 k-steps each (mma, fp32 accumulators)
    m_i    = max(m_i, rowmax(S_ij))    on the accumulator fragments: a quad's 4 lanes hold a row
    P_ij   = exp2(S_ij - m_i)          (log2(e) folded into the scale)
    l_i    = alpha l_i + rowsum(P_ij)  (per lane; the quad's partial sums are added once, at the end)
    O_i    = alpha O_i + P_ij V_j      P_ij rounded to the input's half type IN REGISTERS: the A operand

and at the end O_i = O_i / l_i, L_i = m_i + log(l_i), written once.

Fragments (PTX ISA 9.7.14.5.8, m16n8k16; g = lane >> 2, t = lane % 4).  The accumulator (C/D) of an n8 tile
of S_ij, this lane's four values::

          keys (n) 8 nt + 0 1 | 2 3 | 4 5 | 6 7
    row g      :  lane 4g+0 | 4g+1| 4g+2| 4g+3      c0, c1 = S[g][8nt + 2t], S[g][8nt + 2t + 1]
    row g + 8  :  (the same lanes)                  c2, c3 = S[g+8][8nt + 2t], S[g+8][8nt + 2t + 1]

The A operand of P V for keys 16kk .. 16kk + 15 (k = key)::

    a0 = P[g][16kk + 2t, +1]      = c0, c1 of n8 tile 2kk        a1 = P[g+8][16kk + 2t, +1]     = c2, c3 of 2kk
    a2 = P[g][16kk + 8 + 2t, +1]  = c0, c1 of n8 tile 2kk + 1    a3 = P[g+8][16kk + 8 + 2t, +1] = c2, c3 of 2kk+1

The same lane holds the same P elements in both layouts: FlashAttention-2's register reuse.  P never leaves
registers; each pair is rounded to float16 (bfloat16) and packed, and that is the A operand.

Operands from shared memory (PTX ISA 9.7.9.25, ldmatrix): Q_i as A fragments (ldmatrix.x4, once, kept in
registers), K_j as B fragments of S = Q K^T (B[k][n] = K[n][k]: ldmatrix.x4 of K's rows, no transpose),
V_j as B fragments of P V (B[k][n] = V[k][n]: ldmatrix.x4.trans of V's rows).  Tiles are copied from global
memory 16 bytes a thread (rows past Nk zero-filled: a masked P of 0 times a zero V adds nothing).

Non-finite inputs (docs/RELIABILITY.md, section 2): as the other kernels, except one case.  A NaN or Inf in
q, or in k or v at a visible key, gives NaN/Inf in the rows that see it; rows the causal mask hides get O = 0,
L = -inf; a NaN in k at a masked key is masked (S = -inf).  The exception: an Inf or NaN in **v** at a key
that some rows of a diagonal block cannot see reaches those rows as NaN, because the tensor core computes
0 * Inf (flash2_fast selects such products away, one select per multiply-add; an mma cannot).  Keys past Nk
are zero-filled in shared memory, so the last block's padding never does this.

The sm_75 path (a T4: no m16n8k16) splits each k16 step into two mma.m16n8k8: (a0, a1, b0) then
(a2, a3, b1), the same fragments, the same sums in the same order of k-halves.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, types, uint32, uint64

from ...device import jit
from .. import _dropout, _mma
from .._bf16 import f32_to_bf16
from .._common import add_counts, fmax, kv_head, rounded_mul
from .._tile_ops import head_starts, last_tile_first
from ..causal import crosses_diagonal_dev as crosses_diagonal
from ..causal import sees_no_key_dev as sees_no_key
from ..causal import visible_kv_blocks_dev as visible_kv_blocks
from .layout import FASTMATH, LN2, NT, PAD, Bc, Br, smem_elements


@lru_cache(maxsize=None)
def mma16(dtype_name: str, path: str):
    """``mma16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> (d0, d1, d2, d3)``: one m16n8k16 step, D = A B + C.

    "sm80": one mma.m16n8k16 (.f16 or .bf16); "sm75": two mma.m16n8k8, k = 0..7 (a0, a1, b0) then
    k = 8..15 (a2, a3, b1): the k16 fragments hold exactly the two k8 ones."""
    if path == "sm75":
        if dtype_name != "float16":
            raise ValueError(f"flash2_tc: the sm_75 path runs float16 only, not {dtype_name}")
        k8 = _mma.mma_m16n8k8_f16

        @jit(device=True, forceinline=True)
        def mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            c0, c1, c2, c3 = k8(a0, a1, b0, c0, c1, c2, c3)
            return k8(a2, a3, b1, c0, c1, c2, c3)
        return mma
    return _mma.mma_m16n8k16_bf16 if dtype_name == "bfloat16" else _mma.mma_m16n8k16_f16


@jit(device=True, forceinline=True)
def _nothing():
    """The sm_75 path's cp.async commit and wait: its copies are done when they return."""
    return


@lru_cache(maxsize=None)
def tile_loader(d: int, count: bool, aligned: bool, asynchronous: bool = False):
    """``load(sm, at, x, x0, sN, r0, n, tid) -> bytes read``: rows r0 .. r0 + Bc - 1 of a head of the flat input x
    (row 0 at flat index x0, row stride sN) into sm[at + r * DS + c] for r < Bc, c < d; rows r >= n zero-filled.

    16 bytes a thread at a time (d / 8 threads a row, Bc * d / 8 chunks over 128 threads) where every row starts
    on 16 bytes (``aligned``): ``asynchronous`` (sm_80+), one cp.async each, which returns at once (the data
    lands in shared memory by ``cp_async_wait_all``); else (sm_75) every ld.global.v4 of the thread first, into
    registers, then the st.shared.v4: d / 16 loads in flight at once.  Unaligned: 8 element copies."""
    DS = d + PAD
    CHUNKS_ROW = d // 8
    ROUNDS = Bc * CHUNKS_ROW // NT  # d / 16: whole rounds, d a multiple of 16
    COUNT, ALIGNED = count, aligned
    copy_16, zero_16 = _mma.cp_async_16, _mma.zero_16
    load_16, store_16 = _mma.load_16, _mma.store_16
    CR, DS_U, NT_U = uint32(CHUNKS_ROW), uint32(DS), uint32(NT)
    REGS = 4 * ROUNDS
    if aligned and not asynchronous:
        @jit(device=True, forceinline=True)
        def load_registers_first(sm, at, x, x0, sN, r0, n, tid):
            w = cuda.local.array(REGS, types.uint32)
            nr = 0
            for i in range(ROUNDS):  # every load first ...
                c = uint32(tid) + uint32(i) * NT_U
                r = c // CR
                if r < uint32(n):
                    col = (c - r * CR) * uint32(8)
                    w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3] = load_16(
                        x, x0 + uint64((uint32(r0) + r) * uint32(sN) + col))
                    if COUNT:
                        nr += 16
            for i in range(ROUNDS):  # ... then the stores
                c = uint32(tid) + uint32(i) * NT_U
                r = c // CR
                s_at = uint32(at) + r * DS_U + (c - r * CR) * uint32(8)
                if r < uint32(n):
                    store_16(sm, s_at, w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3])
                else:
                    zero_16(sm, s_at)
            return nr

        return load_registers_first

    @jit(device=True, forceinline=True)
    def load(sm, at, x, x0, sN, r0, n, tid):
        nr = 0
        for i in range(ROUNDS):
            c = uint32(tid) + uint32(i) * NT_U
            r = c // CR
            col = (c - r * CR) * uint32(8)
            s_at = uint32(at) + r * DS_U + col
            if r < uint32(n):
                g_at = x0 + uint64((uint32(r0) + r) * uint32(sN) + col)
                if ALIGNED:
                    copy_16(sm, s_at, x, g_at)
                else:
                    for e in range(8):
                        sm[s_at + uint32(e)] = x[g_at + uint64(e)]
                if COUNT:
                    nr += 16
            else:
                zero_16(sm, s_at)
        return nr

    return load


@lru_cache(maxsize=None)
def forward_kernel(d: int, dtype_name: str, path: str, causal: bool, count: bool, dropout: bool = False,
                   aligned: bool = False):
    """The forward for head dim d (a multiple of 16, <= 128), storage ``dtype_name`` ("float16" or "bfloat16"),
    instruction ``path`` ("sm80" or "sm75", see :func:`.layout.path`).

    Arguments: ``(q, k, v, o, lse, Nq, Nk, G, scale_log2, counter, q_lay, k_lay, v_lay, seed, threshold,
    inv_keep)``: q, k, v flat inputs with layouts ``(H, stride_B, stride_H, stride_N)``
    (:func:`flash_numba._views.flat_input`); o ``(BH, Nq, d)`` storage dtype, lse ``(BH, Nq)`` float32; query
    head bh reads key/value head bh // G; the last three are dropout's (:mod:`flash_numba.kernels._dropout`).
    ``aligned``: every row of q, k and v starts on 16 bytes (16-byte copies).
    """
    BF16 = dtype_name == "bfloat16"
    pack = _mma.pack_bf16x2 if BF16 else _mma.pack_f16x2
    mma = mma16(dtype_name, path)
    ldsm, ldsm_t = _mma.ldmatrix_x4, _mma.ldmatrix_x4_trans
    STORE = types.uint16 if BF16 else types.float16  # shared memory holds the 16-bit inputs as they are
    SMEM = smem_elements(d)
    DS = d + PAD
    KSTEPS = d // 16  # k16 steps of S = Q K^T; also the Q fragments: 4 registers each
    NTILES = Bc // 8  # n8 tiles of S_ij (keys)
    DTILES = d // 8  # n8 tiles of O_i (head dim)
    PSTEPS = Bc // 16  # k16 steps of P V (keys)
    V_AT = Bc * DS
    Q_REGS, S_REGS, O_REGS = 4 * KSTEPS, 4 * NTILES, 4 * DTILES  # local array sizes: constants
    COUNT, CAUSAL, DROPOUT = count, causal, dropout
    ITEM = 2
    ASYNC = path == "sm80"  # cp.async: K_{j+1} and V_j load while the warps compute (the sm_75 path: in turn)
    load_async = tile_loader(d, count, aligned, ASYNC)
    commit, wait_all = (_mma.cp_async_commit, _mma.cp_async_wait_all) if ASYNC else (_nothing, _nothing)
    NEG_INF, ZERO, ONE, LN2_F = float32(-np.inf), float32(0), float32(1), float32(LN2)
    NAN = float32(np.nan)
    MUL_RN = rounded_mul("float32")
    drop_head, drop_row, drop = _dropout.factor(dropout, "float32")
    DS_U = uint32(DS)

    def kernel(q, k, v, o, lse, Nq, Nk, G, scale_log2, counter, q_lay, k_lay, v_lay, seed, threshold, inv_keep):
        sm = cuda.shared.array(SMEM, STORE)  # K_j | V_j, row stride DS (Q_i passes through V_j's rows first)
        qf = cuda.local.array(Q_REGS, types.uint32)  # Q_i's A fragments: 4 registers a k16 step
        s = cuda.local.array(S_REGS, types.float32)  # S_ij (then P_ij): 4 accumulators an n8 tile
        acc = cuda.local.array(O_REGS, types.float32)  # O_i: 4 accumulators an n8 tile of d
        m = cuda.local.array(2, types.float32)  # m_i of rows g and g + 8
        l = cuda.local.array(2, types.float32)  # l_i (this lane's part)

        tid = cuda.threadIdx.x
        warp, lane = uint32(tid) >> uint32(5), uint32(tid) & uint32(31)
        g, t = lane >> uint32(2), lane & uint32(3)
        row0, bh = last_tile_first(Nq, Br)
        hkv = kv_head(bh, G)
        q0, _ = head_starts(q_lay, q_lay, bh)
        k0, v0 = head_starts(k_lay, v_lay, hkv)
        nr = nw = 0

        # Q_i -> shared (V_j's rows) -> registers, once, while K_0 loads: A fragments of rows 16 warp + (lane % 16),
        # columns 16 kk + 8 (lane / 16): ldmatrix.x4's matrices 0..3 are a0..a3 (module docstring)
        n_blocks = visible_kv_blocks(row0, Br, Bc, Nq, Nk, CAUSAL)
        nr += load_async(sm, V_AT, q, q0, q_lay[3], row0, Nq - row0, tid)
        if n_blocks > 0:
            nr += load_async(sm, 0, k, k0, k_lay[3], 0, Nk, tid)  # K_0
        commit()
        wait_all()
        cuda.syncthreads()
        a_row = uint32(V_AT) + (warp * uint32(16) + (lane & uint32(15))) * DS_U + (lane >> uint32(4)) * uint32(8)
        for kk in range(KSTEPS):
            qf[4 * kk], qf[4 * kk + 1], qf[4 * kk + 2], qf[4 * kk + 3] = ldsm(sm, a_row + uint32(16 * kk))
        for r in range(2):
            m[r] = NEG_INF
            l[r] = ZERO
        for x in range(4 * DTILES):
            acc[x] = ZERO

        # ldmatrix row addresses of this lane: K_j (no transpose): key 16 np + (lane % 8) + 8 (lane / 16),
        # column 16 kk + 8 ((lane / 8) % 2) -> b0, b1 of n8 tile 2 np and b0, b1 of tile 2 np + 1;
        # V_j (transposed): key 16 kk + (lane % 8) + 8 ((lane / 8) % 2), column 16 dp + 8 (lane / 16)
        k_row = ((lane & uint32(7)) + ((lane >> uint32(4)) << uint32(3))) * DS_U \
            + ((lane >> uint32(3)) & uint32(1)) * uint32(8)
        v_row = uint32(V_AT) + ((lane & uint32(7)) + (((lane >> uint32(3)) & uint32(1)) << uint32(3))) * DS_U \
            + (lane >> uint32(4)) * uint32(8)
        row_g = row0 + int(warp) * 16 + int(g)  # this lane's two rows: row_g and row_g + 8
        head = drop_head(seed, bh)  # dropout's hashes of this lane's two rows (0 without dropout)
        rk0, rk1 = drop_row(head, row_g), drop_row(head, row_g + 8)

        # The pipeline (one buffer each for K_j and V_j): K_{j+1} loads during softmax and P V of block j,
        # V_j during S_ij = Q_i K_j^T.  A barrier after each wait: every thread's copies have landed, and
        # every warp is done with the buffer the next copy overwrites (the first: with Q_i in V_j's rows).
        for j in range(n_blocks):
            col0 = j * Bc
            wait_all()
            cuda.syncthreads()  # K_j has landed; every warp is done with V_{j-1}
            nr += load_async(sm, V_AT, v, v0, v_lay[3], col0, Nk - col0, tid)  # V_j, while S_ij is computed
            commit()

            # S_ij = Q_i K_j^T: n8 tiles in pairs (one ldmatrix.x4 = B fragments of two tiles), k16 steps inside
            for x in range(4 * NTILES):
                s[x] = ZERO
            for kk in range(KSTEPS):
                for np_ in range(NTILES // 2):
                    b0, b1, b2, b3 = ldsm(sm, k_row + uint32(16 * np_) * DS_U + uint32(16 * kk))
                    n0, n1 = 8 * np_, 8 * np_ + 4
                    s[n0], s[n0 + 1], s[n0 + 2], s[n0 + 3] = mma(
                        qf[4 * kk], qf[4 * kk + 1], qf[4 * kk + 2], qf[4 * kk + 3], b0, b1,
                        s[n0], s[n0 + 1], s[n0 + 2], s[n0 + 3])
                    s[n1], s[n1 + 1], s[n1 + 2], s[n1 + 3] = mma(
                        qf[4 * kk], qf[4 * kk + 1], qf[4 * kk + 2], qf[4 * kk + 3], b2, b3,
                        s[n1], s[n1 + 1], s[n1 + 2], s[n1 + 3])

            wait_all()
            cuda.syncthreads()  # V_j has landed; every warp is done with K_j
            if j + 1 < n_blocks:  # K_{j+1}, while the softmax and P V of block j run
                nr += load_async(sm, 0, k, k0, k_lay[3], col0 + Bc, Nk - col0 - Bc, tid)
                commit()

            # scale (log2(e) folded in; rounded, never fused: a backward recomputes it bit for bit)
            for x in range(4 * NTILES):
                s[x] = MUL_RN(scale_log2, s[x])
            # mask keys past Nk, and (causal) keys past a row's diagonal: only in the blocks that need it
            if col0 + Bc > Nk or (CAUSAL and crosses_diagonal(row0, col0, Bc, Nq, Nk)):
                for nt in range(NTILES):
                    for e in range(4):
                        key = col0 + 8 * nt + 2 * int(t) + (e & 1)
                        row = row_g + 8 * (e >> 1)
                        if key >= Nk or (CAUSAL and key > row + (Nk - Nq)):
                            s[4 * nt + e] = NEG_INF

            # online softmax, rows g (r = 0: c0, c1) and g + 8 (r = 1: c2, c3); a row's 4 lanes are a quad:
            # its max over the block is two shfl_xor (lanes 4g .. 4g + 3 differ in bits 0 and 1)
            for r in range(2):
                mx = NEG_INF
                for nt in range(NTILES):
                    mx = fmax(mx, fmax(s[4 * nt + 2 * r], s[4 * nt + 2 * r + 1]))
                mx = fmax(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 1))
                mx = fmax(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 2))
                m_new = fmax(m[r], mx)
                m_use = ZERO if m_new == NEG_INF else m_new  # nothing visible yet: P = 0, alpha = 0 (not NaN)
                alpha = math.exp2(m[r] - m_use)
                m[r] = m_new
                l[r] *= alpha
                for dt in range(DTILES):
                    acc[4 * dt + 2 * r] *= alpha
                    acc[4 * dt + 2 * r + 1] *= alpha
                for nt in range(NTILES):
                    for e in range(2):
                        p = math.exp2(s[4 * nt + 2 * r + e] - m_use)
                        l[r] += p
                        s[4 * nt + 2 * r + e] = p
            if DROPOUT:  # the paper's Algorithm 2: P dropped after l_i (l and L stay undropped), before P V
                for nt in range(NTILES):
                    for e in range(4):
                        key = col0 + 8 * nt + 2 * int(t) + (e & 1)
                        s[4 * nt + e] *= drop(rk0 if e < 2 else rk1, key, threshold, inv_keep)

            # O_i += P_ij V_j.  P never leaves registers: the accumulators of n8 tiles 2kk and 2kk + 1 are,
            # pair by pair, the A fragment of k16 step kk (module docstring), rounded to the half type here
            for kk in range(PSTEPS):
                a0 = pack(s[8 * kk], s[8 * kk + 1])  # P[g][16kk + 2t, +1]
                a1 = pack(s[8 * kk + 2], s[8 * kk + 3])  # P[g+8][16kk + 2t, +1]
                a2 = pack(s[8 * kk + 4], s[8 * kk + 5])  # P[g][16kk + 8 + 2t, +1]
                a3 = pack(s[8 * kk + 6], s[8 * kk + 7])  # P[g+8][16kk + 8 + 2t, +1]
                for dp in range(DTILES // 2):
                    b0, b1, b2, b3 = ldsm_t(sm, v_row + uint32(16 * kk) * DS_U + uint32(16 * dp))
                    n0, n1 = 8 * dp, 8 * dp + 4
                    acc[n0], acc[n0 + 1], acc[n0 + 2], acc[n0 + 3] = mma(
                        a0, a1, a2, a3, b0, b1, acc[n0], acc[n0 + 1], acc[n0 + 2], acc[n0 + 3])
                    acc[n1], acc[n1 + 1], acc[n1 + 2], acc[n1 + 3] = mma(
                        a0, a1, a2, a3, b2, b3, acc[n1], acc[n1 + 1], acc[n1 + 2], acc[n1 + 3])

        # finish: l_i summed over the quad, O_i / l_i, L_i = m_i ln 2 + log l_i (base-2 m_i).  A row that sees
        # no key (causal): O = 0, L = -inf; a row whose scores are all -inf has l_i = 0: O = L = NaN.
        for r in range(2):
            lt = l[r]
            lt += cuda.shfl_xor_sync(0xFFFFFFFF, lt, 1)
            lt += cuda.shfl_xor_sync(0xFFFFFFFF, lt, 2)
            row = row_g + 8 * r
            if row < Nq:
                hidden = sees_no_key(row, Nq, Nk, CAUSAL)
                inv = ZERO if hidden else ONE / lt
                for dt in range(DTILES):
                    col = 8 * dt + 2 * int(t)
                    for e in range(2):
                        value = ZERO if hidden else acc[4 * dt + 2 * r + e] * inv  # (hidden: 0 even if acc is NaN)
                        if BF16:
                            o[bh, row, col + e] = f32_to_bf16(value)
                        else:
                            o[bh, row, col + e] = value
                if COUNT:
                    nw += 2 * DTILES * ITEM
                if t == 0:
                    lse[bh, row] = NEG_INF if hidden else (m[r] * LN2_F + math.log(lt) if lt != 0 else NAN)
                    if COUNT:
                        nw += 4
        if COUNT:
            add_counts(counter, nr, nw)

    return jit(fastmath=FASTMATH)(kernel)
