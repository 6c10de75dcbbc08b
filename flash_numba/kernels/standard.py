"""Standard attention: the paper's baseline done well, S and P through HBM.

What it does.  The three lines of the FlashAttention paper's Algorithm 0, each a
kernel that reads its inputs from HBM and writes its result to HBM::

    S = scale * Q K^T; m, l, L = m + log l   (BH, Nq, Nk); (BH, Nq) each   "S = scale*Q@K^T"
    P = exp(S - m) / l  (= softmax(S))       (BH, Nq, Nk)                  "P = softmax(S)"
    O = P V                                  (BH, Nq, d)                   "O = P@V"

with the same blocks ``(Br, Bc)`` and the same on-chip discipline as the flash
kernels: the thread block of query block i keeps Q_i on chip while the K_j
stream past in Bc-row tiles, writes each S_ij tile to HBM and keeps the row
statistics m_i, l_i on chip, then writes them and L_i = m_i + log l_i once; the
softmax reads each row of S (and m_i, l_i) once and writes P; the product kernel
streams the P_ij and V_j tiles past an O_i held in registers and writes O once.  So Q is read once,
K and V once per query block, O and L written once, exactly as in
:mod:`flash2`; the only other bytes are S and P written and read back once
each, with their row statistics m and l: the S/P term of
:func:`flash_numba.iomodel.standard.sp_bytes`, which FlashAttention removes.
Causal attention visits the same (query block, key block) pairs as flash2: S
and P exist only in the visible tiles (masked entries inside them are -inf and
0), the other tiles are never written or read.

The backward is the paper's Algorithm 3 with the same blocks: D = rowsum(dO*O)
(flash2's kernel), then per query block the recomputed P = exp(S - L) and
dS = P * (dP - D) with dP = dO V^T (dP stays in registers; P and dS go to HBM),
then dV = P^T dO and dK = scale dS^T Q per key block, dQ = scale dS K per query
block.  The API is stateless, so P is recomputed from Q, K and L rather than
kept from the forward pass as PyTorch's autograd would.

How it is fast.  Every kernel is register-tiled like :mod:`flash2_fast`: 128
threads as an 8 x 16 grid, each owning a TM x TN (or TM x TD) micro-tile, tiles
stored in shared memory so that a thread's values are adjacent (vector loads),
uint32 indices on whole tiles and fastmath; the pieces are the device functions
of :mod:`flash_numba.kernels._tiles`.  Blocks are multiples of (8, 16):
Br = 8 TM query rows, Bc = 16 TN keys.

What the counters count.  Each launch adds to ``counters.array(name)`` the bytes
its threads load from and store to global arrays (see :mod:`._common`): every
element of Q_i, K_j, V_j, S_ij, P_ij, dS_ij, dO_i, L_i, D_i, m_i, l_i it loads
and every element it stores.  :mod:`flash_numba.iomodel.standard` gives the same numbers
in closed form, per kernel.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda, types, uint32

from .. import _inputs
from ..device import SIMULATOR, STATIC_SHARED_LIMIT, jit
from . import _rowsum
from ._common import COUNTER_TYPE, acc_nb_type, array_type, nb_type
from ._spec import KernelSpec
from ._tiles import FASTMATH, NT, TX, TY, micro_product, tile_loader, tile_store
from .matmul16 import TILE, matmul, matmul_kernel  # noqa: F401  (lesson 4's kernel, imported from here before)

USES_BLOCKS = True
FULL_MASK = 0xFFFFFFFF
#: Kernel names, as the counters and the IO model call them.
FORWARD_NAMES = ("S = scale*Q@K^T", "P = softmax(S)", "O = P@V")
BACKWARD_NAMES = (_rowsum.NAME, "P, dS = P*(dP-D)", "dV = P^T@dO", "dK = scale*dS^T@Q", "dQ = scale*dS@K")
#: Rows of the softmax per thread block: one warp per row.
SOFTMAX_ROWS = NT // 32
#: Blocks in order of preference (the largest query block first: K and V are read once per query block).
_PREFERENCE = ((64, 32), (64, 16), (32, 32), (32, 16), (16, 32), (16, 16), (8, 16))


def _consts(dtype):
    """-inf, +inf, 0 as scalars of the accumulation dtype (typed: a Python float means float64 math)."""
    f = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    return f(-np.inf), f(np.inf), f(0)


def geometry(Br: int, Bc: int, d: int, dtype) -> dict:
    """Micro-tiles, padded sizes and shared-memory bytes of every kernel for block (Br, Bc)."""
    a = _inputs.acc_dtype(dtype).itemsize
    vec = 16 // a  # pad rows by one 16-byte vector
    TD = -(-d // TX)
    DP = TD * TX
    QS, KS = Br + vec, Bc + vec
    return dict(
        TM=Br // TY, TN=Bc // TX, TMc=Bc // TY, TD=TD, DP=DP, QS=QS, KS=KS,
        scores=a * DP * (QS + KS),  # Q_i^T, K_j^T
        rowprod=a * Bc * (QS + DP),  # A_ij^T, B_j
        colprod=a * Br * (KS + DP),  # A_ij, B_i
        grad=a * (DP * (2 * QS + KS) + 2 * Br),  # Q_i^T, dO_i^T, K_j^T or V_j^T, L_i, D_i
    )


def shared_bytes(Br: int, Bc: int, d: int, dtype, pass_: str = "forward") -> int:
    """Static shared memory of the largest kernel of the pass (huge if (Br, Bc) is not a micro-tile shape)."""
    if pass_ not in ("forward", "backward"):
        raise ValueError(f"pass_: expected 'forward' or 'backward', got {pass_!r}")
    if Br % TY or Bc % TX or Br < 1 or Bc < 1:
        return 1 << 40
    g = geometry(Br, Bc, d, dtype)
    if pass_ == "forward":
        return max(g["scores"], g["rowprod"])
    return max(g["grad"], g["colprod"], g["rowprod"])


def block_limits(d: int, dtype, pass_: str = "forward") -> tuple[int, int]:
    """Br = 8 TM <= 64 and Bc = 16 TN <= 64 (register micro-tiles of at most 8 x 4)."""
    return TY * 8, TX * 4


def check_block(block, d: int, dtype, pass_: str = "forward") -> None:
    """Refuse, by name, a block that is not a micro-tile shape (api.py calls this first)."""
    if block is None:
        return
    try:
        Br, Bc = block
    except (TypeError, ValueError):
        return  # blocks.validate names the problem
    if isinstance(Br, int) and isinstance(Bc, int) and (Br % TY or Bc % TX or Br < 1 or Bc < 1):
        raise ValueError(
            f"block: standard needs Br a multiple of {TY} and Bc a multiple of {TX} "
            f"(its {TY} x {TX} thread grid), got ({Br}, {Bc})"
        )


def choose_block(d: int, dtype, budget: int, pass_: str = "forward") -> tuple[int, int]:
    """The first block of ``_PREFERENCE`` whose kernels fit ``budget`` bytes of shared memory.

    The same rule as flash2_fast's forward (register micro-tiles bound the block,
    not the paper's Bc = ceil(M / 4d)); at d = 64, float32 both pick (64, 32).
    """
    for Br, Bc in _PREFERENCE:
        if shared_bytes(Br, Bc, d, dtype, pass_) <= budget:
            return Br, Bc
    raise ValueError(f"no block fits d = {d} ({np.dtype(dtype)}) in {budget} bytes of shared memory")


def n_key_blocks(r0: int, Br: int, Bc: int, Nq: int, Nk: int, causal: bool) -> int:
    """Key blocks the query block starting at row ``r0`` visits: all, or (causal) up to
    the one holding the last key its last row sees (host twin of :func:`_n_visible`)."""
    Tc = -(-Nk // Bc)
    if not causal:
        return Tc
    last = r0 + Br - 1 + Nk - Nq
    return 0 if last < 0 else min(Tc, last // Bc + 1)


@jit(device=True)
def _n_visible(r0, Br, Bc, Nq, Nk):
    """Causal: key blocks visible to the query block starting at row ``r0``."""
    Tc = (Nk + Bc - 1) // Bc
    last = r0 + Br - 1 + Nk - Nq
    return 0 if last < 0 else min(Tc, last // Bc + 1)


def _align():
    return None if SIMULATOR else 16


# --------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------


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
    CAUSAL, COUNT, ALIGN, PAD = causal, count, _align(), DP - d
    load_q = tile_loader(Br, d, 1, QS, acc_name)  # Q_i -> QT[x * QS + r]
    load_k = tile_loader(Bc, d, 1, KS, acc_name)  # K_j -> KT[x * KS + c]
    product = micro_product(TM, TN, DP, QS, KS, acc_name)
    store = tile_store(TM, TN, dtype.name)

    QT_SIZE, KT_SIZE = DP * QS, DP * KS  # shared-array sizes must be constants
    def kernel(q, k, s_out, lse, ml, Nq, Nk, scale, counter):
        QT = cuda.shared.array(QT_SIZE, ACC, alignment=ALIGN)  # Q_i^T (DP, QS)
        KT = cuda.shared.array(KT_SIZE, ACC, alignment=ALIGN)  # K_j^T (DP, KS)
        s = cuda.local.array((TM, TN), ACC)
        m = cuda.local.array(TM, ACC)
        l = cuda.local.array(TM, ACC)
        tid = cuda.threadIdx.x
        ty = tid // TX
        tx = tid % TX
        # 1-D grid, the last (longest when causal) query block of every head first
        Tr = (Nq + Br - 1) // Br
        BH = cuda.gridDim.x // Tr
        r0 = (Tr - 1 - cuda.blockIdx.x // BH) * Br
        bh = cuda.blockIdx.x % BH
        off = Nk - Nq
        nr = 0
        nw = 0
        n_j = (Nk + Bc - 1) // Bc
        if CAUSAL:
            n_j = _n_visible(r0, Br, Bc, Nq, Nk)

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
            n = load_k(k, bh, c0, 0, Nk - c0, d, KT, tid)
            if COUNT:
                nr += n * SB
            cuda.syncthreads()
            for a in range(TM):
                for b in range(TN):
                    s[a, b] = ZERO
            product(QT, ty * TM, KT, tx * TN, s)
            for a in range(TM):
                for b in range(TN):
                    x = s[a, b] * scale
                    s[a, b] = ACC(ST(x)) if ROUND else x
            ct = c0 + tx * TN  # this thread's first key
            if c0 + Bc > Nk or (CAUSAL and c0 + Bc - 1 > r0 + off):  # uniform over the block
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
                    mx = max(mx, s[a, b])
                mx = max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 8))
                mx = max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 4))
                mx = max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 2))
                mx = max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 1))
                m_new = max(m[a], mx)
                m_use = ZERO if m_new == NEG_INF else m_new  # a row that sees nothing yet: exp(-inf) = 0
                l[a] *= math.exp(m[a] - m_use)
                for b in range(TN):
                    l[a] += math.exp(s[a, b] - m_use)
                m[a] = m_new
            n = store(s_out, bh, rt, ct, Nq - rt, Nk - ct, s)
            if COUNT:
                nw += n * SB

        for a in range(TM):  # L_i = m_i + log l_i, l_i summed over the 16 threads of the row
            lt = l[a]
            lt += cuda.shfl_xor_sync(FULL_MASK, lt, 8)
            lt += cuda.shfl_xor_sync(FULL_MASK, lt, 4)
            lt += cuda.shfl_xor_sync(FULL_MASK, lt, 2)
            lt += cuda.shfl_xor_sync(FULL_MASK, lt, 1)
            if tx == 0 and rt + a < Nq:
                lse[bh, rt + a] = m[a] + math.log(lt) if lt != 0 else NEG_INF
                ml[bh, 0, rt + a] = m[a]
                ml[bh, 1, rt + a] = lt
                if COUNT:
                    nw += 3 * AB
        if COUNT:
            cuda.atomic.add(counter, 0, nr)
            cuda.atomic.add(counter, 1, nw)

    kernel._fastmath = FASTMATH
    return jit(fastmath=FASTMATH)(kernel)


@lru_cache(maxsize=None)
def softmax_kernel(Br: int, Bc: int, dtype_name: str, causal: bool, count: bool):
    """``P = exp(S - m) / l``: the softmax of each row of S in one pass (m, l from :func:`scores_kernel`).

    One warp per row, ``SOFTMAX_ROWS`` rows per block: launch
    ``kernel[ceil(BH * Nq / SOFTMAX_ROWS), 128](s, ml, p, Nq, Nk, counter)``.  A row
    of query block i reads and writes the keys of the tiles that block visits
    (all Nk, or fewer when causal); a row with no visible key (m = -inf, l = 0) gets P = 0.
    """
    dtype = np.dtype(dtype_name)
    ACC, ST = acc_nb_type(dtype), nb_type(dtype)
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
            if m == NEG_INF:  # no visible key: exp(-inf - 0) = 0, not exp(-inf + inf) = NaN
                m = ZERO
            inv = ONE / l if l != 0 else ZERO  # != 0: a NaN row stays NaN
            n_u = uint32(n)
            c = uint32(lane)
            while c + W3 < n_u:  # four loads in flight per thread, then four stores
                x0 = ACC(s[bh, row, c])
                x1 = ACC(s[bh, row, c + W])
                x2 = ACC(s[bh, row, c + W2])
                x3 = ACC(s[bh, row, c + W3])
                p[bh, row, c] = ST(math.exp(x0 - m) * inv)
                p[bh, row, c + W] = ST(math.exp(x1 - m) * inv)
                p[bh, row, c + W2] = ST(math.exp(x2 - m) * inv)
                p[bh, row, c + W3] = ST(math.exp(x3 - m) * inv)
                if COUNT:
                    nr += 4 * SB
                    nw += 4 * SB
                c += W4
            while c < n_u:
                x0 = ACC(s[bh, row, c])
                p[bh, row, c] = ST(math.exp(x0 - m) * inv)
                if COUNT:
                    nr += SB
                    nw += SB
                c += W
        if COUNT:
            cuda.atomic.add(counter, 0, nr)
            cuda.atomic.add(counter, 1, nw)

    kernel._fastmath = FASTMATH
    return jit(fastmath=FASTMATH)(kernel)


@lru_cache(maxsize=None)
def rowprod_kernel(d: int, Br: int, Bc: int, dtype_name: str, causal: bool, count: bool):
    """``C_i = alpha * sum_j A_ij B_j`` (``O = P V``; ``dQ = scale dS K``), one query block per thread block.

    ``a``: (BH, Nq, Nk) storage dtype, read in the visible tiles only; ``b``: (BH, Nk, d);
    ``c``: (BH, Nq, d).  Launch ``kernel[Tr * BH, 128](a, b, c, Nq, Nk, alpha, counter)``.
    Thread (ty, tx) owns rows ``ty*TM ..`` and columns ``tx*TD ..`` of C_i.
    """
    dtype = np.dtype(dtype_name)
    g = geometry(Br, Bc, d, dtype)
    TM, TD, DP, AS = g["TM"], g["TD"], g["DP"], g["QS"]
    ACC = acc_nb_type(dtype)
    acc_name = str(ACC)
    SB = dtype.itemsize
    _, _, ZERO = _consts(dtype)
    CAUSAL, COUNT, ALIGN, PAD = causal, count, _align(), DP - d
    load_a = tile_loader(Br, Bc, 1, AS, acc_name)  # A_ij -> AT[c * AS + r]
    load_b = tile_loader(Bc, d, DP, 1, acc_name)  # B_j -> Bs[c * DP + x]
    product = micro_product(TM, TD, Bc, AS, DP, acc_name)
    store = tile_store(TM, TD, dtype.name)

    AT_SIZE, B_SIZE = Bc * AS, Bc * DP  # shared-array sizes must be constants
    def kernel(a_in, b_in, c_out, Nq, Nk, alpha, counter):
        AT = cuda.shared.array(AT_SIZE, ACC, alignment=ALIGN)  # A_ij^T (Bc, AS)
        Bs = cuda.shared.array(B_SIZE, ACC, alignment=ALIGN)  # B_j (Bc, DP)
        acc = cuda.local.array((TM, TD), ACC)
        tid = cuda.threadIdx.x
        ty = tid // TX
        tx = tid % TX
        Tr = (Nq + Br - 1) // Br
        BH = cuda.gridDim.x // Tr
        r0 = (Tr - 1 - cuda.blockIdx.x // BH) * Br
        bh = cuda.blockIdx.x % BH
        nr = 0
        nw = 0
        n_j = (Nk + Bc - 1) // Bc
        if CAUSAL:
            n_j = _n_visible(r0, Br, Bc, Nq, Nk)
        for e in range(tid, PAD * Bc, NT):  # padding columns d..DP of B_j stay 0
            Bs[(e // PAD) * DP + d + e % PAD] = ZERO
        for u in range(TM):
            for x in range(TD):
                acc[u, x] = ZERO
        for j in range(n_j):
            c0 = j * Bc
            cuda.syncthreads()  # everyone is done with the previous tiles
            n = load_a(a_in, bh, r0, c0, Nq - r0, Nk - c0, AT, tid)
            n += load_b(b_in, bh, c0, 0, Nk - c0, d, Bs, tid)
            if COUNT:
                nr += n * SB
            cuda.syncthreads()
            product(AT, ty * TM, Bs, tx * TD, acc)
        for u in range(TM):
            for x in range(TD):
                acc[u, x] *= alpha
        rt = r0 + ty * TM
        n = store(c_out, bh, rt, tx * TD, Nq - rt, d - tx * TD, acc)
        if COUNT:
            nw += n * SB
            cuda.atomic.add(counter, 0, nr)
            cuda.atomic.add(counter, 1, nw)

    kernel._fastmath = FASTMATH
    return jit(fastmath=FASTMATH)(kernel)


# --------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def colprod_kernel(d: int, Br: int, Bc: int, dtype_name: str, causal: bool, count: bool):
    """``C_j = alpha * sum_i A_ij^T B_i`` (``dV = P^T dO``; ``dK = scale dS^T Q``), one key block per thread block.

    ``a``: (BH, Nq, Nk) storage dtype, read in the visible tiles only; ``b``: (BH, Nq, d);
    ``c``: (BH, Nk, d).  Launch ``kernel[Tc * BH, 128](a, b, c, Nq, Nk, alpha, counter)``.
    Thread (ty, tx) owns keys ``ty*TMc ..`` (TMc = Bc / 8) and columns ``tx*TD ..`` of C_j.
    """
    dtype = np.dtype(dtype_name)
    g = geometry(Br, Bc, d, dtype)
    TMc, TD, DP, AS = g["TMc"], g["TD"], g["DP"], g["KS"]
    ACC = acc_nb_type(dtype)
    acc_name = str(ACC)
    SB = dtype.itemsize
    _, _, ZERO = _consts(dtype)
    CAUSAL, COUNT, ALIGN, PAD = causal, count, _align(), DP - d
    load_a = tile_loader(Br, Bc, AS, 1, acc_name)  # A_ij -> As[r * AS + c]
    load_b = tile_loader(Br, d, DP, 1, acc_name)  # B_i -> Bs[r * DP + x]
    product = micro_product(TMc, TD, Br, AS, DP, acc_name)
    store = tile_store(TMc, TD, dtype.name)

    A_SIZE, B_SIZE = Br * AS, Br * DP  # shared-array sizes must be constants
    def kernel(a_in, b_in, c_out, Nq, Nk, alpha, counter):
        As = cuda.shared.array(A_SIZE, ACC, alignment=ALIGN)  # A_ij (Br, AS)
        Bs = cuda.shared.array(B_SIZE, ACC, alignment=ALIGN)  # B_i (Br, DP)
        acc = cuda.local.array((TMc, TD), ACC)
        tid = cuda.threadIdx.x
        ty = tid // TX
        tx = tid % TX
        # 1-D grid, key block after key block for every head; the first key blocks are
        # the longest when causal (every query block sees them), so they start first
        Tc = (Nk + Bc - 1) // Bc
        BH = cuda.gridDim.x // Tc
        c0 = (cuda.blockIdx.x // BH) * Bc
        bh = cuda.blockIdx.x % BH
        nr = 0
        nw = 0
        Tr = (Nq + Br - 1) // Br
        i0 = 0
        if CAUSAL:  # the first query row that sees key c0 is c0 - (Nk - Nq)
            first = c0 - (Nk - Nq)
            i0 = 0 if first <= 0 else min(first // Br, Tr)
        for e in range(tid, PAD * Br, NT):  # padding columns d..DP of B_i stay 0
            Bs[(e // PAD) * DP + d + e % PAD] = ZERO
        for u in range(TMc):
            for x in range(TD):
                acc[u, x] = ZERO
        for i in range(i0, Tr):
            r0 = i * Br
            cuda.syncthreads()
            n = load_a(a_in, bh, r0, c0, Nq - r0, Nk - c0, As, tid)
            n += load_b(b_in, bh, r0, 0, Nq - r0, d, Bs, tid)
            if COUNT:
                nr += n * SB
            cuda.syncthreads()
            product(As, ty * TMc, Bs, tx * TD, acc)
        for u in range(TMc):
            for x in range(TD):
                acc[u, x] *= alpha
        ct = c0 + ty * TMc
        n = store(c_out, bh, ct, tx * TD, Nk - ct, d - tx * TD, acc)
        if COUNT:
            nw += n * SB
            cuda.atomic.add(counter, 0, nr)
            cuda.atomic.add(counter, 1, nw)

    kernel._fastmath = FASTMATH
    return jit(fastmath=FASTMATH)(kernel)


@lru_cache(maxsize=None)
def grad_scores_kernel(d: int, Br: int, Bc: int, dtype_name: str, causal: bool, count: bool):
    """``P = exp(S - L)`` and ``dS = P * (dP - D)``, ``dP = dO V^T``, for the visible tiles, one query block per
    thread block; P and dS are written to HBM, dP never leaves the registers.

    Launch ``kernel[Tr * BH, 128](q, k, v, do, lse, D, p, ds, Nq, Nk, scale, counter)``.
    Q_i and dO_i stay in shared memory; V_j, then K_j pass through one buffer.  P is
    ``exp(S - L)`` of exactly the S the forward stored (the same products in the same
    order, the same scale, rounded to the storage dtype), so it differs from the
    forward's P only by a factor per row (L's rounding), which D = rowsum(dO O)
    cancels: with scores of 1e4 a differently rounded S would put noise of ~1e-3
    into each P_ij, which the sum dS K no longer cancels.
    """
    dtype = np.dtype(dtype_name)
    g = geometry(Br, Bc, d, dtype)
    TM, TN, DP, QS, KS = g["TM"], g["TN"], g["DP"], g["QS"], g["KS"]
    ACC = acc_nb_type(dtype)
    acc_name = str(ACC)
    SB, AB = dtype.itemsize, _inputs.acc_dtype(dtype).itemsize
    NEG_INF, POS_INF, ZERO = _consts(dtype)
    ST = nb_type(dtype)
    ROUND = SB < AB
    CAUSAL, COUNT, ALIGN, PAD = causal, count, _align(), DP - d
    load_q = tile_loader(Br, d, 1, QS, acc_name)  # Q_i, dO_i -> (DP, QS) transposed
    load_k = tile_loader(Bc, d, 1, KS, acc_name)  # K_j, V_j -> (DP, KS) transposed
    product = micro_product(TM, TN, DP, QS, KS, acc_name)
    store = tile_store(TM, TN, dtype.name)

    QT_SIZE, KT_SIZE = DP * QS, DP * KS  # shared-array sizes must be constants
    def kernel(q, k, v, do, lse, D, p_out, ds_out, Nq, Nk, scale, counter):
        QT = cuda.shared.array(QT_SIZE, ACC, alignment=ALIGN)  # Q_i^T (DP, QS)
        dOT = cuda.shared.array(QT_SIZE, ACC, alignment=ALIGN)  # dO_i^T (DP, QS)
        XT = cuda.shared.array(KT_SIZE, ACC, alignment=ALIGN)  # V_j^T, then K_j^T (DP, KS)
        Ls = cuda.shared.array(Br, ACC)  # L_i (+inf: the row sees nothing)
        Ds = cuda.shared.array(Br, ACC)  # D_i
        s = cuda.local.array((TM, TN), ACC)  # S, then P
        dp = cuda.local.array((TM, TN), ACC)  # dP, then dS
        Lr = cuda.local.array(TM, ACC)
        Dr = cuda.local.array(TM, ACC)
        tid = cuda.threadIdx.x
        ty = tid // TX
        tx = tid % TX
        Tr = (Nq + Br - 1) // Br
        BH = cuda.gridDim.x // Tr
        r0 = (Tr - 1 - cuda.blockIdx.x // BH) * Br
        bh = cuda.blockIdx.x % BH
        off = Nk - Nq
        nr = 0
        nw = 0
        n_j = (Nk + Bc - 1) // Bc
        if CAUSAL:
            n_j = _n_visible(r0, Br, Bc, Nq, Nk)

        n = load_q(q, bh, r0, 0, Nq - r0, d, QT, tid)
        n += load_q(do, bh, r0, 0, Nq - r0, d, dOT, tid)
        if COUNT:
            nr += n * SB
        for e in range(tid, PAD * QS, NT):  # padding rows d..DP stay 0
            QT[d * QS + e] = ZERO
            dOT[d * QS + e] = ZERO
        for e in range(tid, PAD * KS, NT):
            XT[d * KS + e] = ZERO
        if tid < Br:
            Lv = POS_INF
            Dv = ZERO
            if r0 + tid < Nq:
                Lv = lse[bh, r0 + tid]
                Dv = D[bh, r0 + tid]
                if COUNT:
                    nr += 2 * AB
                if Lv == NEG_INF:
                    Lv = POS_INF  # a row that sees no key: exp(S - inf) = 0
            Ls[tid] = Lv
            Ds[tid] = Dv
        cuda.syncthreads()
        for a in range(TM):
            Lr[a] = Ls[ty * TM + a]
            Dr[a] = Ds[ty * TM + a]
        rt = r0 + ty * TM
        for j in range(n_j):
            c0 = j * Bc
            ct = c0 + tx * TN
            cuda.syncthreads()  # everyone is done with the previous K_j
            n = load_k(v, bh, c0, 0, Nk - c0, d, XT, tid)
            cuda.syncthreads()
            for a in range(TM):
                for b in range(TN):
                    s[a, b] = ZERO
                    dp[a, b] = ZERO
            product(dOT, ty * TM, XT, tx * TN, dp)  # dP = dO_i V_j^T
            cuda.syncthreads()  # everyone is done with V_j
            n += load_k(k, bh, c0, 0, Nk - c0, d, XT, tid)
            if COUNT:
                nr += n * SB
            cuda.syncthreads()
            product(QT, ty * TM, XT, tx * TN, s)  # S = Q_i K_j^T (unscaled)
            edge = c0 + Bc > Nk or (CAUSAL and c0 + Bc - 1 > r0 + off)  # uniform over the block
            for a in range(TM):
                lim = Nk - 1 - ct  # keys ct + b with b <= lim exist and are visible
                if CAUSAL:
                    lim = min(lim, rt + a + off - ct)
                for b in range(TN):
                    x = s[a, b] * scale  # S as the forward stored it
                    if ROUND:
                        x = ACC(ST(x))
                    pv = ZERO  # masked, or past Nk (where S = 0 and exp(0 - L) could overflow)
                    if not (edge and b > lim):
                        pv = math.exp(x - Lr[a])
                    s[a, b] = pv
                    dp[a, b] = pv * (dp[a, b] - Dr[a])
            n = store(p_out, bh, rt, ct, Nq - rt, Nk - ct, s)
            n += store(ds_out, bh, rt, ct, Nq - rt, Nk - ct, dp)
            if COUNT:
                nw += n * SB
        if COUNT:
            cuda.atomic.add(counter, 0, nr)
            cuda.atomic.add(counter, 1, nw)

    kernel._fastmath = FASTMATH
    return jit(fastmath=FASTMATH)(kernel)


# --------------------------------------------------------------------------------------
# The kernel-module protocol
# --------------------------------------------------------------------------------------


def _forward_steps(prob, ops, block, counters):
    """The forward's three launches as ``[(name, run)]`` (``run()`` launches one kernel) and the
    device arrays they fill, ``{"S", "P", "O", "L", "ml"}``: allocated here, once."""
    Br, Bc = block
    BH, Nq, Nk, d, dt, acc = prob.BH, prob.Nq, prob.Nk, prob.d, prob.dtype, prob.acc
    q, k, v = (ops[name].dev for name in ("q", "k", "v"))
    count, causal = counters.enabled, prob.causal
    Tr = -(-Nq // Br)
    out = dict(
        S=_inputs.empty((BH, Nq, Nk), dt), P=_inputs.empty((BH, Nq, Nk), dt), O=_inputs.empty((BH, Nq, d), dt),
        L=_inputs.empty((BH, Nq), acc), ml=_inputs.empty((BH, 2, Nq), acc),  # ml: m_i, l_i
    )
    S, P, O, L, ml = (out[x] for x in ("S", "P", "O", "L", "ml"))
    scores = scores_kernel(d, Br, Bc, dt.name, causal, count)
    softmax = softmax_kernel(Br, Bc, dt.name, causal, count)
    rowprod = rowprod_kernel(d, Br, Bc, dt.name, causal, count)
    c0, c1, c2 = (counters.array(name) for name in FORWARD_NAMES)
    scale, one = acc.type(prob.scale), acc.type(1)
    steps = [
        (FORWARD_NAMES[0], lambda: scores[Tr * BH, NT](q, k, S, L, ml, Nq, Nk, scale, c0)),
        (FORWARD_NAMES[1], lambda: softmax[-(-BH * Nq // SOFTMAX_ROWS), NT](S, ml, P, Nq, Nk, c1)),
        (FORWARD_NAMES[2], lambda: rowprod[Tr * BH, NT](P, v, O, Nq, Nk, one, c2)),
    ]
    return steps, out


def forward(prob, ops, block, counters):
    """S and L, P = softmax(S), O = P V: three launches, S and P in HBM.  Returns device arrays O, L."""
    counters.describe("standard", prob, block, "forward")
    steps, out = _forward_steps(prob, ops, block, counters)
    for _, run in steps:
        run()
    return out["O"], out["L"]


def forward_launches(q, k, v, *, causal=False, block=None, scale=None):
    """The forward of ``q, k, v`` as its three kernel launches, to run (and time) one at a time.

    ``q`` (..., Nq, d), ``k`` and ``v`` (..., Nk, d), device or host arrays as for
    :func:`flash_numba.attention_forward` (host arrays are copied to the device once, here;
    leading dims are flattened to BH); ``causal``, ``scale`` and ``block`` as there (block None:
    the block the API would choose).
    Returns ``(launches, arrays)``: ``launches`` is ``[(name, run)]`` in order, ``name``
    as the counters call the kernel (:data:`FORWARD_NAMES`), ``run()`` one launch of the
    plain (uncounted) kernel; ``arrays`` the device arrays they read and fill,
    ``{"q", "k", "v", "S", "P", "O", "L", "ml"}`` (``ml``: m_i and l_i, (BH, 2, Nq)).
    Running the launches in order computes what :func:`forward` computes.
    """
    from ..api import resolve_block
    from ..hbm import Counters

    prob, ops = _inputs.prepare({"q": q, "k": k, "v": v}, causal=causal, scale=scale)
    block = resolve_block("standard", prob.d, prob.dtype, block, "forward")
    steps, out = _forward_steps(prob, ops, block, Counters(False))
    return steps, {**{name: ops[name].dev for name in ("q", "k", "v")}, **out}


def backward(prob, ops, block, counters):
    """The paper's Algorithm 3 with blocks: D, then P and dS (to HBM), then dV, dK, dQ.  Returns dQ, dK, dV."""
    Br, Bc = block
    BH, Nq, Nk, d, dt, acc = prob.BH, prob.Nq, prob.Nk, prob.d, prob.dtype, prob.acc
    q, k, v, o, lse, do = (ops[name].dev for name in ("q", "k", "v", "o", "lse", "do"))
    count, causal = counters.enabled, prob.causal
    counters.describe("standard", prob, block, "backward")
    Tr, Tc = -(-Nq // Br), -(-Nk // Bc)
    D = _rowsum.rowsum(prob, o, do, counters)
    P = _inputs.empty((BH, Nq, Nk), dt)
    dS = _inputs.empty((BH, Nq, Nk), dt)
    grad_scores_kernel(d, Br, Bc, dt.name, causal, count)[Tr * BH, NT](
        q, k, v, do, lse, D, P, dS, Nq, Nk, acc.type(prob.scale), counters.array(BACKWARD_NAMES[1])
    )
    scale = acc.type(prob.scale)
    colprod = colprod_kernel(d, Br, Bc, dt.name, causal, count)
    dV = _inputs.empty((BH, Nk, d), dt)
    colprod[Tc * BH, NT](P, do, dV, Nq, Nk, acc.type(1), counters.array(BACKWARD_NAMES[2]))
    dK = _inputs.empty((BH, Nk, d), dt)
    colprod[Tc * BH, NT](dS, q, dK, Nq, Nk, scale, counters.array(BACKWARD_NAMES[3]))
    dQ = _inputs.empty((BH, Nq, d), dt)
    rowprod_kernel(d, Br, Bc, dt.name, causal, count)[Tr * BH, NT](
        dS, k, dQ, Nq, Nk, scale, counters.array(BACKWARD_NAMES[4])
    )
    return dQ, dK, dV


def compile_all(ccs, dtypes, ds):
    """PTX of every kernel at the chosen blocks for each d, causal or not, counting or not,
    as ``[(label, ptx)]``; then lesson 4's 16 x 16 product (:mod:`.matmul16`)."""
    from ..compile_check import compile_ptx
    from . import matmul16

    out = []
    I64 = types.int64
    for dtype in dtypes:
        dt = np.dtype(dtype)
        X3, A2, ACC = array_type(dt, 3), array_type(_inputs.acc_dtype(dt), 2), acc_nb_type(dt)
        A3 = array_type(_inputs.acc_dtype(dt), 3)
        for d in ds:
            fwd = choose_block(d, dt, STATIC_SHARED_LIMIT, "forward")
            bwd = choose_block(d, dt, STATIC_SHARED_LIMIT, "backward")
            for count in (False, True):
                for causal in (False, True):
                    tag = f"d={d} {dt}{' causal' * causal}{' count' * count}"
                    f, b = f"{tag} Br={fwd[0]} Bc={fwd[1]}", f"{tag} Br={bwd[0]} Bc={bwd[1]}"
                    specs = [
                        (f"scores {f}", scores_kernel(d, *fwd, dt.name, causal, count),
                         (X3, X3, X3, A2, A3, I64, I64, ACC, COUNTER_TYPE)),
                        (f"softmax {f}", softmax_kernel(*fwd, dt.name, causal, count),
                         (X3, A3, X3, I64, I64, COUNTER_TYPE)),
                        (f"rowprod {f}", rowprod_kernel(d, *fwd, dt.name, causal, count),
                         (X3, X3, X3, I64, I64, ACC, COUNTER_TYPE)),
                        (f"grad_scores {b}", grad_scores_kernel(d, *bwd, dt.name, causal, count),
                         (X3, X3, X3, X3, A2, A2, X3, X3, I64, I64, ACC, COUNTER_TYPE)),
                        (f"colprod {b}", colprod_kernel(d, *bwd, dt.name, causal, count),
                         (X3, X3, X3, I64, I64, ACC, COUNTER_TYPE)),
                    ]
                    if bwd != fwd:
                        specs.append((f"rowprod {b}", rowprod_kernel(d, *bwd, dt.name, causal, count),
                                      (X3, X3, X3, I64, I64, ACC, COUNTER_TYPE)))
                    for label, kernel, sig in specs:
                        for cc in ccs:
                            out.append((f"standard {label} sm_{cc[0]}{cc[1]}", compile_ptx(kernel.py_func, sig, cc)))
    return out + matmul16.compile_all(ccs, dtypes, ds)


SPEC = KernelSpec(
    name="standard", doc=__doc__, forward=forward, backward=backward, compile_all=compile_all,
    forward_launches=FORWARD_NAMES, backward_launches=BACKWARD_NAMES,
    shared_bytes=shared_bytes, block_limits=block_limits, choose_block=choose_block, check_block=check_block,
)
