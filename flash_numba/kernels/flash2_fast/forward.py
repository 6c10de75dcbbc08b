"""The flash2_fast forward kernel: O and L for one block of Br = 8 TM query rows.

FlashAttention-2's forward (as :mod:`flash_numba.kernels.flash2`): the block loads
Q_i once, walks over the visible K/V blocks, keeps O_i, m_i, l_i in registers and
writes O_i and L_i once.  Register-tiled (see :mod:`.layout`): each thread owns a
TM x TN micro-tile of S_ij and a TM x TD one of O_i.  The row max takes four
``shfl_xor`` over the 16 threads of a row (half a warp); the row sum l_i stays
per thread, rescaled with the max, and is reduced once at the end.  The softmax
runs in base 2 (log2(e) folded into the scale: one ``ex2.approx`` per probability).

Thread (ty, tx) owns query rows ty*TM .. ty*TM + TM - 1 and the keys tx, tx + 16, ..., tx + 16 (TN - 1) of
the tile: 16 apart, not adjacent.  That choice is about shared-memory banks (lesson 4):

* P_ij^T is stored a key row at a time, TM adjacent values (16-byte stores).  Rows 16 apart put the 8
  threads of a quarter warp on rows whose starts differ by 16 PS = 16 (2 TM + 1) chunks of 16 bytes
  (PS = Br + 4): an odd number of chunks between neighbours, so 8 different banks.  With adjacent keys
  (tx*TN + b) the rows of neighbours were TN PS apart, and the stores 8-way conflicted (Nsight Compute,
  2026-11-30, commit 3308399, ``benchmarks/results/h200-2026-11-30-s9/C/ncu.txt``).
* K_j is held row-major (stride KS = DP + 4, again an odd number of 16-byte chunks), and S_ij = Q_i K_j^T
  reads each key's row 16 bytes at a time, four steps of k per load; it is loaded row-major too, 16 bytes a
  thread where the rows allow it (:mod:`flash_numba.kernels._vec`), where K_j^T had scalar stores.
* S_ij keeps its order of summation (k = 0, 1, ..., d - 1, one fused multiply-add each), which the backward
  recomputes bit for bit.

Measured on the H200 at N = 4096, d = 64: 4.17 -> 3.74 ms (2026-12-01, ``benchmarks/results/h200-2026-12-01-s10/A/``
and ``B/``; docs/PERFORMANCE.md, "Design decisions").

Launch: a 1-D grid of Tr * B*H blocks, row tile after row tile, each for every
head, the last row tile (the longest when causal) first, 128 threads.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda, uint32

from ...device import jit
from .. import _dropout, _smem, _tile_ops
from .._tile_ops import half_warp_fmax, half_warp_sum
from .._common import acc_nb_type, add_counts, fmax, kv_head, rounded_mul
from ..causal import crosses_diagonal_dev as crosses_diagonal
from ..causal import last_visible_key_dev as last_visible_key
from ..causal import sees_no_key_dev as sees_no_key
from ..causal import visible_kv_blocks_dev as visible_kv_blocks
from .layout import FASTMATH, FORWARD_NAME, TX, device_register_cap, geometry, scalars


@lru_cache(maxsize=None)
def forward_kernel(d: int, TM: int, TN: int, dtype_name: str, causal: bool, count: bool, maxreg=-1,
                   dropout: bool = False, dynamic: bool = False, aligned: bool = False):
    """``(kernel, geometry)``: the forward for head dim d, micro-tile TM x TN, storage ``dtype_name``.

    Arguments of the kernel: ``(q, k, v, o, lse, Nq, Nk, G, scale_log2, counter, q_lay, k_lay, v_lay, seed,
    threshold, inv_keep)``: q, k, v flat inputs and their layouts (:func:`flash_numba._views.flat_input`, any
    strides); query head bh reads key/value head bh // G (grouped-query attention, G = Hq / Hkv); the last
    three are dropout's (:mod:`flash_numba.kernels._dropout`; used iff ``dropout``).  ``maxreg``:
    register cap (-1: the cap for this device, :func:`.layout.register_cap`; None: uncapped).  ``dynamic``:
    the tiles live in dynamic shared memory (``geometry["smem"]`` bytes at launch, see :mod:`.._smem`).
    ``aligned``: every row of k and v starts on 16 bytes (:func:`.._vec.aligned16`): full K/V tiles are read
    with 16-byte loads.
    """
    dtype = np.dtype(dtype_name)
    acc = "float64" if dtype == np.float64 else "float32"
    g = geometry(d, TM, TN, dtype)
    Br, Bc, TD, DP, QS, KS, PS = (g[x] for x in ("Br", "Bc", "TD", "DP", "QS", "KS", "PS"))
    ACC = acc_nb_type(dtype)
    STORE_BYTES = dtype.itemsize
    ACC_BYTES = np.dtype(acc).itemsize
    CAUSAL, COUNT, ALIGNED = causal, count, aligned
    NEG_INF, _, ZERO, ONE, _, LN2_ACC = scalars(dtype)
    NAN = np.dtype(acc).type(np.nan)
    MUL_RN = rounded_mul(acc)
    block_tiles = _smem.tiles(g["tiles"], acc, dynamic)  # in dynamic shared memory iff ``dynamic``
    load_q = _tile_ops.padded_loader(Br, d, DP, QS, False, acc, count)
    load_kv, zero_kv_padding = _tile_ops.pair_loader(Bc, d, DP, KS, DP, False, acc, count, False,
                                                     dtype_name if aligned else None)  # K_j, V_j row-major
    # S_ij = Q_i K_j^T, this thread's keys tx + 16 b (strided: see the module docstring)
    s_product = _tile_ops.strided_product(TM, TN, DP, QS, KS, TX * KS, 1, False, True, acc)
    # O_i += P_ij V_j into this thread's columns of O_i: quads 64 apart where TD is a multiple of 4 (16-byte reads
    # of V_j's rows on all banks), else TD adjacent ones (_tile_ops.thread_columns)
    O0, OCOL, OB, QUADS = _tile_ops.thread_columns(TD, "adjacent")
    pv_product = _tile_ops.strided_product(TM, TD, Bc, PS, O0, OB, DP, False, False, acc, False, QUADS)
    pv_masked = _tile_ops.strided_product(TM, TD, Bc, PS, O0, OB, DP, False, False, acc, "keys", QUADS)
    DROPOUT, (drop_head, drop_row, drop) = dropout, _dropout.factor(dropout, acc)
    PS_U = np.uint32(PS)

    def kernel(q, k, v, o, lse, Nq, Nk, G, scale_log2, counter, q_lay, k_lay, v_lay, seed, threshold, inv_keep):
        QT, Ks, Vs, PT = block_tiles()  # Q_i^T (DP, QS), K_j (Bc, KS), V_j (Bc, DP), P_ij^T (Bc, PS), flattened
        s = cuda.local.array((TM, TN), ACC)
        acc = cuda.local.array((TM, TD), ACC)
        m = cuda.local.array(TM, ACC)
        l = cuda.local.array(TM, ACC)

        tid = cuda.threadIdx.x
        ty, tx = tid // TX, tid % TX
        row0, bh = _tile_ops.last_tile_first(Nq, Br)
        hkv = kv_head(bh, G)
        nr = nw = 0

        n = load_q(QT, QT, q, q, q_lay, q_lay, bh, row0, Nq, tid)  # Q_i -> QT, zero beyond d and Nq
        if COUNT:
            nr += n * STORE_BYTES
        zero_kv_padding(Ks, Vs, tid)
        for a in range(TM):
            m[a] = NEG_INF
            l[a] = ZERO
            for x in range(TD):
                acc[a, x] = ZERO

        row_key = last_visible_key(row0 + ty * TM, Nq, Nk)  # causal: the last key this thread's first row sees
        for j in range(visible_kv_blocks(row0, Br, Bc, Nq, Nk, CAUSAL)):
            col0 = j * Bc
            cuda.syncthreads()  # everyone is done with the previous Ks, Vs, PT
            n = load_kv(Ks, Vs, k, v, k_lay, v_lay, hkv, col0, Nk, tid, ALIGNED)
            if COUNT:
                nr += n * STORE_BYTES
            cuda.syncthreads()

            s_product(s, s, QT, QT, Ks, Ks, ty, tx)

            # online softmax in base 2 (log2(e) folded into the scale).  The scale is applied to
            # S_ij, not to Q_i once at load time: the backward recomputes S = (Q K^T) * scale in
            # this order, and with scores of 1e4 the two roundings of a pre-scaled Q would differ
            # from it by ~1e-3 in the exponent, enough to spoil dQ (test_large_scores_backward).
            for a in range(TM):
                for b in range(TN):
                    s[a, b] = MUL_RN(scale_log2, s[a, b])  # rounded, as the backward recomputes it
            # only the last block (past Nk) and, when causal, blocks that cross the
            # diagonal need a mask; the test is uniform over the block
            diagonal = CAUSAL and crosses_diagonal(row0, col0, Bc, Nq, Nk)
            if col0 + Bc > Nk or diagonal:
                cb = col0 + tx  # this thread's first key
                for a in range(TM):
                    lim = Nk - 1 - cb  # keys cb + 16 b with 16 b <= lim are visible
                    if CAUSAL:
                        lim = min(lim, row_key + a - cb)
                    for b in range(TN):
                        if TX * b > lim:
                            s[a, b] = NEG_INF
            # the row max drops NaNs (fmax: one instruction, nan_max four): a NaN score makes its p, hence l_i,
            # O_i and L_i, NaN all the same
            for a in range(TM):
                mx = NEG_INF
                for b in range(TN):
                    mx = fmax(mx, s[a, b])
                mx = half_warp_fmax(mx)
                m_new = fmax(m[a], mx)
                m_use = ZERO if m_new == NEG_INF else m_new  # all -inf so far: P = 0, alpha = 0 (not NaN)
                alpha = math.exp2(m[a] - m_use)
                m[a] = m_new
                l[a] *= alpha
                for x in range(TD):
                    acc[a, x] *= alpha
                for b in range(TN):
                    p = math.exp2(s[a, b] - m_use)
                    l[a] += p
                    s[a, b] = p  # stored below, a row of P_ij^T at a time
            if DROPOUT:  # the paper's Algorithm 2: P~_ij dropped after l_i (l and L stay undropped), before P~ V;
                for a in range(TM):  # a pass of its own, when s is dead: fewer registers live than in the loop above
                    rk = drop_row(drop_head(seed, bh), row0 + ty * TM + a)  # dropout's hash of the row
                    for b in range(TN):
                        s[a, b] *= drop(rk, col0 + tx + TX * b, threshold, inv_keep)
            for b in range(TN):  # key tx + 16 b: TM adjacent entries of its row of P_ij^T (16-byte stores)
                at = uint32(tx + TX * b) * PS_U + uint32(ty * TM)
                for a in range(TM):
                    PT[at + uint32(a)] = s[a, b]
            cuda.syncthreads()

            if diagonal:  # a masked key adds nothing, even against Inf or NaN in V_j; a visible one does, P = 0 or not
                pv_masked(acc, acc, PT, PT, Vs, Vs, ty, tx, row0 + (Nk - Nq) - col0)
            else:  # (past Nk, V_j is zero-filled)
                pv_product(acc, acc, PT, PT, Vs, Vs, ty, tx)

        # finish: l_i summed over the 16 lanes of the row, O_i / l_i, L_i = m_i + log l_i.  A row that
        # sees no key (causal): O = 0, L = -inf; one whose scores are all -inf has l_i = 0: O = L = NaN.
        for a in range(TM):
            lt = l[a]
            lt = half_warp_sum(lt)
            row = row0 + ty * TM + a
            if row < Nq:
                hidden = sees_no_key(row, Nq, Nk, CAUSAL)
                inv = ZERO if hidden else ONE / lt
                for x in range(TD):
                    col = tx * O0 + OCOL[x]
                    if col < d:
                        o[bh, row, col] = acc[a, x] * inv
                        if COUNT:
                            nw += STORE_BYTES
                if tx == 0:
                    lse[bh, row] = NEG_INF if hidden else (m[a] * LN2_ACC + math.log(lt) if lt != 0 else NAN)
                    if COUNT:
                        nw += ACC_BYTES
        if COUNT:
            add_counts(counter, nr, nw)

    maxreg = device_register_cap(FORWARD_NAME, d, dtype_name, dynamic) if maxreg == -1 else maxreg
    return jit(fastmath=FASTMATH, **({} if maxreg is None else {"max_registers": maxreg}))(kernel), g
