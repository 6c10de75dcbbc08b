"""Tile loads and block products that the kernels share, as device functions (128 threads, an 8 x 16 grid).

Three families:

* For the readable kernels (flash1, flash2): :func:`load_rows` copies rows of head
  bh of a ``(B, H, N, d)`` input (any strides, :func:`._common.batch_head`) and
  :func:`load_vector` of a ``(B*H, N)`` array into a shared tile, the threads of the
  block taking consecutive elements in turn.
* For the register-tiled kernels (flash2_fast): factories that return device
  functions specialised on the tile's shape, reading flat inputs with their layouts
  (:func:`flash_numba._views.flat_input`, :func:`head_starts`) (closure constants, so that NVVM
  unrolls their loops exactly as it did when the code stood inside each kernel).
  They are compiled with ``forceinline``: inlined at the NVVM IR level, their
  local arrays become registers of the caller.  benchmarks/results/LOG.md (2026-11-30,
  issue 12) records the SASS of the kernels before and after they moved here.
* For the rebuilt ``standard`` kernels: :func:`tile_loader` copies a ``R x C`` tile of head bh of a
  global input ``(B, H, rows, cols)`` or ``(BH, rows, cols)`` array into a flat shared buffer, element
  ``(r, c)`` at ``r * RS + c * CS`` (so ``RS = 1`` stores it transposed), zeros past the array's edge;
  :func:`micro_product` adds a thread's ``TM x TN`` register tile ``acc += A^T B`` summed over ``K`` rows
  of two shared buffers; :func:`tile_store` writes such a tile into a global array.  Each is specialised
  on its tile shape and strides (closure constants), so that every shared-memory access has a constant
  offset, and kernels built from them are compiled with :data:`FASTMATH` (:func:`fast_kernel`).

Shared tiles of the register-tiled kernels are flat arrays: a tile stored
*transposed* with row stride S holds element (r, x) of the source at ``x * S + r``.
Loads and stores return the number of elements they read or wrote in global memory
when built with ``count=True`` (the kernels multiply it by an item size), else 0:
a counter that is never read still changed the SASS of the loop around it.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, int32, types, uint32, uint64

from ..device import jit
from . import _vec
from ._common import acc_nb_type, batch_head, element, fmax, madd_if, nan_max

#: Threads per block: TY rows of TX threads (a half warp each).
TY, TX = 8, 16
NT = TY * TX
#: fast math without 'ninf'/'nnan': the kernels compare against -inf on purpose
FASTMATH = {"contract", "afn", "arcp", "nsz", "reassoc"}


def fast_kernel(kernel):
    """``kernel`` compiled as a CUDA kernel with :data:`FASTMATH` (also kept on it as ``_fastmath``)."""
    kernel._fastmath = FASTMATH
    return jit(fastmath=FASTMATH)(kernel)


def check_micro_tile_block(block, what: str) -> None:
    """Refuse, by name, a block (Br, Bc) that is not a multiple of the TY x TX thread grid.

    ``what`` names the kernel in the message ("standard", "flash2_fast's forward").
    Anything that is not a pair of ints is left to blocks.validate, which names the problem.
    """
    try:
        Br, Bc = block
    except (TypeError, ValueError):
        return
    if isinstance(Br, int) and isinstance(Bc, int) and (Br % TY or Bc % TX or Br < 1 or Bc < 1):
        raise ValueError(
            f"block: {what} needs Br a multiple of {TY} and Bc a multiple of {TX} "
            f"(its {TY} x {TX} thread grid), got ({Br}, {Bc})"
        )


# ------------------------------------------------------------------ readable kernels


@jit(device=True, forceinline=True)
def load_rows(tile, src, bh, row0, n_rows, width, t, nt):
    """Copy rows row0, row0 + 1, ... of head bh of the ``(B, H, N, d)`` input ``src`` (``width`` columns) into a
    shared tile.

    Thread t of ``nt`` copies elements t, t + nt, ... of the tile, so consecutive
    threads read consecutive addresses.  Rows at or past ``n_rows`` (the
    sequence's end) are zero-filled.  Returns the number of elements this thread read.
    """
    n = 0
    b, h = batch_head(src, bh)  # src[b, h] is head bh
    for e in range(t, tile.shape[0] * width, nt):
        r = e // width
        x = e - r * width
        if row0 + r < n_rows:
            tile[r, x] = src[b, h, row0 + r, x]
            n += 1
        else:
            tile[r, x] = 0
    return n


@jit(device=True, forceinline=True)
def load_vector(tile, src, bh, row0, n_rows, t, nt):
    """Copy ``src[bh, row0 : row0 + len(tile)]`` into a shared vector (zeros past ``n_rows``)."""
    n = 0
    for r in range(t, tile.shape[0], nt):
        if row0 + r < n_rows:
            tile[r] = src[bh, row0 + r]
            n += 1
        else:
            tile[r] = 0
    return n


# ------------------------------------------------------- register-tiled kernels: flash2_fast


def _zero(acc_name: str):
    return np.dtype(acc_name).type(0)


def fixed_columns(rows: int, d: int) -> tuple[bool, int, int]:
    """``(FIXED, ROWSTEP, NLOAD)`` for loading a full tile of ``rows`` x d.

    When d divides the 128 threads, each thread loads one fixed column, rows ROWSTEP
    apart, NLOAD of them: a loop of constant length that NVVM unrolls (no per-element
    index math).
    """
    fixed = NT % d == 0 and (rows * d) % NT == 0
    return fixed, (NT // d if fixed else 1), ((rows * d) // NT if fixed else 1)


@jit(device=True, forceinline=True)
def head_starts(a_lay, b_lay, bh):
    """Flat indices of row 0 of head ``bh = b*H + h`` in two inputs of H heads, with layouts ``(H, stride_B,
    stride_H, stride_N)`` (:func:`flash_numba._views.flat_input`): ``b*stride_B + h*stride_H`` in each, unsigned.

    One 32-bit division for both (K and V, or Q and dO, have the same heads).
    """
    H = max(uint32(a_lay[0]), uint32(1))  # >= 1: a division without a zero test
    b = uint32(bh) // H
    h = uint64(uint32(bh) - b * H)
    return (uint64(b) * uint64(a_lay[1]) + h * uint64(a_lay[2]),
            uint64(b) * uint64(b_lay[1]) + h * uint64(b_lay[2]))


def vector_columns(rows: int, d: int, vector: str | None) -> tuple[bool, int, int, int]:
    """``(VEC, NV, VROWS, NVLOAD)`` for loading a full tile of ``rows`` x d with 16-byte loads of dtype ``vector``:
    NV elements a load, d / NV threads a row, VROWS rows at a time, NVLOAD loads a thread.  VEC is False (and the
    tile is loaded by :func:`fixed_columns`' rule) without ``vector``, or where the 128 threads do not cover whole
    rows of NV-element vectors."""
    if vector is None:
        return False, 1, 1, 1
    nv = _vec.lanes(vector)
    lanes = d // nv
    if d % nv or NT % lanes or rows % (NT // lanes):
        return False, 1, 1, 1
    return True, nv, NT // lanes, rows // (NT // lanes)


@functools.lru_cache(maxsize=None)
def pair_loader(rows: int, d: int, DP: int, S_A: int, S_B: int, b_transposed: bool, acc_name: str, count: bool,
                a_transposed: bool = True, vector: str | None = None):
    """Device functions ``(load, zero_padding)`` for rows r0 .. r0 + rows - 1 of two arrays.

    ``load(A, B, a, b, a_lay, b_lay, bh, r0, n, tid)`` copies those rows of head bh of
    ``a`` into A (transposed, stride S_A, or with ``a_transposed=False`` row-major: ``A[r * S_A + x]``) and of
    ``b`` into B (transposed with stride S_B, or row-major: ``B[r * S_B + x]``); rows at or past n become zeros.
    ``a`` and ``b`` are flat inputs with layouts ``a_lay``, ``b_lay`` (:func:`flash_numba._views.flat_input`:
    any strides, rows contiguous) and the same head count.  Unsigned indices (a signed index
    costs the code of Python's negative-index wraparound at every access), 32-bit within a
    head.  When d divides 128 each thread loads one fixed column, ROWSTEP rows apart, all
    its loads before its first shared store (the last tile with a test per row); otherwise
    the threads walk the tile's elements 128 apart, (row, column) stepped without a division.
    With ``vector`` (the inputs' dtype name; :mod:`._vec`), full tiles are read 16 bytes a thread
    (``load(..., aligned=True)``, where the host found every row 16-byte aligned: :func:`._vec.aligned16`).
    With ``count``, ``load`` returns the elements read.
    ``zero_padding(A, B, tid)`` zeroes the tiles' columns d .. DP - 1 (their padding).
    """
    ACC = acc_nb_type(np.dtype(acc_name))
    ZERO = _zero(acc_name)
    FIXED, ROWSTEP, NLOAD = fixed_columns(rows, d)
    VEC, NV, VROWS, NVLOAD = vector_columns(rows, d, vector)
    load16 = _vec.loader(vector) if VEC else None
    # a row-major tile is stored 16 bytes at a time where the accumulation dtype is the input's (n elements both)
    STORE16 = VEC and np.dtype(vector) == np.dtype(acc_name) and S_A % NV == 0 and S_B % NV == 0
    store16 = _vec.storer(acc_name) if STORE16 else None
    NV_U, VLANES_U, NVA = np.uint32(NV), np.uint32(max(d // NV, 1)), NVLOAD * NV
    D_U, SA_U, SB_U, ROWS_U = np.uint32(d), np.uint32(S_A), np.uint32(S_B), np.uint32(rows)
    C_STEP, X_STEP, ONE_U = np.uint32(NT // d), np.uint32(NT % d), np.uint32(1)  # 128 elements on: divmod(128, d)
    A_T, B_T, PAD, COUNT = a_transposed, b_transposed, DP - d, count

    @jit(device=True, forceinline=True)
    def put_vector(T, S, transposed, r, x, src, j):
        """Elements src[j .. j + NV - 1], row r and columns x .. of the tile: into T (stride S), transposed or
        row-major (one 16-byte store where STORE16)."""
        if transposed:
            for e in range(NV):
                T[(x + uint32(e)) * S + r] = src[j + uint32(e)]
        elif STORE16:
            store16(T, r * S + x, src, j)
        else:
            for e in range(NV):
                T[r * S + x + uint32(e)] = src[j + uint32(e)]

    @jit(device=True, forceinline=True)
    def load(A, B, a, b, a_lay, b_lay, bh, r0, n, tid, aligned=False):
        areg = cuda.local.array(NLOAD, ACC)
        breg = cuda.local.array(NLOAD, ACC)
        got = 0
        a0, b0 = head_starts(a_lay, b_lay, bh)  # flat index of the head's row 0 in a and in b
        a_rs, b_rs = uint32(a_lay[3]), uint32(b_lay[3])  # row strides; offsets in a head are 32-bit (flat_input)
        if VEC and aligned and r0 + rows <= n:
            # d / NV threads a row, each NV adjacent columns, VROWS rows apart: one 16-byte load each
            avec = cuda.local.array(NVA, ACC)
            bvec = cuda.local.array(NVA, ACC)
            x = (uint32(tid) % VLANES_U) * NV_U
            c = uint32(tid) // VLANES_U
            rk = uint32(r0) + c
            ai = a0 + uint64(rk * a_rs + x)
            bi = b0 + uint64(rk * b_rs + x)
            a_step, b_step = uint64(VROWS) * uint64(a_rs), uint64(VROWS) * uint64(b_rs)
            for t in range(NVLOAD):
                va = load16(a, ai + uint64(t) * a_step)
                vb = load16(b, bi + uint64(t) * b_step)
                for e in range(NV):
                    avec[t * NV + e] = ACC(va[e])
                    bvec[t * NV + e] = ACC(vb[e])
            for t in range(NVLOAD):
                r = c + uint32(t * VROWS)
                put_vector(A, SA_U, A_T, r, x, avec, uint32(t * NV))
                put_vector(B, SB_U, B_T, r, x, bvec, uint32(t * NV))
            if COUNT:
                got = 2 * NVLOAD * NV
        elif FIXED and r0 + rows <= n:
            x = uint32(tid) % D_U
            c = uint32(tid) // D_U
            rk = uint32(r0) + c
            ai = a0 + uint64(rk * a_rs + x)  # element (r0 + c, x) of the head; the next ones ROWSTEP rows apart
            bi = b0 + uint64(rk * b_rs + x)
            a_step, b_step = uint64(ROWSTEP) * uint64(a_rs), uint64(ROWSTEP) * uint64(b_rs)
            for t in range(NLOAD):
                areg[t] = ACC(a[ai + uint64(t) * a_step])
                breg[t] = ACC(b[bi + uint64(t) * b_step])
            for t in range(NLOAD):
                if A_T:
                    A[x * SA_U + c + uint32(t * ROWSTEP)] = areg[t]
                else:
                    A[(c + uint32(t * ROWSTEP)) * SA_U + x] = areg[t]
                if B_T:
                    B[x * SB_U + c + uint32(t * ROWSTEP)] = breg[t]
                else:
                    B[(c + uint32(t * ROWSTEP)) * SB_U + x] = breg[t]
            if COUNT:
                got = 2 * NLOAD
        else:
            # element e = tid, tid + 128, ... of the tile is (c, x) = divmod(e, d), walked without a division
            c = uint32(tid) // D_U
            x = uint32(tid) % D_U
            while c < ROWS_U:
                aval = ZERO
                bval = ZERO
                if uint32(r0) + c < uint32(n):
                    row = uint32(r0) + c
                    aval = ACC(a[a0 + uint64(row * a_rs + x)])
                    bval = ACC(b[b0 + uint64(row * b_rs + x)])
                    if COUNT:
                        got += 2
                if A_T:
                    A[x * SA_U + c] = aval
                else:
                    A[c * SA_U + x] = aval
                if B_T:
                    B[x * SB_U + c] = bval
                else:
                    B[c * SB_U + x] = bval
                c += C_STEP
                x += X_STEP
                if x >= D_U:
                    x -= D_U
                    c += ONE_U
        return got

    @jit(device=True, forceinline=True)
    def zero_columns(T, S, transposed, tid):
        """Columns d .. DP - 1 of tile T (stride S): its last rows if ``transposed``, else the end of each row."""
        if transposed:
            for e in range(tid, PAD * S, NT):
                T[d * S + e] = ZERO
        else:
            for e in range(tid, PAD * rows, NT):
                T[(e % rows) * S + d + e // rows] = ZERO

    @jit(device=True, forceinline=True)
    def zero_padding(A, B, tid):
        zero_columns(A, S_A, A_T, tid)
        zero_columns(B, S_B, B_T, tid)

    return load, zero_padding


@functools.lru_cache(maxsize=None)
def padded_loader(rows: int, d: int, DP: int, S: int, pair: bool, acc_name: str, count: bool):
    """Device function ``load(A, B, a, b, a_lay, b_lay, bh, r0, n, tid)``: a tile loaded once, before a kernel's loop.

    Rows r0 .. r0 + rows - 1 of head bh of the flat input ``a`` (and with ``pair`` of ``b``;
    layouts as for :func:`pair_loader`) into A (B), transposed with stride S, zero beyond d
    (up to DP) and at or past row n.
    """
    ACC = acc_nb_type(np.dtype(acc_name))
    ZERO = _zero(acc_name)
    PAIR, COUNT = pair, count

    @jit(device=True, forceinline=True)
    def load(A, B, a, b, a_lay, b_lay, bh, r0, n, tid):
        got = 0
        a0, b0 = head_starts(a_lay, b_lay, bh)  # flat index of the head's row 0 in a and in b
        for e in range(tid, rows * DP, NT):
            r = e // DP
            x = e % DP
            aval = ZERO
            bval = ZERO
            if x < d and r0 + r < n:
                aval = ACC(a[a0 + uint64(uint32(r0 + r) * uint32(a_lay[3]) + uint32(x))])
                if PAIR:
                    bval = ACC(b[b0 + uint64(uint32(r0 + r) * uint32(b_lay[3]) + uint32(x))])
                if COUNT:
                    got += 1 + PAIR
            A[x * S + r] = aval
            if PAIR:
                B[x * S + r] = bval
        return got

    return load


@functools.lru_cache(maxsize=None)
def stats_loader(rows: int, acc_name: str, count: bool, with_d: bool = True):
    """Device function ``load(Ls, Ds, lse, D, bh, r0, n, tid)``: L_i (log2 units) and D_i of a query block
    (L_i only, Ds and D untouched, without ``with_d``); the number of elements read.

    Thread r < rows loads row r0 + r, L as given (a row that sees no key has L = -inf: the
    kernels select P = 0 on its masked entries); a row past n gets L = +inf, exp2(S - L) = 0.
    """
    POS_INF = np.dtype(acc_name).type(np.inf)
    ZERO, LOG2E = _zero(acc_name), np.dtype(acc_name).type(1.4426950408889634)
    COUNT, WITH_D = count, with_d
    assert rows <= NT  # one thread per row

    @jit(device=True, forceinline=True)
    def load(Ls, Ds, lse, D, bh, r0, n, tid):
        got = 0
        if tid < rows:
            Lr = POS_INF
            Dr = ZERO
            r = uint32(r0) + uint32(tid)
            if r < uint32(n):  # unsigned compares: uint32 < int64 would compare as float64
                Lr = lse[uint32(bh), r] * LOG2E
                if WITH_D:
                    Dr = D[uint32(bh), r]
                if COUNT:
                    got = 1 + WITH_D
            Ls[tid] = Lr
            if WITH_D:
                Ds[tid] = Dr
        return got

    return load


@functools.lru_cache(maxsize=None)
def thread_columns(TD: int, otherwise: str = "strided") -> tuple[int, tuple, int, int]:
    """``(x0, offsets, b_col, quads)``: thread tx's TD columns of a d-wide accumulator, ``tx*x0 + offsets[u]``,
    and the matching arguments of :func:`strided_product` (``b_start = x0``, ``b_col``, ``quads``).

    Where TD is a multiple of 4, quads 64 apart: ``4 tx + u % 4 + 64 (u // 4)``.  A warp's 16-byte reads of a row
    then cover 16 adjacent chunks (all 32 banks, two passes); with TD = 8 adjacent columns (``8 tx + u``) the 8
    threads of a quarter warp would read chunks 2 apart, 2-way conflicted.  Otherwise ``otherwise``: "strided",
    16 apart (``tx + 16 u``: scalar reads on 16 banks a half warp), or "adjacent" (``tx*TD + u``).
    """
    if TD % 4 == 0:
        return 4, tuple(u % 4 + 64 * (u // 4) for u in range(TD)), 1, 64
    if otherwise == "adjacent":
        return TD, tuple(range(TD)), 1, 0
    return 1, tuple(TX * u for u in range(TD)), TX, 0


def strided_store(TM: int, TD: int, d: int, pair: bool, count: bool, columns: tuple | None = None):
    """Device function ``store(out1, acc1, scale1, out2, acc2, scale2, bh, r0, n, ty, tx)``: accumulators to HBM.

    Row r0 + ty*TM + a (if < n), columns ``tx*x0 + offsets[u]`` (if < d; ``columns = (x0, offsets)`` from
    :func:`thread_columns`, default tx + 16 u) of ``out1[bh]`` get ``acc1[a, u] * scale1`` (and, with ``pair``,
    of ``out2[bh]`` ``acc2[a, u] * scale2``, in the same loop).  With ``count``, returns the number of elements
    written.
    """
    PAIR, COUNT = pair, count
    X0, cols = columns if columns is not None else (1, tuple(TX * u for u in range(TD)))

    @jit(device=True, forceinline=True)
    def col(u):
        return cols[u]

    @jit(device=True, forceinline=True)
    def store(out1, acc1, scale1, out2, acc2, scale2, bh, r0, n, ty, tx):
        put = 0
        for a in range(TM):
            row = r0 + ty * TM + a
            if row < n:
                for u in range(TD):
                    x = tx * X0 + col(u)
                    if x < d:
                        out1[bh, row, x] = acc1[a, u] * scale1
                        if PAIR:
                            out2[bh, row, x] = acc2[a, u] * scale2
                        if COUNT:
                            put += 1 + PAIR
        return put

    return store


def masked_lim(mask: str, TM: int):
    """Device function ``(diag, ty) -> lim`` of a product over a tile the causal diagonal crosses
    (:func:`strided_product`, :func:`micro_product`; ``mask`` "keys" or "queries"): entry (k, row ty*TM + a)
    of A is visible iff ``k - a <= lim`` ("keys": k steps over the keys, A's rows are queries) or
    ``a - k <= lim`` ("queries": k steps over the queries, A's rows are keys).

    ``diag`` is the block's diagonal offset ``r0 + (Nk - Nq) - c0`` (query r0 + r sees key c0 + c iff
    ``c - r <= diag``, :mod:`.causal`); k - a and a - k are constants once NVVM unrolls the loops, so the test
    is one integer compare per (k, a), as the ``a != 0`` that it replaced was one float compare.
    """
    assert mask in ("keys", "queries"), mask
    KEYS = mask == "keys"

    @jit(device=True, forceinline=True)
    def lim(diag, ty):
        return int32(diag) + int32(ty * TM) if KEYS else int32(diag) - int32(ty * TM)

    return lim


@functools.lru_cache(maxsize=None)
def strided_product(TM: int, TN: int, steps: int, S_A: int, b_start: int, b_col: int, b_step: int, pair: bool,
                  zero_first: bool, acc_name: str, mask: str = "", quads: int = 0):
    """Device function ``(c1, c2, A1, A2, B1, B2, ty, tx)``: c1 += A1^T B1 (and c2 += A2^T B2 with ``pair``).

    A thread's TM x TN micro-tile, over ``steps`` rows k of the flat shared tiles: its
    TM values ``A[k * S_A + ty*TM + a]`` times its TN values
    ``B[tx*b_start + k*b_step + b*b_col]``; ``zero_first`` sets c1 (c2) to 0 first.  ``mask`` (for the blocks
    that the causal diagonal crosses): "keys" where k steps over keys and A's rows are queries, "queries" the other
    way round; the function then takes a last argument ``diag`` (:func:`masked_lim`), and a masked entry of A adds
    nothing, even against Inf or NaN in B, while a visible one multiplies, 0 or not (a select per multiply-add:
    :func:`~._common.madd_if`; IEEE's 0 * Inf = NaN, docs/RELIABILITY.md).  ``quads``: B's values come in
    groups of 4, ``quads`` apart: ``B[tx*b_start + k*b_step + (b % 4)*b_col + (b // 4)*quads]`` (see
    :func:`thread_columns`).

    * S_ij = Q_i K_j^T from Q_i^T, K_j^T: b_start = TN, b_col = 1, b_step = KS (TN adjacent keys);
    * O_i += P_ij V_j from P_ij^T, V_j: b_start = TD, b_col = 1, b_step = DP;
    * dQ_i += dS_ij K_j from dS_ij^T, K_j^T: b_start = KS, b_col = 16 KS, b_step = 1 (strided columns).

    The loop is a while over uint32 offsets that step by a tile row: NVVM unrolls it and
    every load is a (16-byte where adjacent) LDS at a constant offset (a Python range loop
    kept a 64-bit counter and an address multiply per step: ~50% overhead).
    """
    ACC = acc_nb_type(np.dtype(acc_name))
    ZERO = _zero(acc_name)
    PAIR, ZERO_FIRST, MASK, KEYS = pair, zero_first, bool(mask), mask == "keys"
    N_U, SA_U, BS_U, ONE_U = np.uint32(steps), np.uint32(S_A), np.uint32(b_step), np.uint32(1)
    offsets = tuple((b % 4) * b_col + (b // 4) * quads if quads else b * b_col for b in range(TN))
    lim_of = masked_lim(mask or "keys", TM)

    @jit(device=True, forceinline=True)
    def b_offset(b):
        return offsets[b]

    @jit(device=True, forceinline=True)
    def product(c1, c2, A1, A2, B1, B2, ty, tx, diag):
        av = cuda.local.array(TM, ACC)
        bv = cuda.local.array(TM, ACC)
        xv = cuda.local.array(TN, ACC)
        yv = cuda.local.array(TN, ACC)
        if ZERO_FIRST:
            for a in range(TM):
                for b in range(TN):
                    c1[a, b] = ZERO
                    if PAIR:
                        c2[a, b] = ZERO
        lim = lim_of(diag, ty) if MASK else int32(0)
        ai = uint32(ty * TM)
        bi = uint32(tx * b_start)
        k = uint32(0)
        while k < N_U:
            for a in range(TM):
                av[a] = A1[ai + uint32(a)]
                if PAIR:
                    bv[a] = A2[ai + uint32(a)]
            for b in range(TN):
                xv[b] = B1[bi + uint32(b_offset(b))]
                if PAIR:
                    yv[b] = B2[bi + uint32(b_offset(b))]
            for a in range(TM):
                if MASK:
                    seen = (int32(k) - int32(a) if KEYS else int32(a) - int32(k)) <= lim
                    for b in range(TN):
                        c1[a, b] = madd_if(c1[a, b], av[a], xv[b], seen)
                        if PAIR:
                            c2[a, b] = madd_if(c2[a, b], bv[a], yv[b], seen)
                else:
                    for b in range(TN):
                        c1[a, b] += av[a] * xv[b]
                        if PAIR:
                            c2[a, b] += bv[a] * yv[b]
            ai += SA_U
            bi += BS_U
            k += ONE_U

    if MASK:
        return product

    @jit(device=True, forceinline=True)
    def unmasked(c1, c2, A1, A2, B1, B2, ty, tx):
        product(c1, c2, A1, A2, B1, B2, ty, tx, 0)

    return unmasked


FULL_MASK = 0xFFFFFFFF


def _half_warp(op, doc: str):
    """A device function ``reduce(x)``: ``op`` over the 16 lanes of this half warp (a row of the 8 x 16 grid), in
    every lane: four ``shfl_xor`` steps (lanes 8, 4, 2, 1 apart), each lane combining in the same order."""
    def reduce(x):
        x = op(x, cuda.shfl_xor_sync(FULL_MASK, x, 8))
        x = op(x, cuda.shfl_xor_sync(FULL_MASK, x, 4))
        x = op(x, cuda.shfl_xor_sync(FULL_MASK, x, 2))
        return op(x, cuda.shfl_xor_sync(FULL_MASK, x, 1))

    reduce.__doc__ = doc
    return jit(device=True, forceinline=True)(reduce)


@jit(device=True, forceinline=True)
def _add(a, b):
    return a + b


half_warp_max = _half_warp(nan_max, "The largest ``x`` of the 16 lanes of this half warp, in every lane; NaN if any "
                                    "is.")
half_warp_fmax = _half_warp(fmax, "The largest ``x`` of the 16 lanes of this half warp, in every lane, NaNs dropped "
                                  "(:func:`._common.fmax`).")
half_warp_sum = _half_warp(_add, "The sum of ``x`` over the 16 lanes of this half warp, in every lane (a fixed order: "
                                 "the same in each).")


@jit(device=True, forceinline=True)
def grid_tile(n_tiles):
    """``(tile, bh)`` of this block in a 1-D grid of n_tiles * B*H blocks, tile after tile, each for every head."""
    BH = cuda.gridDim.x // n_tiles
    return cuda.blockIdx.x // BH, cuda.blockIdx.x % BH


@jit(device=True, forceinline=True)
def last_tile_first(n_rows, rows):
    """``(row0, bh)``: the first row of this block's tile of ``rows`` rows, and its head.

    A 1-D grid of Tr * B*H blocks, tile after tile, each for every head, the last tile
    (the longest when causal) first: the heavy blocks start first and the light ones
    fill the tail (a (Tr, B*H) grid started each head's light blocks before the next
    head's heavy ones).
    """
    Tr = (n_rows + rows - 1) // rows
    tile, bh = grid_tile(Tr)
    return (Tr - 1 - tile) * rows, bh


# ---------------------------------------------------------- register-tiled kernels: standard


@functools.lru_cache(maxsize=None)
def tile_loader(R: int, C: int, RS: int, CS: int, acc_name: str):
    """``load(x, bh, r0, c0, n_r, n_c, buf, tid) -> elements read``.

    Copies element ``(r0 + r, c0 + c)`` of head bh of ``x`` (a ``(B, H, N, d)`` input, any
    strides, or a ``(B*H, rows, cols)`` array of the kernels', :func:`._common.element`) for ``r < R``, ``c < C`` into
    ``buf[r * RS + c * CS]`` (accumulation dtype), where rows ``r >= n_r`` and
    columns ``c >= n_c`` (past the array's edge) become 0.  A whole tile whose
    C columns divide the 128 threads takes the fast path: each thread loads one
    fixed column, ``R * C / 128`` rows apart, all loads issued before the first
    shared store, with unsigned indices.  Call it from all 128 threads.
    """
    ACC = getattr(types, acc_name)
    ZERO = np.float64(0) if acc_name == "float64" else np.float32(0)
    FAST = NT % C == 0 and (R * C) % NT == 0
    ROWSTEP = NT // C if FAST else 1
    NLOAD = (R * C) // NT if FAST else 1
    C_U, RS_U, CS_U = np.uint32(C), np.uint32(RS), np.uint32(CS)

    @jit(device=True)
    def load(x, bh, r0, c0, n_r, n_c, buf, tid):
        if FAST and n_r >= R and n_c >= C:
            reg = cuda.local.array(NLOAD, ACC)
            c = uint32(tid) % C_U
            r = uint32(tid) // C_U
            gr = uint32(r0) + r
            gc = uint32(c0) + c
            bh_u = uint32(bh)
            for t in range(NLOAD):
                reg[t] = ACC(element(x, bh_u, gr + uint32(t * ROWSTEP), gc))
            for t in range(NLOAD):
                buf[(r + uint32(t * ROWSTEP)) * RS_U + c * CS_U] = reg[t]
            return NLOAD
        n = 0
        for e in range(tid, R * C, NT):
            r = e // C
            c = e % C
            val = ZERO
            if r < n_r and c < n_c:
                val = ACC(element(x, bh, r0 + r, c0 + c))
                n += 1
            buf[r * RS + c * CS] = val
        return n

    return load


@functools.lru_cache(maxsize=None)
def micro_product(TM: int, TN: int, K: int, AS: int, BS: int, acc_name: str, mask: str = ""):
    """``product(A, a0, B, b0, acc)``: ``acc[a, b] += sum_k A[a0 + k AS + a] * B[b0 + k BS + b]``.

    ``A`` and ``B`` are flat shared buffers holding ``K`` rows of stride ``AS``
    and ``BS``; the thread's ``TM`` (``TN``) values of row k are adjacent, so
    with 16-byte aligned buffers and offsets they come in vector loads.  ``mask`` (tiles the causal diagonal
    crosses): "keys" (k steps over keys, A's rows a0 + a are queries) or "queries" (the other way round), with
    ``a0 = ty * TM``; then ``product(A, a0, B, b0, acc, diag, ty)`` (:func:`masked_lim`): a masked entry of A adds
    nothing, even against Inf or NaN in B, a visible one multiplies, 0 or not (a select per multiply-add:
    :func:`~._common.madd_if`).
    """
    ACC = getattr(types, acc_name)
    MASK, KEYS = bool(mask), mask == "keys"  # product_masked is built only with a mask
    K_U, AS_U, BS_U, ONE_U = np.uint32(K), np.uint32(AS), np.uint32(BS), np.uint32(1)
    lim_of = masked_lim(mask or "keys", TM)

    @jit(device=True, fastmath=FASTMATH)
    def product_masked(A, a0, B, b0, acc, diag, ty):
        av = cuda.local.array(TM, ACC)
        bv = cuda.local.array(TN, ACC)
        lim = lim_of(diag, ty)
        ai = uint32(a0)
        bi = uint32(b0)
        k = uint32(0)
        while k < K_U:
            for a in range(TM):
                av[a] = A[ai + uint32(a)]
            for b in range(TN):
                bv[b] = B[bi + uint32(b)]
            for a in range(TM):
                seen = (int32(k) - int32(a) if KEYS else int32(a) - int32(k)) <= lim
                for b in range(TN):
                    acc[a, b] = madd_if(acc[a, b], av[a], bv[b], seen)
            ai += AS_U
            bi += BS_U
            k += ONE_U

    @jit(device=True, fastmath=FASTMATH)
    def product(A, a0, B, b0, acc):  # unmasked: the loop as it was, written out (not force-inlined: its PTX unchanged)
        av = cuda.local.array(TM, ACC)
        bv = cuda.local.array(TN, ACC)
        ai = uint32(a0)
        bi = uint32(b0)
        k = uint32(0)
        while k < K_U:
            for a in range(TM):
                av[a] = A[ai + uint32(a)]
            for b in range(TN):
                bv[b] = B[bi + uint32(b)]
            for a in range(TM):
                for b in range(TN):
                    acc[a, b] += av[a] * bv[b]
            ai += AS_U
            bi += BS_U
            k += ONE_U

    return product_masked if MASK else product


@functools.lru_cache(maxsize=None)
def tile_store(TM: int, TN: int, store_name: str):
    """``store(x, bh, r0, c0, n_r, n_c, vals) -> elements written``.

    Writes ``x[bh, r0 + a, c0 + b] = vals[a, b]`` for ``a < min(TM, n_r)``,
    ``b < min(TN, n_c)`` (the part of the thread's tile inside the array),
    converting to the storage dtype; unsigned indices when the whole tile is in.
    """
    ST = getattr(types, store_name)

    @jit(device=True)
    def store(x, bh, r0, c0, n_r, n_c, vals):
        if n_r >= TM and n_c >= TN:
            bh_u = uint32(bh)
            for a in range(TM):
                for b in range(TN):
                    x[bh_u, uint32(r0) + uint32(a), uint32(c0) + uint32(b)] = ST(vals[a, b])
            return TM * TN
        n = 0
        for a in range(TM):
            if a < n_r:
                for b in range(TN):
                    if b < n_c:
                        x[bh, r0 + a, c0 + b] = ST(vals[a, b])
                        n += 1
        return n

    return store
