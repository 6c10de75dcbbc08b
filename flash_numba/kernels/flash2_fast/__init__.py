"""flash2_fast: the flash2 forward, register-tiled for speed (performance work, issue 4).

What it does.  The same algorithm as :mod:`flash2` (FlashAttention-2 loop order:
a thread block owns Br query rows, walks over the K/V blocks, keeps O_i, m_i, l_i
on chip and writes O and L once), arranged so that the CUDA cores spend their
time on multiply-adds:

* **Micro-tiles.**  128 threads as an 8 x 16 grid (ty, tx).  Thread (ty, tx)
  owns TM consecutive query rows ``ty*TM ..`` and, of S_ij, TN consecutive keys
  ``tx*TN ..``; of O_i, TD consecutive columns ``tx*TD ..`` (DP = 16*TD >= d)::

        S_ij  (Br = 8 TM  x  Bc = 16 TN)        O_i  (Br  x  DP = 16 TD)
        +---------+---------+-- ...             +------+------+-- ...
        | (0, 0)  | (0, 1)  |                   |(0,0) |(0,1) |
        | TM x TN | TM x TN |                   |TMxTD |TMxTD |
        +---------+---------+                   +------+------+
        | (1, 0)  | ...                         | (1,0)| ...

* **Transposed tiles, vector loads.**  Shared memory holds Q_i^T, K_j^T, V_j and
  P_ij^T, so at each step of a product the TM (or TN, TD) values a thread needs
  are adjacent: one 16-byte ``LDS.128`` feeds four FMAs.  That needs 16-byte
  aligned arrays (``alignment=16``) and *unsigned* indices: with a signed index
  Numba must handle Python's negative indices, and the four loads stay apart.
* **Loops the compiler unrolls.**  The inner products run as ``while`` loops over
  uint32 offsets that advance one tile row per step; NVVM unrolls them and every
  load has a constant offset.  A Python ``range`` loop kept a 64-bit counter and
  a multiply per address: half the instructions were overhead (SASS counted).
* **Typed constants.**  ``-inf``, 0 and 1 are float32 constants.  A Python float
  (``-math.inf``) silently turned the softmax into float64 arithmetic: 288 DFMA
  instructions in the float32 kernel's SASS before the fix.
* **exp2.**  log2(e) is folded into the scale, so each probability is one
  ``ex2.approx`` (``fastmath`` without the no-inf/no-NaN flags, so the -inf
  tests of masked rows stay).
* **Row reductions in registers.**  The 16 threads of a row are half a warp: the
  row max takes four ``shfl_xor``; the row sum l_i stays per-thread (rescaled
  with the max) and is reduced once at the end.

Measured on an NVIDIA H200 (fp32, B*H = 32, N = 4096, d = 64, forward, kernel
alone, 2026-11-30): see ``benchmarks/results/``.  The steps, each run on the GPU:
flash2-style 8x2 micro-tile with scalar loads and Python-float -inf 9.9 ms
(13.9 TFLOP/s); typed constants + unrolled while loops 6.4 ms (21.4 TFLOP/s);
fixed-column K/V loads in unrolled loops + a 128-register cap 5.9 ms (23.4);
**full tiles loaded with unsigned indices, every load before the first shared
store 4.5 ms (30.4 TFLOP/s)**.  That last step came from reading the SASS: a
signed index into a global array costs the code of Python's negative-index
wraparound (a compare and select per dimension, then 64-bit multiplies), about
35 instructions per load, and the loads of a tile took a quarter of all the
instructions of a K/V step (1140 of 4440); with uint32 indices a tile is 173
instructions for its 32 loads and 32 stores.  Edge tiles (past Nk) keep the
checked loop.  Causal: the grid is one-dimensional, the last (longest) row
tile of every head first, so short blocks fill the tail: 0.51 of the
non-causal time (a (Tr, B*H) grid, heavy-first only within a head, gave 0.64).
Not kept: K_j row-major with 16-byte loads along d to remove the 8-way bank
conflict of the transposed K store (6.9 ms: the limit is instruction issue, not
shared-memory banks; docs/PERFORMANCE.md).

Backward: D = rowsum(dO * O), then dK/dV per key block and dQ per query block, in the
same style (see the comment above :func:`dkdv_kernel`); with ``deterministic=False``
one pass instead, the dK/dV kernel adding dS K_j into dQ with atomics (FlashAttention-2's
way).  At N = 4096 on the H200: 12.1 ms atomic, 9.6 + 7.3 ms deterministic (28-29
TFLOP/s over their products; 15.8 and 12.2 + 8.7 ms before the unsigned-index loads).

Counters.  The instrumented forward counts, per thread, every element it loads
from q, k, v and stores to o and lse (one name: "flash2_fast forward").
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda, types, uint32

from .. import _inputs, blocks
from ..compile_check import compile_ptx
from ..device import SIMULATOR, STATIC_SHARED_LIMIT, jit
from . import flash2 as _flash2
from ._common import COUNTER_TYPE, acc_nb_type, array_type, nb_type

TY, TX = 8, 16
NT = TY * TX
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
FULL_MASK = 0xFFFFFFFF
# fast math without 'ninf'/'nnan': the kernels compare against -inf on purpose
FASTMATH = {"contract", "afn", "arcp", "nsz", "reassoc"}
FORWARD_NAME = "flash2_fast forward"
BACKWARD_NAMES = _flash2.BACKWARD_NAMES
USES_BLOCKS = True

# (TM, TN) micro-tile shapes in order of preference (fastest first on the H200
# at d = 64, fp32: 8x2 29.7, 8x1 24.9, 4x2 24.4, 4x3 25.4 TFLOP/s with the current
# loads, probe_sweep.txt; before them 21.4, 19.3, 16.5, 15.8).
_PREFERENCE = ((8, 2), (8, 1), (4, 2), (4, 1), (2, 1), (1, 1))


def geometry(d: int, TM: int, TN: int, dtype) -> dict:
    """Block sizes, shared-memory row strides and bytes for a (TM, TN) micro-tile."""
    acc_item = _inputs.acc_dtype(dtype).itemsize
    vec = 16 // acc_item  # pad rows by one 16-byte vector
    TD = -(-d // TX)
    DP = TD * TX
    Br, Bc = TY * TM, TX * TN
    QS, KS, PS = Br + vec, Bc + vec, Br + vec
    smem = acc_item * (DP * QS + DP * KS + Bc * DP + Bc * PS)
    return dict(Br=Br, Bc=Bc, TD=TD, DP=DP, QS=QS, KS=KS, PS=PS, smem=smem)


def shared_bytes(Br: int, Bc: int, d: int, dtype, pass_: str = "forward") -> int:
    """Static shared memory of the forward kernel; the backward is flash2's."""
    if pass_ == "backward":
        fast = backward_smem(Br, Bc, d, dtype)
        if fast is not None and fast <= STATIC_SHARED_LIMIT:
            return fast
        return _flash2.shared_bytes(Br, Bc, d, dtype, pass_)  # falls back to flash2's backward
    if pass_ != "forward":
        raise ValueError(f"pass_: expected 'forward' or 'backward', got {pass_!r}")
    if Br % TY or Bc % TX:
        return 1 << 40  # not a micro-tile shape: never fits (validate() names the limit)
    return geometry(d, Br // TY, Bc // TX, dtype)["smem"]


def block_limits(d: int, dtype, pass_: str = "forward") -> tuple[int, int]:
    if pass_ == "backward":
        return _flash2.block_limits(d, dtype, pass_)
    return TY * 8, TX * 4


def check_block(block, d: int, dtype, pass_: str = "forward") -> None:
    """Refuse, by name, a forward block that is not a micro-tile shape (api.py calls this first)."""
    if pass_ != "forward" or block is None:
        return
    try:
        Br, Bc = block
    except (TypeError, ValueError):
        return  # blocks.validate names the problem
    if isinstance(Br, int) and isinstance(Bc, int) and (Br % TY or Bc % TX or Br < 1 or Bc < 1):
        raise ValueError(
            f"block: flash2_fast's forward needs Br a multiple of {TY} and Bc a multiple of {TX} "
            f"(its {TY} x {TX} thread grid), got ({Br}, {Bc})"
        )


def uses_fast_backward(Br: int, Bc: int, d: int, dtype) -> bool:
    """True when block (Br, Bc) runs this module's backward kernels (else flash2's)."""
    fast = backward_smem(Br, Bc, d, dtype)
    return fast is not None and fast <= STATIC_SHARED_LIMIT


def choose_block(d: int, dtype, budget: int, pass_: str = "forward") -> tuple[int, int]:
    """The fastest measured micro-tile whose tiles fit ``budget`` bytes of shared memory.

    Unlike flash1 and flash2 (the paper's rule Bc = ceil(M/4d), Br = min(Bc, d)),
    this kernel's blocks are set by its register micro-tiles: the paper's rule
    ignores registers, and here registers, not shared memory, bound the tile.
    """
    if pass_ == "backward":
        for Br, Bc in _BACKWARD_BLOCKS:
            if backward_smem(Br, Bc, d, dtype) <= budget:
                return Br, Bc
        max_Br, max_Bc = block_limits(d, dtype, pass_)  # nothing fits: flash2's backward and block rule
        return blocks.choose(
            d,
            dtype,
            lambda Br, Bc, d_, dt: shared_bytes(Br, Bc, d_, dt, pass_),
            max_Br=max_Br,
            max_Bc=max_Bc,
            budget=budget,
        )
    for TM, TN in _PREFERENCE:
        if geometry(d, TM, TN, dtype)["smem"] <= budget:
            return TY * TM, TX * TN
    raise ValueError(f"no micro-tile fits d = {d} ({np.dtype(dtype)}) in {budget} bytes of shared memory")


#: Register cap of the forward: with the unrolled K/V loads ptxas takes 137 registers at d = 64
#: (3 blocks of 128 threads per SM); capped at 128 it spills nothing and 4 blocks fit.
FORWARD_MAX_REGISTERS = 128


def _typed(dtype):
    """-inf, +inf, 0 and log2(e) as scalars of the accumulation dtype (closure constants of a kernel)."""
    f = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    return f(-np.inf), f(np.inf), f(0), f(LOG2E)


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
    # When d divides the 128 threads, each thread loads one fixed column of K_j and V_j, rows
    # ROWSTEP apart, in a loop of constant length that NVVM unrolls (no per-element index math)
    FIXED_COL = NT % d == 0 and (Bc * d) % NT == 0
    ROWSTEP = NT // d if FIXED_COL else 1
    NLOAD = (Bc * d) // NT if FIXED_COL else 1
    D_U = np.uint32(d)

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
        kreg = cuda.local.array(NLOAD, ACC)
        vreg = cuda.local.array(NLOAD, ACC)

        tid = cuda.threadIdx.x
        ty = tid // TX
        tx = tid % TX
        # a 1-D grid of Tr * B*H blocks, row tile after row tile, each for every head, the last
        # (longest when causal) row tile first: the heavy blocks start first and the light
        # ones fill the tail (a (Tr, B*H) grid started each head's light blocks before the
        # next head's heavy ones; no grid-dimension limit either)
        Tr = (Nq + Br - 1) // Br
        BH = cuda.gridDim.x // Tr
        i_blk = Tr - 1 - cuda.blockIdx.x // BH
        bh = cuda.blockIdx.x % BH
        bh_u = uint32(bh)
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
            if FIXED_COL and col0 + Bc <= Nk:
                # a whole tile: NLOAD loads of K and of V per thread, all issued before the
                # first shared store, with unsigned indices (a signed index costs the code of
                # Python's negative-index wraparound at every access: ~35 instructions a load)
                kk = uint32(tid) % D_U
                c = uint32(tid) // D_U
                rk = uint32(col0) + c
                for t in range(NLOAD):
                    kreg[t] = ACC(k[bh_u, rk + uint32(t * ROWSTEP), kk])
                    vreg[t] = ACC(v[bh_u, rk + uint32(t * ROWSTEP), kk])
                for t in range(NLOAD):
                    KT[kk * KS_U + c + uint32(t * ROWSTEP)] = kreg[t]
                    Vs[(c + uint32(t * ROWSTEP)) * DP_U + kk] = vreg[t]
                if COUNT:
                    nr += 2 * NLOAD * STORE_BYTES
            else:  # the last tile (rows past Nk are zeros), or d does not divide the 128 threads
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

            # online softmax in base 2 (log2(e) folded into the scale).  The scale is applied to
            # S_ij, not to Q_i once at load time: the backward recomputes S = (Q K^T) * scale in
            # this order, and with scores of 1e4 the two roundings of a pre-scaled Q would differ
            # from it by ~1e-3 in the exponent, enough to spoil dQ (test_large_scores_backward).
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
    return jit(fastmath=FASTMATH, max_registers=FORWARD_MAX_REGISTERS)(kernel), g




# --------------------------------------------------------------------------------------
# Backward.  Three launches, deterministic (each output element is summed by one thread
# in a fixed order): D = rowsum(dO * O) (flash2's kernel), then dK/dV per key block,
# then dQ per query block.  Same micro-tile tricks as the forward; the second operand of
# the dV/dK and dQ products is read down a column of a transposed tile, so those tiles
# have an odd row stride (conflict-free scalar loads) and those thread columns are
# strided (x = tx + 16 u).
# --------------------------------------------------------------------------------------

BACKWARD_KV_NAME = "flash2_fast dK, dV"
BACKWARD_Q_NAME = "flash2_fast dQ"
# (TM, TN) preferences for the two backward kernels, fastest first
_BACKWARD_BLOCKS = ((32, 32), (32, 16), (16, 32), (16, 16))


def geometry_kv(d: int, TM: int, TN: int, dtype) -> dict:
    """dK/dV kernel: Bc = 8 TM keys per block (thread rows), Br = 16 TN queries per step."""
    a = _inputs.acc_dtype(dtype).itemsize
    vec = 16 // a
    TD = -(-d // TX)
    DP = TD * TX
    Bc, Br = TY * TM, TX * TN
    KS, QS, PS = Bc + vec, Br + 1, Bc + vec
    smem = a * (2 * DP * KS + 2 * DP * QS + 2 * Br * PS + 2 * Br)
    return dict(Br=Br, Bc=Bc, TD=TD, DP=DP, KS=KS, QS=QS, PS=PS, smem=smem)


def geometry_q(d: int, TM: int, TN: int, dtype) -> dict:
    """dQ kernel: Br = 8 TM queries per block (thread rows), Bc = 16 TN keys per step."""
    a = _inputs.acc_dtype(dtype).itemsize
    vec = 16 // a
    TD = -(-d // TX)
    DP = TD * TX
    Br, Bc = TY * TM, TX * TN
    QS, KS, PS = Br + vec, Bc + 1, Br + vec
    smem = a * (2 * DP * QS + 2 * DP * KS + Bc * PS)
    return dict(Br=Br, Bc=Bc, TD=TD, DP=DP, KS=KS, QS=QS, PS=PS, smem=smem)


def backward_smem(Br: int, Bc: int, d: int, dtype) -> int | None:
    """Shared memory of the larger backward kernel for block (Br, Bc), None if not a micro-tile shape.

    The dK/dV kernel runs Bc = 8 TM keys x Br = 16 TN queries, the dQ kernel
    Br = 8 TM queries x Bc = 16 TN keys: both need Br and Bc multiples of 16.
    """
    if Br % TX or Bc % TX:
        return None
    kv = geometry_kv(d, Bc // TY, Br // TX, dtype)["smem"]
    q = geometry_q(d, Br // TY, Bc // TX, dtype)["smem"]
    return max(kv, q)


#: Register cap of the dK/dV kernel.  Uncapped, ptxas took 159-168 registers at
#: d = 64 (2 blocks per SM); capped at 128 it fit 3 blocks: 12.6 ms instead of 13.3 ms
#: at N = 4096 non-causal on the H200 (same causal).  With the unsigned-index loads it
#: needs 119 registers and no spills.
DKDV_MAX_REGISTERS = 128
#: The same for the kernel that also adds dQ with atomics (``deterministic=False``):
#: 128 / none / 96 gave 12.3 / 11.9 / 12.1 ms in one run (``probe_sweep.txt``), within
#: the run-to-run spread (about 3%), so the cap stays.
DKDV_ATOMIC_MAX_REGISTERS = 128


@lru_cache(maxsize=None)
def dkdv_kernel(d: int, TM: int, TN: int, dtype_name: str, causal: bool, count: bool, maxreg=-1,
                atomic_dq: bool = False):
    """dK_j, dV_j for one key block of Bc = 8 TM rows; walks over the query blocks i.

    With ``atomic_dq`` it also adds dS_ij K_j into dQ_i in HBM with atomics (the
    FlashAttention-2 way: no second pass that recomputes S and dP; the order of the
    additions, so the last bits of dQ, then vary from run to run).  ``dq`` is then a
    zeroed buffer of the accumulation dtype; otherwise the kernel never touches it.
    """
    dtype = np.dtype(dtype_name)
    g = geometry_kv(d, TM, TN, dtype)
    Br, Bc, TD, DP, KS, QS, PS = (g[x] for x in ("Br", "Bc", "TD", "DP", "KS", "QS", "PS"))
    ACC = acc_nb_type(dtype)
    SB, AB = dtype.itemsize, _inputs.acc_dtype(dtype).itemsize
    ALIGN = None if SIMULATOR else 16
    CAUSAL, COUNT, ATOMIC_DQ = causal, count, atomic_dq
    NEG_INF, POS_INF, ZERO, LOG2E_ACC = _typed(dtype)
    KT_SIZE, QT_SIZE, P_SIZE = DP * KS, DP * QS, Br * PS
    DP_U, BR_U, KS_U, QS_U, PS_U, ONE_U = (np.uint32(x) for x in (DP, Br, KS, QS, PS, 1))
    # atomic dQ: warp w owns query rows w*RW .. of the block, lane owns dQ columns lane + 32 u
    RW = Br // (NT // 32)
    NX = -(-DP // 32)
    BC_U, FOUR_U, DP_MAX = np.uint32(Bc), np.uint32(4), np.uint32(DP)
    FIXED_COL = NT % d == 0 and (Br * d) % NT == 0  # Q_i, dO_i loads: see the forward
    ROWSTEP = NT // d if FIXED_COL else 1
    NLOAD = (Br * d) // NT if FIXED_COL else 1
    D_U = np.uint32(d)
    NX_FULL = d == 32 * NX  # every lane's dQ columns exist: no column test
    assert Br <= NT  # one thread per row loads L_i and D_i

    def kernel(q, k, v, do, lse, D, dk, dv, dq, Nq, Nk, scale, scale_log2, counter):
        KT = cuda.shared.array(KT_SIZE, ACC, alignment=ALIGN)  # K_j^T   (DP, KS)
        VT = cuda.shared.array(KT_SIZE, ACC, alignment=ALIGN)  # V_j^T   (DP, KS)
        QT = cuda.shared.array(QT_SIZE, ACC, alignment=ALIGN)  # Q_i^T   (DP, QS), QS odd
        dOT = cuda.shared.array(QT_SIZE, ACC, alignment=ALIGN)  # dO_i^T (DP, QS)
        Ps = cuda.shared.array(P_SIZE, ACC, alignment=ALIGN)  # P_ij    (Br, PS)
        dSs = cuda.shared.array(P_SIZE, ACC, alignment=ALIGN)  # dS_ij  (Br, PS)
        Ls = cuda.shared.array(Br, ACC)  # L_i in log2 units (+inf: row sees nothing)
        Ds = cuda.shared.array(Br, ACC)  # D_i
        sT = cuda.local.array((TM, TN), ACC)  # S^T micro-tile, then P^T
        dpT = cuda.local.array((TM, TN), ACC)  # dP^T micro-tile, then dS^T
        dk_acc = cuda.local.array((TM, TD), ACC)
        dv_acc = cuda.local.array((TM, TD), ACC)
        av = cuda.local.array(TM, ACC)
        bv = cuda.local.array(TM, ACC)
        xv = cuda.local.array(TN, ACC)
        yv = cuda.local.array(TN, ACC)
        uv = cuda.local.array(TD, ACC)
        wv = cuda.local.array(TD, ACC)
        dqp = cuda.local.array((RW, NX), ACC)  # atomic dQ: this step's partial sums
        kq = cuda.local.array((NX, 4), ACC)
        ds4 = cuda.local.array(4, ACC)
        qreg = cuda.local.array(NLOAD, ACC)
        doreg = cuda.local.array(NLOAD, ACC)

        tid = cuda.threadIdx.x
        ty = tid // TX
        tx = tid % TX
        lane = uint32(tid % 32)
        warp = uint32(tid // 32)
        # 1-D grid, key tile after key tile, each for every head; the first key tiles are the
        # longest when causal (they see every query block), so they start first
        Tc = (Nk + Bc - 1) // Bc
        BH = cuda.gridDim.x // Tc
        bh = cuda.blockIdx.x % BH
        bh_u = uint32(bh)
        nq_u = uint32(Nq)  # unsigned compares: uint32 < int64 would compare as float64
        c0 = (cuda.blockIdx.x // BH) * Bc
        off = Nk - Nq
        nr = 0
        nw = 0

        # K_j, V_j -> KT, VT once (zero beyond Nk and beyond d)
        for e in range(tid, Bc * DP, NT):
            c = e // DP
            x = e % DP
            kval = ZERO
            vval = ZERO
            if x < d and c0 + c < Nk:
                kval = ACC(k[bh, c0 + c, x])
                vval = ACC(v[bh, c0 + c, x])
                if COUNT:
                    nr += 2 * SB
            KT[x * KS + c] = kval
            VT[x * KS + c] = vval
        for e in range(tid, (DP - d) * QS, NT):  # padding rows of Q^T, dO^T stay zero
            QT[d * QS + e] = ZERO
            dOT[d * QS + e] = ZERO
        for a in range(TM):
            for u in range(TD):
                dk_acc[a, u] = ZERO
                dv_acc[a, u] = ZERO

        Tr = (Nq + Br - 1) // Br
        i0 = 0
        if CAUSAL:  # first query row that sees key c0 is c0 - off
            first = c0 - off
            i0 = 0 if first <= 0 else min(first // Br, Tr)
        for i in range(i0, Tr):
            r0 = i * Br
            cuda.syncthreads()  # previous step is done with QT, dOT, Ps, dSs
            if FIXED_COL and r0 + Br <= Nq:  # a whole tile: batched unsigned loads, as in the forward
                x = uint32(tid) % D_U
                r = uint32(tid) // D_U
                rq = uint32(r0) + r
                for t in range(NLOAD):
                    qreg[t] = ACC(q[bh_u, rq + uint32(t * ROWSTEP), x])
                    doreg[t] = ACC(do[bh_u, rq + uint32(t * ROWSTEP), x])
                for t in range(NLOAD):
                    QT[x * QS_U + r + uint32(t * ROWSTEP)] = qreg[t]
                    dOT[x * QS_U + r + uint32(t * ROWSTEP)] = doreg[t]
                if COUNT:
                    nr += 2 * NLOAD * SB
            else:
                for e in range(tid, Br * d, NT):
                    r = e // d
                    x = e % d
                    qval = ZERO
                    doval = ZERO
                    if r0 + r < Nq:
                        qval = ACC(q[bh, r0 + r, x])
                        doval = ACC(do[bh, r0 + r, x])
                        if COUNT:
                            nr += 2 * SB
                    QT[x * QS + r] = qval
                    dOT[x * QS + r] = doval
            if tid < Br:
                Lr = POS_INF
                Dr = ZERO
                r = uint32(r0) + uint32(tid)
                if r < nq_u:
                    Lv = lse[bh_u, r]
                    Dr = D[bh_u, r]
                    if COUNT:
                        nr += 2 * AB
                    if Lv != NEG_INF:
                        Lr = Lv * LOG2E_ACC
                Ls[tid] = Lr
                Ds[tid] = Dr
            cuda.syncthreads()

            # S^T = K_j Q_i^T and dP^T = V_j dO_i^T, one TM x TN micro-tile each
            for a in range(TM):
                for b in range(TN):
                    sT[a, b] = ZERO
                    dpT[a, b] = ZERO
            ki = uint32(ty * TM)
            qi = uint32(tx * TN)
            kk = uint32(0)
            while kk < DP_U:
                for a in range(TM):
                    av[a] = KT[ki + uint32(a)]
                    bv[a] = VT[ki + uint32(a)]
                for b in range(TN):
                    xv[b] = QT[qi + uint32(b)]
                    yv[b] = dOT[qi + uint32(b)]
                for a in range(TM):
                    for b in range(TN):
                        sT[a, b] += av[a] * xv[b]
                        dpT[a, b] += bv[a] * yv[b]
                ki += KS_U
                qi += QS_U
                kk += ONE_U

            # P = exp(S - L) (recomputed, masked), dS = P * (dP - D); stored row-major
            edge = CAUSAL and c0 + Bc - 1 > r0 + off  # uniform: does the block cross the diagonal?
            for b in range(TN):
                rl = tx * TN + b
                L2 = Ls[rl]
                Dv = Ds[rl]
                lim = r0 + rl + off - (c0 + ty * TM)  # keys c0 + ty*TM + a with a <= lim are visible
                for a in range(TM):
                    p = math.exp2(min(sT[a, b] * scale_log2 - L2, ZERO))  # P <= 1; padded keys can't overflow
                    if edge and a > lim:
                        p = ZERO
                    Ps[rl * PS + ty * TM + a] = p
                    dSs[rl * PS + ty * TM + a] = p * (dpT[a, b] - Dv)
            cuda.syncthreads()

            # dV_j += P^T dO_i, dK_j += dS^T Q_i (the scale is applied once, at the end)
            pi = uint32(ty * TM)
            xi = uint32(tx * QS)
            r = uint32(0)
            while r < BR_U:
                for a in range(TM):
                    av[a] = Ps[pi + uint32(a)]
                    bv[a] = dSs[pi + uint32(a)]
                for u in range(TD):
                    uv[u] = dOT[xi + uint32(u * TX * QS)]
                    wv[u] = QT[xi + uint32(u * TX * QS)]
                for a in range(TM):
                    for u in range(TD):
                        dv_acc[a, u] += av[a] * uv[u]
                        dk_acc[a, u] += bv[a] * wv[u]
                pi += PS_U
                xi += ONE_U
                r += ONE_U

            if ATOMIC_DQ:
                # dQ_i += dS_ij K_j: per 4 keys, a 16-byte load of K_j^T per dQ column (KS = 4 mod 32
                # words: a quarter-warp hits distinct banks) and a broadcast one of dS per row
                for a in range(RW):
                    for u in range(NX):
                        dqp[a, u] = ZERO
                kqi = lane * KS_U  # K_j^T[lane, c]
                dsi = warp * uint32(RW * PS)  # dS_ij[warp * RW, c]
                c = uint32(0)
                while c < BC_U:
                    for u in range(NX):
                        for t in range(4):
                            kq[u, t] = ZERO
                            if NX_FULL or lane + uint32(32 * u) < DP_MAX:
                                kq[u, t] = KT[kqi + uint32(32 * u * KS + t)]
                    for a in range(RW):
                        for t in range(4):
                            ds4[t] = dSs[dsi + uint32(a * PS + t)]
                        for u in range(NX):
                            for t in range(4):
                                dqp[a, u] += ds4[t] * kq[u, t]
                    kqi += FOUR_U
                    dsi += FOUR_U
                    c += FOUR_U
                for a in range(RW):
                    row = uint32(r0) + warp * uint32(RW) + uint32(a)
                    if row < nq_u:
                        for u in range(NX):
                            x = lane + uint32(32 * u)
                            if NX_FULL or x < D_U:
                                cuda.atomic.add(dq, (bh_u, row, x), dqp[a, u] * scale)
                                if COUNT:
                                    nr += AB
                                    nw += AB

        for a in range(TM):
            c = c0 + ty * TM + a
            if c < Nk:
                for u in range(TD):
                    x = tx + u * TX
                    if x < d:
                        dk[bh, c, x] = dk_acc[a, u] * scale
                        dv[bh, c, x] = dv_acc[a, u]
                        if COUNT:
                            nw += 2 * SB
        if COUNT:
            cuda.atomic.add(counter, 0, nr)
            cuda.atomic.add(counter, 1, nw)

    kernel._fastmath = FASTMATH
    maxreg = (DKDV_ATOMIC_MAX_REGISTERS if atomic_dq else DKDV_MAX_REGISTERS) if maxreg == -1 else maxreg
    opts = {} if maxreg is None else {"max_registers": maxreg}
    return jit(fastmath=FASTMATH, **opts)(kernel), g


@lru_cache(maxsize=None)
def dq_kernel(d: int, TM: int, TN: int, dtype_name: str, causal: bool, count: bool):
    """dQ_i for one query block of Br = 8 TM rows; walks over the key blocks j."""
    dtype = np.dtype(dtype_name)
    g = geometry_q(d, TM, TN, dtype)
    Br, Bc, TD, DP, KS, QS, PS = (g[x] for x in ("Br", "Bc", "TD", "DP", "KS", "QS", "PS"))
    ACC = acc_nb_type(dtype)
    SB, AB = dtype.itemsize, _inputs.acc_dtype(dtype).itemsize
    ALIGN = None if SIMULATOR else 16
    CAUSAL, COUNT = causal, count
    NEG_INF, POS_INF, ZERO, LOG2E_ACC = _typed(dtype)
    QT_SIZE, KT_SIZE, P_SIZE = DP * QS, DP * KS, Bc * PS
    DP_U, BC_U, KS_U, QS_U, PS_U, ONE_U = (np.uint32(x) for x in (DP, Bc, KS, QS, PS, 1))
    FIXED_COL = NT % d == 0 and (Bc * d) % NT == 0  # K_j, V_j loads: see the forward
    ROWSTEP = NT // d if FIXED_COL else 1
    NLOAD = (Bc * d) // NT if FIXED_COL else 1
    D_U = np.uint32(d)

    def kernel(q, k, v, do, lse, D, dq, Nq, Nk, scale, scale_log2, counter):
        QT = cuda.shared.array(QT_SIZE, ACC, alignment=ALIGN)  # Q_i^T   (DP, QS)
        dOT = cuda.shared.array(QT_SIZE, ACC, alignment=ALIGN)  # dO_i^T (DP, QS)
        KT = cuda.shared.array(KT_SIZE, ACC, alignment=ALIGN)  # K_j^T   (DP, KS), KS odd
        VT = cuda.shared.array(KT_SIZE, ACC, alignment=ALIGN)  # V_j^T   (DP, KS)
        dST = cuda.shared.array(P_SIZE, ACC, alignment=ALIGN)  # dS_ij^T (Bc, PS)
        Ls = cuda.shared.array(Br, ACC)
        Ds = cuda.shared.array(Br, ACC)
        s = cuda.local.array((TM, TN), ACC)
        dp = cuda.local.array((TM, TN), ACC)
        dq_acc = cuda.local.array((TM, TD), ACC)
        L2 = cuda.local.array(TM, ACC)
        Dr = cuda.local.array(TM, ACC)
        av = cuda.local.array(TM, ACC)
        bv = cuda.local.array(TM, ACC)
        xv = cuda.local.array(TN, ACC)
        yv = cuda.local.array(TN, ACC)
        uv = cuda.local.array(TD, ACC)
        kreg = cuda.local.array(NLOAD, ACC)
        vreg = cuda.local.array(NLOAD, ACC)

        tid = cuda.threadIdx.x
        ty = tid // TX
        tx = tid % TX
        Tr = (Nq + Br - 1) // Br  # 1-D grid, longest (causal) row tiles first: see the forward
        BH = cuda.gridDim.x // Tr
        i_blk = Tr - 1 - cuda.blockIdx.x // BH
        bh = cuda.blockIdx.x % BH
        bh_u = uint32(bh)
        r0 = i_blk * Br
        off = Nk - Nq
        nr = 0
        nw = 0

        for e in range(tid, Br * DP, NT):  # Q_i, dO_i -> QT, dOT once
            r = e // DP
            x = e % DP
            qval = ZERO
            doval = ZERO
            if x < d and r0 + r < Nq:
                qval = ACC(q[bh, r0 + r, x])
                doval = ACC(do[bh, r0 + r, x])
                if COUNT:
                    nr += 2 * SB
            QT[x * QS + r] = qval
            dOT[x * QS + r] = doval
        for e in range(tid, (DP - d) * KS, NT):  # padding rows of K^T, V^T stay zero
            KT[d * KS + e] = ZERO
            VT[d * KS + e] = ZERO
        for r in range(tid, Br, NT):  # L_i (log2 units, +inf: row sees nothing) and D_i
            Lr = POS_INF
            Dv = ZERO
            if r0 + r < Nq:
                Lv = lse[bh, r0 + r]
                Dv = D[bh, r0 + r]
                if COUNT:
                    nr += 2 * AB
                if Lv != NEG_INF:
                    Lr = Lv * LOG2E_ACC
            Ls[r] = Lr
            Ds[r] = Dv
        cuda.syncthreads()
        for a in range(TM):
            L2[a] = Ls[ty * TM + a]
            Dr[a] = Ds[ty * TM + a]
            for u in range(TD):
                dq_acc[a, u] = ZERO

        Tc = (Nk + Bc - 1) // Bc
        n_j = Tc
        if CAUSAL:
            last = r0 + Br - 1 + off
            n_j = 0 if last < 0 else min(Tc, last // Bc + 1)
        for j in range(n_j):
            c0 = j * Bc
            cuda.syncthreads()  # previous step is done with KT, VT, dST
            if FIXED_COL and c0 + Bc <= Nk:  # a whole tile: batched unsigned loads, as in the forward
                x = uint32(tid) % D_U
                c = uint32(tid) // D_U
                rk = uint32(c0) + c
                for t in range(NLOAD):
                    kreg[t] = ACC(k[bh_u, rk + uint32(t * ROWSTEP), x])
                    vreg[t] = ACC(v[bh_u, rk + uint32(t * ROWSTEP), x])
                for t in range(NLOAD):
                    KT[x * KS_U + c + uint32(t * ROWSTEP)] = kreg[t]
                    VT[x * KS_U + c + uint32(t * ROWSTEP)] = vreg[t]
                if COUNT:
                    nr += 2 * NLOAD * SB
            else:
                for e in range(tid, Bc * d, NT):
                    c = e // d
                    x = e % d
                    kval = ZERO
                    vval = ZERO
                    if c0 + c < Nk:
                        kval = ACC(k[bh, c0 + c, x])
                        vval = ACC(v[bh, c0 + c, x])
                        if COUNT:
                            nr += 2 * SB
                    KT[x * KS + c] = kval
                    VT[x * KS + c] = vval
            cuda.syncthreads()

            # S = Q_i K_j^T and dP = dO_i V_j^T
            for a in range(TM):
                for b in range(TN):
                    s[a, b] = ZERO
                    dp[a, b] = ZERO
            qi = uint32(ty * TM)
            ki = uint32(tx * TN)
            kk = uint32(0)
            while kk < DP_U:
                for a in range(TM):
                    av[a] = QT[qi + uint32(a)]
                    bv[a] = dOT[qi + uint32(a)]
                for b in range(TN):
                    xv[b] = KT[ki + uint32(b)]
                    yv[b] = VT[ki + uint32(b)]
                for a in range(TM):
                    for b in range(TN):
                        s[a, b] += av[a] * xv[b]
                        dp[a, b] += bv[a] * yv[b]
                qi += QS_U
                ki += KS_U
                kk += ONE_U

            # dS = P * (dP - D) with P = exp(S - L) recomputed; stored transposed
            edge = c0 + Bc > Nk or (CAUSAL and c0 + Bc - 1 > r0 + off)  # uniform over the block
            cb = c0 + tx * TN  # this thread's first key
            for a in range(TM):
                lim = Nk - 1 - cb  # keys cb + b with b <= lim are visible
                if CAUSAL:
                    lim = min(lim, r0 + ty * TM + a + off - cb)
                for b in range(TN):
                    p = math.exp2(min(s[a, b] * scale_log2 - L2[a], ZERO))  # P <= 1; padded keys can't overflow
                    if edge and b > lim:
                        p = ZERO
                    dST[(tx * TN + b) * PS + ty * TM + a] = p * (dp[a, b] - Dr[a])
            cuda.syncthreads()

            # dQ_i += dS K_j (scale applied at the end)
            si = uint32(ty * TM)
            xi = uint32(tx * KS)
            c = uint32(0)
            while c < BC_U:
                for a in range(TM):
                    av[a] = dST[si + uint32(a)]
                for u in range(TD):
                    uv[u] = KT[xi + uint32(u * TX * KS)]
                for a in range(TM):
                    for u in range(TD):
                        dq_acc[a, u] += av[a] * uv[u]
                si += PS_U
                xi += ONE_U
                c += ONE_U

        for a in range(TM):
            row = r0 + ty * TM + a
            if row < Nq:
                for u in range(TD):
                    x = tx + u * TX
                    if x < d:
                        dq[bh, row, x] = dq_acc[a, u] * scale
                        if COUNT:
                            nw += SB
        if COUNT:
            cuda.atomic.add(counter, 0, nr)
            cuda.atomic.add(counter, 1, nw)

    kernel._fastmath = FASTMATH
    return cuda.jit(fastmath=FASTMATH)(kernel), g


BACKWARD_KVQ_NAME = "flash2_fast dK, dV, dQ (atomic)"
ZERO_DQ_NAME = "flash2_fast zero dQ"
CAST_DQ_NAME = "flash2_fast dQ to storage dtype"
_ELEMWISE_THREADS = 256


@lru_cache(maxsize=None)
def zero_kernel(acc_name: str, count: bool):
    """Fill a flat buffer with zeros (the atomic dQ accumulator)."""
    ZERO = _typed(np.dtype(acc_name))[2]
    AB, COUNT = np.dtype(acc_name).itemsize, count

    def kernel(x, n, counter):
        i = cuda.grid(1)
        if i < n:
            x[i] = ZERO
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


def forward(prob, ops, block, counters):
    """O and L: one launch, grid (Tr, B*H), 128 threads."""
    Br, Bc = block
    kernel, g = forward_kernel(prob.d, Br // TY, Bc // TX, prob.dtype.name, prob.causal, counters.enabled)
    o = _inputs.empty((prob.BH, prob.Nq, prob.d), prob.dtype)
    lse = _inputs.empty((prob.BH, prob.Nq), prob.acc)
    q, k, v = (ops[name].dev for name in ("q", "k", "v"))
    grid = -(-prob.Nq // Br) * prob.BH
    kernel[grid, NT](q, k, v, o, lse, prob.Nq, prob.Nk, prob.acc.type(prob.scale * LOG2E), counters.array(FORWARD_NAME))
    return o, lse


def backward(prob, ops, block, counters):
    """dQ, dK, dV: D = rowsum(dO*O) (flash2's kernel), dK/dV per key block, dQ per query block.

    Blocks that are not micro-tile shapes (or too large for the fast kernels, e.g.
    float64 with d = 128) run flash2's backward.
    """
    Br, Bc = block
    BH, Nq, Nk, d, dt, acc = prob.BH, prob.Nq, prob.Nk, prob.d, prob.dtype, prob.acc
    if not uses_fast_backward(Br, Bc, d, dt):
        return _flash2.backward(prob, ops, block, counters)
    count = counters.enabled
    q, k, v, o, lse, do = (ops[name].dev for name in ("q", "k", "v", "o", "lse", "do"))
    D = _inputs.empty((BH, Nq), acc)
    dk = _inputs.empty((BH, Nk, d), dt)
    dv = _inputs.empty((BH, Nk, d), dt)
    rowsum = _flash2._rowsum_kernel(d, dt, count)
    rowsum[(-(-Nq // _flash2.TY), BH), _flash2.NT](o, do, D, counters.array(BACKWARD_NAMES[0]), Nq)
    scale, scale_log2 = acc.type(prob.scale), acc.type(prob.scale * LOG2E)
    if not getattr(prob, "deterministic", True):
        return _backward_atomic(prob, q, k, v, do, lse, D, dk, dv, block, counters)
    kv, _ = dkdv_kernel(d, Bc // TY, Br // TX, dt.name, prob.causal, count)
    kv[-(-Nk // Bc) * BH, NT](q, k, v, do, lse, D, dk, dv, _unused_dq(acc), Nq, Nk, scale, scale_log2,
                              counters.array(BACKWARD_KV_NAME))
    dq = _inputs.empty((BH, Nq, d), dt)
    qk, _ = dq_kernel(d, Br // TY, Bc // TX, dt.name, prob.causal, count)
    qk[-(-Nq // Br) * BH, NT](q, k, v, do, lse, D, dq, Nq, Nk, scale, scale_log2, counters.array(BACKWARD_Q_NAME))
    return dq, dk, dv


def _unused_dq(acc):
    """The ``dq`` argument of the deterministic dK/dV kernel, which never touches it (one per context)."""
    key = (0 if SIMULATOR else id(cuda.current_context()), np.dtype(acc).name)
    if key not in _UNUSED:
        _UNUSED[key] = cuda.device_array((1, 1, 1), dtype=acc)
    return _UNUSED[key]


_UNUSED: dict = {}


def _backward_atomic(prob, q, k, v, do, lse, D, dk, dv, block, counters):
    """dK, dV and dQ in one pass over the key blocks, dQ added with atomics (``deterministic=False``)."""
    Br, Bc = block
    BH, Nq, Nk, d, dt, acc = prob.BH, prob.Nq, prob.Nk, prob.d, prob.dtype, prob.acc
    count = counters.enabled
    n = BH * Nq * d
    dq_acc = _inputs.empty((BH, Nq, d), acc)  # float32 (float64) even for float16 inputs: atomics add there
    zero = zero_kernel(acc.name, count)
    zero[-(-n // _ELEMWISE_THREADS), _ELEMWISE_THREADS](dq_acc.reshape(n), n, counters.array(ZERO_DQ_NAME))
    scale, scale_log2 = acc.type(prob.scale), acc.type(prob.scale * LOG2E)
    kv, _ = dkdv_kernel(d, Bc // TY, Br // TX, dt.name, prob.causal, count, atomic_dq=True)
    kv[-(-Nk // Bc) * BH, NT](q, k, v, do, lse, D, dk, dv, dq_acc, Nq, Nk, scale, scale_log2,
                              counters.array(BACKWARD_KVQ_NAME))
    if dt == acc:
        return dq_acc, dk, dv
    dq = _inputs.empty((BH, Nq, d), dt)
    cast = cast_kernel(acc.name, dt.name, count)
    cast[-(-n // _ELEMWISE_THREADS), _ELEMWISE_THREADS](dq_acc.reshape(n), dq.reshape(n), n,
                                                        counters.array(CAST_DQ_NAME))
    return dq, dk, dv


def compile_all(ccs, dtypes, ds):
    """PTX of every specialisation: the forward and, where its blocks are micro-tile shapes, the
    dK/dV and dQ kernels (else the backward is flash2's, compiled by that module), at the chosen
    blocks for each d, causal or not, counting or not."""
    out = []
    I64 = types.int64
    for dtype in dtypes:
        dt = np.dtype(dtype)
        X3, A2, ACC = array_type(dt, 3), array_type(_inputs.acc_dtype(dt), 2), acc_nb_type(dt)
        fwd_sig = (X3, X3, X3, X3, A2, I64, I64, ACC, COUNTER_TYPE)
        A3 = array_type(_inputs.acc_dtype(dt), 3)
        kv_sig = (X3, X3, X3, X3, A2, A2, X3, X3, A3, I64, I64, ACC, ACC, COUNTER_TYPE)
        q_sig = (X3, X3, X3, X3, A2, A2, X3, I64, I64, ACC, ACC, COUNTER_TYPE)
        for d in ds:
            Br, Bc = choose_block(d, dt, STATIC_SHARED_LIMIT)
            bBr, bBc = choose_block(d, dt, STATIC_SHARED_LIMIT, "backward")
            fast_bwd = uses_fast_backward(bBr, bBc, d, dt)
            for count in (False, True):
                for causal in (False, True):
                    tag = f"{' causal' * causal} {dt}{' count' * count}"
                    specs = [(f"{FORWARD_NAME} d={d} Br={Br} Bc={Bc}{tag}",
                              forward_kernel(d, Br // TY, Bc // TX, dt.name, causal, count)[0], fwd_sig)]
                    if fast_bwd:
                        specs += [
                            (f"{BACKWARD_KV_NAME} d={d} Br={bBr} Bc={bBc}{tag}",
                             dkdv_kernel(d, bBc // TY, bBr // TX, dt.name, causal, count)[0], kv_sig),
                            (f"{BACKWARD_Q_NAME} d={d} Br={bBr} Bc={bBc}{tag}",
                             dq_kernel(d, bBr // TY, bBc // TX, dt.name, causal, count)[0], q_sig),
                            (f"{BACKWARD_KVQ_NAME} d={d} Br={bBr} Bc={bBc}{tag}",
                             dkdv_kernel(d, bBc // TY, bBr // TX, dt.name, causal, count, atomic_dq=True)[0],
                             kv_sig),
                        ]
                    if fast_bwd and causal and d == ds[0]:  # the atomic path's element-wise kernels, once
                        A1, X1 = array_type(_inputs.acc_dtype(dt), 1), array_type(dt, 1)
                        specs.append((f"{ZERO_DQ_NAME} {dt}{' count' * count}",
                                      zero_kernel(_inputs.acc_dtype(dt).name, count), (A1, I64, COUNTER_TYPE)))
                        if dt != _inputs.acc_dtype(dt):
                            specs.append((f"{CAST_DQ_NAME} {dt}{' count' * count}",
                                          cast_kernel(_inputs.acc_dtype(dt).name, dt.name, count),
                                          (A1, X1, I64, COUNTER_TYPE)))
                    for label, kernel, sig in specs:
                        for cc in ccs:
                            out.append((f"{label} sm_{cc[0]}{cc[1]}", compile_ptx(kernel.py_func, sig, cc)))
    return out
