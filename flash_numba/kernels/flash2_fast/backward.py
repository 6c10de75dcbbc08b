"""The flash2_fast backward kernels: dK/dV per key block, dQ per query block, or dK/dV/dQ with atomics.

After D = rowsum(dO * O) (:mod:`flash_numba.kernels._rowsum`):

* ``dkdv_kernel``: a block owns Bc = 8 TM keys (thread rows), keeps dK_j, dV_j in
  registers and walks over the query blocks of Br = 16 TN rows that see its keys,
  recomputing S^T = K_j Q_i^T and P^T, dP^T = V_j dO_i^T, dS^T = P^T * (dP^T - D),
  then dV_j += P^T dO_i and dK_j += dS^T Q_i (from d = 113 on, one after the other, P and dS
  taking turns in one shared tile: :data:`.layout.SHARE_P_DS_MIN_TD`).  With ``atomic_dq`` it also adds
  dS_ij K_j into dQ_i in HBM with atomics (FlashAttention-2's way: no second pass).
  Where :func:`.layout.split_s_dp` says so, warps 0-1 compute S^T and P, warps 2-3 dP^T and then dS
  from the P that warps 0-1 left in shared memory: each thread one micro-tile of twice the queries,
  so fewer shared loads per multiply-add (the backward 6-7% faster at d = 128 on the H200: 2026-12-01, 4f81286,
  ``benchmarks/results/h200-2026-12-01-s14/A/``); and where
  P and dS have a tile each, warps 0-1 keep dV_j and warps 2-3 dK_j (:func:`.layout.split_dv_dk`).
  On a grid of one block per key tile (``deterministic=False``) the order of the
  additions, so the last bits of dQ, vary from run to run.  On a grid of S blocks per
  head (the split deterministic backward), launched once per round, block s runs key
  tiles s, 2S-1-s, 2S+s, .. one a launch, and adds into its own copy s of dQ: one
  block at a time, in one order; ``sum_copies_kernel`` then adds the copies in a fixed order.
* ``dq_kernel``: a block owns Br = 8 TM queries, keeps dQ_i in registers and walks
  over the visible key blocks, recomputing S, P, dP and dS; dQ_i += dS K_j.

Same micro-tiles as the forward (:mod:`.layout`).  In the dK/dV kernel, as in the forward, a
thread's queries are 16 apart (tx + 16 b; 8 apart, rx + 8 b, where S^T and dP^T are split) and
Q_i, dO_i are held row-major with a stride of an odd number of 16-byte chunks: S^T and dP^T read
each query's row 16 bytes at a time, P and dS are stored 16 bytes at a time, all conflict-free;
dV_j += P^T dO_i and dK_j += dS^T Q_i read rows of dO_i, Q_i into columns in quads 64 apart
(x = 4 tx + u % 4 + 64 (u // 4): 16-byte loads on all banks) where TD is a multiple of 4, else 16
apart (x = tx + 16 u); where dV_j and dK_j are split across warps too (:func:`.layout.split_dv_dk`),
a thread's 2 TD columns in quads 32 apart (x = 4 rx + u % 4 + 32 (u // 4)).  At N = 4096 on the
H200 that took fwd+bwd at d = 64 from 16.46 to 15.78 ms (atomic 15.62 to 15.23; 2026-12-01, cf89f39,
``benchmarks/results/h200-2026-12-01-s10/D/``).  The dQ
kernel reads the transposed tiles of before: an odd row stride (conflict-free scalar loads) and
strided columns (x = tx + 16 u).  Every output element is summed by one thread in a fixed
order (deterministic) except dQ in the atomic kernel on its one-tile-a-block grid.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda, int32, int64, uint32, uint64

from ...device import jit
from .. import _dropout, _smem, _tile_ops
from .._common import acc_nb_type, add_counts, exp2_ieee, group_step, kv_head, madd_if, nb_type
from .._common import rounded_mul
from ..causal import crosses_diagonal_dev as crosses_diagonal
from ..causal import first_visible_q_block_dev as first_visible_q_block
from ..causal import key_limit_dev as key_limit
from ..causal import visible_kv_blocks_dev as visible_kv_blocks
from .layout import (
    BACKWARD_KV_NAME,
    BACKWARD_KVQ_NAME,
    FASTMATH,
    NT,
    TX,
    built_from_tiles,
    device_register_cap,
    dq_lane_groups,
    geometry_kv,
    geometry_q,
    scalars,
    split_dv_dk,
    split_s_dp,
)

ELEMWISE_THREADS = 256
#: The dK/dV kernel's S^T and dP^T: each in half the block's threads, an 8 x 8 grid (ry, rx).
SPLIT_THREADS, SPLIT_X = NT // 2, 8
#: Elements each thread of ``zero_kernel`` zeroes: 512 MB of copies took 0.32 ms with one (1.6 TB/s) and 0.12 with
#: four (2026-11-30, benchmarks/results/h200-2026-11-30-s8/F/ncu.csv and G/ncu_zero.csv).
ZEROS_PER_THREAD = 4


def _kernel_constants(dtype_name: str):
    """(accumulation dtype name, Numba ACC type, storage bytes, accumulation bytes)."""
    dtype = np.dtype(dtype_name)
    acc = "float64" if dtype == np.float64 else "float32"
    return acc, acc_nb_type(dtype), dtype.itemsize, np.dtype(acc).itemsize


@built_from_tiles  # dropped when layout's switches change (layout.p_ds_tiles, s_dp_split, dq_lanes)
@lru_cache(maxsize=None)
def dkdv_kernel(d: int, TM: int, TN: int, dtype_name: str, causal: bool, count: bool, maxreg=-1,
                atomic_dq: bool = False, dropout: bool = False, dynamic: bool = False):
    """``(kernel, geometry)``: dK_j, dV_j for one key block of Bc = 8 TM rows (and dQ by atomics).

    Arguments: ``(q, k, v, do, lse, D, dk, dv, dq, Nq, Nk, G, rnd, scale, scale_log2, counter, q_lay, k_lay,
    v_lay, do_lay, seed, threshold, inv_keep)``: ``rnd`` the round of key tiles (0 but for the split
    backward's launches, see the comment in the kernel); q, k, v, do flat inputs and their layouts
    (:func:`flash_numba._views.flat_input`), the last three dropout's (used iff ``dropout``); ``dq`` is
    a zeroed buffer of the accumulation dtype with ``atomic_dq``, else never touched.  A block of
    key/value head hkv walks over the query blocks of its G query heads in turn (grouped-query
    attention, G = Hq / Hkv; dk and dv have B*Hkv heads).  ``maxreg``:
    register cap (-1: the cap for this device, :func:`.layout.register_cap`; None: uncapped).  ``dynamic``: the
    tiles live in dynamic shared memory (``geometry["smem"]`` bytes at launch, see :mod:`.._smem`).
    """
    acc, ACC, SB, AB = _kernel_constants(dtype_name)
    MUL_RN = rounded_mul(acc)  # scale * S rounded as the forward rounds it
    g = geometry_kv(d, TM, TN, dtype_name)
    Br, Bc, TD, DP, KS, QS, PS = (g[x] for x in ("Br", "Bc", "TD", "DP", "KS", "QS", "PS"))
    CAUSAL, COUNT, ATOMIC_DQ = causal, count, atomic_dq
    _, _, ZERO, ONE, _, _ = scalars(dtype_name)
    block_tiles = _smem.tiles(g["tiles"], acc, dynamic)  # in dynamic shared memory iff ``dynamic``
    # dQ_i += dS_ij K_j: warp w owns query rows w*RW .. of the block; its lanes in G groups of 32/G (dq_lane_groups):
    # group h the RH = RW/G rows w*RW + h*RH .., lane l of it the NX dQ columns l + (32/G) u
    RW = Br // (NT // 32)
    G_DQ = dq_lane_groups(RW, DP, causal and dropout)
    RH, LG = RW // G_DQ, 32 // G_DQ
    NX = -(-DP // LG)
    KS_U, BC_U, FOUR_U, DP_MAX, D_U = np.uint32(KS), np.uint32(Bc), np.uint32(4), np.uint32(DP), np.uint32(d)
    LG_U, RH_U, GROUPED = np.uint32(LG), np.uint32(RH), G_DQ > 1
    NX_FULL = d == LG * NX  # every lane's dQ columns exist: no column test
    load_kv = _tile_ops.padded_loader(Bc, d, DP, KS, True, acc, count)
    # Q_i, dO_i row-major (16-byte global loads here measured slower: 2026-12-01, results/h200-2026-12-01-s10/C/)
    load_q, zero_q_padding = _tile_ops.pair_loader(Br, d, DP, QS, QS, False, acc, count, False)
    load_stats = _tile_ops.stats_loader(Br, acc, count)
    # S^T = K Q^T and dP^T = V dO^T.  SPLIT (:func:`.layout.split_s_dp`): S^T in warps 0-1 (role 0), dP^T in warps
    # 2-3 (role 1), a thread's TM x 2TN micro-tile of one of them: its keys ry*TM .., its queries rx + 8 b (8
    # apart: rows of Q_i, dO_i read 16 bytes at a time, 8 rows a warp on all banks), TM + 2TN shared loads a step
    # for 2 TM TN multiply-adds.  Else a thread computes both, TM x TN of each, its queries tx + 16 b: 2 TM + 2 TN
    # loads for as many (rows of Q_i, dO_i read 16 bytes at a time, and the stores of P, dS below on all banks)
    s_or_dp_product = _tile_ops.strided_product(TM, 2 * TN, DP, KS, QS, SPLIT_X * QS, 1, False, True, acc)
    s_dp_product = _tile_ops.strided_product(TM, TN, DP, KS, QS, TX * QS, 1, True, True, acc)
    # P^T dO_i, dS^T Q_i into this thread's columns of dV, dK: quads 64 apart (TD a multiple of 4, 16-byte reads
    # of dO_i, Q_i rows on all banks), else 16 apart (scalar reads)
    X0, XOFF, XCOL, QUADS = _tile_ops.thread_columns(TD)
    dv_dk_product = _tile_ops.strided_product(TM, TD, Br, PS, X0, XCOL, QS, True, False, acc, False, QUADS)
    # on blocks the diagonal crosses: P, dS (queries k x keys ty*TM + a), a masked entry adding nothing
    dv_dk_masked = _tile_ops.strided_product(TM, TD, Br, PS, X0, XCOL, QS, True, False, acc, "queries", QUADS)
    # P and dS in one tile (layout.SHARE_P_DS_MIN_TD): the two products one after the other
    SHARE = g["share_p_ds"]
    one_product = _tile_ops.strided_product(TM, TD, Br, PS, X0, XCOL, QS, False, False, acc, False, QUADS)
    one_masked = _tile_ops.strided_product(TM, TD, Br, PS, X0, XCOL, QS, False, False, acc, "queries", QUADS)
    store = _tile_ops.strided_store(TM, TD, d, True, count, (X0, XOFF))  # the products' columns
    PS_U = np.uint32(PS)
    launch = BACKWARD_KVQ_NAME if atomic_dq else BACKWARD_KV_NAME
    maxreg = device_register_cap(launch, d, dtype_name, dynamic, count) if maxreg == -1 else maxreg
    SPLIT = split_s_dp(TN, maxreg)
    TN2, DROPOUT = 2 * TN, dropout
    ST_COLS = TN2 if SPLIT else TN
    # with SPLIT and two tiles for P and dS, dV_j in warps 0-1 and dK_j in warps 2-3 too (split_dv_dk): a thread's
    # TM x 2TD of one, columns in quads 32 apart (4 rx + u % 4 + 32 (u // 4): a warp's 16-byte reads of a row of
    # dO_i or Q_i cover 8 adjacent chunks, all banks): TM + 2TD loads a query for 2 TM TD multiply-adds, not 2 TM + 2TD
    SPLIT_KV = split_dv_dk(SPLIT, g["share_p_ds"], TD)
    TD2 = 2 * TD
    KV_COLS = tuple(u % 4 + 32 * (u // 4) for u in range(TD2))
    kv_product = _tile_ops.strided_product(TM, TD2, Br, PS, 4, 1, QS, False, False, acc, False, 32)
    kv_masked = _tile_ops.strided_product(TM, TD2, Br, PS, 4, 1, QS, False, False, acc, "queries", 32)
    kv_store = _tile_ops.strided_store(TM, TD2, d, False, count, (4, KV_COLS))

    def dq_partial(masked: bool):
        """``partial(dqp, kq, ds4, KT, dSs, lane, warp, diag)``: dqp = this step's dS_ij K_j for the lane's rows and
        columns; ``masked`` (blocks the diagonal crosses, ``diag = r0 + (Nk - Nq) - c0``): a masked entry adds
        nothing, even against Inf or NaN in K_j, a visible one multiplies, dS = 0 or not (a select per multiply-add)."""
        MASKED = masked

        @jit(device=True, forceinline=True)
        def partial(dqp, kq, ds4, KT, dSs, lane, warp, diag):
            for a in range(RH):
                for u in range(NX):
                    dqp[a, u] = ZERO
            col = lane  # the lane's first column, and its first row, in its group
            first = warp * uint32(RW)
            if GROUPED:
                col = lane % LG_U
                first += lane // LG_U * RH_U
            kqi = col * KS_U  # K_j^T[col, c]
            dsi = first * uint32(PS)  # dS_ij[first, c]
            lim = int32(diag) + int32(first)  # row first + a sees key c + t iff c + t - a <= lim
            c = uint32(0)
            while c < BC_U:
                for u in range(NX):
                    for t in range(4):
                        kq[u, t] = ZERO
                        if NX_FULL or col + uint32(LG * u) < DP_MAX:
                            kq[u, t] = KT[kqi + uint32(LG * u * KS + t)]
                for a in range(RH):
                    for t in range(4):
                        ds4[t] = dSs[dsi + uint32(a * PS + t)]
                    for u in range(NX):
                        for t in range(4):
                            if MASKED:
                                seen = int32(c) + int32(t - a) <= lim
                                dqp[a, u] = madd_if(dqp[a, u], ds4[t], kq[u, t], seen)
                            else:
                                dqp[a, u] += ds4[t] * kq[u, t]
                kqi += FOUR_U
                dsi += FOUR_U
                c += FOUR_U

        return partial

    dq_plain, dq_masked = dq_partial(False), dq_partial(True)
    BRPS_U, PASSES = np.uint32(Br * PS), -(-Br * PS // NT)

    @jit(device=True, forceinline=True)
    def zero_rows_past(X, Y, n, tid):
        """Rows n .. Br - 1 of the (Br, PS) tiles X and Y (P and dS, or dS twice) set to 0, the block's threads taking
        every NT-th entry."""
        first = uint32(n) * PS_U
        for t in range(PASSES):
            e = uint32(tid) + uint32(t * NT)
            if e >= first and e < BRPS_U:
                X[e] = ZERO
                Y[e] = ZERO
    drop_head, drop_row, drop = _dropout.factor(dropout, acc)

    def kernel(q, k, v, do, lse, D, dk, dv, dq, Nq, Nk, G, rnd, scale, scale_log2, counter, q_lay, k_lay, v_lay,
               do_lay, seed, threshold, inv_keep):
        # K_j^T, V_j^T (DP, KS); Q_i, dO_i (Br, QS); P_ij, dS_ij (Br, PS); L_i in log2 units (+inf past Nq), D_i (Br)
        if SHARE:
            KT, VT, Qs, dOs, Ps, Ls, Ds = block_tiles()
            dSs = Ps  # P, then dS
        else:
            KT, VT, Qs, dOs, Ps, dSs, Ls, Ds = block_tiles()
        # SPLIT: S^T, then P^T (role 0); dP^T, then dS^T (role 1).  Else S^T, then P^T, and dP^T, then dS^T
        sT = cuda.local.array((TM, ST_COLS), ACC)
        dpT = cuda.local.array((TM, TN), ACC)
        dk_acc = cuda.local.array((TM, TD), ACC)
        dv_acc = cuda.local.array((TM, TD), ACC)
        kv_acc = cuda.local.array((TM, TD2), ACC)  # SPLIT_KV: dV_j (role 0) or dK_j (role 1)
        dqp = cuda.local.array((RH, NX), ACC)  # atomic dQ: this step's partial sums
        kq = cuda.local.array((NX, 4), ACC)
        ds4 = cuda.local.array(4, ACC)

        tid = cuda.threadIdx.x
        ty, tx = tid // TX, tid % TX
        lane = uint32(tid % 32)
        warp = uint32(tid // 32)
        role = tid // SPLIT_THREADS  # 0: S^T and P; 1: dP^T and dS (warp-uniform)
        ry, rx = (tid % SPLIT_THREADS) // SPLIT_X, tid % SPLIT_X
        # a 1-D grid of S * B*Hkv blocks, launched once per round of S key tiles: block s of key/value head
        # hkv runs tile rnd*S + s, or rnd*S + S-1-s in odd rounds (with causal masking the first key tiles are
        # the longest, they see every query block, so each block gets long and short ones).  S = Tc and one
        # round but for the split deterministic dQ, whose block s adds into dQ copy s (dq holds ``copies`` = S
        # or 1 copies of the B*H query heads); rounds are launches, so one runs after the other
        BHkv = uint32(dk.shape[0])
        split = uint32(cuda.blockIdx.x) // BHkv
        hkv = int64(uint32(cuda.blockIdx.x) - split * BHkv)  # key/value head
        S = uint32(cuda.gridDim.x) // BHkv
        tile = int64(uint32(rnd) * S + (split if rnd % 2 == 0 else S - uint32(1) - split))
        if tile * Bc >= Nk:  # a last round with fewer tiles than blocks
            return
        if ATOMIC_DQ:  # this block's copy of dQ (a view: no register more than dq's own)
            heads = int64(BHkv) * G
            dq = dq[int64(split % uint32(dq.shape[0] // heads)) * heads:]
        nq_u = uint32(Nq)  # unsigned compares: uint32 < int64 would compare as float64
        c0 = tile * Bc
        nr = 0
        n_atomic = uint32(0)  # atomic adds (a read and a write of AB bytes each): 32 bits, a register less

        n = load_kv(KT, VT, k, v, k_lay, v_lay, hkv, c0, Nk, tid)  # K_j, V_j -> KT, VT once, 0 past Nk and d
        if COUNT:
            nr += n * SB
        zero_q_padding(Qs, dOs, tid)
        for a in range(TM):
            for u in range(TD):
                dk_acc[a, u] = ZERO
                dv_acc[a, u] = ZERO
            for u in range(TD2):
                kv_acc[a, u] = ZERO

        i_first = first_visible_q_block(c0, Br, Nq, Nk, CAUSAL)
        n_i = (Nq + Br - 1) // Br - i_first
        for step in range(G * n_i):  # the query blocks of each query head bh of the group in turn
            bh, i = group_step(step, n_i, i_first, hkv, G)
            r0 = i * Br
            head = drop_head(seed, bh)  # dropout's hash of the query head
            cuda.syncthreads()  # previous step is done with Qs, dOs, Ps, dSs
            n = load_q(Qs, dOs, q, do, q_lay, do_lay, bh, r0, Nq, tid)
            n_stats = load_stats(Ls, Ds, lse, D, bh, r0, Nq, tid)
            if COUNT:
                nr += n * SB + n_stats * AB
            cuda.syncthreads()

            diagonal = CAUSAL and crosses_diagonal(r0, c0, Bc, Nq, Nk)
            edge = c0 + Bc > Nk or diagonal  # uniform over the block
            if SPLIT:
                # P = exp(S - L) (recomputed with the given L, unclamped) by role 0, stored row-major; then role 1
                # reads it back for the same entries: dS = P * (Zs dP - D), and Zs P over P (Zs: dropout's factor,
                # regenerated).  Both 0 where masked, past Nk or past Nq
                if role == 0:
                    s_or_dp_product(sT, sT, KT, KT, Qs, Qs, ry, rx)
                    for b in range(TN2):
                        rl = rx + SPLIT_X * b  # this thread's query b
                        lim = key_limit(r0 + rl, c0 + ry * TM, Nq, Nk, CAUSAL)  # keys c0 + ry*TM + a, a <= lim
                        at = uint32(rl) * PS_U + uint32(ry * TM)  # TM adjacent keys of query rl: 16-byte stores
                        L2 = Ls[rl]
                        for a in range(TM):
                            p = exp2_ieee(MUL_RN(scale_log2, sT[a, b]) - L2)  # rounded as in the forward
                            if edge and a > lim:
                                p = ZERO
                            Ps[at + uint32(a)] = p
                else:
                    s_or_dp_product(sT, sT, VT, VT, dOs, dOs, ry, rx)
                cuda.syncthreads()
                if role == 1:
                    for b in range(TN2):
                        rl = rx + SPLIT_X * b
                        Dv = Ds[rl]
                        lim = TM  # no key masked
                        if edge:
                            lim = key_limit(r0 + rl, c0 + ry * TM, Nq, Nk, CAUSAL)
                        rk = drop_row(drop_head(seed, bh), r0 + rl)  # dropout's hash of the row
                        at = uint32(rl) * PS_U + uint32(ry * TM)
                        for a in range(TM):
                            p = Ps[at + uint32(a)]
                            zs = drop(rk, c0 + ry * TM + a, threshold, inv_keep)  # dropout's factor (1 without)
                            ds = p * (zs * sT[a, b] - Dv)
                            if edge and a > lim:
                                ds = ZERO
                            sT[a, b] = ds
                            if DROPOUT:
                                Ps[at + uint32(a)] = p * zs
                            if not SHARE:
                                dSs[at + uint32(a)] = ds
                if DROPOUT or not SHARE:
                    cuda.syncthreads()
            else:
                s_dp_product(sT, dpT, KT, VT, Qs, dOs, ty, tx)
                # P = exp(S - L) (recomputed with the given L, unclamped), dS = P * (Zs dP - D), both selected
                # to 0 where masked, past Nk or Nq; stored row-major, P as Zs P (Zs: dropout's factor, regenerated)
                for b in range(TN):
                    rl = tx + TX * b  # this thread's query b
                    L2 = Ls[rl]
                    Dv = Ds[rl]
                    lim = key_limit(r0 + rl, c0 + ty * TM, Nq, Nk, CAUSAL)  # keys c0 + ty*TM + a, a <= lim
                    rk = drop_row(head, r0 + rl)  # dropout's hash of the row
                    for a in range(TM):
                        p = exp2_ieee(MUL_RN(scale_log2, sT[a, b]) - L2)  # rounded as in the forward
                        zs = drop(rk, c0 + ty * TM + a, threshold, inv_keep)  # dropout's factor (1 without)
                        ds = p * (zs * dpT[a, b] - Dv)
                        if edge and a > lim:
                            p = ZERO
                            ds = ZERO
                        sT[a, b] = p * zs
                        dpT[a, b] = ds
                    at = uint32(rl) * PS_U + uint32(ty * TM)  # TM adjacent keys of query rl: 16-byte stores
                    for a in range(TM):
                        Ps[at + uint32(a)] = sT[a, b]
                        if not SHARE:
                            dSs[at + uint32(a)] = dpT[a, b]
                if r0 + Br > Nq:  # the rows past Nq (see below): each thread zeroes the P and dS it stored
                    for b in range(TN):
                        if r0 + tx + TX * b >= Nq:
                            at = uint32(tx + TX * b) * PS_U + uint32(ty * TM)
                            for a in range(TM):
                                Ps[at + uint32(a)] = ZERO
                                dpT[a, b] = ZERO
                                if not SHARE:
                                    dSs[at + uint32(a)] = ZERO
                cuda.syncthreads()
            # the last query block: its rows past Nq hold S = 0 * Inf = NaN against an infinite key (and dP = NaN
            # against an infinite value), so their P and dS are set to 0 after the loops above (selected inside
            # them, as masked entries are, the test cost the atomic kernel spills): by each thread for its own
            # entries without SPLIT, by a pass of the block's threads once all are stored with it
            if SPLIT and r0 + Br > Nq:
                if SHARE and not DROPOUT:
                    cuda.syncthreads()  # the one path without a barrier after the stores above
                zero_rows_past(Ps, Ps if SHARE else dSs, Nq - r0, tid)
                cuda.syncthreads()

            diag = r0 + (Nk - Nq) - c0  # query r0 + r sees key c0 + c iff c - r <= diag (the masked products)
            if SHARE:  # dV_j += P^T dO_i; then dS over P (every thread done with P); dK_j += dS^T Q_i below
                if diagonal:
                    one_masked(dv_acc, dv_acc, Ps, Ps, dOs, dOs, ty, tx, diag)
                else:
                    one_product(dv_acc, dv_acc, Ps, Ps, dOs, dOs, ty, tx)
                cuda.syncthreads()
                if SPLIT:
                    if role == 1:
                        for b in range(TN2):
                            at = uint32(rx + SPLIT_X * b) * PS_U + uint32(ry * TM)
                            for a in range(TM):
                                dSs[at + uint32(a)] = sT[a, b]
                else:
                    for b in range(TN):
                        at = uint32(tx + TX * b) * PS_U + uint32(ty * TM)
                        for a in range(TM):
                            dSs[at + uint32(a)] = dpT[a, b]
                cuda.syncthreads()
                if SPLIT and r0 + Br > Nq:  # dS of the rows past Nq to 0, as above (without SPLIT: dpT is)
                    zero_rows_past(dSs, dSs, Nq - r0, tid)
                    cuda.syncthreads()
                if diagonal:
                    one_masked(dk_acc, dk_acc, dSs, dSs, Qs, Qs, ty, tx, diag)
                else:
                    one_product(dk_acc, dk_acc, dSs, dSs, Qs, Qs, ty, tx)  # scale applied to dK at the end
            elif SPLIT_KV:  # scale applied to dK at the end; masked entries add nothing
                if role == 0:
                    if diagonal:
                        kv_masked(kv_acc, kv_acc, Ps, Ps, dOs, dOs, ry, rx, diag)
                    else:
                        kv_product(kv_acc, kv_acc, Ps, Ps, dOs, dOs, ry, rx)
                elif diagonal:
                    kv_masked(kv_acc, kv_acc, dSs, dSs, Qs, Qs, ry, rx, diag)
                else:
                    kv_product(kv_acc, kv_acc, dSs, dSs, Qs, Qs, ry, rx)
            elif diagonal:  # masked entries add nothing, even against Inf or NaN in dO_i, Q_i; visible ones do, 0 too
                dv_dk_masked(dv_acc, dk_acc, Ps, dSs, dOs, Qs, ty, tx, diag)
            else:
                dv_dk_product(dv_acc, dk_acc, Ps, dSs, dOs, Qs, ty, tx)  # scale applied to dK at the end

            if ATOMIC_DQ:
                # dQ_i += dS_ij K_j: per 4 keys, a 16-byte load of K_j^T per dQ column (KS = 4 mod 32
                # words: a quarter-warp hits distinct banks) and one of dS per row, broadcast to the lane group
                if diagonal:  # a masked entry adds nothing, even against Inf or NaN in K_j
                    dq_masked(dqp, kq, ds4, KT, dSs, lane, warp, diag)
                else:
                    dq_plain(dqp, kq, ds4, KT, dSs, lane, warp, diag)
                col = lane  # as in dq_partial (written out twice: a shared helper reorders the PTX)
                first = uint32(r0) + warp * uint32(RW)
                if GROUPED:
                    col = lane % LG_U
                    first += lane // LG_U * RH_U
                for a in range(RH):
                    row = first + uint32(a)
                    if row < nq_u:
                        for u in range(NX):
                            x = col + uint32(LG * u)
                            if NX_FULL or x < D_U:
                                cuda.atomic.add(dq, (uint32(bh), row, x), dqp[a, u] * scale)
                                if COUNT:
                                    n_atomic += uint32(1)

        if not SPLIT_KV:
            n = store(dk, dk_acc, scale, dv, dv_acc, ONE, hkv, c0, Nk, ty, tx)
        elif role == 0:
            n = kv_store(dv, kv_acc, ONE, dv, kv_acc, ONE, hkv, c0, Nk, ry, rx)
        else:
            n = kv_store(dk, kv_acc, scale, dk, kv_acc, scale, hkv, c0, Nk, ry, rx)
        if COUNT:
            add_counts(counter, nr + int64(n_atomic) * AB, int64(n_atomic) * AB + n * SB)

    opts = {} if maxreg is None else {"max_registers": maxreg}
    return jit(fastmath=FASTMATH, **opts)(kernel), g


@lru_cache(maxsize=None)
def dq_kernel(d: int, TM: int, TN: int, dtype_name: str, causal: bool, count: bool, dropout: bool = False,
              dynamic: bool = False):
    """``(kernel, geometry)``: D_i and dQ_i for one query block of Br = 8 TM rows; walks over the key blocks j.

    The two-pass backward's first launch: it computes D_i = rowsum(dO_i * O_i) itself, from the dO_i it holds
    and O_i read once, uses it, and writes D for the dK/dV kernel (no separate D launch: one launch less per
    call, and dO read once less).  Arguments: ``(q, k, v, do, o, lse, D, dq, Nq, Nk, G, scale, scale_log2,
    counter, q_lay, k_lay, v_lay, do_lay, o_lay, seed, threshold, inv_keep)`` (as for :func:`dkdv_kernel`, with
    o flat and its layout; ``D`` written), and ``dynamic``.
    """
    acc, ACC, SB, AB = _kernel_constants(dtype_name)
    MUL_RN = rounded_mul(acc)  # scale * S rounded as the forward rounds it
    g = geometry_q(d, TM, TN, dtype_name)
    Br, Bc, TD, DP, KS, QS, PS = (g[x] for x in ("Br", "Bc", "TD", "DP", "KS", "QS", "PS"))
    CAUSAL, COUNT = causal, count
    _, _, ZERO, _, _, _ = scalars(dtype_name)
    block_tiles = _smem.tiles(g["tiles"], acc, dynamic)
    load_q = _tile_ops.padded_loader(Br, d, DP, QS, True, acc, count)
    load_kv, zero_kv_padding = _tile_ops.pair_loader(Bc, d, DP, KS, KS, True, acc, count)  # K_j^T, V_j^T
    load_stats = _tile_ops.stats_loader(Br, acc, count, with_d=False)  # L_i only: D_i is computed here
    s_dp_product = _tile_ops.strided_product(TM, TN, DP, QS, TN, 1, KS, True, True, acc)  # S = Q K^T, dP = dO V^T
    dq_product = _tile_ops.strided_product(TM, TD, Bc, PS, KS, TX * KS, 1, False, False, acc)  # dS_ij K_j
    dq_masked = _tile_ops.strided_product(TM, TD, Bc, PS, KS, TX * KS, 1, False, False, acc, "keys")  # masked: none
    store = _tile_ops.strided_store(TM, TD, d, False, count)
    drop_head, drop_row, drop = _dropout.factor(dropout, acc)

    def kernel(q, k, v, do, o, lse, D, dq, Nq, Nk, G, scale, scale_log2, counter, q_lay, k_lay, v_lay, do_lay,
               o_lay, seed, threshold, inv_keep):
        # Q_i^T, dO_i^T (DP, QS); K_j^T, V_j^T (DP, KS), KS odd; dS_ij^T (Bc, PS); L_i, D_i (Br)
        QT, dOT, KT, VT, dST, Ls, Ds = block_tiles()
        s = cuda.local.array((TM, TN), ACC)
        dp = cuda.local.array((TM, TN), ACC)
        dq_acc = cuda.local.array((TM, TD), ACC)
        L2 = cuda.local.array(TM, ACC)
        Dr = cuda.local.array(TM, ACC)

        tid = cuda.threadIdx.x
        ty, tx = tid // TX, tid % TX
        r0, bh = _tile_ops.last_tile_first(Nq, Br)  # longest (causal) row tiles first, as in the forward
        hkv = kv_head(bh, G)
        nr = nw = 0

        n = load_q(QT, dOT, q, do, q_lay, do_lay, bh, r0, Nq, tid)  # Q_i, dO_i -> QT, dOT once
        n_stats = load_stats(Ls, Ds, lse, D, bh, r0, Nq, tid)  # L_i (log2 units)
        if COUNT:
            nr += n * SB + n_stats * AB
        zero_kv_padding(KT, VT, tid)
        cuda.syncthreads()
        # D_i = rowsum(dO_i * O_i): thread r sums row r0 + r, columns in order (deterministic), dO_i from QT's twin
        if tid < Br:
            D_row = ZERO
            row = uint32(r0) + uint32(tid)
            if row < uint32(Nq):
                o0 = _tile_ops.head_starts(o_lay, o_lay, bh)[0] + uint64(row * uint32(o_lay[3]))
                for x in range(d):
                    D_row += dOT[x * QS + tid] * ACC(o[o0 + uint64(x)])
                D[uint32(bh), row] = D_row
                if COUNT:
                    nr += d * SB
                    nw += AB
            Ds[tid] = D_row
        cuda.syncthreads()
        for a in range(TM):
            L2[a] = Ls[ty * TM + a]
            Dr[a] = Ds[ty * TM + a]
            for u in range(TD):
                dq_acc[a, u] = ZERO

        for j in range(visible_kv_blocks(r0, Br, Bc, Nq, Nk, CAUSAL)):
            c0 = j * Bc
            cuda.syncthreads()  # previous step is done with KT, VT, dST
            n = load_kv(KT, VT, k, v, k_lay, v_lay, hkv, c0, Nk, tid)
            if COUNT:
                nr += n * SB
            cuda.syncthreads()

            s_dp_product(s, dp, QT, dOT, KT, VT, ty, tx)

            # dS = P * (Zs dP - D) with P = exp(S - L) recomputed (the given L, unclamped), 0 where masked or
            # past Nk; stored transposed (Zs: dropout's factor, regenerated)
            diagonal = CAUSAL and crosses_diagonal(r0, c0, Bc, Nq, Nk)
            edge = c0 + Bc > Nk or diagonal  # uniform over the block
            cb = c0 + tx * TN  # this thread's first key
            for a in range(TM):
                lim = key_limit(r0 + ty * TM + a, cb, Nq, Nk, CAUSAL)  # keys cb + b with b <= lim are visible
                rk = drop_row(drop_head(seed, bh), r0 + ty * TM + a)  # dropout's hash of the row
                for b in range(TN):
                    zs = drop(rk, cb + b, threshold, inv_keep)
                    ds = exp2_ieee(MUL_RN(scale_log2, s[a, b]) - L2[a]) * (zs * dp[a, b] - Dr[a])
                    if edge and b > lim:
                        ds = ZERO
                    dST[(tx * TN + b) * PS + ty * TM + a] = ds
            cuda.syncthreads()

            if diagonal:  # masked entries add nothing, even against Inf or NaN in K_j; visible ones do, dS = 0 or not
                dq_masked(dq_acc, dq_acc, dST, dST, KT, KT, ty, tx, r0 + (Nk - Nq) - c0)
            else:
                dq_product(dq_acc, dq_acc, dST, dST, KT, KT, ty, tx)  # dQ_i += dS K_j, scale applied at the end

        n = store(dq, dq_acc, scale, dq, dq_acc, scale, bh, r0, Nq, ty, tx)
        if COUNT:
            add_counts(counter, nr, nw + n * SB)

    return jit(fastmath=FASTMATH)(kernel), g


@lru_cache(maxsize=None)
def zero_kernel(acc_name: str, count: bool):
    """Fill a flat buffer with zeros (the atomic dQ accumulator, the split backward's copies): each thread
    ZEROS_PER_THREAD elements a grid apart (coalesced stores; a quarter of the blocks of one element each)."""
    ZERO = np.dtype(acc_name).type(0)
    AB, COUNT = np.dtype(acc_name).itemsize, count

    def kernel(x, n, counter):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        for t in range(ZEROS_PER_THREAD):
            j = i + t * stride
            if j < n:
                x[j] = ZERO
                if COUNT:
                    cuda.atomic.add(counter, 1, AB)

    return jit()(kernel)


@lru_cache(maxsize=None)
def cast_kernel(src_name: str, dst_name: str, count: bool):
    """dq = dq_acc, element by element, in the storage dtype (float16 calls)."""
    DST = nb_type(dst_name)
    SA, SB, COUNT = np.dtype(src_name).itemsize, np.dtype(dst_name).itemsize, count

    def kernel(src, dst, n, counter):
        i = cuda.grid(1)
        if i < n:
            dst[i] = DST(src[i])
            if COUNT:
                cuda.atomic.add(counter, 0, SA)
                cuda.atomic.add(counter, 1, SB)

    return jit()(kernel)


@lru_cache(maxsize=None)
def sum_copies_kernel(acc_name: str, dst_name: str, count: bool):
    """dq = the sum of the split dQ copies, copy 0 first (a fixed order: deterministic), in the storage dtype.

    Arguments ``(src, dst, n, copies, counter)``: ``src`` flat, ``copies`` blocks of n elements.
    """
    DST = nb_type(dst_name)
    SA, SB, COUNT = np.dtype(acc_name).itemsize, np.dtype(dst_name).itemsize, count

    def kernel(src, dst, n, copies, counter):
        i = cuda.grid(1)
        if i < n:
            total = src[i]
            for c in range(1, copies):
                total += src[c * n + i]
            dst[i] = DST(total)
            if COUNT:
                cuda.atomic.add(counter, 0, SA * copies)
                cuda.atomic.add(counter, 1, SB)

    return jit()(kernel)
