"""16-byte moves of half-precision rows, for standard's tensor-core kernels (:mod:`.tensor`).

A float16 or bfloat16 row holds 8 elements per 16 bytes.  These move them as four ``uint32``
words (two 16-bit elements a word, the lower column in the lower 16 bits: the packing of the mma
operands, docs/INTERFACES section 3):

* ``load8(x, bh, row, col) -> UniTuple(uint32, 4)``: elements ``col .. col + 7`` of row ``row``
  of head bh of a 16-bit array (a ``(B, H, N, d)`` input, :func:`._common.element`, or a
  ``(B*H, rows, cols)`` array of ours) in one ``ld.global.v4.b32``;
* ``store8(x, bh, row, col, w)``: the same 16 bytes of a 3-D array of ours written in one store;
* ``to_shared8(buf, i, w)``, ``from_shared8(buf, i)``: 16 bytes of a 1-D shared array at element i.

The caller promises 16-byte alignment: ``col`` and ``i`` multiples of 8, the row start on 16 bytes
(:func:`rows_aligned`, checked on the host; a kernel takes it as a run-time flag and moves
element by element where it does not hold).  Numba has no vector loads: eight ``x[...]`` reads stay
eight 2-byte loads, a quarter of a sector's worth each (:mod:`.._vec` says the same for float32).

:func:`tile_loader` builds the block-wide copy of a tile of rows into shared memory with them.

In the simulator each is plain Python on the elements' bits (NumPy ``view``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda, uint32

from ...device import SIMULATOR, jit
from .._common import batch_head
from .._tile_ops import NT


def rows_aligned(arr) -> bool:
    """Whether every row of ``arr`` (16-bit elements, rows contiguous) starts on 16 bytes."""
    if SIMULATOR:
        start = arr._ary.__array_interface__["data"][0]
    else:
        start = int(arr.device_ctypes_pointer.value or 0)
    shape, strides = tuple(arr.shape), tuple(arr.strides)
    return start % 16 == 0 and all(int(s) % 16 == 0 for s in strides[:-1]) and shape[-1] % 8 == 0


if SIMULATOR:
    def _bits(value) -> int:
        return int(np.asarray(value).view(np.uint16))

    def _word(lo, hi):
        return np.uint32(_bits(lo) | (_bits(hi) << 16))

    def _halves(word, dtype):
        pair = np.array([int(word) & 0xFFFF, int(word) >> 16], np.uint16)
        return pair.view(dtype)

    def _load(x, index):
        *head, col = index
        return tuple(_word(x[(*head, col + 2 * e)], x[(*head, col + 2 * e + 1)]) for e in range(4))

    def _store(x, index, w):
        *head, col = index
        for e in range(4):
            lo, hi = _halves(w[e], x.dtype)
            x[(*head, col + 2 * e)] = lo
            x[(*head, col + 2 * e + 1)] = hi

    def load8(x, bh, row, col):
        if x.ndim == 4:
            b, h = batch_head(x, bh)
            return _load(x, (b, h, row, col))
        return _load(x, (bh, row, col))

    def store8(x, bh, row, col, w):
        _store(x, (bh, row, col), w)

    def to_shared8(buf, i, w):
        _store(buf, (i,), w)

    def from_shared8(buf, i):
        return _load(buf, (i,))

else:
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic
    from numba.cuda.np.arrayobj import make_array

    _V4 = ir.VectorType(ir.IntType(32), 4)
    _WORDS = types.UniTuple(types.uint32, 4)

    def _pointer(context, builder, aryty, ary, idxty, idx):
        arr = make_array(aryty)(context, builder, ary)
        n = len(idxty) if isinstance(idxty, types.BaseTuple) else 1
        if isinstance(idxty, types.BaseTuple):
            inds = [context.cast(builder, builder.extract_value(idx, e), idxty[e], types.intp) for e in range(n)]
        else:
            inds = [context.cast(builder, idx, idxty, types.intp)]
        ptr = cgutils.get_item_pointer2(context, builder, arr.data, cgutils.unpack_tuple(builder, arr.shape),
                                        cgutils.unpack_tuple(builder, arr.strides), aryty.layout, inds,
                                        wraparound=False)
        return builder.bitcast(ptr, _V4.as_pointer())

    @intrinsic
    def _load(typingctx, x, index):
        def codegen(context, builder, sig, args):
            value = builder.load(_pointer(context, builder, x, args[0], index, args[1]), align=16)
            items = [builder.extract_element(value, ir.Constant(ir.IntType(32), e)) for e in range(4)]
            return context.make_tuple(builder, _WORDS, items)

        return _WORDS(x, index), codegen

    @intrinsic
    def _store(typingctx, x, index, w):
        def codegen(context, builder, sig, args):
            vec = ir.Constant(_V4, ir.Undefined)
            for e in range(4):
                vec = builder.insert_element(vec, builder.extract_value(args[2], e), ir.Constant(ir.IntType(32), e))
            builder.store(vec, _pointer(context, builder, x, args[0], index, args[1]), align=16)
            return context.get_dummy_value()

        return types.void(x, index, w), codegen

    @jit(device=True, forceinline=True)
    def load8(x, bh, row, col):
        if x.ndim == 4:
            b, h = batch_head(x, bh)
            return _load(x, (b, h, row, col))
        return _load(x, (bh, row, col))

    @jit(device=True, forceinline=True)
    def store8(x, bh, row, col, w):
        _store(x, (bh, row, col), w)

    @jit(device=True, forceinline=True)
    def to_shared8(buf, i, w):
        _store(buf, i, w)

    @jit(device=True, forceinline=True)
    def from_shared8(buf, i):
        return _load(buf, i)

if SIMULATOR:  # device functions the simulator calls (it runs them as Python either way)
    load8, store8, to_shared8, from_shared8 = (jit(device=True)(f) for f in (load8, store8, to_shared8, from_shared8))


@lru_cache(maxsize=None)
def tile_loader(R: int, C: int, RS: int, storage_name: str, count: bool):
    """``load(x, bh, r0, c0, n_r, n_c, vec, buf, tid) -> elements read``: the R x C tile at (r0, c0)
    of head bh of ``x`` into ``buf[r * RS + c]``, rows ``r >= n_r`` and columns ``c >= n_c`` as 0.

    Each thread moves whole 16-byte chunks (8 elements of a row, ``C`` a multiple of 8), chunk
    ``tid``, ``tid + 128``, ...: a warp reads consecutive chunks of a row.  A chunk wholly inside
    the array moves in one load when ``vec`` (the rows are 16-byte aligned), else element by
    element.  Counts the elements inside the array (when ``count``).  Call it from all 128 threads.

    **Every load first, then the stores** (a tile wholly inside the array, with ``vec``): a thread issues all
    its ``ROUNDS`` 16-byte loads into registers before the first shared store, so ROUNDS loads are in flight at
    once instead of one (a load-store pair per chunk waits out the memory's latency ROUNDS times; a loop over
    ``range(tid, ...)`` has no constant trip count to unroll).  Edge tiles keep the chunk-by-chunk loop: with the
    edge tests inside the unrolled rounds ptxas took rowprod to 248 registers.  The sm_75 path of flash2_tc's
    loader does the same.  H200, float16, N = 4096, d = 64: standard's forward 2.965 -> 2.070 ms
    (`benchmarks/results/h200-2026-12-01-harness/launch_shares.csv`).
    """
    ZERO = np.float32(0) if storage_name == "float16" else np.uint16(0)  # (a float16 constant lowers badly)
    CH = C // 8  # chunks per row
    N_CHUNKS = R * CH
    ROUNDS = -(-N_CHUNKS // NT)  # chunks a thread (the last round may leave threads idle)
    WORDS = 4 * ROUNDS
    EVEN = N_CHUNKS % NT == 0  # every round has a chunk for every thread
    COUNT = count
    assert C % 8 == 0 and RS % 8 == 0

    @jit(device=True, inline="always")
    def load(x, bh, r0, c0, n_r, n_c, vec, buf, tid):
        n = 0
        if vec and n_r >= R and n_c >= C:  # the whole tile inside the array (uniform over the block)
            w = cuda.local.array(WORDS, uint32)  # constant indices after unrolling: registers
            for i in range(ROUNDS):  # every 16-byte load of this thread ...
                e = tid + i * NT
                if EVEN or e < N_CHUNKS:
                    r = e // CH
                    c = (e % CH) * 8
                    w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3] = load8(x, bh, uint32(r0 + r), uint32(c0 + c))
            for i in range(ROUNDS):  # ... then the shared stores
                e = tid + i * NT
                if EVEN or e < N_CHUNKS:
                    r = e // CH
                    to_shared8(buf, r * RS + (e % CH) * 8, (w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]))
                    if COUNT:
                        n += 8
            return n
        for e in range(tid, N_CHUNKS, NT):  # an edge tile: chunk by chunk
            r = e // CH
            c = (e % CH) * 8
            i = r * RS + c
            if vec and r < n_r and c + 8 <= n_c:
                to_shared8(buf, i, load8(x, bh, uint32(r0 + r), uint32(c0 + c)))
                if COUNT:
                    n += 8
            else:
                for u in range(8):
                    if r < n_r and c + u < n_c:
                        buf[i + u] = x_at(x, bh, r0 + r, c0 + c + u)
                        if COUNT:
                            n += 1
                    else:
                        buf[i + u] = ZERO
        return n

    return load


@jit(device=True, forceinline=True)
def x_at(x, bh, row, col):
    """Element (row, col) of head bh of a 4-D input or a 3-D array of ours."""
    if x.ndim == 4:
        b, h = batch_head(x, bh)
        return x[b, h, row, col]
    return x[bh, row, col]

