"""The flash2_tc backward: dK, dV and dQ on tensor cores (mma.sync), float16 and bfloat16.

FlashAttention-2's backward (Algorithm 2 of the FA2 paper; Dao-AILab's ``flash_bwd_kernel.h``) with
every block product on the warp-level building blocks of :mod:`flash_numba.kernels._mma`.  Per pair of a
query block i and a key block j, recomputed from Q_i, K_j, V_j, dO_i, L_i and D_i = rowsum(dO_i * O_i):

    S = Q_i K_j^T                      the forward's instructions in the forward's order (below)
    P = exp2(S * scale * log2 e - L_i * log2 e)      0 where masked (causal, past Nk)
    dV_j += (Z P)^T dO_i               Z: dropout's factor, regenerated (:mod:`.._dropout`)
    dP = dO_i V_j^T
    dS = P * (Z dP - D_i)
    dK_j += dS^T Q_i                   (times scale at the end)
    dQ_i += dS K_j                     (times scale at the end)

**S bit for bit.**  Every S entry is one chain of mma instructions over the head dim, k = 0..15, 16..31,
.. in that order, from a zero accumulator, with Q as the A operand and K^T as the B operand: the chain
the forward runs, so S (and P's exponent) is bit-identical to the forward's; the m16n8k8 path (sm_75)
runs two m16n8k8 per 16 columns, k = 0..7 then 8..15, as the forward does on that path.

**Two kernels walk the pairs** (both 128 threads, 4 warps):

* ``dkdv_kernel``: a block owns Bc = 64 keys (16 a warp for dK_j, dV_j, which stay in registers as mma
  accumulators) and walks over the query blocks of Br = 32 rows that see them (GQA: of each of the G query
  heads of its key/value head in turn).  S and dP are computed in 2 x 2 warp tiles of 16 queries x 32 keys;
  P (times Z) and dS, rounded to the storage type, go to shared memory row-major (queries x keys), from
  where ``ldmatrix.trans`` hands them back transposed as the A operand of (Z P)^T dO_i and dS^T Q_i
  (FA2 keeps them in shared memory the same way).  With ``atomic_dq`` it also computes dS K_j (A = dS by a
  plain ``ldmatrix``, B = K_j by ``ldmatrix.trans``) and adds it into a float32 dQ with atomics.
* ``dq_kernel`` (deterministic backward): a block owns Br = 64 query rows (16 a warp), computes D_i
  itself from the dO_i it loads and O_i, keeps Q_i and dO_i as A fragments in registers and dQ_i as
  accumulators, and walks over the visible key blocks of Bc = 64: S and dP as in the forward, dS in the
  accumulator registers, rounded and packed in place as the A operand of dS K_j (the C layout of two
  n8 tiles is the A layout of one k16 step: FA2's trick for P V, here for dS K).  Then ``dkdv_kernel``
  without atomics: each output element summed by one warp in a fixed order, bitwise reproducible.

The atomic backward: ``d_kernel`` (D = rowsum(dO * O) and the float32 dQ accumulator zeroed, one launch),
``dkdv_kernel(atomic_dq=True)``, ``cast_kernel`` (dQ to the storage type).  Every shared tile is row-major
with a stride of d + 8 (or Bc + 8) elements: an odd number of 16-byte chunks, so the eight row addresses
of each ``ldmatrix`` phase fall on distinct banks.

Not handled as the CUDA-core kernels do: an Inf or NaN in Q, K, V or dO where its P or dS is masked
(mma multiplies 0 by it: NaN); inputs are finite in every test.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda, float32, int64, uint32, uint64

from ...device import jit
from .. import _bf16, _dropout, _mma, _smem
from .._common import add_counts, exp2_ieee, group_step, kv_head, rounded_mul
from .._tile_ops import head_starts, last_tile_first
from ..causal import crosses_diagonal_dev as crosses_diagonal
from ..causal import first_visible_q_block_dev as first_visible_q_block
from ..causal import key_limit_dev as key_limit
from ..causal import visible_kv_blocks_dev as visible_kv_blocks

NT = 128  # threads a block: 4 warps
NW = NT // 32
#: dK/dV kernel: keys a block (16 a warp), queries a step
KV_BC, KV_BR = 64, 32
#: dQ kernel: queries a block (16 a warp), keys a step
Q_BR, Q_BC = 64, 64
#: elements of the D / cast kernels a block
ELEMWISE_THREADS = 256
#: D kernel: rows a block (TX lanes a row)
D_TX = 16
D_ROWS = NT // D_TX
LOG2E = 1.4426950408889634
FASTMATH = {"contract", "afn", "arcp", "nsz", "reassoc"}

BACKWARD_Q_NAME = "flash2_tc dQ"
BACKWARD_KV_NAME = "flash2_tc dK, dV"
D_ZERO_NAME = "flash2_tc D, zero dQ"
BACKWARD_KVQ_NAME = "flash2_tc dK, dV, dQ (atomic)"
CAST_DQ_NAME = "flash2_tc dQ to storage dtype"

F32_ZERO, F32_ONE = np.float32(0), np.float32(1)
POS_INF = np.float32(np.inf)


def stride(width: int) -> int:
    """Row stride (elements) of a shared tile of ``width`` 16-bit columns: width + 8, an odd number of 16-byte
    chunks for width a multiple of 16 (ldmatrix: 8 rows of 16 bytes on distinct banks)."""
    return width + 8


def kv_shared_bytes(d: int) -> int:
    """Shared memory of the dK/dV kernel: K_j, V_j, Q_i, dO_i, P, dS tiles (2 bytes) and L_i, D_i (float32)."""
    return 2 * (2 * KV_BC * stride(d) + 2 * KV_BR * stride(d) + 2 * KV_BR * stride(KV_BC)) + 8 * KV_BR


def q_shared_bytes(d: int) -> int:
    """Shared memory of the dQ kernel: Q_i, dO_i, K_j, V_j tiles and L_i, D_i."""
    return 2 * (2 * Q_BR * stride(d) + 2 * Q_BC * stride(d)) + 8 * Q_BR


def _storage(dtype_name: str):
    """(to_f32, from_f32, pack) device functions of a storage type: float16 or bfloat16 (uint16 words)."""
    if dtype_name == "bfloat16":
        return _bf16.bf16_to_f32, _bf16.f32_to_bf16, _mma.pack_bf16x2
    if dtype_name != "float16":
        raise ValueError(f"dtype: flash2_tc runs float16 and bfloat16, not {dtype_name}")

    @jit(device=True, forceinline=True)
    def to_f32(x):
        return float32(x)

    from numba import float16

    @jit(device=True, forceinline=True)
    def from_f32(x):
        return float16(x)

    return to_f32, from_f32, _mma.pack_f16x2


def _tile_type(dtype_name: str) -> str:
    """The shared tiles' element type: the storage words (uint16 for bfloat16)."""
    return "uint16" if dtype_name == "bfloat16" else "float16"


@lru_cache(maxsize=None)
def fragments(dtype_name: str, k8: bool):
    """Device functions ``(ld_a, ld_a_t, ld_b, ld_b_t, mma)`` over 16 x 16 tiles of shared memory.

    ``ld_a(tile, r0, k0, S, lane)``: the A fragment (a0..a3) of the 16 x 16 block at (r0, k0) of a row-major
    tile of stride S; ``ld_a_t``: of the transpose of the block whose rows are k (k0..) and columns r (r0..);
    ``ld_b(tile, n0, k0, S, lane)``: the B fragments of two n8 tiles (n0, n0 + 8) over k0..k0+15 from B^T
    stored row-major (rows n); ``ld_b_t(tile, k0, n0, S, lane)``: the same from B stored row-major (rows k).
    ``mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)``: C + A B for one m16n8k16 step, or two m16n8k8 (k8, sm_75).
    """
    ldx4, ldx4_t = _mma.ldmatrix_x4, _mma.ldmatrix_x4_trans
    SEVEN, EIGHT = uint32(7), uint32(8)

    @jit(device=True, forceinline=True)
    def ld_a(tile, r0, k0, S, lane):
        m = lane >> uint32(3)
        return ldx4(tile, (uint32(r0) + (lane & SEVEN) + (m & uint32(1)) * EIGHT) * uint32(S)
                    + uint32(k0) + (m >> uint32(1)) * EIGHT)

    @jit(device=True, forceinline=True)
    def ld_a_t(tile, r0, k0, S, lane):
        m = lane >> uint32(3)
        return ldx4_t(tile, (uint32(k0) + (lane & SEVEN) + (m >> uint32(1)) * EIGHT) * uint32(S)
                      + uint32(r0) + (m & uint32(1)) * EIGHT)

    @jit(device=True, forceinline=True)
    def ld_b(tile, n0, k0, S, lane):
        m = lane >> uint32(3)
        return ldx4(tile, (uint32(n0) + (lane & SEVEN) + (m >> uint32(1)) * EIGHT) * uint32(S)
                    + uint32(k0) + (m & uint32(1)) * EIGHT)

    @jit(device=True, forceinline=True)
    def ld_b_t(tile, k0, n0, S, lane):
        m = lane >> uint32(3)
        return ldx4_t(tile, (uint32(k0) + (lane & SEVEN) + (m & uint32(1)) * EIGHT) * uint32(S)
                      + uint32(n0) + (m >> uint32(1)) * EIGHT)

    if k8:
        mma8 = _mma.mma_m16n8k8_f16

        @jit(device=True, forceinline=True)
        def mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            c0, c1, c2, c3 = mma8(a0, a1, b0, c0, c1, c2, c3)
            return mma8(a2, a3, b1, c0, c1, c2, c3)
    else:
        mma = _mma.mma_m16n8k16_bf16 if dtype_name == "bfloat16" else _mma.mma_m16n8k16_f16

    return ld_a, ld_a_t, ld_b, ld_b_t, mma


@lru_cache(maxsize=None)
def tile_loader(rows: int, d: int, dtype_name: str, count: bool):
    """Device function ``load(tile, x, lay, bh, r0, n, tid) -> elements read``: rows r0 .. r0 + rows - 1 of head
    bh of a flat input (layout ``lay``) into a row-major tile of stride d + 8, 16-bit words copied as they are;
    rows past n zero-filled."""
    S, D_U, COUNT = stride(d), uint32(d), count
    ZERO = np.uint16(0) if dtype_name == "bfloat16" else np.float16(0)
    PER = rows * d // NT  # every thread the same number of elements (d a multiple of 16, rows of 32, 64)
    assert rows * d % NT == 0

    @jit(device=True, forceinline=True)
    def load(tile, x, lay, bh, r0, n, tid):
        start = head_starts(lay, lay, bh)[0]
        rs = uint32(lay[3])
        got = 0
        for it in range(PER):
            e = uint32(it * NT) + uint32(tid)
            r = e // D_U
            c = e - r * D_U
            row = uint32(r0) + r
            at = r * uint32(S) + c
            if row < uint32(n):
                tile[at] = x[start + uint64(row * rs + c)]
                if COUNT:
                    got += 1
            else:
                tile[at] = ZERO
        return got

    return load
