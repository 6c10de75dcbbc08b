"""flash1: FlashAttention as the paper writes it (Dao et al. 2022, Algorithms 1 and 4).

What it does.  The forward pass is Algorithm 1, line by line: the outer loop
walks over the key/value blocks K_j, V_j (Bc rows each, loaded once into shared
memory, our SRAM), the inner loop over the query blocks Q_i (Br rows each).  For
every block pair it computes the score tile S_ij = scale * Q_i K_j^T on chip,
its row statistics (m~_ij, l~_ij) and P~_ij, and merges them into the running
O_i, l_i, m_i, which live in HBM: they are read and written back on every outer
step, exactly the IO pattern that the paper's Theorem 2 analyses.  The backward
pass is the paper's Algorithm 4 (Appendix B) with one change taken from
FlashAttention-2: it recomputes P_ij = exp(S_ij - L_i) from the saved
L = m + log(l) instead of from l and m.  dQ is accumulated in HBM by a
read-modify-write on every outer step (Algorithm 4, line 21).

What changed since ``standard``.  S and P (N x N) are never stored: each score
tile lives in shared memory only while one block pair is processed, and the
softmax is computed online.  HBM traffic drops from Theta(N d + N^2) to
Theta(N^2 d^2 / M) for M elements of SRAM (see :mod:`flash_numba.iomodel.flash1`).

Layout.  One thread block per (batch, head) and max(Br, Bc) threads, as the
original FlashAttention.  All threads cooperate on loading and storing tiles,
one element each in turn; thread r < Br owns query row r of the block (its
scores, softmax statistics, D_i), thread c < Bc owns key row c (dK_j, dV_j).
Tiles are held in the accumulation dtype (float32, float64 for float64
storage).  Grouped-query attention (G = Hq / Hkv query heads per key/value head):
the forward's block of query head bh reads K and V of head bh // G; the backward
runs one block per key/value head, whose inner loop visits the query blocks of
each of the G query heads of its group, adding into the same dK_j, dV_j.  For
float16 storage the running O (forward) and dQ (backward) are float32 buffers in
HBM, converted to float16 once at the end; for float32 and float64 the output
itself is the accumulator.

Caveats.  One block per (batch, head) leaves most of a GPU idle when B*H is
smaller than the number of SMs, and each block walks all Tc*Tr pairs in
sequence: this version is written to be read next to the paper, not to be fast.
flash2 swaps the loops (one block per query block, O_i kept on chip) and fixes
both.  Causal: block pairs wholly above the diagonal are skipped (nothing is
loaded for them); the others are masked element by element.  A query row with no
visible key (causal with Nq > Nk) ends with O = 0 and L = -inf.

Counters (``count_hbm=True``).  Bytes the kernels' code reads from and writes to
global arrays, per launch: "init O, l, m" and "Algorithm 1" for the forward,
"init dQ" and "Algorithm 4" for the backward.  :mod:`flash_numba.iomodel.flash1`
predicts the same numbers in closed form.

Run it::

    import numpy as np, flash_numba as fn
    q = k = v = np.random.default_rng(0).standard_normal((4, 256, 64)).astype(np.float32)
    r = fn.flash_attention_forward(q, k, v, kernel="flash1", count_hbm=True)
    print(r.block, r.hbm.table())
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np
from numba import cuda, types

from .. import _inputs
from ..compile_check import compile_kernel, count_variants
from ..device import STATIC_SHARED_LIMIT, jit
from ._launch import launch
from ._common import (COUNTER_TYPE, acc_nb_type, add_counts, array_type, element, exp_ieee, group_step, head_grid,
                      input_type, kv_head)
from ._common import nan_max, rounded_mul
from . import _dropout
from ._spec import KernelSpec, launch_flops
from ._tile_ops import load_rows
from .causal import key_limit_dev as key_limit
from .causal import sees_no_key_dev as sees_no_key
from .causal import visible_dev as visible
from .causal import visible_kv_blocks_dev as visible_kv_blocks

#: A block runs max(Br, Bc) threads, at most 256: then it launches whatever the
#: kernel's register count (256 threads x at most 255 registers fit an SM's 64K).
MAX_THREADS = 256

FORWARD_NAMES = ("init O, l, m", "Algorithm 1")
BACKWARD_NAMES = ("init dQ", "Algorithm 4")


def shared_bytes(Br: int, Bc: int, d: int, dtype, pass_: str = "forward") -> int:
    """Static shared memory of the main kernel of ``pass_``, as it declares it."""
    a = _inputs.acc_dtype(dtype).itemsize
    if pass_ == "forward":
        # K_j, V_j (Bc, d); Q_i (Br, d); S_ij (Br, Bc); w_old, w_new (Br)
        return a * (2 * Bc * d + Br * d + Br * Bc + 2 * Br)
    if pass_ == "backward":
        # K_j, V_j, dK_j, dV_j (Bc, d); Q_i, dO_i (Br, d); P_ij, dS_ij (Br, Bc)
        return a * (4 * Bc * d + 2 * Br * d + 2 * Br * Bc)
    raise ValueError(f"pass_: expected 'forward' or 'backward', got {pass_!r}")


def block_limits(d: int, dtype, pass_: str = "forward") -> tuple[int, int]:
    """``(max_Br, max_Bc)``: a block runs max(Br, Bc) threads, at most :data:`MAX_THREADS`."""
    return MAX_THREADS, MAX_THREADS


def _constants(d, Br, Bc, dtype):
    """(ACC, D = d, T = max(Br, Bc) threads per block, storage item size, accumulation item size, float16?)."""
    dtype = np.dtype(dtype)
    ISZ, ASZ = dtype.itemsize, _inputs.acc_dtype(dtype).itemsize
    return acc_nb_type(dtype), d, max(Br, Bc), ISZ, ASZ, ISZ != ASZ


@functools.lru_cache(maxsize=None)
def _steps(d, Br, Bc, dtype, count, causal):
    """Device functions that Algorithms 1 and 4 (and their init kernels) share, for one shape, dtype, COUNT and
    ``causal``.

    * ``zero_fill(X, bh, tid) -> nw``: X[bh] = 0 for an (N, d) accumulator in HBM, thread tid of T
      taking every T-th element; nw: the bytes written when counting, else 0.
    * ``sizes(q, k) -> (Nq, Nk, Tr, Tc)``: the sequence lengths and the paper's numbers of blocks.
    * ``load_pair(A, a, B, b, h, r0, N, tid, nr) -> nr``: rows r0.. of head h of a and b loaded from HBM into
      the SRAM tiles A and B (zeros past row N); nr plus the bytes read when counting.
    * ``key_block(j, k, v, hkv, Nk, K_j, V_j, tid, nr) -> (c0, cols, nr)``: key block j's first key and
      length (the last block may be partial), K_j and V_j loaded (``load_pair``).
    * ``row_times_col(A, B, r, x, n) -> sum_{c < n} A[r, c] B[c, x]``: the sum over the first n columns only,
      each product taken (IEEE: a P~ or dS of exactly 0 against Inf or NaN in B gives NaN).
    * ``seen_keys(row, c0, cols, Nq, Nk) -> n``: how many of the keys c0 .. c0 + cols - 1 query row sees (with
      causal, the first n of them): where row_times_col stops, so that a masked key adds nothing, even against
      Inf or NaN (docs/RELIABILITY.md, section 2).
    * ``first_seeing_row(c, r0, rows, Nq, Nk) -> r``: the first of the query rows r0 .. r0 + rows - 1 that sees
      key c (all from there on do; ``rows`` when none does): where a key's sum over rows starts.
    * ``convert(dst, src, bh, e, nr, nw) -> (nr, nw)``: element e of the float32 accumulator src[bh]
      written to dst[bh] in the storage dtype (float16), and the bytes counted.

    Inlined by Numba (``inline="always"``): the kernels compile as with these lines written out in them.
    """
    ACC, D, T, ISZ, ASZ, _ = _constants(d, Br, Bc, dtype)
    COUNT, ZERO, CAUSAL = count, ACC(0), causal

    @jit(device=True, inline="always")
    def zero_fill(X, bh, tid):
        nw = 0
        for idx in range(tid, X.shape[1] * D, T):
            X[bh, idx // D, idx % D] = ZERO
            if COUNT:
                nw += ASZ
        return nw

    @jit(device=True, inline="always")
    def sizes(q, k):
        Nq = q.shape[2]  # q: (B, H, Nq, d)
        Nk = k.shape[2]
        return Nq, Nk, (Nq + Br - 1) // Br, (Nk + Bc - 1) // Bc

    @jit(device=True, inline="always")
    def load_pair(A, a, B, b, h, r0, N, tid, nr):
        n = load_rows(A, a, h, r0, N, D, tid, T) + load_rows(B, b, h, r0, N, D, tid, T)
        if COUNT:
            nr += n * ISZ
        return nr

    @jit(device=True, inline="always")
    def key_block(j, k, v, hkv, Nk, K_j, V_j, tid, nr):
        c0 = j * Bc
        return c0, min(Bc, Nk - c0), load_pair(K_j, k, V_j, v, hkv, c0, Nk, tid, nr)

    @jit(device=True, inline="always")
    def row_times_col(A, B, r, x, n):
        s = ZERO
        for c in range(n):
            s += A[r, c] * B[c, x]
        return s

    @jit(device=True, inline="always")
    def seen_keys(row, c0, cols, Nq, Nk):
        return max(0, min(cols, key_limit(row, c0, Nq, Nk, CAUSAL) + 1))

    @jit(device=True, inline="always")
    def first_seeing_row(c, r0, rows, Nq, Nk):
        if not CAUSAL:
            return 0
        return min(rows, max(0, c - (Nk - Nq) - r0))  # query c - (Nk - Nq) is the first that sees key c

    @jit(device=True, inline="always")
    def convert(dst, src, bh, e, nr, nw):
        dst[bh, e // D, e % D] = src[bh, e // D, e % D]
        if COUNT:
            nr += ASZ
            nw += ISZ
        return nr, nw

    return SimpleNamespace(zero_fill=zero_fill, sizes=sizes, load_pair=load_pair, key_block=key_block,
                           row_times_col=row_times_col, seen_keys=seen_keys, first_seeing_row=first_seeing_row,
                           convert=convert)


@functools.lru_cache(maxsize=None)
def _forward_kernels(d, Br, Bc, dtype, causal, count, dropout=False):
    """``(init_O_l_m, algorithm1)`` specialised for one shape, dtype, causal, COUNT and ``dropout``."""
    # ISZ: bytes of an element of q, k, v, o; ASZ: of O (the accumulator), l, m, L;
    # CONVERT (float16): O accumulates in float32 and is converted at the end
    ACC, D, T, ISZ, ASZ, CONVERT = _constants(d, Br, Bc, dtype)
    CAUSAL, COUNT = causal, count
    ZERO, NEG_INF, NAN = ACC(0), ACC(-math.inf), ACC(math.nan)
    MUL_RN = rounded_mul(_inputs.acc_dtype(dtype))  # scale * S rounded as the backward recomputes it
    drop_head, drop_row, drop = _dropout.factor(dropout, _inputs.acc_dtype(dtype).name)
    st = _steps(d, Br, Bc, dtype, count, causal)
    zero_fill, sizes, key_block, row_times_col, convert = (st.zero_fill, st.sizes, st.key_block, st.row_times_col,
                                                           st.convert)
    seen_keys = st.seen_keys

    @jit
    def init_O_l_m(O, l, m, counter):
        """Algorithm 1, line 2: O = 0, l = 0, m = -inf in HBM; block bh does one (batch, head)."""
        bh = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        N = O.shape[1]
        nw = zero_fill(O, bh, tid)
        for row in range(tid, N, T):
            l[bh, row] = ZERO
            m[bh, row] = NEG_INF
            if COUNT:
                nw += 2 * ASZ
        if COUNT:
            cuda.atomic.add(counter, 1, nw)

    @jit
    def algorithm1(q, k, v, O, l, m, o, L, G, scale, counter, seed, threshold, inv_keep):
        """Algorithm 1, lines 5-15, then L = m + log(l) (and o = O for float16); K, V of head bh // G.

        With dropout (Algorithm 2: seed, threshold, inv_keep), P~_ij is dropped after l~_ij, before P~_ij V_j.
        """
        tid = cuda.threadIdx.x
        bh = cuda.blockIdx.x
        hkv = kv_head(bh, G)
        Nq, Nk, Tr, Tc = sizes(q, k)
        K_j = cuda.shared.array((Bc, D), ACC)
        V_j = cuda.shared.array((Bc, D), ACC)
        Q_i = cuda.shared.array((Br, D), ACC)
        S_ij = cuda.shared.array((Br, Bc), ACC)  # S_ij, then P~_ij in place
        w_old = cuda.shared.array(Br, ACC)  # line 12's weight of O_i:        l_i e^(m_i - m_new) / l_new
        w_new = cuda.shared.array(Br, ACC)  # line 12's weight of P~_ij V_j:  e^(m~_ij - m_new) / l_new
        nr = 0
        nw = 0
        for j in range(Tc):  # line 5
            c0, cols, nr = key_block(j, k, v, hkv, Nk, K_j, V_j, tid, nr)  # line 6: load K_j, V_j to SRAM
            cuda.syncthreads()
            for i in range(Tr):  # line 7
                r0 = i * Br
                rows = min(Br, Nq - r0)
                n_j = visible_kv_blocks(r0, Br, Bc, Nq, Nk, CAUSAL)
                if j >= n_j:
                    continue  # block pair wholly above the diagonal: skipped, nothing loaded
                # line 8: load Q_i to SRAM (O_i, l_i, m_i are read where they are used)
                n = load_rows(Q_i, q, bh, r0, Nq, D, tid, T)
                if COUNT:
                    nr += n * ISZ
                cuda.syncthreads()
                if tid < rows:  # thread r owns query row r of the block
                    r = tid
                    row = r0 + r
                    m_i = m[bh, row]
                    l_i = l[bh, row]
                    if COUNT:
                        nr += 2 * ASZ
                    # line 9: S_ij = scale Q_i K_j^T (row r, masked); line 10: m~_ij = rowmax(S_ij)
                    m_ij = NEG_INF
                    for c in range(cols):
                        s = ZERO
                        for x in range(D):
                            s += Q_i[r, x] * K_j[c, x]
                        s = MUL_RN(scale, s)
                        if not visible(row, c0 + c, Nq, Nk, CAUSAL):
                            s = NEG_INF
                        S_ij[r, c] = s
                        m_ij = nan_max(m_ij, s)
                    # line 10: P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij); a masked score gives 0
                    # (test the score, not m~_ij: a masked or -inf score gives exactly 0 whatever m~_ij is)
                    l_ij = ZERO
                    rk = drop_row(drop_head(seed, bh), row)  # dropout's hash of the row
                    for c in range(cols):
                        p = ZERO
                        if S_ij[r, c] != NEG_INF:
                            p = math.exp(S_ij[r, c] - m_ij)
                        S_ij[r, c] = p * drop(rk, c0 + c, threshold, inv_keep)  # Algorithm 2: l~_ij undropped
                        l_ij += p
                    # line 11: m_new = max(m_i, m~_ij), l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
                    m_new = nan_max(m_i, m_ij)
                    l_new = ZERO
                    if m_new == NEG_INF:  # every score so far masked or -inf: l and O_i stay 0, and after the
                        w = ZERO  # last key block O_i = NaN for a row that sees keys (all scored -inf)
                        if j == n_j - 1 and not sees_no_key(row, Nq, Nk, CAUSAL):
                            w = NAN
                        w_old[r] = w
                        w_new[r] = w
                    else:
                        e_old = math.exp(m_i - m_new)
                        e_new = math.exp(m_ij - m_new)
                        l_new = e_old * l_i + e_new * l_ij
                        w_old[r] = l_i * e_old / l_new
                        w_new[r] = e_new / l_new
                    # line 13: write l_i <- l_new, m_i <- m_new to HBM
                    l[bh, row] = l_new
                    m[bh, row] = m_new
                    if COUNT:
                        nw += 2 * ASZ
                cuda.syncthreads()
                # line 12: O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j),
                # read from and written to HBM, one element (r, x) per thread in turn
                for idx in range(tid, rows * D, T):
                    r = idx // D
                    x = idx % D
                    # (P~_ij V_j)[r, x] over the keys row r0 + r sees: a masked key adds nothing, a visible one's
                    # P~ multiplies even where it is 0 (IEEE: 0 * Inf = NaN)
                    pv = row_times_col(S_ij, V_j, r, x, seen_keys(r0 + r, c0, cols, Nq, Nk))
                    O[bh, r0 + r, x] = w_old[r] * O[bh, r0 + r, x] + w_new[r] * pv
                    if COUNT:
                        nr += ASZ
                        nw += ASZ
                cuda.syncthreads()
        # The pair (Tr-1, j) is never skipped, so every thread passed a barrier after the last write.
        # FlashAttention-2's statistic for the backward: L = m + log(l), -inf for a row with no visible key,
        # NaN for a row whose scores are all -inf (l = 0).
        for row in range(tid, Nq, T):
            l_r = l[bh, row]
            L_r = NEG_INF
            if not sees_no_key(row, Nq, Nk, CAUSAL):
                L_r = m[bh, row] + math.log(l_r) if l_r != ZERO else NAN
            L[bh, row] = L_r
            if COUNT:
                nr += 2 * ASZ
                nw += ASZ
        if CONVERT:
            for idx in range(tid, Nq * D, T):
                nr, nw = convert(o, O, bh, idx, nr, nw)
        if COUNT:
            add_counts(counter, nr, nw)

    return init_O_l_m, algorithm1


@functools.lru_cache(maxsize=None)
def _backward_kernels(d, Br, Bc, dtype, causal, count, dropout=False):
    """``(init_dQ, algorithm4)`` specialised for one shape, dtype, causal, COUNT and ``dropout``."""
    # ISZ: bytes of an element of q, k, v, o, do, dq, dk, dv; ASZ: of dQ (the accumulator), L;
    # CONVERT (float16): dQ accumulates in float32 and is converted at the end
    ACC, D, T, ISZ, ASZ, CONVERT = _constants(d, Br, Bc, dtype)
    MUL_RN = rounded_mul(_inputs.acc_dtype(dtype))
    CAUSAL, COUNT, ZERO = causal, count, ACC(0)
    drop_head, drop_row, drop = _dropout.factor(dropout, _inputs.acc_dtype(dtype).name)
    st = _steps(d, Br, Bc, dtype, count, causal)
    zero_fill, sizes, load_pair, key_block = st.zero_fill, st.sizes, st.load_pair, st.key_block
    row_times_col, convert = st.row_times_col, st.convert
    seen_keys, first_seeing_row = st.seen_keys, st.first_seeing_row

    @jit
    def init_dQ(dQ, counter):
        """Algorithm 4, line 5: dQ = 0 in HBM; block bh does one (batch, head)."""
        bh = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        nw = zero_fill(dQ, bh, tid)
        if COUNT:
            cuda.atomic.add(counter, 1, nw)

    @jit
    def algorithm4(q, k, v, o, L, do, dQ, dq, dk, dv, G, scale, counter, seed, threshold, inv_keep):
        """Algorithm 4, lines 6-25, with P_ij = exp(S_ij - L_i) (and dq = dQ for float16); with dropout
        (seed, threshold, inv_keep) the mask regenerated: dV from Zs P_ij, dS_ij = P_ij * (Zs dP_ij - D_i).

        Block hkv does key/value head hkv; its inner loop visits the query blocks of each of
        the G query heads bh of its group in turn (grouped-query attention, G = Hq / Hkv).
        """
        hkv = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        Nq, Nk, Tr, Tc = sizes(q, k)
        K_j = cuda.shared.array((Bc, D), ACC)
        V_j = cuda.shared.array((Bc, D), ACC)
        dK_j = cuda.shared.array((Bc, D), ACC)
        dV_j = cuda.shared.array((Bc, D), ACC)
        Q_i = cuda.shared.array((Br, D), ACC)
        dO_i = cuda.shared.array((Br, D), ACC)
        P_ij = cuda.shared.array((Br, Bc), ACC)
        dS_ij = cuda.shared.array((Br, Bc), ACC)
        nr = 0
        nw = 0
        for j in range(Tc):  # line 6
            c0, cols, nr = key_block(j, k, v, hkv, Nk, K_j, V_j, tid, nr)  # line 7: load K_j, V_j to SRAM
            # line 8: dK_j = dV_j = 0 on SRAM
            for idx in range(tid, Bc * D, T):
                dK_j[idx // D, idx % D] = ZERO
                dV_j[idx // D, idx % D] = ZERO
            cuda.syncthreads()
            for step in range(G * Tr):  # line 9, for each query head bh of the group
                bh, i = group_step(step, Tr, 0, hkv, G)
                r0 = i * Br
                rows = min(Br, Nq - r0)
                if j >= visible_kv_blocks(r0, Br, Bc, Nq, Nk, CAUSAL):
                    continue  # block pair wholly above the diagonal: skipped, nothing loaded
                # line 10: load Q_i, dO_i to SRAM (O_i, L_i and dQ_i are read where they are used)
                nr = load_pair(Q_i, q, dO_i, do, bh, r0, Nq, tid, nr)
                cuda.syncthreads()
                if tid < rows:  # thread r owns query row r of the block
                    r = tid
                    row = r0 + r
                    L_i = L[bh, row]
                    # line 19: D_i = rowsum(dO_i * O_i), with O_i's row read from HBM
                    D_i = ZERO
                    for x in range(D):
                        D_i += dO_i[r, x] * ACC(element(o, bh, row, x))
                    if COUNT:
                        nr += ASZ + D * ISZ
                    rk = drop_row(drop_head(seed, bh), row)  # dropout's hash of the row
                    for c in range(cols):
                        qk = ZERO
                        dP = ZERO
                        for x in range(D):
                            qk += Q_i[r, x] * K_j[c, x]
                            dP += dO_i[r, x] * V_j[c, x]  # line 17: dP_ij = dO_i V_j^T
                        # lines 11-13: S_ij = scale Q_i K_j^T, masked, P_ij = exp(S_ij - L_i) with the given L_i
                        # (0 where masked); line 20: dS_ij = P_ij * (dP_ij - D_i) (0 where masked)
                        P = ZERO
                        dS = ZERO
                        if visible(row, c0 + c, Nq, Nk, CAUSAL):
                            P = exp_ieee(MUL_RN(scale, qk) - L_i)  # scale * S rounded as in the forward
                            zs = drop(rk, c0 + c, threshold, inv_keep)  # dropout's factor (1 without)
                            dS = P * (zs * dP - D_i)
                            P *= zs
                        P_ij[r, c] = P
                        dS_ij[r, c] = dS
                cuda.syncthreads()
                if tid < cols:  # thread c owns key row c of the block
                    c = tid
                    for x in range(D):
                        pdo = ZERO
                        dsq = ZERO
                        # over the rows that see key c0 + c: a masked entry adds nothing, even against Inf or
                        # NaN; a visible one multiplies, 0 or not (IEEE)
                        for r in range(first_seeing_row(c0 + c, r0, rows, Nq, Nk), rows):
                            pdo += P_ij[r, c] * dO_i[r, x]
                            dsq += dS_ij[r, c] * Q_i[r, x]
                        dV_j[c, x] += pdo  # line 16: dV_j <- dV_j + P_ij^T dO_i
                        dK_j[c, x] += scale * dsq  # line 22: dK_j <- dK_j + scale dS_ij^T Q_i
                # line 21: dQ_i <- dQ_i + scale dS_ij K_j, read from and written to HBM
                for idx in range(tid, rows * D, T):
                    r = idx // D
                    x = idx % D
                    dsk = row_times_col(dS_ij, K_j, r, x, seen_keys(r0 + r, c0, cols, Nq, Nk))  # over the keys seen
                    dQ[bh, r0 + r, x] += scale * dsk
                    if COUNT:
                        nr += ASZ
                        nw += ASZ
                cuda.syncthreads()
            # line 24: write dK_j, dV_j to HBM
            for idx in range(tid, cols * D, T):
                c = idx // D
                x = idx % D
                dk[hkv, c0 + c, x] = dK_j[c, x]
                dv[hkv, c0 + c, x] = dV_j[c, x]
                if COUNT:
                    nw += 2 * ISZ
        if CONVERT:  # every thread passed a barrier after the last dQ update (pair (Tr-1, Tc-1) runs)
            for idx in range(tid, G * Nq * D, T):  # the group's G query heads
                bh = hkv * G + idx // (Nq * D)
                e = idx % (Nq * D)
                nr, nw = convert(dq, dQ, bh, e, nr, nw)
        if COUNT:
            add_counts(counter, nr, nw)

    return init_dQ, algorithm4


def grids(prob, block) -> dict:
    """The launch grid of each launch, by launch name: one block per (batch, head), on axis x
    ("Algorithm 4": per key/value head, B*Hkv blocks)."""
    return {**dict.fromkeys(FORWARD_NAMES + BACKWARD_NAMES[:1], head_grid(1, prob.BH)),
            BACKWARD_NAMES[1]: head_grid(1, prob.BHkv)}


def forward(prob, ops, block, counters):
    """O and L = m + log(l) for ``prob``: the init kernel, then Algorithm 1."""
    Br, Bc = block
    dropout, drop_args = _dropout.launch_args(prob)
    init, algorithm1 = _forward_kernels(prob.d, Br, Bc, prob.dtype, prob.causal, counters.enabled, dropout)
    BH, Nq, d, acc = prob.BH, prob.Nq, prob.d, prob.acc
    o = _inputs.empty((BH, Nq, d), prob.dtype)
    O = o if acc == prob.dtype else _inputs.empty((BH, Nq, d), acc)  # float16: a float32 accumulator
    l = _inputs.empty((BH, Nq), acc)
    m = _inputs.empty((BH, Nq), acc)
    lse = _inputs.empty((BH, Nq), acc)
    threads = max(Br, Bc)
    grid = grids(prob, block)[FORWARD_NAMES[0]]
    launch(init, grid, threads)(O, l, m, counters.array(FORWARD_NAMES[0]))
    q, k, v = (ops[name].dev for name in ("q", "k", "v"))
    launch(algorithm1, grid, threads)(q, k, v, O, l, m, o, lse, prob.G, acc.type(prob.scale),
                              counters.array(FORWARD_NAMES[1]), *drop_args)
    return o, lse


def backward(prob, ops, block, counters):
    """dQ, dK, dV for ``prob``: the init kernel, then Algorithm 4."""
    Br, Bc = block
    dropout, drop_args = _dropout.launch_args(prob)
    init, algorithm4 = _backward_kernels(prob.d, Br, Bc, prob.dtype, prob.causal, counters.enabled, dropout)
    BH, Nq, Nk, d, acc = prob.BH, prob.Nq, prob.Nk, prob.d, prob.acc
    dq = _inputs.empty((BH, Nq, d), prob.dtype)
    dQ = dq if acc == prob.dtype else _inputs.empty((BH, Nq, d), acc)  # float16: a float32 accumulator
    dk = _inputs.empty((prob.BHkv, Nk, d), prob.dtype)
    dv = _inputs.empty((prob.BHkv, Nk, d), prob.dtype)
    threads = max(Br, Bc)
    grid = grids(prob, block)
    launch(init, grid[BACKWARD_NAMES[0]], threads)(dQ, counters.array(BACKWARD_NAMES[0]))
    q, k, v, o, lse, do = (ops[name].dev for name in ("q", "k", "v", "o", "lse", "do"))
    scale, counter = acc.type(prob.scale), counters.array(BACKWARD_NAMES[1])
    launch(algorithm4, grid[BACKWARD_NAMES[1]], threads)(q, k, v, o, lse, do, dQ, dq, dk, dv, prob.G, scale, counter,
                                                 *drop_args)
    return dq, dk, dv


def compile_all(ccs, dtypes, ds):
    """PTX of every specialisation: default blocks for each d, causal or not, counting or not.

    Returns ``[(label, ptx)]``; the label names the pass, kernel, d, dtype,
    (Br, Bc), causal, count and ``sm_XY``.  Needs ``NUMBA_ENABLE_CUDASIM=0``.
    """
    out = []
    for dtype in dtypes:
        dt = np.dtype(dtype)
        acc = _inputs.acc_dtype(dt)
        X3, A3, A2 = array_type(dt, 3), array_type(acc, 3), array_type(acc, 2)
        XI = input_type(dt)  # q, k, v, o, do: (B, H, N, d), any strides with contiguous rows
        ACC = acc_nb_type(dt)
        DROP = _dropout.arg_types(ACC)
        signatures = {
            FORWARD_NAMES[0]: (A3, A2, A2, COUNTER_TYPE),
            FORWARD_NAMES[1]: (XI, XI, XI, A3, A2, A2, X3, A2, types.int64, ACC, COUNTER_TYPE, *DROP),
            BACKWARD_NAMES[0]: (A3, COUNTER_TYPE),
            BACKWARD_NAMES[1]: (XI, XI, XI, XI, A2, XI, A3, X3, X3, X3, types.int64, ACC, COUNTER_TYPE, *DROP),
        }
        for d in ds:
            for pass_, factory, names in (
                ("forward", _forward_kernels, FORWARD_NAMES),
                ("backward", _backward_kernels, BACKWARD_NAMES),
            ):
                Br, Bc = SPEC.block(d, dt, pass_, budget=STATIC_SHARED_LIMIT)
                variants = ((count, causal, drop) for count in count_variants(dt, d) for causal in (False, True)
                            for drop in _dropout.compile_variants(dt, d, count))
                for count, causal, drop in variants:
                    kernels = factory(d, Br, Bc, dt, causal, count, drop)
                    for name, kernel in zip(names, kernels):
                        if name.startswith("init") and (causal or drop):
                            continue  # the init kernels do not depend on causal or dropout
                        tags = " causal" * causal + " count" * count + " dropout" * drop
                        label = f"flash1 {pass_} {name} d={d} {dt} Br={Br} Bc={Bc}{tags}"
                        out += [compile_kernel(label, kernel, signatures[name], cc) for cc in ccs]
    return out


#: FLOPs per launch (see :func:`flash_numba.kernels._spec.launch_flops`).
FLOPS = launch_flops(
    forward={FORWARD_NAMES[0]: (0, 0, 0), FORWARD_NAMES[1]: (4, 5, 0)},  # Q K^T, P V; scale, max, subtract, exp, add
    # Q K^T, dV, dP, dQ, dK; scale, subtract, exp, subtract, multiply
    backward={BACKWARD_NAMES[0]: (0, 0, 0), BACKWARD_NAMES[1]: (10, 5, 0)},
)

SPEC = KernelSpec(
    name="flash1", flops=FLOPS, doc=__doc__, forward=forward, backward=backward, compile_all=compile_all,
    forward_launches=FORWARD_NAMES, backward_launches=BACKWARD_NAMES,
    shared_bytes=shared_bytes, block_limits=block_limits,  # the paper's block rule (blocks.choose)
)
