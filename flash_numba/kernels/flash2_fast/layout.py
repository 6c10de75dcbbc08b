"""flash2_fast's shapes: thread grid, micro-tiles, shared-memory tiles, block rules, register caps.

A block is 128 threads, an 8 x 16 grid (ty, tx).  In the forward, thread (ty, tx)
owns TM consecutive query rows ``ty*TM ..``; of S_ij, the TN keys ``tx, tx + 16, ...``
(16 apart: the columns of the 16 threads of a row interleave, see :mod:`.forward` for why);
of O_i, TD consecutive columns ``tx*TD ..`` (DP = 16 TD >= d)::

    S_ij  (Br = 8 TM  x  Bc = 16 TN)             O_i  (Br  x  DP = 16 TD)
    key:  0   1  ..  15  16  17 .. 31  32 ..     +------+------+-- ...
        +---+---+--+---+---+---+--+---+--        |(0,0) |(0,1) |
    TM  |0,0|0,1|..|0,15|0,0|0,1|..|0,15|..      |TMxTD |TMxTD |
    rows+---+---+--+---+---+---+--+---+--        +------+------+
        |1,0|1,1|..                              | (1,0)| ...

The backward kernels deal their tiles out in TM x TN blocks of adjacent rows and keys (see :mod:`.backward`).
Shared tiles are held transposed where a product reads them down a column, padded
by one 16-byte vector (or one element, for an odd stride) per row.  A kernel's tiles are one
array (``geometry(...)["tiles"]``): static up to 48 KB, dynamic shared memory above
(:mod:`flash_numba.kernels._smem`).
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache

import numpy as np

from ... import _inputs, _switches, blocks, device
from ...device import STATIC_SHARED_LIMIT
from .. import flash2 as _flash2
from .. import _smem
from .._spec import check_pass
from .._tile_ops import check_micro_tile_block

TY, TX = 8, 16
NT = TY * TX
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
FULL_MASK = 0xFFFFFFFF
# fast math without 'ninf'/'nnan': the kernels compare against -inf on purpose
FASTMATH = {"contract", "afn", "arcp", "nsz", "reassoc"}

FORWARD_NAME = "flash2_fast forward"
BACKWARD_KV_NAME = "flash2_fast dK, dV"
BACKWARD_Q_NAME = "flash2_fast dQ"
BACKWARD_KVQ_NAME = "flash2_fast dK, dV, dQ (atomic)"
ZERO_DQ_NAME = "flash2_fast zero dQ"
CAST_DQ_NAME = "flash2_fast dQ to storage dtype"
ZERO_DQ_COPIES_NAME = "flash2_fast zero dQ copies"
BACKWARD_KVQ_SPLIT_NAME = "flash2_fast dK, dV, dQ (split)"
SUM_DQ_NAME = "flash2_fast sum dQ copies"

#: Register cap of the forward: with the unrolled K/V loads ptxas takes 137 registers at d = 64
#: (3 blocks of 128 threads per SM); capped at 128, 4 blocks fit.
#: Not at TD = 6 (d = 81..96, whose 8 x 1 tiles spilled 24 bytes causal under it on sm_90): uncapped it ran
#: 8.69-8.70 / 4.49-4.56 ms (causal) at N = 4096 against 8.73-8.74 / 4.58 capped (2026-11-30, 36631ac,
#: benchmarks/results/h200-2026-11-30-s8/D/d96_cap.txt).
FORWARD_MAX_REGISTERS = 128
#: Register cap of the dK/dV kernel.  Uncapped, ptxas took 159-168 registers at
#: d = 64 (2 blocks per SM); capped at 128 it fit 3 blocks: 12.6 ms instead of 13.3 ms
#: at N = 4096 non-causal on the H200 (same causal).
DKDV_MAX_REGISTERS = 128
#: Register cap of the kernel that also adds dQ with atomics (``deterministic=False``), where
#: :func:`register_cap` applies it: float32 and float16 storage at d <= 64 on cc 9.0 and up.  There
#: ptxas builds it in 125-127 registers without spills, and faster code than uncapped (122 registers):
#: fwd+bwd 17.05-17.40 ms against 18.51-18.61 ms at N = 4096 on the H200 (2026-11-30, f820584,
#: benchmarks/results/h200-2026-11-30-s6/A/bench_*.csv), the speed it had with this cap before.  Elsewhere the
#: cap spills: float64 at d = 64 (12-16 bytes), d = 80 and 128 (8-20 bytes), cc 8.0 causal (24-36 bytes); there
#: the kernel runs uncapped.
ATOMIC_MAX_REGISTERS = 128
#: Register cap of the atomic kernel where its tiles are dynamic shared memory (d <= 64 at 32 x 64 on cc 9.0 up,
#: float32 and float16): three blocks of 128 threads an SM.  ptxas builds it in 167 registers uncapped, but
#: 175-233 with S^T and dP^T in separate warps (:func:`split_s_dp`), causal or with dropout, which leaves two.
#: Backward only, N = 4096, B*H = 32 on the H200: 10.48 ms split and capped (10.79 not split, capped), against
#: 11.08 as it shipped before (not split, uncapped); 2026-12-01, 3bef02a and 4f81286,
#: benchmarks/results/h200-2026-12-01-s14/B/ and A/old64.csv.
ATOMIC_DYNAMIC_MAX_REGISTERS = 168
#: Launch name -> register cap (where :func:`register_cap` applies one).
MAX_REGISTERS = {
    FORWARD_NAME: FORWARD_MAX_REGISTERS,
    BACKWARD_KV_NAME: DKDV_MAX_REGISTERS,
    BACKWARD_KVQ_NAME: ATOMIC_MAX_REGISTERS,
}
#: The caps apply from this compute capability up.  Below it (a T4 is cc 7.5: 64 KB of shared
#: memory per SM) one block of these kernels (40-45 KB of tiles) fills an SM's shared memory,
#: so a cap buys no occupancy and only makes ptxas spill (8-44 bytes at cc 7.5).
CAPPED_FROM_CC = (8, 0)


def register_cap(launch: str, cc, d: int, dtype, dynamic: bool = False, count: bool = False) -> int | None:
    """The register cap of ``launch`` at head dim ``d`` and storage ``dtype`` compiled for compute capability
    ``cc`` (None: uncapped); ``dynamic``: its tiles are in dynamic shared memory (larger than 48 KB); ``count``:
    the variant with HBM byte counters (the dK/dV/dQ kernel's spills 4-8 bytes at 128 registers: uncapped,
    its runs count bytes, they are not timed)."""
    if tuple(cc) < CAPPED_FROM_CC:
        return None
    if dynamic and launch != BACKWARD_KVQ_NAME:  # tiles above 48 KB hold more accumulators than 128 registers do
        return None
    if launch == FORWARD_NAME and -(-d // TX) == 6:  # d = 81..96 (8 x 1 tiles): see FORWARD_MAX_REGISTERS
        return None
    if launch == BACKWARD_KVQ_NAME and (tuple(cc) < (9, 0) or np.dtype(dtype) == np.float64 or d > 64 or count):
        return None
    if dynamic:
        return ATOMIC_DYNAMIC_MAX_REGISTERS if launch == BACKWARD_KVQ_NAME else None
    return MAX_REGISTERS.get(launch)


def device_register_cap(launch: str, d: int, dtype, dynamic: bool = False, count: bool = False) -> int | None:
    """:func:`register_cap` for the device present (the one the kernel launches on)."""
    return register_cap(launch, device.info().compute_capability, d, dtype, dynamic, count)

# (TM, TN) micro-tile shapes in order of preference, fastest first, by TD = ceil(d / 16), the columns of O a
# thread owns.  Within 48 KB (d = 64; 2026-11-30, benchmarks/results/h200-2026-11-30-s3/call2_sweep/): 8x2 29.7,
# 8x1 24.9, 4x2 24.4, 4x3 25.4 TFLOP/s.  With dynamic shared memory (N = 4096, forward, ms; 2026-11-30, 46ac853,
# benchmarks/results/h200-2026-11-30-s7/B/sweep_fwd.csv and D/sweep_96.csv):
#   d = 32: 8x2 2.79, 8x3 2.50, 8x4 2.53    d = 64: 8x2 4.51, 8x3 4.32, 8x4 4.27    d = 80: 8x2 6.83, 8x3 9.37, 8x4 11.1
#   d = 96: 8x1 8.72, 8x2 11.0, 8x3 14.0, 8x4 13.3, 4x2 12.6, 4x1 13.6    d = 128: 8x2 9.76, 8x3 9.20, 8x4 11.6
# Where a shape does not fit the budget, the next one that does.
_FALLBACK = ((8, 2), (8, 1), (4, 2), (4, 1), (2, 1), (1, 1))
_PREFERENCE = {4: ((8, 4), (8, 3)) + _FALLBACK, 5: _FALLBACK, 6: ((8, 1),) + _FALLBACK, 8: ((8, 3),) + _FALLBACK}
# (Br, Bc) for the two backward kernels, fastest first, by TD as above.  Deterministic / atomic backward, N = 4096, ms:
#   d = 64: 32x32 16.6 / 12.0, 32x64 16.5 / 12.2, 64x32 15.9 / 12.5   (so 32x32, which fits 48 KB, stays first)
#   d = 96: 16x16 50.3 / 29.8, 32x16 44.0 / 30.7, 16x32 41.0 / 23.9, 32x32 43.3 / 25.1
#   d = 128: 16x16 55.7 / 35.6, 32x16 44.4 / 31.9, 16x32 42.8 / 27.2, 32x32 37.4 / 25.3
#   (2026-12-01, B*H = 32, backward only, P and dS in one tile: d = 128 32x32 23.34 / 22.30-22.67; 16x64 with two
#   tiles 24.47-24.92 / 24.52-24.82 but slower causal)
_BACKWARD_BLOCKS = ((32, 32), (32, 16), (16, 32), (16, 16))
_BACKWARD_PREFERENCE = {5: _BACKWARD_BLOCKS, 6: ((16, 32),) + _BACKWARD_BLOCKS, 8: _BACKWARD_BLOCKS}
# The atomic backward's own blocks (``deterministic=False``) for TD <= 4 (d <= 64).  N = 4096, B*H = 32, backward
# only, ms (2026-12-01, benchmarks/results/h200-2026-12-01-s11/, calls A-D): d = 64: 32x64 10.96-10.97 (causal
# 5.41-5.42) against 32x32 11.53-11.69 (5.81-5.85); 64x32
# 11.89, 16x64 13.10.  d = 32: 5.90 (3.13) against 7.80 (3.82); d = 16: 4.60 (2.29) against 5.28 (2.60); d = 48:
# 12.69 (5.91) against 12.64 (6.22).  32 x 64 holds 64 keys a block (TM = 8): half the dQ atomics per FLOP; at
# d = 64 its tiles (69,888 bytes) are dynamic shared memory and its build uncapped (ptxas: 167 registers, 3 blocks
# an SM).  The deterministic backward is slower there at d = 64 (12.69-12.92 against 12.12-12.24) and keeps 32 x 32.
# Only where a block may have more than 48 KB (cc 9.0 up, where it was measured): a T4's 64 KB an SM would hold one
# 32 x 64 block at d = 32 (44 KB) where it holds two of 32 x 32 (28 KB), unmeasured.
_ATOMIC_BACKWARD_BLOCKS = ((32, 64),) + _BACKWARD_BLOCKS
_ATOMIC_BACKWARD_MAX_TD = 4


def _by_head_dim(table: dict, d: int) -> tuple:
    """The entry of ``table`` (keyed by TD, measured there) that serves head dim ``d``: the first key >= its TD."""
    TD = -(-d // TX)
    return next(shapes for td, shapes in sorted(table.items()) if TD <= td)


def scalars(dtype):
    """-inf, +inf, 0, 1, log2(e) and ln(2) as scalars of the accumulation dtype.

    Closure constants of the kernels: a Python float (-math.inf) would turn every
    use into float64 arithmetic.
    """
    f = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    return f(-np.inf), f(np.inf), f(0), f(1), f(LOG2E), f(LN2)


def _columns(d: int, dtype) -> tuple[int, int, int, int]:
    """(accumulation item size, elements of a 16-byte vector, TD, DP = 16 TD >= d)."""
    a = _inputs.acc_dtype(dtype).itemsize
    TD = -(-d // TX)
    return a, 16 // a, TD, TD * TX


def geometry(d: int, TM: int, TN: int, dtype) -> dict:
    """Block sizes, shared-memory row strides and bytes for a (TM, TN) micro-tile of the forward: Q_i^T (DP rows,
    stride QS), K_j row-major (Bc rows, stride KS), V_j (Bc rows, stride DP), P_ij^T (Bc rows, stride PS)."""
    acc_item, vec, TD, DP = _columns(d, dtype)  # rows padded by one 16-byte vector
    Br, Bc = TY * TM, TX * TN
    QS, KS, PS = Br + vec, DP + vec, Br + vec
    tiles = (DP * QS, Bc * KS, Bc * DP, Bc * PS)  # Q_i^T, K_j (row-major), V_j, P_ij^T
    return dict(Br=Br, Bc=Bc, TD=TD, DP=DP, QS=QS, KS=KS, PS=PS, tiles=tiles, smem=_smem.total_bytes(tiles, acc_item))


def shared_bytes(Br: int, Bc: int, d: int, dtype, pass_: str = "forward") -> int:
    """Shared memory of a block of the forward kernel, or of the larger backward kernel (flash2's where this
    module's backward does not run the block on this device: :func:`uses_fast_backward`)."""
    if pass_ == "backward":
        if uses_fast_backward(Br, Bc, d, dtype):
            return backward_smem(Br, Bc, d, dtype)
        return _flash2.shared_bytes(Br, Bc, d, dtype, pass_)  # falls back to flash2's backward
    check_pass(pass_)
    if Br % TY or Bc % TX:
        return 1 << 40  # not a micro-tile shape: never fits (validate() names the limit)
    return geometry(d, Br // TY, Bc // TX, dtype)["smem"]


def block_limits(d: int, dtype, pass_: str = "forward") -> tuple[int, int]:
    if pass_ == "backward":
        return _flash2.block_limits(d, dtype, pass_)
    return TY * 8, TX * 4


def check_block(block, d: int, dtype, pass_: str = "forward") -> None:
    """Refuse, by name, a forward block that is not a micro-tile shape (api.py calls this first)."""
    if pass_ == "forward" and block is not None:
        check_micro_tile_block(block, "flash2_fast's forward")


def uses_fast_backward(Br: int, Bc: int, d: int, dtype, budget: int | None = None) -> bool:
    """True when block (Br, Bc) runs this module's backward kernels (else flash2's): a micro-tile shape whose
    tiles fit ``budget`` bytes (default: what a block may use on this device, dynamic shared memory included)."""
    fast = backward_smem(Br, Bc, d, dtype)
    return fast is not None and fast <= _usable(blocks.dynamic_budget() if budget is None else budget, dtype)


def _usable(budget: int, dtype) -> int:
    """The part of ``budget`` this module's blocks use: float64 (accumulated in float64, two registers a value)
    stays within 48 KB, where its blocks were measured; its larger tiles took 230 registers (one block per SM)."""
    return min(budget, STATIC_SHARED_LIMIT) if _inputs.acc_dtype(dtype) == np.float64 else budget


def choose_block(d: int, dtype, budget: int, pass_: str = "forward") -> tuple[int, int]:
    """The fastest measured micro-tile whose tiles fit ``budget`` bytes of shared memory.

    Unlike flash1 and flash2 (the paper's rule Bc = ceil(M/4d), Br = min(Bc, d)),
    this kernel's blocks are set by its register micro-tiles: the paper's rule
    ignores registers, and here registers, not shared memory, bound the tile.
    """
    budget = _usable(budget, dtype)
    if pass_ == "backward":
        for Br, Bc in _by_head_dim(_BACKWARD_PREFERENCE, d):
            if backward_smem(Br, Bc, d, dtype) <= budget:
                return Br, Bc
        return _flash2.SPEC.block(d, dtype, pass_, budget=min(budget, STATIC_SHARED_LIMIT))  # flash2's backward
    for TM, TN in _by_head_dim(_PREFERENCE, d):
        if geometry(d, TM, TN, dtype)["smem"] <= budget:
            return TY * TM, TX * TN
    raise ValueError(f"no micro-tile fits d = {d} ({np.dtype(dtype)}) in {budget} bytes of shared memory")


def choose_atomic_block(d: int, dtype, budget: int) -> tuple[int, int]:
    """The atomic backward's block (``deterministic=False``): for d <= 64, on a device that gives a block more than
    48 KB, the first of :data:`_ATOMIC_BACKWARD_BLOCKS` that fits ``budget`` bytes; else the deterministic
    backward's (:func:`choose_block`)."""
    usable = _usable(budget, dtype)
    if -(-d // TX) <= _ATOMIC_BACKWARD_MAX_TD and budget > STATIC_SHARED_LIMIT:
        for Br, Bc in _ATOMIC_BACKWARD_BLOCKS:
            if backward_smem(Br, Bc, d, dtype) <= usable:
                return Br, Bc
    return choose_block(d, dtype, budget, "backward")


#: From this TD = ceil(d / 16) on (d > 112), the dK/dV kernel keeps P_ij and dS_ij in one shared tile, one after the
#: other: dV_j += P^T dO_i first, then dS over P, then dK_j += dS^T Q_i (and dQ), two barriers more a step.  At
#: d = 128 and 32 x 32 that takes its tiles from 80,128 to 75,520 bytes: three blocks in the H200's 228 KB an SM
#: instead of two (its 168 registers allow three), 12 warps instead of 8 (Nsight Compute, 2026-12-01, 667bc71,
#: benchmarks/results/h200-2026-12-01-s13/A/ncu_details.txt: 42% of cycles with
#: no eligible warp, waiting on shared-memory results).
SHARE_P_DS_MIN_TD = 8


def split_s_dp(TN: int, cap: int | None) -> bool:
    """Whether the dK/dV kernel of Br = 16 TN queries a step, built with register cap ``cap``, computes S^T in half
    its warps and dP^T in the other half (a TM x 2TN micro-tile of one), not both in every thread (TM x TN of each).

    Split, a thread loads TM + 2TN values from shared memory per 2 TM TN multiply-adds, not 2 TM + 2 TN, and hands P
    to its partner through shared memory.  Outputs are the same bit for bit (``bits.txt``).  H200, N = 4096,
    B*H = 32, backward only, split against not (2026-12-01, 4f81286 and 3bef02a,
    ``benchmarks/results/h200-2026-12-01-s14/A/`` and ``B/``): d = 128 (32 x 32) 21.87 / 23.25 ms, atomic
    20.70 / 22.34; d = 80 24.68 / 25.72, atomic 22.52 / 24.58 (but causal 10.74 / 10.29: 168 registers against
    128); the atomic 32 x 64 at d = 64 (capped at 168) 10.41-10.48 / 10.79.  Not split:

    * under a cap of 128 registers (d <= 64 in static shared memory on cc 8.0 up): ptxas spills 4-36 bytes
      there (it was 5% faster at d = 64 on the H200 all the same: 11.57 / 12.23 ms);
    * at TN = 1 (d = 96's 16 x 32 block): the split build takes 140 registers, not 128, so one block less an SM
      and a split plan made for four: 39.51 / 25.45 ms.

    On GPUs without a cap (a T4) the rule applies unmeasured.
    """
    if _switches.FORCE_SPLIT_S_DP is not None:  # s_dp_split(...)
        return _switches.FORCE_SPLIT_S_DP
    return TN >= 2 and (cap is None or cap > 128)


def split_dv_dk(split: bool, share_p_ds: bool, TD: int) -> bool:
    """Whether the dK/dV kernel keeps dV_j in warps 0-1 and dK_j in warps 2-3 (a thread's TM x 2TD of one, TM + 2TD
    shared loads a query for 2 TM TD multiply-adds, not 2 TM + 2 TD): where S^T and dP^T are split, P and dS have a
    tile each (both products run at once) and 2 TD is a multiple of 4 (columns in quads).  The sums are the same,
    in the same order.  H200, d = 64, the atomic backward at 32 x 64 (N = 4096, B*H = 32; 2026-12-01, 3c17b6b,
    ``benchmarks/results/h200-2026-12-01-s14/D/``): 10.24-10.26 ms
    against 10.58 (causal 5.22-5.24 against 5.35); where the rule applies elsewhere (a T4, an A100) it is unmeasured."""
    return _switches.SPLIT_DV_DK and split and not share_p_ds and (2 * TD) % 4 == 0


def dq_lane_groups(RW: int, DP: int, causal_dropout: bool = False) -> int:
    """In how many groups (1 or 2) a warp's lanes share the dK/dV kernel's dQ_i += dS_ij K_j, for RW query rows a
    warp and DP columns: group h of G the rows h RW/G .., lane l of it the columns l + (32/G) u.  The one with fewer
    shared loads per useful multiply-add: per 4 keys a lane loads one 16-byte vector of K_j^T per column and one of
    dS_ij per row, ceil(G DP / 32) + RW / G vectors for (RW / G) (G DP / 32) multiply-adds of 4.  A tie keeps 1.

    * d = 64 (RW = 8): 10 vectors for 16 (one group, 8 x 2 a lane), 8 for 16 (two, 4 x 4): two;
    * d = 32: 9 for 8, 6 for 8: two; d = 80: 11 for 20 (columns 64-95 half idle), 9 for 20: two;
    * d = 128: 12 for 32 either way: one; d = 96 (RW = 4): 7 for 12, 8 for 12: one.

    Not in the builds both causal and with dropout (``causal_dropout``): at d = 64 two groups hold 8 more values of
    K_j^T, and there ptxas (13.5) spills 4 bytes under the caps of 128 and 168 registers.  The sums are the same, in
    the same order (the split backward's copies of dQ the same bits).  H200, d = 64, N = 4096, B*H = 32, backward
    only, two groups against one, alternating (2026-12-01, 0cf1fe6, ``benchmarks/results/h200-2026-12-01-s15/E/``):
    atomic 32 x 64 9.83 / 9.91 ms against 10.07 / 10.26 (causal
    4.99 / 5.06 against 5.10 / 5.22); the deterministic default at 32 x 32 12.19 / 12.19 against 12.25 / 12.24."""
    if _switches.FORCE_DQ_LANE_GROUPS is not None:  # dq_lanes(...)
        return _switches.FORCE_DQ_LANE_GROUPS
    if causal_dropout:
        return 1

    def loads_per_madd(G: int) -> float:
        return (-(-G * DP // 32) + RW // G) / (RW // G * (G * DP / 32))

    return 2 if RW % 2 == 0 and loads_per_madd(2) < loads_per_madd(1) else 1


def s_dp_split(split: bool | None):
    """Within: ``_switches.FORCE_SPLIT_S_DP`` is ``split``; kernels and launch plans dropped on entry and on exit."""
    return _rebuilt_with("FORCE_SPLIT_S_DP", split)


def dq_lanes(groups: int | None):
    """Within: ``_switches.FORCE_DQ_LANE_GROUPS`` is ``groups``; kernels and launch plans dropped on entry and on
    exit."""
    return _rebuilt_with("FORCE_DQ_LANE_GROUPS", groups)


def p_ds_tiles(share: bool):
    """Within: the dK/dV kernel keeps P and dS in one tile (``share``) or in two, at every head dim, to time the two
    (lesson 10).  The kernels, the blocks-per-SM table and the launch plans built from the tiles are dropped on entry
    and on exit, so that each call builds what it runs."""
    return _rebuilt_with("SHARE_P_DS", bool(share))


@contextmanager
def _rebuilt_with(name: str, value):
    """Within: the switch ``_switches.<name>`` is ``value``; what was built from it is dropped on entry and on exit."""
    saved = getattr(_switches, name)
    setattr(_switches, name, value)
    _drop_tile_builds()
    try:
        yield
    finally:
        setattr(_switches, name, saved)
        _drop_tile_builds()


#: Caches of what is built from the tile layout (the kernel factories register theirs: :func:`built_from_tiles`).
_TILE_BUILDS: list = []


def built_from_tiles(cached):
    """Register an ``lru_cache``-d factory whose results depend on the tile switches; returns it (a decorator)."""
    _TILE_BUILDS.append(cached)
    return cached


def _drop_tile_builds() -> None:
    from ... import _launch_plan

    for cached in _TILE_BUILDS:
        cached.cache_clear()
    kvq_blocks_per_sm.cache_clear()
    _launch_plan._PLANS.clear()


def geometry_kv(d: int, TM: int, TN: int, dtype) -> dict:
    """dK/dV kernel: Bc = 8 TM keys per block (thread rows), Br = 16 TN queries per step (a thread's 16 apart, as the
    forward's keys), Q_i and dO_i row-major with stride QS = DP + 4; ``share_p_ds``: P and dS take turns in one
    tile (:data:`SHARE_P_DS_MIN_TD`)."""
    a, vec, TD, DP = _columns(d, dtype)
    Bc, Br = TY * TM, TX * TN
    KS, QS, PS = Bc + vec, DP + vec, Bc + vec
    share = TD >= SHARE_P_DS_MIN_TD if _switches.SHARE_P_DS is None else _switches.SHARE_P_DS  # p_ds_tiles(...)
    # K_j^T, V_j^T, Q_i, dO_i (row-major), P, dS (or P then dS), L, D
    tiles = (DP * KS, DP * KS, Br * QS, Br * QS) + ((Br * PS,) if share else (Br * PS, Br * PS)) + (Br, Br)
    return dict(Br=Br, Bc=Bc, TD=TD, DP=DP, KS=KS, QS=QS, PS=PS, tiles=tiles, share_p_ds=share,
                smem=_smem.total_bytes(tiles, a))


def geometry_q(d: int, TM: int, TN: int, dtype) -> dict:
    """dQ kernel: Br = 8 TM queries per block (thread rows), Bc = 16 TN keys per step."""
    a, vec, TD, DP = _columns(d, dtype)
    Br, Bc = TY * TM, TX * TN
    QS, KS, PS = Br + vec, Bc + 1, Br + vec
    tiles = (DP * QS, DP * QS, DP * KS, DP * KS, Bc * PS, Br, Br)  # Q_i^T, dO_i^T, K_j^T, V_j^T, dS^T, L_i, D_i
    return dict(Br=Br, Bc=Bc, TD=TD, DP=DP, KS=KS, QS=QS, PS=PS, tiles=tiles, smem=_smem.total_bytes(tiles, a))


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


# ---------------------------------------------------------------- the split (deterministic) dQ

#: Bytes the split deterministic backward may spend on copies of dQ (its accumulation dtype); past it
#: (a long sequence with few heads) the two-pass backward runs.
DQ_COPIES_LIMIT = 1 << 30
#: The split backward runs where its blocks keep at least this share of the GPU's block slots busy
#: (:func:`dq_copies`); below, the two-pass backward, whose 7 block products (against 5) cost about that.
DQ_SPLIT_MIN_EFFICIENCY = 0.7
#: Registers per thread of the uncapped dK/dV/dQ kernel on sm_90, float32, by TD = ceil(d / 16), for the
#: resident-block estimate; capped kernels use their cap, other head dims (and ccs below 9.0, where the kernel runs
#: uncapped) :data:`_UNCAPPED_KVQ_DEFAULT`.  TD = 5 and 6 hold what the H200 showed, not what ptxas 13.5 reports
#: here (128 and 142): with the forced copies of dQ (N = 4096, B*H = 32, backward; 2026-12-01, dcf4e76,
#: benchmarks/results/h200-2026-12-01-s11/E/copies.txt), d = 80 ran 12 copies
#: (3 blocks an SM) in 25.6 ms against 16 copies' 37.9, d = 96 16 copies (4 an SM) in 25.5 against 12's 30.0.  Set
#: from ptxas before (commit cf89f39), d = 96 chose 12 copies: fwd+bwd 39.0 ms (e39bb8a, h200-2026-12-01-s11/C/)
#: against 34.0 (cf89f39, h200-2026-12-01-s10/D/).
_UNCAPPED_KVQ_REGISTERS = {5: 136, 6: 128, 8: 168}
#: What ptxas took for the other uncapped builds measured: 159-168 (sm_75 at d = 64, sm_90 at d = 128).
_UNCAPPED_KVQ_DEFAULT = 168
_REGISTERS_PER_SM = 65536  # every GPU from cc 5.0 on
_MAX_BLOCKS_PER_SM = 16


@lru_cache(maxsize=None)
def kvq_blocks_per_sm(Br: int, Bc: int, d: int, dtype, cc, shared_per_sm: int) -> int:
    """Blocks of the dK/dV/dQ kernel one SM holds at once: the fewer of what its registers (its cap, or
    :data:`_UNCAPPED_KVQ_REGISTERS`) and its shared memory (tiles plus the 1 KB the driver reserves) allow."""
    g = geometry_kv(d, Bc // TY, Br // TX, dtype)
    dynamic = _smem.is_dynamic(g["smem"])
    regs = register_cap(BACKWARD_KVQ_NAME, cc, d, dtype, dynamic)
    if regs is None:
        regs = _UNCAPPED_KVQ_REGISTERS.get(g["TD"], _UNCAPPED_KVQ_DEFAULT) if tuple(cc) >= (9, 0) else \
            _UNCAPPED_KVQ_DEFAULT
    regs = -(-regs // 8) * 8  # allocated 8 at a time
    by_regs = _REGISTERS_PER_SM // (regs * NT)
    by_smem = shared_per_sm // (g["smem"] + 1024)
    return max(1, min(by_regs, by_smem, _MAX_BLOCKS_PER_SM))


@lru_cache(maxsize=4096)
def dq_copies(BHkv: int, Tc: int, dq_bytes: int, slots: int, limit: int = DQ_COPIES_LIMIT) -> int:
    """How many copies of dQ the split deterministic backward sums into: S, or 0 for the two-pass backward.

    S blocks per key/value head (a grid of S * BHkv) each walk over about Tc / S key tiles and add into their
    own copy of dQ, so every copy is written by one block, in one order.  S is the smallest that keeps the
    ``slots`` blocks the GPU holds at once busiest: efficiency = Tc * BHkv tiles over
    (waves * slots * tiles per block), waves = ceil(S * BHkv / slots); within ``limit`` bytes of copies.
    """
    best, best_eff = 0, 0.0
    for S in range(1, min(Tc, limit // max(dq_bytes, 1)) + 1):
        waves = -(-(S * BHkv) // slots)
        eff = Tc * BHkv / (waves * slots * -(-Tc // S))
        if eff > best_eff + 0.01:
            best, best_eff = S, eff
    return best if best_eff >= DQ_SPLIT_MIN_EFFICIENCY else 0


def split_dq_copies(BH: int, G: int, Nq: int, Nk: int, d: int, dtype, block) -> int:
    """:func:`dq_copies` for a call on this device (0: the two-pass backward runs), block = (Br, Bc);
    ``_switches.FORCE_DQ_COPIES`` where set."""
    if _switches.FORCE_DQ_COPIES is not None:
        return _switches.FORCE_DQ_COPIES
    info = device.info()
    Br, Bc = block
    slots = info.sm_count * kvq_blocks_per_sm(Br, Bc, d, dtype, info.compute_capability, info.shared_mem_per_sm)
    dq_bytes = BH * Nq * d * _inputs.acc_dtype(dtype).itemsize
    return dq_copies(BH // G, -(-Nk // Bc), dq_bytes, slots)
