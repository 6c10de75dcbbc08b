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

**Two kernels walk the pairs** (both 128 threads, 4 warps; up to d = 64 in one launch, below):

* ``dkdv_kernel``: a block owns Bc keys and walks over the query blocks of Br = 32 rows that see them (GQA:
  of each of the G query heads of its key/value head in turn); dK_j, dV_j stay in registers as mma
  accumulators.  Up to d = 64 (Bc = 64, :func:`_dkdv_transposed`) a warp owns 16 keys and all d columns of
  their dK and dV, and computes S^T = K_j Q_i^T and dP^T = V_j dO_i^T for its keys: the accumulators of P^T and
  dS^T, two n8 tiles joined, are the A fragments of (Z P)^T dO_i and dS^T Q_i (the forward's trick for P V), so
  P and dS never touch shared memory and no barrier separates them from their use (before 2026-12-01 they went
  through shared memory as they still do above d = 64: 520 M executed instructions at d = 64, 8 per mma).  On
  sm_80+ the next step's Q_i and dO_i load with cp.async into a second buffer while this step computes.  Above
  d = 64 (:func:`_dkdv_shared`; Bc = 32: at d = 128, 64 keys x d took 128 accumulators a lane and ptxas spilled)
  a warp owns 16 keys x d/2 columns, S and dP are computed in 2 x 2 warp tiles of 16 queries x Bc/2 keys, and
  P (times Z) and dS, rounded to the storage type a lane's two neighbouring keys at a time (one ``pack``, one
  32-bit store), go to shared memory row-major (queries x keys), from where
  ``ldmatrix.trans`` hands them back transposed as the A operand of (Z P)^T dO_i and dS^T Q_i (FA2 keeps them in
  shared memory the same way).  With ``atomic_dq`` it also computes dS K_j (A = dS by ``ldmatrix``, B = K_j by
  ``ldmatrix.trans``) and adds it into a float32 dQ with atomics, two neighbouring columns in one
  ``red.global.add.v2.f32`` on sm_90.
* ``dq_kernel`` (deterministic backward): a block owns Br = 64 query rows (16 a warp), computes D_i
  itself from the dO_i it loads and O_i, keeps Q_i and dO_i as A fragments in registers (their shared tiles
  then hold K_j and V_j, two buffers of each on sm_80+: the next block loads with cp.async while this one
  computes; 37 KB at d = 64 and 35 KB at d = 128, within a T4's 48 KB of static shared memory) and dQ_i as
  accumulators, and walks over the visible key blocks of Bc = 64 keys (32 above d = 64): S and dP as in the
  forward, dS in the accumulator registers, rounded and packed in place as the A operand of dS K_j (the C
  layout of two n8 tiles is the A layout of one k16 step: FA2's trick for P V, here for dS K).  Then ``dkdv_kernel``
  without atomics: each output element summed by one warp in a fixed order, bitwise reproducible.

**One launch up to d = 64, no mask** (:func:`backward_kernel`, :func:`one_launch`): ``d_kernel`` writes D first,
then one launch runs both kernels' blocks (a grid of two rows: y = 0 the dQ blocks, which then read D instead of O;
y = 1 the dK/dV blocks).  A launch's last wave runs part-full while the next launch waits for it, and the dK/dV
kernel's time stepped with its waves on the H200 (2,048 blocks at 3 an SM: 5.17 waves); one launch of both has
one tail instead of two: d = 64 float16 forward+backward 2.87 -> 2.72-2.75 ms at N = 4096, B*H = 32
(benchmarks/results/h200-2026-12-02-backward-one-launch/).  Above d = 64 the dQ kernel's registers (about 230
at d = 128) would halve the dK/dV blocks an SM, and the two launches stay; causal too (slower in one launch,
:func:`one_launch`).

**S^T bit for bit.**  The transposed kernel's S^T entries are the same mma chains as the forward's S entries,
with A and B swapped: each is sum_k Q[q][k] K[c][k] over the same k16 steps in the same order, and a tensor core's
D[m][n] depends on row m of A and column n of B only (``tests/test_mma.py`` checks it on the GPU, bit for bit).

The atomic backward: ``d_kernel`` (D = rowsum(dO * O) and the float32 dQ accumulator zeroed, one launch),
``dkdv_kernel(atomic_dq=True)``, ``cast_kernel`` (dQ to the storage type).  Every shared tile is row-major
with a stride of d + 8 (or Bc + 8) elements: an odd number of 16-byte chunks, so the eight row addresses
of each ``ldmatrix`` phase fall on distinct banks.  Tiles are loaded 16 bytes a thread where every row of
q, k, v and dO starts on 16 bytes (the usual contiguous tensor), else an element at a time.

Not handled as the CUDA-core kernels do: an Inf or NaN in Q, K, V or dO where its P or dS is masked
(mma multiplies 0 by it: NaN); inputs are finite in every test.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda, float32, int64, uint16, uint32, uint64

from ...device import jit
from .. import _bf16, _dropout, _mma, _smem, _vec
from .._launch import launch
from .._common import add_counts, head_grid, nb_type, exp2_ieee, group_step, kv_head, rounded_mul
from .._tile_ops import head_starts, last_tile_first
from .forward import _nothing
from ..causal import crosses_diagonal_dev as crosses_diagonal
from ..causal import first_visible_q_block_dev as first_visible_q_block
from ..causal import key_limit_dev as key_limit
from ..causal import visible_kv_blocks_dev as visible_kv_blocks

NT = 128  # threads a block: 4 warps
NW = NT // 32
#: dK/dV kernel: queries a step; keys a block: 64 (16 a warp) up to d = 64, else 32 (16 keys x d/2 columns of dK
#: and dV a warp: 64 accumulators a lane at d = 128, where 64 keys x d took 128 and spilled)
KV_BR = 32
KV_BC_SMALL_D, KV_BC_LARGE_D = 64, 32
#: dQ kernel: queries a block (16 a warp); keys a step: 64 up to d = 64, else 32 (S and dP 16 accumulators a lane
#: each instead of 32: at d = 128 on the m16n8k8 path 64 keys spilled)
Q_BR = 64
Q_BC_SMALL_D, Q_BC_LARGE_D = 64, 32
#: elements of the D / cast kernels a block
ELEMWISE_THREADS = 256
#: D kernel: rows a block (TX lanes a row)
D_TX = 16
D_ROWS = NT // D_TX
LOG2E = 1.4426950408889634
FASTMATH = {"contract", "afn", "arcp", "nsz", "reassoc"}

BACKWARD_Q_NAME = "flash2_tc dQ"
BACKWARD_KV_NAME = "flash2_tc dK, dV"
D_NAME = "flash2_tc D"
BACKWARD_NAME = "flash2_tc dQ | dK, dV"
D_ZERO_NAME = "flash2_tc D, zero dQ"
BACKWARD_KVQ_NAME = "flash2_tc dK, dV, dQ (atomic)"
CAST_DQ_NAME = "flash2_tc dQ to storage dtype"

F32_ZERO, F32_ONE = np.float32(0), np.float32(1)
POS_INF = np.float32(np.inf)


def stride(width: int) -> int:
    """Row stride (elements) of a shared tile of ``width`` 16-bit columns: width + 8, an odd number of 16-byte
    chunks for width a multiple of 16 (ldmatrix: 8 rows of 16 bytes on distinct banks)."""
    return width + 8


def kv_block(d: int) -> tuple[int, int]:
    """(Br, Bc) of the dK/dV kernel at head dim d."""
    return KV_BR, (KV_BC_SMALL_D if d <= 64 else KV_BC_LARGE_D)


def kv_buffers(k8: bool) -> int:
    """Buffers of Q_i and dO_i in the transposed dK/dV kernel: 2 (the next step's load overlaps this step's work)
    with cp.async (sm_80+), 1 on the sm_75 path (no cp.async; a T4's 64 KB of shared memory an SM)."""
    return 1 if k8 else 2


def transposed(d: int) -> bool:
    """Whether the dK/dV kernel computes S^T and dP^T, keeping P^T and dS^T in registers (:func:`_dkdv_transposed`):
    where a warp owns 16 keys and every column of their dK and dV (Bc = 64, up to d = 64)."""
    return kv_block(d)[1] == 16 * NW


def kv_shared_bytes(d: int) -> int:
    """Shared memory of the dK/dV kernel (the atomic one, the larger): K_j, V_j, Q_i, dO_i tiles and P, dS (Br x Bc)
    or up to d = 64 dS^T (Bc x Br) (2 bytes an element), and L_i, D_i (float32)."""
    Br, Bc = kv_block(d)
    if transposed(d):  # two buffers of Q_i, dO_i, L_i, D_i (the sm80 path; sm_75: one)
        return 2 * (2 * Bc * stride(d) + 4 * Br * stride(d) + Bc * stride(Br)) + 16 * Br
    return 2 * (2 * Bc * stride(d) + 2 * Br * stride(d) + 2 * Br * stride(Bc)) + 8 * Br


def q_block(d: int) -> tuple[int, int]:
    """(Br, Bc) of the dQ kernel at head dim d."""
    return Q_BR, (Q_BC_SMALL_D if d <= 64 else Q_BC_LARGE_D)


def q_shared_bytes(d: int) -> int:
    """Shared memory of the dQ kernel (the sm80 path, the larger): two tiles (Q_i and dO_i, then two buffers of K_j and
    of V_j) and L_i, D_i."""
    Br, Bc = q_block(d)
    return 2 * 2 * max(2 * Bc, Br) * stride(d) + 8 * Br


def _storage(dtype_name: str):
    """(to_f32, from_f32, pack) device functions of a storage type: float16 or bfloat16 (uint16 words)."""
    if dtype_name == "bfloat16":
        # from_f32: one cvt.rn.bf16x2 a value (sm_80+, as standard's tensor-core kernels).  With _bf16's integer
        # rounding (8 instructions and a NaN branch a value) the dK/dV kernel at d = 128 took 176 registers (2 blocks
        # an SM) in bfloat16 against float16's 128 (4 blocks): ptxas for sm_90, 2026-12-02
        pack = _mma.pack_bf16x2

        @jit(device=True, forceinline=True)
        def to_bf16(x):
            return uint16(pack(x, x) & uint32(0xFFFF))

        return _bf16.bf16_to_f32, to_bf16, pack
    if dtype_name != "float16":
        raise ValueError(f"dtype: flash2_tc runs float16 and bfloat16, not {dtype_name}")

    @jit(device=True, forceinline=True)
    def to_f32(x):
        return float32(x)

    F16 = nb_type(np.float16)

    @jit(device=True, forceinline=True)
    def from_f32(x):
        return F16(x)

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
def fragments_single(dtype_name: str):
    """``ld_b_t1(tile, k0, n0, S, lane)``: the B fragments (b0, b1) of one n8 tile (n0..n0+7) over k0..k0+15 from B
    stored row-major (rows k), as ``ld_b_t`` returns them for its first tile; lanes 16-31 give the addresses of
    lanes 0-15 again (registers 2 and 3 repeat 0 and 1), so no column past n0 + 7 is read."""
    ldx4_t, SEVEN, EIGHT = _mma.ldmatrix_x4_trans, uint32(7), uint32(8)

    @jit(device=True, forceinline=True)
    def ld_b_t1(tile, k0, n0, S, lane):
        m = lane >> uint32(3)
        return ldx4_t(tile, (uint32(k0) + (lane & SEVEN) + (m & uint32(1)) * EIGHT) * uint32(S) + uint32(n0))

    return ld_b_t1


@jit(device=True, forceinline=True)
def lane_rows(S, lane):
    """This lane's parts of the ``ldmatrix`` row addresses of :func:`fragments`' loaders, for tiles of stride S:
    ``(b, b_t)``, so that ``ld_b(tile, n0, k0, S, lane)`` reads ``ldmatrix_x4(tile, b + n0 S + k0)`` and
    ``ld_b_t(tile, k0, n0, S, lane)`` reads ``ldmatrix_x4_trans(tile, b_t + k0 S + n0)``.  A kernel computes them
    once; the rest of each address is then a constant of its unrolled loops (an immediate offset)."""
    m = lane >> uint32(3)
    r = lane & uint32(7)
    b = (r + (m >> uint32(1)) * uint32(8)) * uint32(S) + (m & uint32(1)) * uint32(8)
    b_t = (r + (m & uint32(1)) * uint32(8)) * uint32(S) + (m >> uint32(1)) * uint32(8)
    return b, b_t


@lru_cache(maxsize=None)
def tile_loader(rows: int, d: int, dtype_name: str, count: bool, aligned: bool = False, asynchronous: bool = False):
    """Device function ``load(tile, at0, x, lay, bh, r0, n, tid) -> elements read``: rows r0 .. r0 + rows - 1 of
    head bh of a flat input (layout ``lay``) into a row-major tile of stride d + 8 starting at element at0 of
    ``tile``, 16-bit words copied as they are; rows past n zero-filled.

    ``aligned`` (every row of x starts on 16 bytes, :func:`.._vec.aligned16`): 16 bytes a thread at a time, with
    ``asynchronous`` (sm_80+) one ``cp.async`` each, which returns at once (the data lands by
    ``cp_async_wait_all``: the kernel computes meanwhile), else all of a thread's ``ld.global.v4`` first, then its
    ``st.shared.v4`` (as the forward's sm_75 loader); not ``aligned``: one element a thread at a time
    (consecutive threads, consecutive elements)."""
    S, D_U, COUNT = stride(d), uint32(d), count
    from_f32 = _storage(dtype_name)[1]  # a zero of the tile's type (a float16 constant does not lower)
    PER = rows * d // NT  # every thread the same number of elements (d a multiple of 16, rows of 32, 64)
    assert rows * d % NT == 0
    CHUNKS, CR = rows * d // 8, uint32(d // 8)  # 16-byte chunks of the tile, of a row
    ROUNDS = -(-CHUNKS // NT)
    WHOLE = CHUNKS % NT == 0  # every thread a chunk every round
    REGS = 4 * ROUNDS  # a constant: a local array's shape must be one
    load_16, store_16, zero_16, copy_16 = _mma.load_16, _mma.store_16, _mma.zero_16, _mma.cp_async_16

    if aligned and asynchronous:
        @jit(device=True, forceinline=True)
        def load_async(tile, at0, x, lay, bh, r0, n, tid):
            start = head_starts(lay, lay, bh)[0]
            rs = uint32(lay[3])
            got = 0
            for i in range(ROUNDS):
                c = uint32(tid) + uint32(i * NT)
                r = c // CR
                if WHOLE or c < uint32(CHUNKS):
                    at = uint32(at0) + r * uint32(S) + (c - r * CR) * uint32(8)
                    if uint32(r0) + r < uint32(n):
                        copy_16(tile, at, x, start + uint64((uint32(r0) + r) * rs + (c - r * CR) * uint32(8)))
                        if COUNT:
                            got += 8
                    else:
                        zero_16(tile, at)
            return got

        return load_async

    if aligned:
        @jit(device=True, forceinline=True)
        def load_vectors(tile, at0, x, lay, bh, r0, n, tid):
            start = head_starts(lay, lay, bh)[0]
            rs = uint32(lay[3])
            w = cuda.local.array(REGS, uint32)
            got = 0
            for i in range(ROUNDS):  # every load first ...
                c = uint32(tid) + uint32(i * NT)
                r = c // CR
                if (WHOLE or c < uint32(CHUNKS)) and uint32(r0) + r < uint32(n):
                    w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3] = load_16(
                        x, start + uint64((uint32(r0) + r) * rs + (c - r * CR) * uint32(8)))
                    if COUNT:
                        got += 8
            for i in range(ROUNDS):  # ... then the stores
                c = uint32(tid) + uint32(i * NT)
                r = c // CR
                if WHOLE or c < uint32(CHUNKS):
                    at = uint32(at0) + r * uint32(S) + (c - r * CR) * uint32(8)
                    if uint32(r0) + r < uint32(n):
                        store_16(tile, at, w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3])
                    else:
                        zero_16(tile, at)
            return got

        return load_vectors

    @jit(device=True, forceinline=True)
    def load(tile, at0, x, lay, bh, r0, n, tid):
        start = head_starts(lay, lay, bh)[0]
        rs = uint32(lay[3])
        got = 0
        for it in range(PER):
            e = uint32(it * NT) + uint32(tid)
            r = e // D_U
            c = e - r * D_U
            row = uint32(r0) + r
            at = uint32(at0) + r * uint32(S) + c
            if row < uint32(n):
                tile[at] = x[start + uint64(row * rs + c)]
                if COUNT:
                    got += 1
            else:
                tile[at] = from_f32(F32_ZERO)
        return got

    return load


@jit(device=True, forceinline=True)
def read_stats(lse, D, bh, r):
    """(L_i in log2 units, D_i) of row r of head bh; (+inf, 0) past the last row (r = -1 here: P = 0 there)."""
    if r < 0:
        return POS_INF, F32_ZERO
    return lse[uint32(bh), uint32(r)] * float32(LOG2E), D[uint32(bh), uint32(r)]


@lru_cache(maxsize=None)
def stats_loader(rows: int, count: bool):
    """Device function ``load(Ls, Ds, lse, D, bh, r0, n, tid) -> elements read``: L_i in log2 units (+inf past
    n: P = 0 there) and D_i (0 past n), one thread a row."""
    COUNT = count

    @jit(device=True, forceinline=True)
    def load(Ls, Ds, lse, D, bh, r0, n, tid):
        got = 0
        if tid < rows:
            Lr = POS_INF
            Dr = F32_ZERO
            r = uint32(r0) + uint32(tid)
            if r < uint32(n):
                Lr = lse[uint32(bh), r] * float32(LOG2E)
                Dr = D[uint32(bh), r]
                if COUNT:
                    got = 2
            Ls[tid] = Lr
            Ds[tid] = Dr
        return got

    return load


def _block_tiles(sizes, dtype_name: str, dynamic: bool):
    """The kernel's 16-bit tiles in one shared array (:mod:`.._smem`; dynamic above 48 KB)."""
    return _smem.tiles(tuple(sizes), _tile_type(dtype_name), dynamic)


@lru_cache(maxsize=None)
def dkdv_kernel(d: int, dtype_name: str, causal: bool, count: bool, k8: bool = False, atomic_dq: bool = False,
                dropout: bool = False, dynamic: bool = False, aligned: bool = False, red2: bool = False,
                device: bool = False):
    """The dK/dV kernel (with ``atomic_dq``: dQ by atomics too) for head dim d (a multiple of 16, <= 128).

    Arguments ``(q, k, v, do, lse, D, dk, dv, dq, Nq, Nk, G, scale, scale_log2, counter, q_lay, k_lay, v_lay,
    do_lay, seed, threshold, inv_keep)``: q, k, v, do flat 16-bit inputs and their layouts
    (:func:`flash_numba._views.flat_input`); lse, D ``(B*H, Nq)`` float32; dk, dv ``(B*Hkv, Nk, d)``; dq a zeroed
    ``(B*H, Nq, d)`` float32 accumulator with ``atomic_dq``, else never touched.  A 1-D grid of Tc * B*Hkv
    blocks: block x runs key tile x // B*Hkv of key/value head x % B*Hkv (the first, longest tiles first).
    ``red2`` (sm_90+, with ``atomic_dq``): each lane adds its two neighbouring dQ columns with one
    ``red.global.add.v2.f32`` (:func:`.._mma.red_add_f32x2`), half the atomic instructions of one add an element.

    Up to d = 64 (:func:`transposed`) S^T and dP^T in registers (:func:`_dkdv_transposed`), above through
    shared memory (:func:`_dkdv_shared`).  ``device``: the same code as a device function, for
    :func:`backward_kernel` (the block's key tile and head from ``blockIdx.x`` all the same).
    """
    build = _dkdv_transposed if transposed(d) else _dkdv_shared
    return build(d, dtype_name, causal, count, k8, atomic_dq, dropout, dynamic, aligned, red2, device)


@lru_cache(maxsize=None)
def _atomic_dq(d: int, Bc: int, a_stride: int, transposed: bool, dtype_name: str, k8: bool, count: bool, red2: bool):
    """``dq_step(dS, Ks, sr, qc, lane, g, t, dq_acc, dq, bh, r0, Nq, scale) -> atomics``: the atomic backward's
    dQ_i += scale dS K_j for one warp (rows sr .. sr + 15 of the query block at r0, columns qc .. qc + d/2, over
    the block's Bc keys), shared by both dK/dV kernels.  dS is read from shared memory with row stride
    ``a_stride``, queries x keys (``ldmatrix``: :func:`_dkdv_shared`) or keys x queries (``transposed``,
    ``ldmatrix.trans``: :func:`_dkdv_transposed`); K_j from ``Ks`` (Bc rows of stride(d)).  The lane adds its
    accumulators ``dq_acc`` (QN x 4) into the float32 ``dq`` (BH, Nq, d): one ``red.global.add.v2.f32`` for two
    columns (``red2``, sm_90) or two atomic adds.  Returns the float32 atomics made when counting, else 0."""
    ld_a, ld_a_t, _, ld_b_t, mma = fragments(dtype_name, k8)
    load_a = ld_a_t if transposed else ld_a
    ld_b_t1 = fragments_single(dtype_name)
    red_add2 = _mma.red_add_f32x2
    DS = stride(d)
    QW = d // 2  # dQ columns of a warp (2 x 2 warps over Br x d)
    QN = QW // 8
    QN_ODD = QN % 2 == 1  # d = 16, 48, 80, 112: the last n8 tile alone
    COUNT, RED2 = count, red2

    @jit(device=True, forceinline=True)
    def dq_step(src, Ks, sr, qc, lane, g, t, dq_acc, dq, bh, r0, Nq, scale):
        n_atomic = uint32(0)
        for j in range(QN):
            for e in range(4):
                dq_acc[j, e] = F32_ZERO
        for kk in range(Bc // 16):
            a0, a1, a2, a3 = load_a(src, sr, kk * 16, a_stride, lane)
            for nb in range(QN // 2):
                b0, b1, b2, b3 = ld_b_t(Ks, kk * 16, qc + uint32(nb * 16), DS, lane)
                dq_acc[2 * nb, 0], dq_acc[2 * nb, 1], dq_acc[2 * nb, 2], dq_acc[2 * nb, 3] = mma(
                    a0, a1, a2, a3, b0, b1, dq_acc[2 * nb, 0], dq_acc[2 * nb, 1], dq_acc[2 * nb, 2],
                    dq_acc[2 * nb, 3])
                dq_acc[2 * nb + 1, 0], dq_acc[2 * nb + 1, 1], dq_acc[2 * nb + 1, 2], dq_acc[2 * nb + 1, 3] = mma(
                    a0, a1, a2, a3, b2, b3, dq_acc[2 * nb + 1, 0], dq_acc[2 * nb + 1, 1], dq_acc[2 * nb + 1, 2],
                    dq_acc[2 * nb + 1, 3])
            if QN_ODD:  # d/2 = 8 (2 u + 1) columns: its two matrices loaded twice
                b0, b1, b2, b3 = ld_b_t1(Ks, kk * 16, qc + uint32(QW - 8), DS, lane)
                dq_acc[QN - 1, 0], dq_acc[QN - 1, 1], dq_acc[QN - 1, 2], dq_acc[QN - 1, 3] = mma(
                    a0, a1, a2, a3, b0, b1, dq_acc[QN - 1, 0], dq_acc[QN - 1, 1], dq_acc[QN - 1, 2],
                    dq_acc[QN - 1, 3])
        for h in range(2):
            row = uint32(r0) + sr + g + uint32(8 * h)
            if row < uint32(Nq):
                for j in range(QN):
                    col = qc + uint32(8 * j) + 2 * t
                    if RED2:  # columns col, col + 1 in one
                        red_add2(dq, (uint64(bh) * uint64(Nq) + uint64(row)) * uint64(d) + uint64(col),
                                 dq_acc[j, 2 * h] * scale, dq_acc[j, 2 * h + 1] * scale)
                    else:
                        for e in range(2):
                            cuda.atomic.add(dq, (uint32(bh), row, col + uint32(e)), dq_acc[j, 2 * h + e] * scale)
                    if COUNT:
                        n_atomic += uint32(2)
        return n_atomic

    return dq_step


def _dkdv_shared(d: int, dtype_name: str, causal: bool, count: bool, k8: bool, atomic_dq: bool, dropout: bool,
                 dynamic: bool, aligned: bool, red2: bool, device: bool = False):
    """The dK/dV kernel above d = 64: S and dP in 2 x 2 warp tiles of 16 queries x Bc/2 keys, P (times Z) and dS
    through shared memory (module docstring)."""
    assert d % 16 == 0 and 16 <= d <= 128
    to_f32, from_f32, pack = _storage(dtype_name)
    store_32 = _mma.store_32
    ld_a, ld_a_t, ld_b, ld_b_t, mma = fragments(dtype_name, k8)
    Br, Bc = kv_block(d)
    DS, PS = stride(d), stride(Bc)
    SW = Bc // 2  # keys of a warp's S tile (2 x 2 warps over Br x Bc)
    WK = Bc // 16  # warps along the keys of dK/dV (4 or 2); NW // WK along their columns
    DW = d // (NW // WK)  # dK/dV columns of a warp
    SN, DN = SW // 8, DW // 8  # n8 tiles: of a warp's S, of dK/dV
    DN_ODD = DN % 2 == 1
    QW = d // 2  # dQ columns of a warp (2 x 2 warps over Br x d)
    QN = QW // 8
    ld_b_t1 = fragments_single(dtype_name)
    CAUSAL, COUNT, ATOMIC_DQ = causal, count, atomic_dq
    dq_step = _atomic_dq(d, Bc, PS, False, dtype_name, k8, count, red2)
    SB = 2
    MUL_RN = rounded_mul("float32")
    block_tiles = _block_tiles((Bc * DS, Bc * DS, Br * DS, Br * DS, Br * PS, Br * PS), dtype_name, dynamic)
    load_kv = tile_loader(Bc, d, dtype_name, count, aligned)
    load_q = tile_loader(Br, d, dtype_name, count, aligned)
    load_stats = stats_loader(Br, count)
    drop_head, drop_row, drop = _dropout.factor(dropout, "float32")

    def kernel(q, k, v, do, lse, D, dk, dv, dq, Nq, Nk, G, scale, scale_log2, counter, q_lay, k_lay, v_lay,
               do_lay, seed, threshold, inv_keep):
        Ks, Vs, Qs, dOs, Ps, dSs = block_tiles()  # row-major: K_j, V_j (Bc, DS); Q_i, dO_i (Br, DS); P, dS (Br, PS)
        Ls = cuda.shared.array(Br, float32)  # L_i in log2 units
        Ds = cuda.shared.array(Br, float32)
        s = cuda.local.array((SN, 4), float32)
        dp = cuda.local.array((SN, 4), float32)
        dv_acc = cuda.local.array((DN, 4), float32)
        dk_acc = cuda.local.array((DN, 4), float32)
        dq_acc = cuda.local.array((QN, 4), float32)

        tid = cuda.threadIdx.x
        lane = uint32(tid % 32)
        warp = uint32(tid // 32)
        g, t = lane >> uint32(2), lane & uint32(3)
        BHkv = uint32(dk.shape[0])
        tile = uint32(cuda.blockIdx.x) // BHkv
        hkv = int64(uint32(cuda.blockIdx.x) - tile * BHkv)
        c0 = int64(tile) * Bc
        nr = 0
        n_atomic = uint32(0)
        # the warp's tiles: S and dP rows sr.., keys sc..; dK, dV keys kr..; dQ rows sr.., columns qc..
        sr = (warp & uint32(1)) * uint32(16)
        sc = (warp >> uint32(1)) * uint32(SW)
        kr = (warp % uint32(WK)) * uint32(16)
        kc = (warp // uint32(WK)) * uint32(DW)
        qc = (warp >> uint32(1)) * uint32(QW)

        n = load_kv(Ks, 0, k, k_lay, hkv, c0, Nk, tid) + load_kv(Vs, 0, v, v_lay, hkv, c0, Nk, tid)
        if COUNT:
            nr += n * SB
        for j in range(DN):
            for e in range(4):
                dv_acc[j, e] = F32_ZERO
                dk_acc[j, e] = F32_ZERO

        i_first = first_visible_q_block(c0, Br, Nq, Nk, CAUSAL)
        n_i = (Nq + Br - 1) // Br - i_first
        for step in range(G * n_i):  # the query blocks of each query head of the group in turn
            bh, i = group_step(step, n_i, i_first, hkv, G)
            r0 = i * Br
            cuda.syncthreads()  # the previous step is done with Qs, dOs, Ps, dSs, Ls, Ds
            n = load_q(Qs, 0, q, q_lay, bh, r0, Nq, tid) + load_q(dOs, 0, do, do_lay, bh, r0, Nq, tid)
            n_stats = load_stats(Ls, Ds, lse, D, bh, r0, Nq, tid)
            if COUNT:
                nr += n * SB + n_stats * 4
            cuda.syncthreads()

            # S = Q_i K_j^T and dP = dO_i V_j^T: this warp's 16 x SW tile, k = 0, 16, .. (the forward's order)
            for j in range(SN):
                for e in range(4):
                    s[j, e] = F32_ZERO
                    dp[j, e] = F32_ZERO
            for kk in range(d // 16):
                a0, a1, a2, a3 = ld_a(Qs, sr, kk * 16, DS, lane)
                for nb in range(SN // 2):
                    b0, b1, b2, b3 = ld_b(Ks, sc + uint32(nb * 16), kk * 16, DS, lane)
                    s[2 * nb, 0], s[2 * nb, 1], s[2 * nb, 2], s[2 * nb, 3] = mma(
                        a0, a1, a2, a3, b0, b1, s[2 * nb, 0], s[2 * nb, 1], s[2 * nb, 2], s[2 * nb, 3])
                    s[2 * nb + 1, 0], s[2 * nb + 1, 1], s[2 * nb + 1, 2], s[2 * nb + 1, 3] = mma(
                        a0, a1, a2, a3, b2, b3, s[2 * nb + 1, 0], s[2 * nb + 1, 1], s[2 * nb + 1, 2],
                        s[2 * nb + 1, 3])
            for kk in range(d // 16):
                a0, a1, a2, a3 = ld_a(dOs, sr, kk * 16, DS, lane)
                for nb in range(SN // 2):
                    b0, b1, b2, b3 = ld_b(Vs, sc + uint32(nb * 16), kk * 16, DS, lane)
                    dp[2 * nb, 0], dp[2 * nb, 1], dp[2 * nb, 2], dp[2 * nb, 3] = mma(
                        a0, a1, a2, a3, b0, b1, dp[2 * nb, 0], dp[2 * nb, 1], dp[2 * nb, 2], dp[2 * nb, 3])
                    dp[2 * nb + 1, 0], dp[2 * nb + 1, 1], dp[2 * nb + 1, 2], dp[2 * nb + 1, 3] = mma(
                        a0, a1, a2, a3, b2, b3, dp[2 * nb + 1, 0], dp[2 * nb + 1, 1], dp[2 * nb + 1, 2],
                        dp[2 * nb + 1, 3])

            # P = exp2(S scale log2e - L), dS = P (Z dP - D), 0 where masked; Z P and dS to shared memory
            diagonal = CAUSAL and crosses_diagonal(r0, c0, Bc, Nq, Nk)
            edge = c0 + Bc > Nk or diagonal  # uniform over the block
            head = int64(drop_head(seed, bh))
            for h in range(2):
                rl = sr + g + uint32(8 * h)  # the lane's row of the tile
                L2 = Ls[rl]
                Dv = Ds[rl]
                lim = key_limit(r0 + int64(rl), c0 + int64(sc), Nq, Nk, CAUSAL)  # keys c0 + sc + x, x <= lim
                rk = int64(drop_row(head, r0 + int64(rl)))
                for j in range(SN):
                    for e in range(2):
                        x = uint32(8 * j + e) + 2 * t  # key c0 + sc + x
                        p = exp2_ieee(MUL_RN(scale_log2, s[j, 2 * h + e]) - L2)
                        zs = drop(rk, c0 + int64(sc + x), threshold, inv_keep)
                        ds = p * (zs * dp[j, 2 * h + e] - Dv)
                        if edge and int64(x) > lim:
                            p = F32_ZERO
                            ds = F32_ZERO
                        s[j, 2 * h + e] = p * zs
                        dp[j, 2 * h + e] = ds
                    # keys sc + 8 j + 2 t and + 1: rounded in pairs (one cvt.rn.bf16x2 in bfloat16, where one
                    # element's rounding in integer arithmetic took 8 instructions) and stored a word each
                    at = rl * uint32(PS) + sc + uint32(8 * j) + 2 * t
                    store_32(Ps, at, pack(s[j, 2 * h], s[j, 2 * h + 1]))
                    store_32(dSs, at, pack(dp[j, 2 * h], dp[j, 2 * h + 1]))
            cuda.syncthreads()

            # dV_j += (Z P)^T dO_i, dK_j += dS^T Q_i: this warp's 16 keys kr.., all d columns, k = the Br queries
            for kk in range(Br // 16):
                a0, a1, a2, a3 = ld_a_t(Ps, kr, kk * 16, PS, lane)
                for nb in range(DN // 2):
                    b0, b1, b2, b3 = ld_b_t(dOs, kk * 16, kc + uint32(nb * 16), DS, lane)
                    dv_acc[2 * nb, 0], dv_acc[2 * nb, 1], dv_acc[2 * nb, 2], dv_acc[2 * nb, 3] = mma(
                        a0, a1, a2, a3, b0, b1, dv_acc[2 * nb, 0], dv_acc[2 * nb, 1], dv_acc[2 * nb, 2],
                        dv_acc[2 * nb, 3])
                    dv_acc[2 * nb + 1, 0], dv_acc[2 * nb + 1, 1], dv_acc[2 * nb + 1, 2], dv_acc[2 * nb + 1, 3] = mma(
                        a0, a1, a2, a3, b2, b3, dv_acc[2 * nb + 1, 0], dv_acc[2 * nb + 1, 1], dv_acc[2 * nb + 1, 2],
                        dv_acc[2 * nb + 1, 3])
                if DN_ODD:
                    b0, b1, b2, b3 = ld_b_t1(dOs, kk * 16, kc + uint32(DW - 8), DS, lane)
                    dv_acc[DN - 1, 0], dv_acc[DN - 1, 1], dv_acc[DN - 1, 2], dv_acc[DN - 1, 3] = mma(
                        a0, a1, a2, a3, b0, b1, dv_acc[DN - 1, 0], dv_acc[DN - 1, 1], dv_acc[DN - 1, 2],
                        dv_acc[DN - 1, 3])
                a0, a1, a2, a3 = ld_a_t(dSs, kr, kk * 16, PS, lane)
                for nb in range(DN // 2):
                    b0, b1, b2, b3 = ld_b_t(Qs, kk * 16, kc + uint32(nb * 16), DS, lane)
                    dk_acc[2 * nb, 0], dk_acc[2 * nb, 1], dk_acc[2 * nb, 2], dk_acc[2 * nb, 3] = mma(
                        a0, a1, a2, a3, b0, b1, dk_acc[2 * nb, 0], dk_acc[2 * nb, 1], dk_acc[2 * nb, 2],
                        dk_acc[2 * nb, 3])
                    dk_acc[2 * nb + 1, 0], dk_acc[2 * nb + 1, 1], dk_acc[2 * nb + 1, 2], dk_acc[2 * nb + 1, 3] = mma(
                        a0, a1, a2, a3, b2, b3, dk_acc[2 * nb + 1, 0], dk_acc[2 * nb + 1, 1], dk_acc[2 * nb + 1, 2],
                        dk_acc[2 * nb + 1, 3])
                if DN_ODD:
                    b0, b1, b2, b3 = ld_b_t1(Qs, kk * 16, kc + uint32(DW - 8), DS, lane)
                    dk_acc[DN - 1, 0], dk_acc[DN - 1, 1], dk_acc[DN - 1, 2], dk_acc[DN - 1, 3] = mma(
                        a0, a1, a2, a3, b0, b1, dk_acc[DN - 1, 0], dk_acc[DN - 1, 1], dk_acc[DN - 1, 2],
                        dk_acc[DN - 1, 3])

            if ATOMIC_DQ:  # dQ_i += dS K_j: this warp's 16 rows sr.., columns qc .. qc + d/2, k = the Bc keys
                n_atomic += dq_step(dSs, Ks, sr, qc, lane, g, t, dq_acc, dq, bh, r0, Nq, scale)

        # dK_j = scale dS^T Q, dV_j: the lane's rows kr + g (+ 8), columns kc + 8 j + 2 t (+ 1)
        nw = 0
        for h in range(2):
            row = uint32(c0) + kr + g + uint32(8 * h)
            if row < uint32(Nk):
                for j in range(DN):
                    for e in range(2):
                        col = kc + uint32(8 * j + e) + 2 * t
                        dk[hkv, row, col] = from_f32(dk_acc[j, 2 * h + e] * scale)
                        dv[hkv, row, col] = from_f32(dv_acc[j, 2 * h + e])
                        if COUNT:
                            nw += 2 * SB
        if COUNT:
            add_counts(counter, nr + int64(n_atomic) * 4, int64(n_atomic) * 4 + nw)

    return _compiled(kernel, device)


def _dkdv_transposed(d: int, dtype_name: str, causal: bool, count: bool, k8: bool, atomic_dq: bool, dropout: bool,
                     dynamic: bool, aligned: bool, red2: bool, device: bool = False):
    """The dK/dV kernel up to d = 64: each warp owns 16 keys (kr = 16 warp ..) and computes S^T = K_j Q_i^T and
    dP^T = V_j dO_i^T for them, so that P^T and dS^T stay in registers.

    The accumulators of S^T (16 keys x Br queries, C layout) are, two n8 tiles joined, the A fragments of the
    k16 steps of (Z P)^T dO_i and dS^T Q_i (k = the queries): the forward's P V trick, here for both products,
    with no shared-memory round trip and no barrier between P and its use.  K_j and V_j are A operands of every
    step, ``ldmatrix`` from their shared tiles (kept in registers instead they took 174 registers a thread, two
    blocks an SM; so, 137: three).  S^T is bit-identical to the forward's S: each entry is the same chain of mma
    steps over the head dim with the same products (a tensor core's D[m][n] depends on row m of A and column n of
    B only; ``tests/test_mma.py`` checks it on the GPU).  With ``atomic_dq`` dS^T (rounded) also goes to
    shared memory (keys x queries), from where ``ldmatrix.trans`` hands dS to dQ_i += dS K_j as in
    :func:`_dkdv_shared`.
    """
    to_f32, from_f32, pack = _storage(dtype_name)
    ld_a, ld_a_t, ld_b, ld_b_t, mma = fragments(dtype_name, k8)
    Br, Bc = kv_block(d)
    assert Bc == 16 * NW
    DS, TS = stride(d), stride(Br)
    KD, QT, DN = d // 16, Br // 8, d // 8  # k16 steps of d; n8 tiles of S^T (queries), of dK and dV (columns)
    QW = d // 2  # dQ columns of a warp (2 x 2 warps over Br x d)
    QN = QW // 8
    store_32 = _mma.store_32
    ldx4, ldx4_t = _mma.ldmatrix_x4, _mma.ldmatrix_x4_trans
    CAUSAL, COUNT, ATOMIC_DQ = causal, count, atomic_dq
    dq_step = _atomic_dq(d, Bc, TS, True, dtype_name, k8, count, red2)
    SB = 2
    MUL_RN = rounded_mul("float32")
    NBUF = kv_buffers(k8)
    QSZ, SSZ = Br * DS, NBUF * Br  # elements of a Q_i (dO_i) buffer; of L_i (D_i) and its buffers
    block_tiles = _block_tiles(transposed_kv_tiles(d, k8, atomic_dq), dtype_name, dynamic)
    load_kv = tile_loader(Bc, d, dtype_name, count, aligned, not k8)
    load_q = tile_loader(Br, d, dtype_name, count, aligned, not k8)
    commit, wait_all = (_nothing, _nothing) if k8 else (_mma.cp_async_commit, _mma.cp_async_wait_all)
    drop_head, drop_row, drop = _dropout.factor(dropout, "float32")

    def kernel(q, k, v, do, lse, D, dk, dv, dq, Nq, Nk, G, scale, scale_log2, counter, q_lay, k_lay, v_lay,
               do_lay, seed, threshold, inv_keep):
        # row-major: K_j, V_j (Bc, DS); Q_i, dO_i (NBUF buffers of Br x DS); dS^T (Bc, TS) with atomic_dq (else 8
        # unused elements)
        Ks, Vs, Q2, dO2, dSt = block_tiles()
        Ls = cuda.shared.array(SSZ, float32)  # L_i in log2 units, a buffer of Br each
        Ds = cuda.shared.array(SSZ, float32)
        st = cuda.local.array((QT, 4), float32)  # S^T, then P^T
        dpt = cuda.local.array((QT, 4), float32)  # dP^T, then dS^T
        dv_acc = cuda.local.array((DN, 4), float32)
        dk_acc = cuda.local.array((DN, 4), float32)
        dq_acc = cuda.local.array((QN, 4), float32)

        tid = cuda.threadIdx.x
        lane = uint32(tid % 32)
        warp = uint32(tid // 32)
        g, t = lane >> uint32(2), lane & uint32(3)
        BHkv = uint32(dk.shape[0])
        tile = uint32(cuda.blockIdx.x) // BHkv
        hkv = int64(uint32(cuda.blockIdx.x) - tile * BHkv)
        c0 = int64(tile) * Bc
        nr = 0
        n_atomic = uint32(0)
        kr = warp * uint32(16)  # this warp's keys c0 + kr ..; the lane's: kr + g and kr + g + 8
        b_lane, bt_lane = lane_rows(DS, lane)
        # K_j's and V_j's A fragments (rows kr + lane % 16, columns 8 (lane / 16) ..): ldmatrix each step
        a_lane = (kr + (lane & uint32(15))) * uint32(DS) + (lane >> uint32(4)) * uint32(8)
        sr = (warp & uint32(1)) * uint32(16)  # dQ (atomic_dq): rows sr .., columns qc ..
        qc = (warp >> uint32(1)) * uint32(QW)

        n = load_kv(Ks, 0, k, k_lay, hkv, c0, Nk, tid) + load_kv(Vs, 0, v, v_lay, hkv, c0, Nk, tid)
        i_first = first_visible_q_block(c0, Br, Nq, Nk, CAUSAL)
        n_i = (Nq + Br - 1) // Br - i_first
        n_steps = G * n_i
        if NBUF == 2 and n_steps > 0:  # step 0's Q_i, dO_i into buffer 0, with K_j and V_j
            bh, i = group_step(0, n_i, i_first, hkv, G)
            n += load_q(Q2, 0, q, q_lay, bh, i * Br, Nq, tid) + load_q(dO2, 0, do, do_lay, bh, i * Br, Nq, tid)
            if tid < Br:
                row = i * Br + tid
                Ls[tid], Ds[tid] = read_stats(lse, D, bh, row if row < Nq else -1)
                if COUNT and row < Nq:
                    nr += 8
        commit()
        if COUNT:
            nr += n * SB
        wait_all()
        cuda.syncthreads()
        for j in range(DN):
            for e in range(4):
                dv_acc[j, e] = F32_ZERO
                dk_acc[j, e] = F32_ZERO

        # The pipeline (NBUF = 2, sm_80+): step s + 1's Q_i, dO_i load (cp.async) into the other buffer while step s
        # computes; its L_i, D_i are read into registers then and stored at the step's end.  A barrier after each
        # wait: every thread's copies have landed, and every warp is done with the buffer the next copies overwrite.
        # NBUF = 1 (the sm_75 path, no cp.async; a T4's shared memory): each step loads its own, between barriers.
        for step in range(n_steps):  # the query blocks of each query head of the group in turn
            bh, i = group_step(step, n_i, i_first, hkv, G)
            r0 = i * Br
            cur = uint32(step % NBUF)
            nxt = uint32((step + 1) % NBUF)
            wait_all()
            cuda.syncthreads()  # this step's buffer has landed; the previous step is done with the other (and dSt)
            Ln = POS_INF
            Dn = F32_ZERO
            if NBUF == 1 or step + 1 < n_steps:
                nbh, ni = group_step(step + NBUF - 1, n_i, i_first, hkv, G)  # NBUF = 1: this step
                n = load_q(Q2, nxt * uint32(QSZ), q, q_lay, nbh, ni * Br, Nq, tid) \
                    + load_q(dO2, nxt * uint32(QSZ), do, do_lay, nbh, ni * Br, Nq, tid)
                commit()
                if tid < Br:
                    row = ni * Br + tid
                    Ln, Dn = read_stats(lse, D, nbh, row if row < Nq else -1)
                    if COUNT and row < Nq:
                        nr += 8
                if COUNT:
                    nr += n * SB
            if NBUF == 1:
                if tid < Br:
                    Ls[tid] = Ln
                    Ds[tid] = Dn
                cuda.syncthreads()
            qo = cur * uint32(Br)  # this step's buffer: rows qo .. of Q2 and dO2, Ls[qo ..], Ds[qo ..]
            qb = b_lane + qo * uint32(DS)
            qbt = bt_lane + qo * uint32(DS)

            # S^T = K_j Q_i^T and dP^T = V_j dO_i^T: 16 keys x Br queries, k = 0, 16, .. (the forward's order)
            for j in range(QT):
                for e in range(4):
                    st[j, e] = F32_ZERO
                    dpt[j, e] = F32_ZERO
            for kk in range(KD):
                ka0, ka1, ka2, ka3 = ldx4(Ks, a_lane + uint32(kk * 16))
                for nb in range(QT // 2):
                    b0, b1, b2, b3 = ldx4(Q2, qb + uint32(nb * 16 * DS + kk * 16))
                    st[2 * nb, 0], st[2 * nb, 1], st[2 * nb, 2], st[2 * nb, 3] = mma(
                        ka0, ka1, ka2, ka3, b0, b1,
                        st[2 * nb, 0], st[2 * nb, 1], st[2 * nb, 2], st[2 * nb, 3])
                    st[2 * nb + 1, 0], st[2 * nb + 1, 1], st[2 * nb + 1, 2], st[2 * nb + 1, 3] = mma(
                        ka0, ka1, ka2, ka3, b2, b3,
                        st[2 * nb + 1, 0], st[2 * nb + 1, 1], st[2 * nb + 1, 2], st[2 * nb + 1, 3])
            for kk in range(KD):
                va0, va1, va2, va3 = ldx4(Vs, a_lane + uint32(kk * 16))
                for nb in range(QT // 2):
                    b0, b1, b2, b3 = ldx4(dO2, qb + uint32(nb * 16 * DS + kk * 16))
                    dpt[2 * nb, 0], dpt[2 * nb, 1], dpt[2 * nb, 2], dpt[2 * nb, 3] = mma(
                        va0, va1, va2, va3, b0, b1,
                        dpt[2 * nb, 0], dpt[2 * nb, 1], dpt[2 * nb, 2], dpt[2 * nb, 3])
                    dpt[2 * nb + 1, 0], dpt[2 * nb + 1, 1], dpt[2 * nb + 1, 2], dpt[2 * nb + 1, 3] = mma(
                        va0, va1, va2, va3, b2, b3,
                        dpt[2 * nb + 1, 0], dpt[2 * nb + 1, 1], dpt[2 * nb + 1, 2], dpt[2 * nb + 1, 3])

            # P^T = exp2(S^T scale log2e - L), dS^T = P^T (Z dP^T - D), 0 where masked; st <- Z P^T, dpt <- dS^T.
            # Entry (key kr + g + 8 h, query 8 j + 2 t + e) is st[j, 2 h + e]
            diagonal = CAUSAL and crosses_diagonal(r0, c0, Bc, Nq, Nk)
            edge = c0 + Bc > Nk or diagonal  # uniform over the block
            head = int64(drop_head(seed, bh))
            for j in range(QT):
                for e in range(2):
                    ql = uint32(8 * j + e) + 2 * t  # the query of the tile: r0 + ql
                    L2 = Ls[qo + ql]
                    Dv = Ds[qo + ql]
                    lim = key_limit(r0 + int64(ql), c0, Nq, Nk, CAUSAL)  # keys c0 + x, x <= lim
                    rk = int64(drop_row(head, r0 + int64(ql)))
                    for h in range(2):
                        x = kr + g + uint32(8 * h)  # key c0 + x
                        p = exp2_ieee(MUL_RN(scale_log2, st[j, 2 * h + e]) - L2)
                        zs = drop(rk, c0 + int64(x), threshold, inv_keep)
                        ds = p * (zs * dpt[j, 2 * h + e] - Dv)
                        if edge and int64(x) > lim:
                            p = F32_ZERO
                            ds = F32_ZERO
                        st[j, 2 * h + e] = p * zs
                        dpt[j, 2 * h + e] = ds

            # dV_j += (Z P)^T dO_i, dK_j += dS^T Q_i: A from the accumulators (rounded to the storage type, packed),
            # k = the Br queries, 16 a step
            for kk in range(Br // 16):
                a0 = pack(st[2 * kk, 0], st[2 * kk, 1])
                a1 = pack(st[2 * kk, 2], st[2 * kk, 3])
                a2 = pack(st[2 * kk + 1, 0], st[2 * kk + 1, 1])
                a3 = pack(st[2 * kk + 1, 2], st[2 * kk + 1, 3])
                for nb in range(DN // 2):
                    b0, b1, b2, b3 = ldx4_t(dO2, qbt + uint32(kk * 16 * DS + nb * 16))
                    dv_acc[2 * nb, 0], dv_acc[2 * nb, 1], dv_acc[2 * nb, 2], dv_acc[2 * nb, 3] = mma(
                        a0, a1, a2, a3, b0, b1, dv_acc[2 * nb, 0], dv_acc[2 * nb, 1], dv_acc[2 * nb, 2],
                        dv_acc[2 * nb, 3])
                    dv_acc[2 * nb + 1, 0], dv_acc[2 * nb + 1, 1], dv_acc[2 * nb + 1, 2], dv_acc[2 * nb + 1, 3] = mma(
                        a0, a1, a2, a3, b2, b3, dv_acc[2 * nb + 1, 0], dv_acc[2 * nb + 1, 1], dv_acc[2 * nb + 1, 2],
                        dv_acc[2 * nb + 1, 3])
                a0 = pack(dpt[2 * kk, 0], dpt[2 * kk, 1])
                a1 = pack(dpt[2 * kk, 2], dpt[2 * kk, 3])
                a2 = pack(dpt[2 * kk + 1, 0], dpt[2 * kk + 1, 1])
                a3 = pack(dpt[2 * kk + 1, 2], dpt[2 * kk + 1, 3])
                if ATOMIC_DQ:  # dS^T rounded, two queries a word: keys kr + g (+ 8), queries 16 kk + 2 t (+ 8)
                    for h in range(2):
                        at = (kr + g + uint32(8 * h)) * uint32(TS) + uint32(16 * kk) + 2 * t
                        store_32(dSt, at, a0 if h == 0 else a1)
                        store_32(dSt, at + uint32(8), a2 if h == 0 else a3)
                for nb in range(DN // 2):
                    b0, b1, b2, b3 = ldx4_t(Q2, qbt + uint32(kk * 16 * DS + nb * 16))
                    dk_acc[2 * nb, 0], dk_acc[2 * nb, 1], dk_acc[2 * nb, 2], dk_acc[2 * nb, 3] = mma(
                        a0, a1, a2, a3, b0, b1, dk_acc[2 * nb, 0], dk_acc[2 * nb, 1], dk_acc[2 * nb, 2],
                        dk_acc[2 * nb, 3])
                    dk_acc[2 * nb + 1, 0], dk_acc[2 * nb + 1, 1], dk_acc[2 * nb + 1, 2], dk_acc[2 * nb + 1, 3] = mma(
                        a0, a1, a2, a3, b2, b3, dk_acc[2 * nb + 1, 0], dk_acc[2 * nb + 1, 1], dk_acc[2 * nb + 1, 2],
                        dk_acc[2 * nb + 1, 3])

            if ATOMIC_DQ:  # dQ_i += dS K_j: this warp's 16 rows sr.., columns qc .. qc + d/2, k = the Bc keys
                cuda.syncthreads()  # every warp's dS^T is in dSt
                n_atomic += dq_step(dSt, Ks, sr, qc, lane, g, t, dq_acc, dq, bh, r0, Nq, scale)
            if NBUF == 2 and tid < Br:  # the next step's L_i, D_i into the buffer no warp reads in this step
                Ls[nxt * uint32(Br) + uint32(tid)] = Ln
                Ds[nxt * uint32(Br) + uint32(tid)] = Dn

        # dK_j = scale dS^T Q, dV_j: the lane's rows kr + g (+ 8), columns 8 j + 2 t (+ 1)
        nw = 0
        for h in range(2):
            row = uint32(c0) + kr + g + uint32(8 * h)
            if row < uint32(Nk):
                for j in range(DN):
                    for e in range(2):
                        col = uint32(8 * j + e) + 2 * t
                        dk[hkv, row, col] = from_f32(dk_acc[j, 2 * h + e] * scale)
                        dv[hkv, row, col] = from_f32(dv_acc[j, 2 * h + e])
                        if COUNT:
                            nw += 2 * SB
        if COUNT:
            add_counts(counter, nr + int64(n_atomic) * 4, int64(n_atomic) * 4 + nw)

    return _compiled(kernel, device)


@lru_cache(maxsize=None)
def dq_kernel(d: int, dtype_name: str, causal: bool, count: bool, k8: bool = False, dropout: bool = False,
              dynamic: bool = False, aligned: bool = False, device: bool = False):
    """The dQ kernel of the deterministic backward: D_i and dQ_i for one query block of Br = 64 rows.

    Arguments ``(q, k, v, do, o, lse, D, dq, Nq, Nk, G, scale, scale_log2, counter, q_lay, k_lay, v_lay, do_lay,
    o_lay, seed, threshold, inv_keep)``; D written (for the dK/dV kernel).  A 1-D grid of Tr * B*H blocks, the
    last (longest, causal) row tiles first.  ``device``: a device function for :func:`backward_kernel`, which
    reads D (written by :func:`d_kernel`; o and o_lay unused) and takes its row tile and head from
    ``blockIdx.x`` and B*H = ``dq.shape[0]`` (its grid is wider than Tr * B*H).
    """
    assert d % 16 == 0 and 16 <= d <= 128
    to_f32, from_f32, pack = _storage(dtype_name)
    ld_a, _, _, _, mma = fragments(dtype_name, k8)
    Br, Bc = q_block(d)
    DS = stride(d)
    KN, DN, KD = Bc // 8, d // 8, d // 16  # n8 tiles of S (16 x Bc a warp), of dQ (16 x d a warp); k16 steps of d
    CAUSAL, COUNT = causal, count
    SB = 2
    MUL_RN = rounded_mul("float32")
    NBUF = kv_buffers(k8)
    block_tiles = _block_tiles(q_tiles(d, k8), dtype_name, dynamic)
    load_q = tile_loader(Br, d, dtype_name, count, aligned)
    load_kv = tile_loader(Bc, d, dtype_name, count, aligned, not k8)
    commit, wait_all = (_nothing, _nothing) if k8 else (_mma.cp_async_commit, _mma.cp_async_wait_all)
    ldx4, ldx4_t = _mma.ldmatrix_x4, _mma.ldmatrix_x4_trans
    drop_head, drop_row, drop = _dropout.factor(dropout, "float32")
    DEVICE = device

    def kernel(q, k, v, do, o, lse, D, dq, Nq, Nk, G, scale, scale_log2, counter, q_lay, k_lay, v_lay, do_lay,
               o_lay, seed, threshold, inv_keep):
        # Q_i, dO_i until they are in registers (A fragments), then K_j, V_j in the same memory (NBUF buffers each)
        Qs, dOs = block_tiles()
        K2, V2 = Qs, dOs
        Ls = cuda.shared.array(Br, float32)
        Ds = cuda.shared.array(Br, float32)
        qa = cuda.local.array((KD, 4), uint32)  # Q_i's A fragments (this warp's 16 rows), all of d
        da = cuda.local.array((KD, 4), uint32)  # dO_i's
        s = cuda.local.array((KN, 4), float32)
        dp = cuda.local.array((KN, 4), float32)
        dq_acc = cuda.local.array((DN, 4), float32)

        tid = cuda.threadIdx.x
        lane = uint32(tid % 32)
        warp = uint32(tid // 32)
        g, t = lane >> uint32(2), lane & uint32(3)
        if DEVICE:  # the fused grid's x runs past Tr * B*H: the head count from dq
            BHq = uint32(dq.shape[0])
            tile_q = uint32(cuda.blockIdx.x) // BHq
            bh = uint32(cuda.blockIdx.x) - tile_q * BHq
            r0 = (int64((uint32(Nq) + uint32(Br - 1)) // uint32(Br)) - 1 - int64(tile_q)) * Br
        else:
            r0, bh = last_tile_first(Nq, Br)
        hkv = kv_head(bh, G)
        sr = warp * uint32(16)
        b_lane, bt_lane = lane_rows(DS, lane)
        nr = nw = 0

        n = load_q(Qs, 0, q, q_lay, bh, r0, Nq, tid) + load_q(dOs, 0, do, do_lay, bh, r0, Nq, tid)
        if COUNT:
            nr += n * SB
        cuda.syncthreads()
        # D_i = rowsum(dO_i * O_i), L_i: thread r sums row r0 + r over its columns in order (deterministic)
        if tid < Br:
            Dr = F32_ZERO
            Lr = POS_INF
            row = uint32(r0) + uint32(tid)
            if row < uint32(Nq):
                if DEVICE:
                    Dr = D[uint32(bh), row]
                    if COUNT:
                        nr += 8  # D_i and L_i
                else:
                    o0 = head_starts(o_lay, o_lay, bh)[0] + uint64(row * uint32(o_lay[3]))
                    for x in range(d):
                        Dr += to_f32(dOs[uint32(tid * DS + x)]) * to_f32(o[o0 + uint64(x)])
                    D[uint32(bh), row] = Dr
                    if COUNT:
                        nr += d * SB + 4
                        nw += 4
                Lr = lse[uint32(bh), row] * float32(LOG2E)
            Ds[tid] = Dr
            Ls[tid] = Lr
        for kk in range(KD):
            qa[kk, 0], qa[kk, 1], qa[kk, 2], qa[kk, 3] = ld_a(Qs, sr, kk * 16, DS, lane)
            da[kk, 0], da[kk, 1], da[kk, 2], da[kk, 3] = ld_a(dOs, sr, kk * 16, DS, lane)
        for j in range(DN):
            for e in range(4):
                dq_acc[j, e] = F32_ZERO
        cuda.syncthreads()
        L2a, L2b = Ls[sr + g], Ls[sr + g + uint32(8)]
        Da, Db = Ds[sr + g], Ds[sr + g + uint32(8)]
        head = int64(drop_head(seed, bh))
        rka = int64(drop_row(head, r0 + int64(sr + g)))
        rkb = int64(drop_row(head, r0 + int64(sr + g + uint32(8))))

        # The pipeline (NBUF = 2, sm_80+): K_{j+1}, V_{j+1} load (cp.async) into the other buffer while block j
        # computes; a barrier after each wait (every thread's copies have landed; every warp is done with the buffer
        # the next copies overwrite).  NBUF = 1 (sm_75): each block loads its own between barriers.
        n_blocks = visible_kv_blocks(r0, Br, Bc, Nq, Nk, CAUSAL)
        if NBUF == 2 and n_blocks > 0:  # block 0 into buffer 0: every warp is done with Q_i, dO_i (the barrier above)
            n = load_kv(K2, 0, k, k_lay, hkv, 0, Nk, tid) + load_kv(V2, 0, v, v_lay, hkv, 0, Nk, tid)
            commit()
            if COUNT:
                nr += n * SB
        for jb in range(n_blocks):
            c0 = jb * Bc
            cur = uint32(jb % NBUF)
            wait_all()
            cuda.syncthreads()  # block j's buffer has landed; the previous step is done with the other one
            if NBUF == 1 or jb + 1 < n_blocks:
                at = uint32((jb + 1) % NBUF) * uint32(Bc * DS)
                cn = c0 + (NBUF - 1) * Bc  # NBUF = 1: this block
                n = load_kv(K2, at, k, k_lay, hkv, cn, Nk, tid) + load_kv(V2, at, v, v_lay, hkv, cn, Nk, tid)
                commit()
                if COUNT:
                    nr += n * SB
            if NBUF == 1:
                cuda.syncthreads()
            kb = b_lane + cur * uint32(Bc * DS)  # this block's buffer: ldmatrix rows of K_j, V_j
            kbt = bt_lane + cur * uint32(Bc * DS)

            for j in range(KN):
                for e in range(4):
                    s[j, e] = F32_ZERO
                    dp[j, e] = F32_ZERO
            for kk in range(KD):  # S = Q_i K_j^T, k = 0, 16, .. (the forward's order)
                for nb in range(KN // 2):
                    b0, b1, b2, b3 = ldx4(K2, kb + uint32(nb * 16 * DS + kk * 16))
                    s[2 * nb, 0], s[2 * nb, 1], s[2 * nb, 2], s[2 * nb, 3] = mma(
                        qa[kk, 0], qa[kk, 1], qa[kk, 2], qa[kk, 3], b0, b1,
                        s[2 * nb, 0], s[2 * nb, 1], s[2 * nb, 2], s[2 * nb, 3])
                    s[2 * nb + 1, 0], s[2 * nb + 1, 1], s[2 * nb + 1, 2], s[2 * nb + 1, 3] = mma(
                        qa[kk, 0], qa[kk, 1], qa[kk, 2], qa[kk, 3], b2, b3,
                        s[2 * nb + 1, 0], s[2 * nb + 1, 1], s[2 * nb + 1, 2], s[2 * nb + 1, 3])
            for kk in range(KD):  # dP = dO_i V_j^T
                for nb in range(KN // 2):
                    b0, b1, b2, b3 = ldx4(V2, kb + uint32(nb * 16 * DS + kk * 16))
                    dp[2 * nb, 0], dp[2 * nb, 1], dp[2 * nb, 2], dp[2 * nb, 3] = mma(
                        da[kk, 0], da[kk, 1], da[kk, 2], da[kk, 3], b0, b1,
                        dp[2 * nb, 0], dp[2 * nb, 1], dp[2 * nb, 2], dp[2 * nb, 3])
                    dp[2 * nb + 1, 0], dp[2 * nb + 1, 1], dp[2 * nb + 1, 2], dp[2 * nb + 1, 3] = mma(
                        da[kk, 0], da[kk, 1], da[kk, 2], da[kk, 3], b2, b3,
                        dp[2 * nb + 1, 0], dp[2 * nb + 1, 1], dp[2 * nb + 1, 2], dp[2 * nb + 1, 3])

            # dS = P (Z dP - D), in place of S, 0 where masked
            diagonal = CAUSAL and crosses_diagonal(r0, c0, Bc, Nq, Nk)
            edge = c0 + Bc > Nk or diagonal
            for h in range(2):
                rl = sr + g + uint32(8 * h)
                L2 = L2a if h == 0 else L2b
                Dv = Da if h == 0 else Db
                rk = rka if h == 0 else rkb
                lim = key_limit(r0 + int64(rl), c0, Nq, Nk, CAUSAL)
                for j in range(KN):
                    for e in range(2):
                        x = uint32(8 * j + e) + 2 * t
                        p = exp2_ieee(MUL_RN(scale_log2, s[j, 2 * h + e]) - L2)
                        zs = drop(rk, c0 + int64(x), threshold, inv_keep)
                        ds = p * (zs * dp[j, 2 * h + e] - Dv)
                        if edge and int64(x) > lim:
                            ds = F32_ZERO
                        s[j, 2 * h + e] = ds

            # dQ_i += dS K_j: dS's accumulators, two n8 tiles joined, are the A fragment of a k16 step
            for kk in range(KN // 2):
                a0 = pack(s[2 * kk, 0], s[2 * kk, 1])
                a1 = pack(s[2 * kk, 2], s[2 * kk, 3])
                a2 = pack(s[2 * kk + 1, 0], s[2 * kk + 1, 1])
                a3 = pack(s[2 * kk + 1, 2], s[2 * kk + 1, 3])
                for nb in range(DN // 2):
                    b0, b1, b2, b3 = ldx4_t(K2, kbt + uint32(kk * 16 * DS + nb * 16))
                    dq_acc[2 * nb, 0], dq_acc[2 * nb, 1], dq_acc[2 * nb, 2], dq_acc[2 * nb, 3] = mma(
                        a0, a1, a2, a3, b0, b1, dq_acc[2 * nb, 0], dq_acc[2 * nb, 1], dq_acc[2 * nb, 2],
                        dq_acc[2 * nb, 3])
                    dq_acc[2 * nb + 1, 0], dq_acc[2 * nb + 1, 1], dq_acc[2 * nb + 1, 2], dq_acc[2 * nb + 1, 3] = mma(
                        a0, a1, a2, a3, b2, b3, dq_acc[2 * nb + 1, 0], dq_acc[2 * nb + 1, 1], dq_acc[2 * nb + 1, 2],
                        dq_acc[2 * nb + 1, 3])

        for h in range(2):
            row = uint32(r0) + sr + g + uint32(8 * h)
            if row < uint32(Nq):
                for j in range(DN):
                    for e in range(2):
                        col = uint32(8 * j + e) + 2 * t
                        dq[bh, row, col] = from_f32(dq_acc[j, 2 * h + e] * scale)
                        if COUNT:
                            nw += SB
        if COUNT:
            add_counts(counter, nr, nw)

    return _compiled(kernel, device)


def _compiled(kernel, device: bool):
    """``kernel`` (a Python function) compiled as a kernel, or with ``device`` as an inlined device function."""
    if device:
        return jit(device=True, forceinline=True, fastmath=FASTMATH)(kernel)
    return jit(fastmath=FASTMATH)(kernel)


@lru_cache(maxsize=None)
def backward_kernel(d: int, dtype_name: str, causal: bool, count: bool, k8: bool = False, dropout: bool = False,
                    aligned: bool = False):
    """The deterministic backward's dQ and dK/dV in one launch (after :func:`d_kernel` has written D).

    A grid ``(max(Tr * B*H, Tc * B*Hkv), 2)``: row y = 0 runs the dQ kernel's blocks (:func:`dq_kernel`, x < n_q),
    row y = 1 the dK/dV kernel's (:func:`dkdv_kernel`, x < n_kv); both read D and nothing of the other's.  Why one
    launch: a launch's last wave runs part-full while the next launch waits.  Measured on the H200 at N = 4096,
    d = 64 float16 (benchmarks/results/h200-2026-12-02-backward-one-launch/): the dK/dV kernel's 2,048 blocks at
    B*H = 32, 3 an SM, are 5.17 waves of 396, and it took 0.99 / 1.42 / 1.47 / 1.71 ms at B*H = 24 / 32 / 36 / 40
    (4, 6, 6, 7 waves: its time steps with the waves, each launch timed with host work included); one launch of
    both kernels' 4,096 blocks has one tail instead of two (forward + backward 2.87 -> 2.72-2.75 ms).  The
    tiles of both are dynamic shared memory (one array, aliased: a block runs one of the two), the larger
    of the two a block.

    Arguments ``(q, k, v, do, lse, D, dq, dk, dv, Nq, Nk, G, scale, scale_log2, counter, q_lay, k_lay, v_lay,
    do_lay, seed, threshold, inv_keep, n_q, n_kv)``.
    """
    dq_part = dq_kernel(d, dtype_name, causal, count, k8, dropout, True, aligned, True)
    kv_part = dkdv_kernel(d, dtype_name, causal, count, k8, False, dropout, True, aligned, False, True)

    def kernel(q, k, v, do, lse, D, dq, dk, dv, Nq, Nk, G, scale, scale_log2, counter, q_lay, k_lay, v_lay,
               do_lay, seed, threshold, inv_keep, n_q, n_kv):
        if cuda.blockIdx.y == 0:
            if cuda.blockIdx.x < n_q:
                dq_part(q, k, v, do, do, lse, D, dq, Nq, Nk, G, scale, scale_log2, counter, q_lay, k_lay, v_lay,
                        do_lay, do_lay, seed, threshold, inv_keep)
        elif cuda.blockIdx.x < n_kv:
            kv_part(q, k, v, do, lse, D, dk, dv, dq, Nq, Nk, G, scale, scale_log2, counter, q_lay, k_lay, v_lay,
                    do_lay, seed, threshold, inv_keep)

    return jit(fastmath=FASTMATH)(kernel)


@lru_cache(maxsize=None)
def d_kernel(d: int, dtype_name: str, count: bool, zero: bool = True):
    """D = rowsum(dO * O) and (``zero``, the atomic backward) the float32 dQ accumulator zeroed: one launch.

    Arguments ``(o, do, D, dq_acc, Nq, counter, o_lay, do_lay)`` (dq_acc untouched without ``zero``); a 1-D grid
    of ceil(Nq / 8) * B*H blocks of 128 threads, 8 rows a block, 16 lanes a row (columns 16 apart; the row's 16
    partial sums added in a fixed order with shuffles: deterministic)."""
    to_f32, _, _ = _storage(dtype_name)
    COUNT, SB, ZERO = count, 2, zero
    STEPS = -(-d // D_TX)

    def kernel(o, do, D, dq_acc, Nq, counter, o_lay, do_lay):
        tid = cuda.threadIdx.x
        r0, bh = last_tile_first(Nq, D_ROWS)
        row = uint32(r0) + uint32(tid // D_TX)
        x0 = uint32(tid % D_TX)
        part = F32_ZERO
        nr = nw = 0
        if row < uint32(Nq):
            o0, d0 = head_starts(o_lay, do_lay, bh)
            o0 += uint64(row * uint32(o_lay[3]))
            d0 += uint64(row * uint32(do_lay[3]))
            for u in range(STEPS):
                x = x0 + uint32(u * D_TX)
                if x < uint32(d):
                    part += to_f32(do[d0 + uint64(x)]) * to_f32(o[o0 + uint64(x)])
                    if ZERO:
                        dq_acc[bh, row, x] = F32_ZERO
                    if COUNT:
                        nr += 2 * SB
                        if ZERO:
                            nw += 4
        for m in (8, 4, 2, 1):  # the 16 lanes of the row
            part += cuda.shfl_xor_sync(0xFFFFFFFF, part, m)
        if row < uint32(Nq) and x0 == uint32(0):
            D[bh, row] = part
            if COUNT:
                nw += 4
        if COUNT:
            add_counts(counter, nr, nw)

    return jit(fastmath=FASTMATH)(kernel)


@lru_cache(maxsize=None)
def cast_kernel(dtype_name: str, count: bool):
    """dq = dq_acc (float32) in the storage type, element by element."""
    _, from_f32, _ = _storage(dtype_name)
    COUNT = count

    def kernel(src, dst, n, counter):
        i = cuda.grid(1)
        if i < n:
            dst[i] = from_f32(src[i])
            if COUNT:
                cuda.atomic.add(counter, 0, 4)
                cuda.atomic.add(counter, 1, 2)

    return jit()(kernel)


# ---------------------------------------------------------------- launches


def _dynamic_bytes(nbytes_tiles: int) -> int:
    """Bytes of dynamic shared memory of a kernel whose 16-bit tiles take ``nbytes_tiles`` (0: static)."""
    return nbytes_tiles if _smem.is_dynamic(nbytes_tiles) else 0


def kv_tile_bytes(d: int) -> int:
    """Bytes of the dK/dV kernel's 16-bit tiles (its L_i, D_i are static: 8 Br bytes more, 16 Br double-buffered)."""
    return kv_shared_bytes(d) - (16 if transposed(d) else 8) * kv_block(d)[0]


def q_tile_bytes(d: int) -> int:
    """Bytes of the dQ kernel's 16-bit tiles."""
    return q_shared_bytes(d) - 8 * Q_BR


def q_tiles(d: int, k8: bool) -> tuple[int, int]:
    """Elements of the dQ kernel's two 16-bit tiles: rows max(NBUF Bc, Br) each (NBUF buffers of K_j and of V_j,
    or first Q_i and dO_i) of d + 8."""
    Br, Bc = q_block(d)
    rows = max(kv_buffers(k8) * Bc, Br)
    return rows * stride(d), rows * stride(d)


def transposed_kv_tiles(d: int, k8: bool, atomic_dq: bool) -> tuple[int, ...]:
    """Elements of the transposed dK/dV kernel's 16-bit tiles (up to d = 64): K_j, V_j (Bc rows); NBUF buffers of
    Q_i and of dO_i (Br rows); dS^T (Bc x (Br + 8)) with ``atomic_dq``, else 8 unused."""
    Br, Bc = kv_block(d)
    DS, nbuf = stride(d), kv_buffers(k8)
    return Bc * DS, Bc * DS, nbuf * Br * DS, nbuf * Br * DS, Bc * stride(Br) if atomic_dq else 8


def backward_tile_bytes(d: int, k8: bool) -> int:
    """Dynamic shared memory of :func:`backward_kernel` (up to d = 64): the larger of the two kernels' tiles (a
    block runs one), on the sm_80 path or (``k8``) the sm_75 path's single buffers."""
    return max(_smem.total_bytes(q_tiles(d, k8), 2), _smem.total_bytes(transposed_kv_tiles(d, k8, False), 2))


def grids(prob) -> dict:
    """The 1-D grid of each backward launch, by launch name."""
    n = prob.BH * prob.Nq * prob.d
    Bc = kv_block(prob.d)[1]
    kv = head_grid(-(-prob.Nk // Bc), prob.BHkv)
    q = head_grid(-(-prob.Nq // Q_BR), prob.BH)
    d_rows = head_grid(-(-prob.Nq // D_ROWS), prob.BH)
    return {BACKWARD_Q_NAME: q, BACKWARD_KV_NAME: kv, BACKWARD_KVQ_NAME: kv, BACKWARD_NAME: (max(q, kv), 2),
            D_NAME: d_rows, D_ZERO_NAME: d_rows, CAST_DQ_NAME: head_grid(-(-n // ELEMWISE_THREADS), 1)}


def _inputs_of(prob, ops):
    """(q, k, v, do, their layouts, dk, dv, aligned): q, k, v, do flat; ``aligned``: every row of them starts on
    16 bytes (the kernels' 16-byte tile loads)."""
    from ... import _inputs, _views

    (q, q_lay), (k, k_lay), (v, v_lay), (do, do_lay) = (_views.flat_input(ops[name].dev, name)
                                                        for name in ("q", "k", "v", "do"))
    dk = _inputs.empty((prob.BHkv, prob.Nk, prob.d), prob.dtype)
    dv = _inputs.empty((prob.BHkv, prob.Nk, prob.d), prob.dtype)
    aligned = all(_vec.aligned16(x, lay) for x, lay in ((q, q_lay), (k, k_lay), (v, v_lay), (do, do_lay)))
    return q, k, v, do, (q_lay, k_lay, v_lay, do_lay), dk, dv, aligned


def one_launch(d: int, causal: bool) -> bool:
    """Whether the deterministic backward runs its dQ and dK/dV blocks in one launch (:func:`backward_kernel`): up
    to d = 64 without a causal mask, where the two kernels take about as many registers (sm_90, float16: 166 and
    137, one launch 168; three blocks an SM either way).  Above d = 64 the dQ kernel's registers (about 230 at
    d = 128) would halve the dK/dV blocks an SM (128 registers, four).  Causal: measured slower in one launch on the
    H200 (harness of 2026-12-02, N = 4096, d = 64, float16: 1.694 ms against 1.508 in two; N = 16384: 23.93 against
    20.89), whose causal build takes 173 registers (two blocks an SM, not three), while two launches ordered
    heaviest blocks first already fill each other's tails with light blocks.  Otherwise two launches, the dQ
    kernel's first (it writes D)."""
    return transposed(d) and not causal


def run_backward(prob, ops, counters, k8: bool):
    """dQ, dK, dV, deterministic: up to d = 64 (:func:`one_launch`) D (:func:`d_kernel`), then the dQ and dK/dV
    kernels' blocks in one launch (:func:`backward_kernel`); above, the dQ kernel (which writes D), then the dK/dV
    kernel."""
    from ... import _inputs, _views

    name, count = prob.dtype_name, counters.enabled
    q, k, v, do, lays, dk, dv, aligned = _inputs_of(prob, ops)
    o, o_lay = _views.flat_input(ops["o"].dev, "o")
    dropout, drop_args = _dropout.launch_args(prob)
    grid = grids(prob)
    scale, scale_log2 = np.float32(prob.scale), np.float32(prob.scale * LOG2E)
    D = _inputs.empty((prob.BH, prob.Nq), np.float32)
    dq = _inputs.empty((prob.BH, prob.Nq, prob.d), prob.dtype)
    if not one_launch(prob.d, prob.causal):
        q_dyn = _dynamic_bytes(q_tile_bytes(prob.d))
        qk = dq_kernel(prob.d, name, prob.causal, count, k8, dropout, bool(q_dyn), aligned)
        launch(qk, grid[BACKWARD_Q_NAME], NT, q_dyn)(
            q, k, v, do, o, ops["lse"].dev, D, dq, prob.Nq, prob.Nk, prob.G, scale, scale_log2,
            counters.array(BACKWARD_Q_NAME), *lays, o_lay, *drop_args)
        kv_dyn = _dynamic_bytes(kv_tile_bytes(prob.d))
        kv = dkdv_kernel(prob.d, name, prob.causal, count, k8, False, dropout, bool(kv_dyn), aligned)
        launch(kv, grid[BACKWARD_KV_NAME], NT, kv_dyn)(
            q, k, v, do, ops["lse"].dev, D, dk, dv, _unused_dq(), prob.Nq, prob.Nk, prob.G, scale, scale_log2,
            counters.array(BACKWARD_KV_NAME), *lays, *drop_args)
        return dq, dk, dv
    launch(d_kernel(prob.d, name, count, False), grid[D_NAME], NT)(o, do, D, _unused_dq(), prob.Nq,
                                                                   counters.array(D_NAME), o_lay, lays[3])
    n_q = grid[BACKWARD_Q_NAME]
    n_kv = grid[BACKWARD_KV_NAME]
    launch(backward_kernel(prob.d, name, prob.causal, count, k8, dropout, aligned), grid[BACKWARD_NAME], NT,
           backward_tile_bytes(prob.d, k8))(
        q, k, v, do, ops["lse"].dev, D, dq, dk, dv, prob.Nq, prob.Nk, prob.G, scale, scale_log2,
        counters.array(BACKWARD_NAME), *lays, *drop_args, n_q, n_kv)
    return dq, dk, dv


def run_backward_atomic(prob, ops, counters, k8: bool):
    """dQ, dK, dV with dQ by float32 atomics (``deterministic=False``): D and the zeroed accumulator, the dK/dV/dQ
    kernel, the cast of dQ to the storage type."""
    from ... import _inputs, _views

    name, count = prob.dtype_name, counters.enabled
    q, k, v, do, lays, dk, dv, aligned = _inputs_of(prob, ops)
    o, o_lay = _views.flat_input(ops["o"].dev, "o")
    dropout, drop_args = _dropout.launch_args(prob)
    grid = grids(prob)
    scale, scale_log2 = np.float32(prob.scale), np.float32(prob.scale * LOG2E)
    n = prob.BH * prob.Nq * prob.d
    D = _inputs.empty((prob.BH, prob.Nq), np.float32)
    dq_acc = _inputs.empty((prob.BH, prob.Nq, prob.d), np.float32)
    launch(d_kernel(prob.d, name, count), grid[D_ZERO_NAME], NT)(o, do, D, dq_acc, prob.Nq,
                                                                 counters.array(D_ZERO_NAME), o_lay, lays[3])
    kv_dyn = _dynamic_bytes(kv_tile_bytes(prob.d))
    kv = dkdv_kernel(prob.d, name, prob.causal, count, k8, True, dropout, bool(kv_dyn), aligned, vector_red())
    launch(kv, grid[BACKWARD_KVQ_NAME], NT, kv_dyn)(
        q, k, v, do, ops["lse"].dev, D, dk, dv, dq_acc, prob.Nq, prob.Nk, prob.G, scale, scale_log2,
        counters.array(BACKWARD_KVQ_NAME), *lays, *drop_args)
    dq = _inputs.empty((prob.BH, prob.Nq, prob.d), prob.dtype)
    launch(cast_kernel(name, count), grid[CAST_DQ_NAME], ELEMWISE_THREADS)(dq_acc.reshape(n), dq.reshape(n), n,
                                                                          counters.array(CAST_DQ_NAME))
    return dq, dk, dv


def vector_red() -> bool:
    """Whether this GPU has ``red.global.add.v2.f32`` (cc >= 9.0; the simulator: its stand-in, so the tests run the
    H200's code)."""
    from ...device import SIMULATOR, info

    return SIMULATOR or tuple(info().compute_capability) >= (9, 0)


def _unused_dq():
    """The ``dq`` argument of the deterministic dK/dV kernel, which never touches it (one per context)."""
    from ... import _launch_plan
    from ...device import SIMULATOR

    key = 0 if SIMULATOR else id(cuda.current_context())
    if key not in _UNUSED:
        _UNUSED[key] = _launch_plan.persistent(cuda.device_array((1, 1, 1), dtype=np.float32))
    return _UNUSED[key]


_UNUSED: dict = {}


# ---------------------------------------------------------------- IO model


def io_backward(BH, Nq, Nk, d, dtype, causal=False, G=1) -> dict:
    """Bytes (read, written) of the deterministic backward's launches, by name: what they count.  Up to d = 64
    (:func:`one_launch`) D: O and dO read, D written; the one launch of dQ and dK/dV (:func:`backward_kernel`):
    the dQ blocks read Q_i, dO_i, L_i, D_i once and K_j, V_j per visited key, and write dQ; the dK/dV blocks as
    :func:`_kv_bytes`.  Above: the dQ kernel reads O_i instead of D_i and writes D_i."""
    from ...iomodel.flash2_fast import visited_keys

    s, a = np.dtype(dtype).itemsize, 4
    keys = visited_keys(Nq, Nk, *q_block(d), causal)
    kv = _kv_bytes(BH, Nq, Nk, d, s, causal, G)
    if not one_launch(d, causal):  # the dQ kernel reads O_i and writes D_i
        dq = (BH * ((3 * s * d + a) * Nq + 2 * s * d * keys), BH * (s * d + a) * Nq)
        return {BACKWARD_Q_NAME: dq, BACKWARD_KV_NAME: kv}
    dq_read, dq_written = BH * ((2 * s * d + 2 * a) * Nq + 2 * s * d * keys), BH * s * d * Nq
    return {D_NAME: (BH * 2 * s * d * Nq, BH * a * Nq), BACKWARD_NAME: (dq_read + kv[0], dq_written + kv[1])}


def _kv_bytes(BH, Nq, Nk, d, s, causal, G):
    """(read, written) of the dK/dV kernel without atomics: K_j, V_j once; Q_i, dO_i, L_i, D_i per visited pair
    (``s`` bytes an element of the storage, 4 of L and D)."""
    from ...iomodel.flash2_fast import visited_queries

    a = 4
    rows = visited_queries(Nq, Nk, *kv_block(d), causal)
    BHkv = BH // G
    return BHkv * 2 * s * d * Nk + BH * (2 * s * d + 2 * a) * rows, BHkv * 2 * s * Nk * d


def io_backward_atomic(BH, Nq, Nk, d, dtype, causal=False, G=1) -> dict:
    """Bytes (read, written) of the atomic backward's launches: one float32 atomic add (a read and a write of 4
    bytes) per dQ element per visited (key block, query row)."""
    from ...iomodel.flash2_fast import visited_queries

    s, a = np.dtype(dtype).itemsize, 4
    n = BH * Nq * d
    atomics = a * BH * d * visited_queries(Nq, Nk, *kv_block(d), causal)
    kv_read, kv_written = _kv_bytes(BH, Nq, Nk, d, s, causal, G)
    return {D_ZERO_NAME: (BH * 2 * s * d * Nq, BH * a * Nq + n * a),
            BACKWARD_KVQ_NAME: (kv_read + atomics, kv_written + atomics),
            CAST_DQ_NAME: (n * a, n * s)}


# ---------------------------------------------------------------- the compile tier


def compile_backward(ccs, dtypes, ds):
    """The compile tier's :class:`~flash_numba.compile_check.Compiled` list of the backward kernels: for each cc,
    dtype (float16 everywhere, bfloat16 from sm_80; the m16n8k8 path below sm_80, as the forward's switch picks)
    and head dim: causal or not with 16-byte tile loads, not causal with element loads; at the first head dim of
    ``ds`` a causal dropout build and (float16) a counting one.  The element-wise kernels once a dtype."""
    from numba import types

    from ...compile_check import compile_kernel
    from .._common import COUNTER_TYPE, LAYOUT_TYPE

    I64, F32 = types.int64, types.float32
    A2, A3 = types.Array(F32, 2, "C"), types.Array(F32, 3, "C")
    DROP = _dropout.arg_types(F32)
    out = []
    for cc in ccs:
        k8 = tuple(cc) < (8, 0)
        for dtype in dtypes:
            if dtype == "bfloat16" and k8:
                continue
            T = types.uint16 if dtype == "bfloat16" else types.float16
            X1, X3 = types.Array(T, 1, "C"), types.Array(T, 3, "C")
            kv_sig = (X1, X1, X1, X1, A2, A2, X3, X3, A3, I64, I64, I64, F32, F32, COUNTER_TYPE,
                      LAYOUT_TYPE, LAYOUT_TYPE, LAYOUT_TYPE, LAYOUT_TYPE, *DROP)
            q_sig = (X1, X1, X1, X1, X1, A2, A2, X3, I64, I64, I64, F32, F32, COUNTER_TYPE,
                     LAYOUT_TYPE, LAYOUT_TYPE, LAYOUT_TYPE, LAYOUT_TYPE, LAYOUT_TYPE, *DROP)
            bwd_sig = (X1, X1, X1, X1, A2, A2, X3, X3, X3, I64, I64, I64, F32, F32, COUNTER_TYPE,
                       LAYOUT_TYPE, LAYOUT_TYPE, LAYOUT_TYPE, LAYOUT_TYPE, *DROP, I64, I64)
            for d in ds:
                kv_dyn, q_dyn = bool(_dynamic_bytes(kv_tile_bytes(d))), bool(_dynamic_bytes(q_tile_bytes(d)))
                # (count, causal, dropout, aligned): causal or not with 16-byte loads, element loads (not causal);
                # at the first head dim, float16: a counting build; at the first head dim: causal with dropout (and
                # without the mask where that runs in one launch)
                variants = [(False, False, False, True), (False, True, False, True), (False, False, False, False)]
                variants += [(True, False, False, True)] if d == ds[0] and dtype == "float16" else []
                variants += [(False, True, True, True)] if d == ds[0] else []
                variants += [(False, False, True, True)] if d == ds[0] and one_launch(d, False) else []
                for count, causal, drop, aligned in variants:
                    tag = (f"d={d} {dtype}{' causal' * causal}{' count' * count}{' dropout' * drop}"
                           f"{' aligned' * aligned}{' m16n8k8' * k8}")
                    if one_launch(d, causal):
                        out.append(compile_kernel(f"{BACKWARD_NAME} {tag} aliased={backward_tile_bytes(d, k8)}",
                                                  backward_kernel(d, dtype, causal, count, k8, drop, aligned),
                                                  bwd_sig, cc))
                    else:
                        out += [compile_kernel(f"{BACKWARD_Q_NAME} {tag}{' dynamic' * q_dyn}",
                                               dq_kernel(d, dtype, causal, count, k8, drop, q_dyn, aligned), q_sig, cc),
                                compile_kernel(f"{BACKWARD_KV_NAME} {tag}{' dynamic' * kv_dyn}",
                                               dkdv_kernel(d, dtype, causal, count, k8, False, drop, kv_dyn, aligned),
                                               kv_sig, cc)]
                    out += [
                        compile_kernel(f"{BACKWARD_KVQ_NAME} {tag}{' dynamic' * kv_dyn}",
                                       dkdv_kernel(d, dtype, causal, count, k8, True, drop, kv_dyn, aligned,
                                                   tuple(cc) >= (9, 0)), kv_sig, cc)]
                if d == ds[0]:
                    for count in (False, True):
                        tag = f"{dtype}{' count' * count}"
                        d_sig = (X1, X1, A2, A3, I64, COUNTER_TYPE, LAYOUT_TYPE, LAYOUT_TYPE)
                        out += [compile_kernel(f"{D_ZERO_NAME} d={d} {tag}", d_kernel(d, dtype, count), d_sig, cc),
                                compile_kernel(f"{D_NAME} d={d} {tag}", d_kernel(d, dtype, count, False), d_sig,
                                               cc),
                                compile_kernel(f"{CAST_DQ_NAME} {tag}", cast_kernel(dtype, count),
                                               (types.Array(F32, 1, "C"), X1, I64, COUNTER_TYPE), cc)]
    return out
