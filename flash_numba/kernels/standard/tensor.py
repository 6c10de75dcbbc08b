"""Standard attention's two forward products on tensor cores (float16, bfloat16): S = scale Q K^T and O = P V.

The same three launches as :mod:`.forward`, the same bytes (:mod:`flash_numba.iomodel.standard`),
the same softmax kernel between them: only the two matrix products move from CUDA cores to
``mma.sync`` (:mod:`.._mma`), so that in half precision standard attention differs from
:mod:`flash2_tc` in one thing, S and P going through HBM, as in the paper.  The float16 backward
runs ``scores_kernel`` again, so that its P is exp(S - L) of exactly the forward's S
(:mod:`flash_numba.kernels.standard`).

Blocks: Br = 64 query rows, four warps of 16 rows each (the m16 of m16n8k16); Bc = 16, 32 or 64
keys.  Tiles are 16-bit rows in shared memory, each row padded by 8 elements (16 bytes: the 8
rows an ``ldmatrix`` reads fall in 8 different bank groups), loaded with 16-byte loads
(:mod:`.halves`); head dims are padded with zero columns to DP, a multiple of 16.

``scores_kernel``, per key block j (warp w owns query rows 16 w .. 16 w + 15 of block i)::

    Q_i A fragments: ldmatrix once, kept in registers (DP / 16 of them, 4 words each)
    K_j -> shared; S_ij = Q_i K_j^T: per k step, ldmatrix.x4 of K_j (B fragments of two n8 tiles), 2 mma
    S_ij = round(scale * S_ij), -inf outside the array / above the diagonal     (fp32 accumulators)
    m_i, l_i online, from the rounded S: a lane holds rows g and g + 8, the quad (t = 0..3) a row
    S_ij -> shared -> HBM in 16-byte stores (a warp writes its own 16 rows)

``rowprod_kernel`` (O_i = P_i V): per key block j, P_ij and V_j into shared memory, then per 16 keys
one ldmatrix.x4 of P_ij (the A fragment) and, per 16 columns of d, one ldmatrix.x4.trans of V_j (B
fragments of two n8 tiles: V is stored by rows, B wants columns), 2 mma; O_i stays in fp32
registers until the end; with dropout each P_ij tile is multiplied in shared memory by dropout's factor
(regenerated from the seed) and rounded back to 16 bits first.  A causal tile whose V_j holds an Inf or
NaN is multiplied on CUDA cores instead, so that a masked key adds nothing (0 * Inf would be NaN); a visible
key multiplies, its P 0 or not (IEEE, as the reference).

Measured on the H200 (B*H = 32, N = 4096, d = 64, float16; benchmarks/results/h200-2026-12-01-harness/, c6f8000):
scores 0.96 ms (1.48x its bytes at the copy rate), the softmax 0.58 (0.90x), P V 0.53 (0.82x: V re-read from the
L2): 2.07 ms, 1.07x the forward's byte bound, where the CUDA-core forward took 5.18.  Before the tile loader issued
every load of a tile first (:func:`.halves.tile_loader`) the same forward took 2.97 ms (h200-2026-12-01-standard-tc/).

bfloat16 is stored as uint16 words (the softmax kernel of :mod:`.forward` reads and writes them with
:mod:`.._bf16`'s conversions); its mma is m16n8k16.bf16, from compute capability 8.0.

Fragment layouts (PTX ISA 9.7.14.5, g = lane // 4, t = lane % 4): A (16 x 16) a0 = A[g][2t, 2t+1],
a1 = A[g+8][..], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, ..]; B (16 x 8) b0 = B[2t, 2t+1][g],
b1 = B[2t+8, 2t+9][g]; C (16 x 8) c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1].  On sm_75
(``sm75=True``) each m16n8k16 is two m16n8k8: (a0, a1, b0) then (a2, a3, b1).

ldmatrix.x4 takes one row address per lane: lane l gives row l % 8 of matrix l // 8.  For Q and P
(A, 16 x 16 at (r, k)): row r + l % 16, column k + 8 (l // 16).  For K (B of two n8 tiles at key n,
k): key n + l % 8 + 8 (l // 16), column k + 8 ((l // 8) % 2).  For V (.trans, B of two n8 tiles at
key k, column n): key k + l % 8 + 8 ((l // 8) % 2), column n + 8 (l // 16).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda, float32, int32, types, uint32

from .. import _mma
from .. import _dropout
from .._common import add_counts, madd_if, nan_max, rounded_mul
from .._tile_ops import NT, fast_kernel
from ..causal import crosses_diagonal_dev as crosses_diagonal
from ..causal import sees_no_key_dev as sees_no_key
from .halves import from_shared8, store8, tile_loader
from .layout import FULL_MASK, TC_BCS, TC_BR, TC_PAD, _align, padded_d
from .steps import query_block

BR, BCS, PAD = TC_BR, TC_BCS, TC_PAD


@lru_cache(maxsize=None)
def _conversions(storage_name: str):
    """``(to_storage(float32) -> 16-bit, to_float(16-bit) -> float32, mma_k16)`` for float16 or bfloat16."""
    if storage_name == "float16":
        from numba.types import float16

        from ...device import jit

        @jit(device=True, forceinline=True)
        def to_storage(x):
            return float16(x)

        @jit(device=True, forceinline=True)
        def to_float(h):
            return float32(h)

        return to_storage, to_float, _mma.mma_m16n8k16_f16
    if storage_name == "bfloat16":  # one cvt.rn.bf16x2 a value (sm_80+): the integer rounding of _bf16 took
        from numba import uint16       # acc out of registers in the scores kernel (128 bytes of stack)

        from ...device import jit
        from .._bf16 import bf16_to_f32

        pack = _mma.pack_bf16x2

        @jit(device=True, forceinline=True)
        def to_storage(x):
            return uint16(pack(x, x) & uint32(0xFFFF))

        return to_storage, bf16_to_f32, _mma.mma_m16n8k16_bf16
    raise ValueError(f"dtype: the tensor-core kernels take float16 or bfloat16, got {storage_name}")


def _storage(dtype_name: str) -> str:
    """The Numba element type of the 16-bit arrays (bfloat16 is stored as uint16 words)."""
    return "uint16" if dtype_name == "bfloat16" else dtype_name


@lru_cache(maxsize=None)
def _mma16(dtype_name: str, sm75: bool):
    """``mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> 4 x float32``: one m16n8k16, or two m16n8k8 on sm_75."""
    from ...device import jit

    if not sm75:
        return _conversions(dtype_name)[2]
    if dtype_name != "float16":
        raise ValueError("q: dtype bfloat16 is not supported on the sm_75 path (a T4 has no bfloat16 tensor cores); "
                         "unset FLASH_NUMBA_TC_PATH or use float16")
    k8 = _mma.mma_m16n8k8_f16

    @jit(device=True, forceinline=True)
    def mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        c0, c1, c2, c3 = k8(a0, a1, b0, c0, c1, c2, c3)
        return k8(a2, a3, b1, c0, c1, c2, c3)

    return mma


@lru_cache(maxsize=None)
def scores_kernel(d: int, Br: int, Bc: int, dtype_name: str, causal: bool, count: bool, sm75: bool = False):
    """``S = scale * Q K^T`` for the visible tiles, m, l and L = m + log l, on tensor cores.

    Launch ``kernel[Tr * BH, 128](q, k, s, lse, ml, Nq, Nk, G, scale, vec_qk, vec_s, counter)``:
    the arguments of :func:`.forward.scores_kernel` and two flags, ``vec_qk`` (the rows of q and k
    start on 16 bytes: 16-byte loads) and ``vec_s`` (those of S do: 16-byte stores).  S is rounded
    to the storage dtype before the row statistics are taken, as there.
    """
    assert Br == BR and Bc in BCS, (Br, Bc)
    DP = padded_d(d)
    RS, SS = DP + PAD, Bc + PAD  # row strides of Q_i, K_j and of the S staging tile
    KSTEPS, NTILES = DP // 16, Bc // 8
    SB, AB = 2, 4
    ST = getattr(types, _storage(dtype_name))
    to_storage, to_float, _ = _conversions(dtype_name)
    mma = _mma16(dtype_name, sm75)
    ldm = _mma.ldmatrix_x4
    NEG_INF, ZERO = np.float32(-np.inf), np.float32(0)
    NAN = np.float32(np.nan)
    CAUSAL, COUNT, ALIGN = causal, count, _align()
    CH = Bc // 8  # 16-byte chunks per row of S_ij
    STORES = 16 * CH // 32  # chunks of its 16 rows per lane
    MUL_RN = rounded_mul(np.float32)
    block_start = query_block(Br, Bc, causal)
    load_q = tile_loader(Br, DP, RS, _storage(dtype_name), count)
    load_k = tile_loader(Bc, DP, RS, _storage(dtype_name), count)

    Q_SIZE, K_SIZE, S_SIZE = Br * RS, Bc * RS, Br * SS  # shared-array sizes must be constants
    def kernel(q, k, s_out, lse, ml, Nq, Nk, G, scale, vec_qk, vec_s, counter):
        Qs = cuda.shared.array(Q_SIZE, ST, alignment=ALIGN)  # Q_i (Br, RS)
        Ks = cuda.shared.array(K_SIZE, ST, alignment=ALIGN)  # K_j (Bc, RS)
        Ss = cuda.shared.array(S_SIZE, ST, alignment=ALIGN)  # S_ij (Br, SS), on its way to HBM
        qa = cuda.local.array((KSTEPS, 4), uint32)  # Q_i's A fragments, one per 16 columns of d
        acc = cuda.local.array((NTILES, 4), float32)  # S_ij: NTILES n8 tiles of 16 x 8
        m = cuda.local.array(2, float32)  # rows g and g + 8 of the warp's 16
        l = cuda.local.array(2, float32)
        tid = cuda.threadIdx.x
        lane, w = tid % 32, tid // 32
        g, t = lane // 4, lane % 4
        r0, bh, hkv, n_j = block_start(Nq, Nk, G)  # the last (longest when causal) query block of every head first
        off = Nk - Nq
        nr = 0
        nw = 0

        n = load_q(q, bh, r0, 0, Nq - r0, d, vec_qk, Qs, tid)
        if COUNT:
            nr += n * SB
        cuda.syncthreads()
        a_at = uint32((16 * w + lane % 16) * RS + 8 * (lane // 16))
        for kk in range(KSTEPS):
            qa[kk, 0], qa[kk, 1], qa[kk, 2], qa[kk, 3] = ldm(Qs, a_at + uint32(16 * kk))
        for h in range(2):
            m[h] = NEG_INF
            l[h] = ZERO
        row = r0 + 16 * w + g  # this lane's first row; the second is row + 8
        b_at = uint32((lane % 8 + 8 * (lane // 16)) * RS + 8 * ((lane // 8) % 2))
        for j in range(n_j):
            c0 = j * Bc
            cuda.syncthreads()  # everyone is done with K_j and S_ij of the previous step
            n = load_k(k, hkv, c0, 0, Nk - c0, d, vec_qk, Ks, tid)
            if COUNT:
                nr += n * SB
            cuda.syncthreads()
            for nt in range(NTILES):
                for e in range(4):
                    acc[nt, e] = ZERO
            for kk in range(KSTEPS):  # S_ij = Q_i K_j^T
                for p in range(NTILES // 2):
                    b0, b1, b2, b3 = ldm(Ks, b_at + uint32(16 * p * RS + 16 * kk))
                    acc[2 * p, 0], acc[2 * p, 1], acc[2 * p, 2], acc[2 * p, 3] = mma(
                        qa[kk, 0], qa[kk, 1], qa[kk, 2], qa[kk, 3], b0, b1,
                        acc[2 * p, 0], acc[2 * p, 1], acc[2 * p, 2], acc[2 * p, 3])
                    acc[2 * p + 1, 0], acc[2 * p + 1, 1], acc[2 * p + 1, 2], acc[2 * p + 1, 3] = mma(
                        qa[kk, 0], qa[kk, 1], qa[kk, 2], qa[kk, 3], b2, b3,
                        acc[2 * p + 1, 0], acc[2 * p + 1, 1], acc[2 * p + 1, 2], acc[2 * p + 1, 3])
            edge = c0 + Bc > Nk or (CAUSAL and crosses_diagonal(r0, c0, Bc, Nq, Nk))  # uniform over the block
            for nt in range(NTILES):  # scale, round to the storage dtype, mask; stage for the store
                for e in range(4):
                    x = to_float(to_storage(MUL_RN(scale, acc[nt, e])))
                    if edge:
                        col = c0 + 8 * nt + 2 * t + e % 2
                        if col >= Nk or (CAUSAL and col > row + 8 * (e // 2) + off):
                            x = NEG_INF
                    acc[nt, e] = x
                    Ss[(16 * w + g + 8 * (e // 2)) * SS + 8 * nt + 2 * t + e % 2] = to_storage(x)
            for h in range(2):  # online row max and sum: a row's 16 .. 64 values lie on the 4 lanes of a quad
                mx = NEG_INF
                for nt in range(NTILES):
                    mx = nan_max(mx, nan_max(acc[nt, 2 * h], acc[nt, 2 * h + 1]))
                mx = nan_max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 1))
                mx = nan_max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 2))
                m_new = nan_max(m[h], mx)
                m_use = ZERO if m_new == NEG_INF else m_new  # all -inf so far: exp(-inf - 0) = 0, not NaN
                l[h] *= math.exp(m[h] - m_use)
                for nt in range(NTILES):
                    l[h] += math.exp(acc[nt, 2 * h] - m_use) + math.exp(acc[nt, 2 * h + 1] - m_use)
                m[h] = m_new
            cuda.syncthreads()
            for it in range(STORES):  # the warp's 16 rows of S_ij, 16 bytes a lane, a row's chunks side by side
                ch = lane + 32 * it
                rl = 16 * w + ch // CH
                cl = (ch % CH) * 8
                gr = r0 + rl
                gc = c0 + cl
                if gr < Nq:
                    if vec_s and gc + 8 <= Nk:
                        store8(s_out, bh, uint32(gr), uint32(gc), from_shared8(Ss, uint32(rl * SS + cl)))
                        if COUNT:
                            nw += 8 * SB
                    else:
                        for u in range(8):
                            if gc + u < Nk:
                                s_out[bh, gr, gc + u] = Ss[rl * SS + cl + u]
                                if COUNT:
                                    nw += SB

        # L_i = m_i + log l_i, l_i summed over the quad; -inf for a row that sees no key (causal),
        # NaN for one whose scores are all -inf (l_i = 0)
        for h in range(2):
            lt = l[h]
            lt += cuda.shfl_xor_sync(FULL_MASK, lt, 1)
            lt += cuda.shfl_xor_sync(FULL_MASK, lt, 2)
            r = row + 8 * h
            if t == 0 and r < Nq:
                hidden = sees_no_key(r, Nq, Nk, CAUSAL)
                lse[bh, r] = NEG_INF if hidden else (m[h] + math.log(lt) if lt != 0 else NAN)
                ml[bh, 0, r] = m[h]
                ml[bh, 1, r] = lt
                if COUNT:
                    nw += 3 * AB
        if COUNT:
            add_counts(counter, nr, nw)

    return fast_kernel(kernel)


@lru_cache(maxsize=None)
def rowprod_kernel(d: int, Br: int, Bc: int, dtype_name: str, causal: bool, count: bool, sm75: bool = False,
                   dropout: bool = False):
    """``C_i = alpha * sum_j A_ij B_j`` on tensor cores (``O = P V``), one query block per thread block.

    Launch ``kernel[Tr * BH, 128](a, b, c, Nq, Nk, G, alpha, vec_a, vec_b, counter, seed, threshold, inv_keep)``
    (the last three dropout's, used iff ``dropout``: each A_ij tile in shared memory is multiplied by dropout's
    factor Zs and rounded back to the storage dtype, O = (Zs P) V; P in HBM stays the softmax): ``a`` (BH, Nq, Nk),
    read in the visible tiles only (P: zeros above the diagonal, as the softmax wrote them); ``b``
    (BH / G, Nk, d) input, head bh // G; ``c`` (BH, Nq, d); ``vec_a``, ``vec_b``: the rows of a, b
    start on 16 bytes (16-byte loads).  A tile that the causal diagonal crosses and whose V_j holds an Inf
    or NaN is multiplied on CUDA cores, skipping the masked entries (an mma would add 0 * Inf = NaN), as
    the CUDA-core kernel does: masked keys add nothing, visible ones multiply, P = 0 or not (docs/RELIABILITY.md).
    """
    assert Br == BR and Bc in BCS, (Br, Bc)
    DP = padded_d(d)
    RS, AS = DP + PAD, Bc + PAD  # row strides of B_j and of A_ij
    KSTEPS, DTILES = Bc // 16, DP // 8
    SB = 2
    ST = getattr(types, _storage(dtype_name))
    to_storage, to_float, _ = _conversions(dtype_name)
    mma = _mma16(dtype_name, sm75)
    ldm, ldm_t = _mma.ldmatrix_x4, _mma.ldmatrix_x4_trans
    ZERO = np.float32(0)
    CAUSAL, COUNT, ALIGN, DROPOUT = causal, count, _align(), dropout
    drop_head, drop_row, drop = _dropout.factor(dropout, "float32")
    block_start = query_block(Br, Bc, causal)
    load_a = tile_loader(Br, Bc, AS, _storage(dtype_name), count)
    load_b = tile_loader(Bc, DP, RS, _storage(dtype_name), count)

    A_SIZE, B_SIZE = Br * AS, Bc * RS  # shared-array sizes must be constants
    def kernel(a_in, b_in, c_out, Nq, Nk, G, alpha, vec_a, vec_b, counter, seed, threshold, inv_keep):
        As = cuda.shared.array(A_SIZE, ST, alignment=ALIGN)  # A_ij (Br, AS)
        Bs = cuda.shared.array(B_SIZE, ST, alignment=ALIGN)  # B_j (Bc, RS)
        acc = cuda.local.array((DTILES, 4), float32)  # C_i: DTILES n8 tiles of 16 x 8
        tid = cuda.threadIdx.x
        lane, w = tid % 32, tid // 32
        g, t = lane // 4, lane % 4
        r0, bh, hkv, n_j = block_start(Nq, Nk, G)
        nr = 0
        nw = 0
        for nt in range(DTILES):
            for e in range(4):
                acc[nt, e] = ZERO
        a_at = uint32((16 * w + lane % 16) * AS + 8 * (lane // 16))
        b_at = uint32((lane % 8 + 8 * ((lane // 8) % 2)) * RS + 8 * (lane // 16))
        for j in range(n_j):
            c0 = j * Bc
            cuda.syncthreads()  # everyone is done with the previous tiles
            n = load_a(a_in, bh, r0, c0, Nq - r0, Nk - c0, vec_a, As, tid)  # P_ij
            n += load_b(b_in, hkv, c0, 0, Nk - c0, d, vec_b, Bs, tid)  # V_j
            if COUNT:
                nr += n * SB
            cuda.syncthreads()
            if DROPOUT:  # A_ij = Zs P_ij: dropout's mask, regenerated (zeros past Nq and Nk stay 0)
                for e in range(tid, Br * Bc, NT):
                    r, c = e // Bc, e % Bc
                    zs = drop(drop_row(drop_head(seed, bh), r0 + r), c0 + c, threshold, inv_keep)
                    As[r * AS + c] = to_storage(to_float(As[r * AS + c]) * zs)
                cuda.syncthreads()
            if CAUSAL and crosses_diagonal(r0, c0, Bc, Nq, Nk):  # masked P_ij = 0 against Inf/NaN in B_j?
                bad = int32(0)
                for e in range(tid, Bc * d, NT):
                    if not math.isfinite(to_float(Bs[(e // d) * RS + e % d])):
                        bad = int32(1)
                if cuda.syncthreads_or(bad):  # rare: this tile on CUDA cores, a masked key adding nothing
                    lim = r0 + 16 * w + g + (Nk - Nq) - c0  # the lane's first row sees keys c0 + kk, kk <= lim
                    for kk in range(Bc):  # (the key loop outside: acc's indices stay constants, in registers)
                        a_lo = to_float(As[(16 * w + g) * AS + kk])
                        a_hi = to_float(As[(16 * w + g + 8) * AS + kk])
                        for nt in range(DTILES):
                            for e in range(4):
                                b = to_float(Bs[kk * RS + 8 * nt + 2 * t + e % 2])
                                acc[nt, e] = madd_if(acc[nt, e], a_hi if e >= 2 else a_lo, b, kk <= lim + 8 * (e // 2))
                    continue
            for kk in range(KSTEPS):  # C_i += A_ij B_j, 16 keys a step
                a0, a1, a2, a3 = ldm(As, a_at + uint32(16 * kk))
                for p in range(DTILES // 2):
                    b0, b1, b2, b3 = ldm_t(Bs, b_at + uint32(16 * kk * RS + 16 * p))
                    acc[2 * p, 0], acc[2 * p, 1], acc[2 * p, 2], acc[2 * p, 3] = mma(
                        a0, a1, a2, a3, b0, b1, acc[2 * p, 0], acc[2 * p, 1], acc[2 * p, 2], acc[2 * p, 3])
                    acc[2 * p + 1, 0], acc[2 * p + 1, 1], acc[2 * p + 1, 2], acc[2 * p + 1, 3] = mma(
                        a0, a1, a2, a3, b2, b3,
                        acc[2 * p + 1, 0], acc[2 * p + 1, 1], acc[2 * p + 1, 2], acc[2 * p + 1, 3])
        row = r0 + 16 * w + g
        for nt in range(DTILES):  # C_i = alpha C_i, rows g and g + 8 of the warp, columns 8 nt + 2t, + 1
            for e in range(4):
                r = row + 8 * (e // 2)
                col = 8 * nt + 2 * t + e % 2
                if r < Nq and col < d:
                    c_out[bh, r, col] = to_storage(alpha * acc[nt, e])
                    if COUNT:
                        nw += SB
        if COUNT:
            add_counts(counter, nr, nw)

    return fast_kernel(kernel)
