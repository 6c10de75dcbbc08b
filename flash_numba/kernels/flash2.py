"""flash2: the FlashAttention-2 loop order (Dao 2023), forward and backward.

What it does.  Forward (FA2's Algorithm 1): one thread block per query block
Q_i (Br rows) and (batch, head), a grid of (B*H, Tr) blocks, the last query block of each
head first (under a causal mask it sees the most keys).  The block loads Q_i into
shared memory once and walks over the key/value blocks K_j, V_j (Bc rows each,
in shared memory, our SRAM): S_ij = scale Q_i K_j^T, the online-softmax update
of m_i and l_i, the rescale of the accumulator O_i when the row maximum moves,
and O_i += P~_ij V_j.  m_i, l_i and O_i stay on chip (registers, accumulation
dtype) and normalisation is delayed: O_i / l_i and L_i = m_i + log(l_i) are
written once, at the end.

Backward (FA2's Algorithm 2, split in three kernels, no atomics on floats):

1. "D = rowsum(dO*O)": 8 rows per block, 16 threads per row.
2. "dK, dV": a grid of (B*H, Tc) blocks.  A block owns K_j, V_j, keeps dK_j, dV_j in
   registers and walks over the query blocks i that see its keys, recomputing
   S_ij, P_ij = exp(S_ij - L_i), dV_j += P_ij^T dO_i, dP_ij = dO_i V_j^T,
   dS_ij = P_ij * (dP_ij - D_i), dK_j += scale dS_ij^T Q_i.
3. "dQ": a grid of (B*H, Tr) blocks.  A block owns Q_i, dO_i, L_i, D_i, keeps dQ_i in
   registers and walks over the visible key blocks j, recomputing S, P, dP, dS
   and dQ_i += scale dS_ij K_j.

Grouped-query attention (G = Hq / Hkv query heads per key/value head): query head bh
reads K and V of head bh // G; the "dK, dV" grid has (B*Hkv, Tc) blocks, each walking
over the query blocks of the G query heads of its group in turn (one sum, fixed order).

Why it is deterministic: every output element is written once, by one thread,
from a sum taken in a fixed order, so repeated calls give bitwise identical
results.  FlashAttention-2 instead adds each pair's dS_ij K_j into dQ_i with
float atomics from kernel 2.  That saves kernel 3: recomputing S_ij and dP_ij
(two of the backward's seven block matrix products, about 30% of its FLOPs)
and reading K and V once more per query block.  It costs a float32 dQ buffer in
HBM that each dQ_i is added to Tc times (atomic read-modify-writes, contended
when key blocks finish together), and the order of those additions changes from
run to run, so dQ changes in its last bits.

What changed since ``flash1``.  The loops are swapped: the outer loop runs over
query blocks, in parallel, one thread block each (flash1 runs one block per
(batch, head) and leaves most SMs idle), and O_i, l_i, m_i stay on chip
instead of being read and written in HBM at every K/V step.  Forward HBM
traffic becomes Theta(N d + N^2 d / Br) (see :mod:`flash_numba.iomodel.flash2`).
Causal attention visits only the K/V blocks that are not wholly masked for the
query block (about half of them; the rest are never loaded) and masks inside
the blocks that cross the diagonal.  A query row with no visible key (causal
with Nq > Nk) gives O = 0 and L = -inf.

Threads.  128 threads per block, an 8 x 16 grid: thread t is (ty, tx) =
(t // 16, t % 16).  Every (rows x columns) tile a block computes is dealt out
the same way; for S_ij with Br = 16, Bc = 32, entry (r, c) belongs to thread
(r % 8, c % 16)::

                c:   0      1    ...   15      16     17    ...   31
        r =  0     (0,0)  (0,1)  ...  (0,15)  (0,0)  (0,1)  ...  (0,15)
        r =  1     (1,0)  (1,1)  ...  (1,15)  (1,0)  (1,1)  ...  (1,15)
         ...
        r =  7     (7,0)  (7,1)  ...  (7,15)  (7,0)  (7,1)  ...  (7,15)
        r =  8     (0,0)  (0,1)  ...  (0,15)  (0,0)  (0,1)  ...  (0,15)
         ...
        r = 15     (7,0)  (7,1)  ...  (7,15)  (7,0)  (7,1)  ...  (7,15)

so thread (ty, tx) holds a register tile of RA x CB = 2 x 2 entries, rows
{ty, ty + 8}, columns {tx, tx + 16}; the accumulator O_i (Br x d) is dealt out
with columns x = tx, tx + 16, ...  In each step of a product a thread loads
RA + CB values from shared memory and does RA * CB multiply-adds.  A thread
whose rows or columns run past the tile works on a repeat of the tile's last
row or column and never stores the result, so any (Br, Bc) works.  The 16
threads of a row (half a warp) find the row's max and sum through shared
memory: each writes its partial, and after a barrier each reads the row's 16
partials.  (Warp shuffles would need no barrier, but Numba's simulator emulates
each shuffle with two block-wide barriers, which would make learners' runs on a
laptop several times slower.)  Tiles are loaded cooperatively: thread t copies
elements t, t + 128, ... of the tile, which is contiguous in HBM, so a warp
reads 32 consecutive elements.  Shared tiles that the 16 threads of a row read
down a column get an odd row stride (d | 1), so they hit 16 different banks.
Tiles are held in the accumulation dtype (float32, float64 for float64 storage).

Counters (``count_hbm=True``).  Bytes the kernels' code reads from and writes to
global arrays, per launch: "flash2 forward"; "D = rowsum(dO*O)", "dK, dV" and
"dQ" for the backward.  :mod:`flash_numba.iomodel.flash2` predicts the same
numbers in closed form.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
from numba import cuda, types

from .. import _inputs
from ..compile_check import compile_kernel
from ..device import STATIC_SHARED_LIMIT, jit
from . import _dropout, _rowsum
from ._tile_ops import load_rows, load_vector
from .causal import crosses_diagonal_dev as crosses_diagonal
from .causal import first_visible_q_block_dev as first_visible_q_block
from .causal import sees_no_key_dev as sees_no_key
from .causal import visible_dev as visible
from .causal import visible_kv_blocks_dev as visible_kv_blocks
from ._common import COUNTER_TYPE, acc_nb_type, add_counts, array_type, exp_ieee, group_step, head_grid_2d
from ._common import heavy_first_block, input_type, kv_head, nan_max, rounded_mul
from ._spec import KernelSpec, check_pass

TY, TX = 8, 16  # thread grid of a block: TY rows of TX threads (a half warp each)
NT = TY * TX  # 128 threads per block

#: Values per thread in an accumulator tile of width d (O_i, dQ_i, dK_j, dV_j) that block_limits allows.
MAX_TILE = 32

FORWARD_NAME = "flash2 forward"
BACKWARD_NAMES = (_rowsum.NAME, "dK, dV", "dQ")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def shared_bytes(Br: int, Bc: int, d: int, dtype, pass_: str = "forward") -> int:
    """Static shared memory the kernels of ``pass_`` declare (backward: the larger kernel)."""
    a = _inputs.acc_dtype(dtype).itemsize
    odd = d | 1
    if pass_ == "forward":
        # Q_i (Br, d); K_j (Bc, d|1); V_j (Bc, d); P~_ij (Br, Bc); row partials (Br, 16)
        return a * (Br * d + Bc * odd + Bc * d + Br * Bc + Br * TX)
    if pass_ == "backward":
        # dK, dV: K_j, V_j (Bc, d); Q_i, dO_i (Br, d|1); P_ij^T, dS_ij^T (Bc, Br); L_i, D_i (Br)
        dkdv = 2 * Bc * d + 2 * Br * odd + 2 * Bc * Br + 2 * Br
        # dQ: Q_i, dO_i (Br, d); K_j, V_j (Bc, d|1); dS_ij (Br, Bc); L_i, D_i (Br)
        dq = 2 * Br * d + 2 * Bc * odd + Br * Bc + 2 * Br
        return a * max(dkdv, dq)
    raise ValueError(f"pass_: expected 'forward' or 'backward', got {pass_!r}")


def block_limits(d: int, dtype, pass_: str = "forward") -> tuple[int, int]:
    """``(max_Br, max_Bc)``, so that a thread's register tiles stay small.

    A thread holds ceil(rows / 8) x ceil(d / 16) values of each (rows x d)
    accumulator (O_i or dQ_i: rows = Br; dK_j and dV_j: rows = Bc), at most
    :data:`MAX_TILE`, and ceil(Br / 8) x ceil(Bc / 16) values of S_ij (its
    transpose in the dK, dV kernel), with Br <= 64 and Bc <= 256 (backward: 128).
    Any block within the limits is correct; the default blocks compile without
    spills (see :func:`compile_all`).
    """
    check_pass(pass_)
    rows = TY * (MAX_TILE // _cdiv(d, TX))  # rows of a (rows x d) accumulator within MAX_TILE
    if pass_ == "forward":
        return min(rows, 64), 256
    return min(rows, 64), min(rows, 128)


@jit(device=True, forceinline=True)
def _load_pair(A, B, a, b, bh, row0, n_rows, d, t):
    """Rows row0, ... of ``a[bh]`` and ``b[bh]`` (d columns) into the shared tiles A and B (zeros past n_rows).

    ``d`` is the kernel's compile-time head dim: with it the index arithmetic divides by a constant.
    """
    return load_rows(A, a, bh, row0, n_rows, d, t, NT) + load_rows(B, b, bh, row0, n_rows, d, t, NT)


@jit(device=True, forceinline=True)
def _load_query_side(Q_i, dO_i, L_i, D_i, q, do, lse, D, bh, i0, Nq, d, t):
    """Q_i, dO_i (tiles) and L_i, D_i (vectors) of the query block at row i0: (elements of q and dO, of L and D)."""
    n_vec = load_vector(L_i, lse, bh, i0, Nq, t, NT) + load_vector(D_i, D, bh, i0, Nq, t, NT)
    return _load_pair(Q_i, dO_i, q, do, bh, i0, Nq, d, t), n_vec


@functools.lru_cache(maxsize=None)
def _two_products(RA: int, CB: int, acc_name: str):
    """Device function ``(S, dP, A1, A2, B1, B2, ty, tx, nA, nB, d)``: a thread's S = A1 B1^T and dP = A2 B2^T.

    Thread (ty, tx) computes entries (ty + 8a, tx + 16b) (rows of A past nA, of B past nB
    repeat the last one: those entries are never stored) over d columns.  The dK/dV
    kernel calls it with A = K_j, V_j and B = Q_i, dO_i (S^T, dP^T); the dQ kernel with
    A = Q_i, dO_i and B = K_j, V_j.
    """
    ACC = acc_nb_type(np.dtype(acc_name))
    ZERO = np.dtype(acc_name).type(0)

    @jit(device=True, forceinline=True)
    def products(S, dP, A1, A2, B1, B2, ty, tx, nA, nB, d):
        b1 = cuda.local.array(CB, ACC)
        b2 = cuda.local.array(CB, ACC)
        for a in range(RA):
            for b in range(CB):
                S[a, b] = ZERO
                dP[a, b] = ZERO
        for x in range(d):
            for b in range(CB):
                r = min(tx + TX * b, nB - 1)
                b1[b] = B1[r, x]
                b2[b] = B2[r, x]
            for a in range(RA):
                r = min(ty + TY * a, nA - 1)
                a1 = A1[r, x]
                a2 = A2[r, x]
                for b in range(CB):
                    S[a, b] += a1 * b1[b]
                    dP[a, b] += a2 * b2[b]

    return products


@functools.lru_cache(maxsize=None)
def _p_and_ds(acc_name: str):
    """Device function ``(s, dp, L, D, scale, visible, zs) -> (Zs P, dS)``: P = exp(scale s - L),
    dS = P (Zs dP - D), with Zs dropout's factor (1 without dropout; the paper's Algorithm 4).

    Both are 0 where the key is masked (``visible`` False), whatever s and dp; elsewhere P uses
    the given L, unclamped (exp overflows to +inf for an L far below the scores).
    """
    ZERO = np.dtype(acc_name).type(0)
    MUL_RN = rounded_mul(acc_name)  # scale * s rounded as the forward rounds it (see rounded_mul)

    @jit(device=True, forceinline=True)
    def p_and_ds(s, dp, L, D, scale, visible, zs):
        if not visible:
            return ZERO, ZERO
        p = exp_ieee(MUL_RN(scale, s) - L)
        return p * zs, p * (zs * dp - D)

    return p_and_ds


def _constants(dtype):
    """(ACC numba type, its NumPy type, storage item size, accumulation item size)."""
    acc = _inputs.acc_dtype(dtype)
    return acc_nb_type(dtype), acc.type, np.dtype(dtype).itemsize, acc.itemsize


@functools.lru_cache(maxsize=None)
def _forward_kernel(d, Br, Bc, dtype, causal, count, dropout=False):
    """The forward kernel for head dim d, blocks (Br, Bc), storage ``dtype`` (``dropout``: with attention dropout)."""
    ACC, acc, IN_BYTES, L_BYTES = _constants(dtype)
    NEG_INF, ZERO, ONE, NAN = acc(-math.inf), acc(0), acc(1), acc(math.nan)
    MUL_RN = rounded_mul(acc)
    RA, CB, XB = _cdiv(Br, TY), _cdiv(Bc, TX), _cdiv(d, TX)  # rows, S columns, O columns per thread
    KS = d | 1  # odd row stride of K_j: the 16 threads of a row read 16 banks
    Q_TILE, K_TILE, V_TILE, P_TILE, PART = (Br, d), (Bc, KS), (Bc, d), (Br, Bc), (Br, TX)
    S_REGS, O_REGS = (RA, CB), (RA, XB)
    CAUSAL, COUNT = causal, count
    drop_head, drop_row, drop = _dropout.factor(dropout, np.dtype(acc).name)

    @jit
    def flash2_forward(q, k, v, o, lse, counter, Nq, Nk, G, scale, seed, threshold, inv_keep):
        t = cuda.threadIdx.x
        ty, tx = t // TX, t % TX
        bh, i0 = cuda.blockIdx.x, heavy_first_block(Br)  # (batch, head) and the first query row of Q_i
        hkv = kv_head(bh, G)  # its key/value head
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
            n = _load_pair(K_j, V_j, k, v, hkv, j0, Nk, d, t)
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
            # a masked key's P~ is 0 and adds nothing, even where V_j holds Inf or NaN (only blocks
            # on the diagonal hold masked keys: the test is uniform over the block, and constant
            # False without a causal mask)
            masked = CAUSAL and crosses_diagonal(i0, j0, Bc, Nq, Nk)
            for c in range(min(Bc, Nk - j0)):
                for xb in range(XB):
                    v_row[xb] = V_j[c, min(tx + TX * xb, d - 1)]
                for a in range(RA):
                    p = P_ij[min(ty + TY * a, Br - 1), c]
                    if not (masked and p == 0):
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


@functools.lru_cache(maxsize=None)
def _dkdv_kernel(d, Br, Bc, dtype, causal, count, dropout=False):
    """Kernel 2 of the backward: dK_j, dV_j for one key block per thread block."""
    ACC, acc, IN_BYTES, L_BYTES = _constants(dtype)
    ZERO = acc(0)
    # The block owns key rows, so the thread grid deals out key rows c over ty and query rows r
    # over tx: S_ij is computed transposed, and the thread that holds S_ij^T[c, :] holds dK_j[c, :].
    CA, RB, XB = _cdiv(Bc, TY), _cdiv(Br, TX), _cdiv(d, TX)
    QS = d | 1  # odd row stride of Q_i, dO_i: read down a column by the 16 threads of a row
    KV_TILE, Q_TILE, T_TILE = (Bc, d), (Br, QS), (Bc, Br)
    ST_REGS, KV_REGS = (CA, RB), (CA, XB)
    CAUSAL, COUNT = causal, count
    products, p_and_ds = _two_products(CA, RB, np.dtype(acc).name), _p_and_ds(np.dtype(acc).name)
    drop_head, drop_row, drop = _dropout.factor(dropout, np.dtype(acc).name)

    @jit
    def flash2_dkdv(q, k, v, do, lse, D, dk, dv, counter, Nq, Nk, G, scale, seed, threshold, inv_keep):
        t = cuda.threadIdx.x
        ty, tx = t // TX, t % TX
        hkv, j0 = cuda.blockIdx.x, cuda.blockIdx.y * Bc  # key/value head and the first key row of K_j
        nr = 0
        nw = 0

        K_j = cuda.shared.array(KV_TILE, ACC)
        V_j = cuda.shared.array(KV_TILE, ACC)
        Q_i = cuda.shared.array(Q_TILE, ACC)
        dO_i = cuda.shared.array(Q_TILE, ACC)
        PT = cuda.shared.array(T_TILE, ACC)  # P_ij^T
        dST = cuda.shared.array(T_TILE, ACC)  # dS_ij^T
        L_i = cuda.shared.array(Br, ACC)
        D_i = cuda.shared.array(Br, ACC)
        S = cuda.local.array(ST_REGS, ACC)  # this thread's entries of S_ij^T
        dP = cuda.local.array(ST_REGS, ACC)  # ... of dP_ij^T
        dK = cuda.local.array(KV_REGS, ACC)  # ... of dK_j (without the factor scale)
        dV = cuda.local.array(KV_REGS, ACC)  # ... of dV_j
        q_row = cuda.local.array(XB, ACC)
        do_row = cuda.local.array(XB, ACC)

        # Load K_j, V_j; dK_j = 0, dV_j = 0 on chip.
        n = _load_pair(K_j, V_j, k, v, hkv, j0, Nk, d, t)
        if COUNT:
            nr += n * IN_BYTES
        for a in range(CA):
            for xb in range(XB):
                dK[a, xb] = ZERO
                dV[a, xb] = ZERO

        # The query blocks i: all, or (causal) from the one holding the first query that sees key j0,
        # of each query head bh of the group (grouped-query attention: G of them) in turn.
        Tr = (Nq + Br - 1) // Br
        i_first = first_visible_q_block(j0, Br, Nq, Nk, CAUSAL)
        for step in range(G * (Tr - i_first)):
            bh, i = group_step(step, Tr - i_first, i_first, hkv, G)
            i0 = i * Br
            cuda.syncthreads()  # the previous step has finished reading Q_i, dO_i, P^T, dS^T
            # Load Q_i, dO_i, L_i, D_i.
            n, n_vec = _load_query_side(Q_i, dO_i, L_i, D_i, q, do, lse, D, bh, i0, Nq, d, t)
            if COUNT:
                nr += n * IN_BYTES + n_vec * L_BYTES
            cuda.syncthreads()

            # S_ij^T = K_j Q_i^T and dP_ij^T = V_j dO_i^T, this thread's CA x RB entries
            products(S, dP, K_j, V_j, Q_i, dO_i, ty, tx, Bc, Br, d)

            # P_ij = exp(scale S_ij - L_i) (0 where masked), dS_ij = P_ij * (Zs dP_ij - D_i); PT holds Zs P_ij
            # (Zs: the dropout mask regenerated, 1 without dropout)
            for a in range(CA):
                c = ty + TY * a
                for b in range(RB):
                    r = tx + TX * b
                    if c < Bc and r < Br:
                        seen = visible(i0 + r, j0 + c, Nq, Nk, CAUSAL)
                        zs = drop(drop_row(drop_head(seed, bh), i0 + r), j0 + c, threshold, inv_keep)
                        PT[c, r], dST[c, r] = p_and_ds(S[a, b], dP[a, b], L_i[r], D_i[r], scale, seen, zs)
            cuda.syncthreads()

            # dV_j += P_ij^T dO_i;  dK_j += dS_ij^T Q_i (over the query rows that exist)
            masked = CAUSAL and crosses_diagonal(i0, j0, Bc, Nq, Nk)  # uniform; False without a mask
            for r in range(min(Br, Nq - i0)):
                for xb in range(XB):
                    x = min(tx + TX * xb, d - 1)
                    do_row[xb] = dO_i[r, x]
                    q_row[xb] = Q_i[r, x]
                for a in range(CA):
                    c = min(ty + TY * a, Bc - 1)
                    p = PT[c, r]
                    ds = dST[c, r]
                    if not (masked and p == 0 and ds == 0):  # a masked entry adds nothing, even against Inf, NaN
                        for xb in range(XB):
                            dV[a, xb] += p * do_row[xb]
                            dK[a, xb] += ds * q_row[xb]

        # Write dK_j = scale * sum_i dS_ij^T Q_i and dV_j once.
        for a in range(CA):
            c = ty + TY * a
            if c < Bc and j0 + c < Nk:
                for xb in range(XB):
                    x = tx + TX * xb
                    if x < d:
                        dk[hkv, j0 + c, x] = scale * dK[a, xb]
                        dv[hkv, j0 + c, x] = dV[a, xb]
                        if COUNT:
                            nw += 2 * IN_BYTES
        if COUNT:
            add_counts(counter, nr, nw)

    return flash2_dkdv


@functools.lru_cache(maxsize=None)
def _dq_kernel(d, Br, Bc, dtype, causal, count, dropout=False):
    """Kernel 3 of the backward: dQ_i for one query block per thread block."""
    ACC, acc, IN_BYTES, L_BYTES = _constants(dtype)
    ZERO = acc(0)
    RA, CB, XB = _cdiv(Br, TY), _cdiv(Bc, TX), _cdiv(d, TX)
    KS = d | 1  # odd row stride of K_j, V_j: read down a column by the 16 threads of a row
    Q_TILE, KV_TILE, S_TILE = (Br, d), (Bc, KS), (Br, Bc)
    S_REGS, Q_REGS = (RA, CB), (RA, XB)
    CAUSAL, COUNT = causal, count
    products, p_and_ds = _two_products(RA, CB, np.dtype(acc).name), _p_and_ds(np.dtype(acc).name)
    drop_head, drop_row, drop = _dropout.factor(dropout, np.dtype(acc).name)

    @jit
    def flash2_dq(q, k, v, do, lse, D, dq, counter, Nq, Nk, G, scale, seed, threshold, inv_keep):
        t = cuda.threadIdx.x
        ty, tx = t // TX, t % TX
        bh, i0 = cuda.blockIdx.x, heavy_first_block(Br)
        hkv = kv_head(bh, G)
        nr = 0
        nw = 0

        Q_i = cuda.shared.array(Q_TILE, ACC)
        dO_i = cuda.shared.array(Q_TILE, ACC)
        K_j = cuda.shared.array(KV_TILE, ACC)
        V_j = cuda.shared.array(KV_TILE, ACC)
        dS_ij = cuda.shared.array(S_TILE, ACC)
        L_i = cuda.shared.array(Br, ACC)
        D_i = cuda.shared.array(Br, ACC)
        S = cuda.local.array(S_REGS, ACC)  # this thread's entries of S_ij
        dP = cuda.local.array(S_REGS, ACC)  # ... of dP_ij
        dQ = cuda.local.array(Q_REGS, ACC)  # ... of dQ_i (without the factor scale)
        k_row = cuda.local.array(XB, ACC)

        # Load Q_i, dO_i, L_i, D_i once; dQ_i = 0 on chip.
        n, n_vec = _load_query_side(Q_i, dO_i, L_i, D_i, q, do, lse, D, bh, i0, Nq, d, t)
        if COUNT:
            nr += n * IN_BYTES + n_vec * L_BYTES
        for a in range(RA):
            for xb in range(XB):
                dQ[a, xb] = ZERO

        for j in range(visible_kv_blocks(i0, Br, Bc, Nq, Nk, CAUSAL)):
            j0 = j * Bc
            cuda.syncthreads()  # the previous step has finished reading K_j, dS_ij
            n = _load_pair(K_j, V_j, k, v, hkv, j0, Nk, d, t)
            if COUNT:
                nr += n * IN_BYTES
            cuda.syncthreads()

            # S_ij = Q_i K_j^T and dP_ij = dO_i V_j^T, this thread's RA x CB entries
            products(S, dP, Q_i, dO_i, K_j, V_j, ty, tx, Br, Bc, d)

            # dS_ij = P_ij * (Zs dP_ij - D_i), P_ij = exp(scale S_ij - L_i) (0 where masked), Zs: dropout's factor
            for a in range(RA):
                r = ty + TY * a
                for b in range(CB):
                    c = tx + TX * b
                    if r < Br and c < Bc:
                        seen = visible(i0 + r, j0 + c, Nq, Nk, CAUSAL)
                        zs = drop(drop_row(drop_head(seed, bh), i0 + r), j0 + c, threshold, inv_keep)
                        dS_ij[r, c] = p_and_ds(S[a, b], dP[a, b], L_i[r], D_i[r], scale, seen, zs)[1]
            cuda.syncthreads()

            # dQ_i += dS_ij K_j (over the keys that exist)
            masked = CAUSAL and crosses_diagonal(i0, j0, Bc, Nq, Nk)  # uniform; False without a mask
            for c in range(min(Bc, Nk - j0)):
                for xb in range(XB):
                    k_row[xb] = K_j[c, min(tx + TX * xb, d - 1)]
                for a in range(RA):
                    ds = dS_ij[min(ty + TY * a, Br - 1), c]
                    if not (masked and ds == 0):  # a masked entry (dS = 0) adds nothing, even against Inf or NaN
                        for xb in range(XB):
                            dQ[a, xb] += ds * k_row[xb]

        # Write dQ_i = scale * sum_j dS_ij K_j once.
        for a in range(RA):
            r = ty + TY * a
            if r < Br and i0 + r < Nq:
                for xb in range(XB):
                    x = tx + TX * xb
                    if x < d:
                        dq[bh, i0 + r, x] = scale * dQ[a, xb]
                        if COUNT:
                            nw += IN_BYTES
        if COUNT:
            add_counts(counter, nr, nw)

    return flash2_dq


def grids(prob, block) -> dict:
    """The launch grid of each launch, by launch name: (B*H, blocks per head), see head_grid_2d."""
    Br, Bc = block
    Tr, Tc = _cdiv(prob.Nq, Br), _cdiv(prob.Nk, Bc)
    return {FORWARD_NAME: head_grid_2d(Tr, prob.BH), BACKWARD_NAMES[0]: _rowsum.grid(prob),
            BACKWARD_NAMES[1]: head_grid_2d(Tc, prob.BHkv), BACKWARD_NAMES[2]: head_grid_2d(Tr, prob.BH)}


def forward(prob, ops, block, counters):
    """O and L = m + log(l): one launch of Tr * B*H blocks."""
    Br, Bc = block
    dropout, drop_args = _dropout.launch_args(prob)
    kernel = _forward_kernel(prob.d, Br, Bc, prob.dtype, prob.causal, counters.enabled, dropout)
    o = _inputs.empty((prob.BH, prob.Nq, prob.d), prob.dtype)
    lse = _inputs.empty((prob.BH, prob.Nq), prob.acc)
    q, k, v = (ops[name].dev for name in ("q", "k", "v"))
    kernel[grids(prob, block)[FORWARD_NAME], NT](q, k, v, o, lse, counters.array(FORWARD_NAME), prob.Nq, prob.Nk,
                                                 prob.G, prob.acc.type(prob.scale), *drop_args)
    return o, lse


def backward(prob, ops, block, counters):
    """dQ, dK, dV: D = rowsum(dO * O), then dK, dV (Tc * B*H blocks), then dQ (Tr * B*H blocks)."""
    Br, Bc = block
    BH, Nq, Nk, d, dt, acc = prob.BH, prob.Nq, prob.Nk, prob.d, prob.dtype, prob.acc
    count = counters.enabled
    q, k, v, o, lse, do = (ops[name].dev for name in ("q", "k", "v", "o", "lse", "do"))
    scale = acc.type(prob.scale)
    D = _rowsum.rowsum(prob, o, do, counters)
    dq = _inputs.empty((BH, Nq, d), dt)
    dk = _inputs.empty((prob.BHkv, Nk, d), dt)
    dv = _inputs.empty((prob.BHkv, Nk, d), dt)
    dropout, drop_args = _dropout.launch_args(prob)
    dkdv = _dkdv_kernel(d, Br, Bc, dt, prob.causal, count, dropout)
    grid = grids(prob, block)
    dkdv[grid[BACKWARD_NAMES[1]], NT](q, k, v, do, lse, D, dk, dv, counters.array(BACKWARD_NAMES[1]), Nq, Nk, prob.G,
                                      scale, *drop_args)
    dq_kernel = _dq_kernel(d, Br, Bc, dt, prob.causal, count, dropout)
    dq_kernel[grid[BACKWARD_NAMES[2]], NT](q, k, v, do, lse, D, dq, counters.array(BACKWARD_NAMES[2]), Nq, Nk, prob.G,
                                           scale, *drop_args)
    return dq, dk, dv


def compile_all(ccs, dtypes, ds):
    """PTX of every specialisation: default blocks for each d, causal or not, counting or not;
    with dropout only for :data:`flash_numba.kernels._dropout.COMPILED_WITH_DROPOUT` (not counting).

    Returns ``[(label, ptx)]``; the label names the kernel, d, dtype, (Br, Bc),
    causal, count and ``sm_XY``.  Needs ``NUMBA_ENABLE_CUDASIM=0``.
    """
    out = []
    I64 = types.int64
    for dtype in dtypes:
        dt = np.dtype(dtype)
        X3, A2, ACC = array_type(dt, 3), array_type(_inputs.acc_dtype(dt), 2), acc_nb_type(dt)
        DROP = _dropout.arg_types(ACC)
        XI = input_type(dt)  # q, k, v, do: (B, H, N, d), any strides with contiguous rows
        fwd_sig = (XI, XI, XI, X3, A2, COUNTER_TYPE, I64, I64, I64, ACC, *DROP)
        dkdv_sig = (XI, XI, XI, XI, A2, A2, X3, X3, COUNTER_TYPE, I64, I64, I64, ACC, *DROP)
        dq_sig = (XI, XI, XI, XI, A2, A2, X3, COUNTER_TYPE, I64, I64, I64, ACC, *DROP)
        for d in ds:
            fwd, bwd = (SPEC.block(d, dt, pass_, budget=STATIC_SHARED_LIMIT) for pass_ in ("forward", "backward"))
            for count in (False, True):
                tail = f"d={d} {dt}{' count' * count}"
                specs = [(f"{BACKWARD_NAMES[0]} {tail}", _rowsum.rowsum_kernel(d, dt, count), _rowsum.signature(dt))]
                for causal, drop in itertools.product((False, True), _dropout.compile_variants(dt, d, count)):
                    tag = f"{tail}{' causal' * causal}{' dropout' * drop}"
                    fwd_tag, bwd_tag = f"{tag} Br={fwd[0]} Bc={fwd[1]}", f"{tag} Br={bwd[0]} Bc={bwd[1]}"
                    specs += [
                        (f"forward {fwd_tag}", _forward_kernel(d, *fwd, dt, causal, count, drop), fwd_sig),
                        (f"{BACKWARD_NAMES[1]} {bwd_tag}", _dkdv_kernel(d, *bwd, dt, causal, count, drop), dkdv_sig),
                        (f"{BACKWARD_NAMES[2]} {bwd_tag}", _dq_kernel(d, *bwd, dt, causal, count, drop), dq_sig),
                    ]
                out += [compile_kernel(f"flash2 {name}", kernel, sig, cc) for name, kernel, sig in specs for cc in ccs]
    return out


SPEC = KernelSpec(
    name="flash2", doc=__doc__, forward=forward, backward=backward, compile_all=compile_all,
    forward_launches=(FORWARD_NAME,), backward_launches=BACKWARD_NAMES,
    shared_bytes=shared_bytes, block_limits=block_limits,  # the paper's block rule (blocks.choose)
)
