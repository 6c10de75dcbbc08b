"""A thread block's shared-memory tiles: one array, cut into tiles at fixed offsets.

Up to 48 KB a kernel declares the array statically, which every GPU we target runs (a T4
included).  Above 48 KB it is *dynamic* shared memory: the kernel declares an array of
unknown size (``cuda.shared.array(0, ...)``), the launch says how many bytes it gets
(``kernel[grid, block, stream, nbytes]``), and the kernel must first opt in to more than
48 KB per block (the driver's ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``; up to
64 KB on a T4, 227 KB on an H100/H200).  :func:`flash_numba.kernels._launch.launch` does that
opt-in once per compiled kernel.

Why one array cut by an intrinsic, not slices: a slice of the dynamic array is clamped to
its length, which the kernel only learns at run time, so the compiler no longer knows that
a tile starts on a 16-byte boundary and splits the 16-byte shared loads (``LDS.128``) of
the products into single ones.  :func:`tiles` cuts at offsets fixed at compile time, each a
multiple of 16 bytes, so every tile keeps the alignment of the array.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from .. import _switches
from ..device import SIMULATOR, jit
from ._common import nb_type

ALIGN = 16  # bytes: tiles start on a 16-byte boundary (vector loads)

def offsets(sizes, itemsize: int) -> tuple[tuple[int, ...], int]:
    """(start of each tile, total), in elements: each start rounded up to a multiple of 16 bytes."""
    per = ALIGN // itemsize if itemsize < ALIGN else 1
    starts, n = [], 0
    for size in sizes:
        n = -(-n // per) * per
        starts.append(n)
        n += size
    return tuple(starts), n


def total_bytes(sizes, itemsize: int) -> int:
    """Bytes of the block's array for tiles of ``sizes`` elements (with the alignment padding)."""
    return offsets(sizes, itemsize)[1] * itemsize


def is_dynamic(nbytes: int) -> bool:
    """Whether a block's tiles of ``nbytes`` bytes go in dynamic shared memory."""
    return nbytes > _switches.DYNAMIC_ABOVE  # 48 KB (a test sets it to 0 to run the dynamic path at small sizes)


@functools.lru_cache(maxsize=None)
def tiles(sizes: tuple, dtype_name: str, dynamic: bool):
    """Device function ``() -> (tile_0, tile_1, ...)``: 1-D shared arrays of ``sizes`` elements of ``dtype_name``.

    One array holds them all, static (``dynamic=False``) or dynamic (the launch gives its bytes:
    :func:`total_bytes`; see :func:`configure`).
    """
    dtype = np.dtype(dtype_name)
    starts, total = offsets(sizes, dtype.itemsize)
    TOTAL, TYPE, DYNAMIC = total, nb_type(dtype), dynamic
    ALIGNMENT = None if SIMULATOR else ALIGN  # the simulator refuses an alignment (its arrays are NumPy's)
    if SIMULATOR:  # the simulator runs Python: plain slices of its (static or dynamic) array
        def cut(block):
            return tuple(block[s:s + n] for s, n in zip(starts, sizes))
    else:
        cut = _cutter(starts, sizes)

    @jit(device=True, forceinline=True)
    def block_tiles():
        if DYNAMIC:
            block = cuda.shared.array(0, TYPE, alignment=ALIGNMENT)
        else:
            block = cuda.shared.array(TOTAL, TYPE, alignment=ALIGNMENT)
        return cut(block)

    return block_tiles


def _cutter(starts, sizes):
    """An intrinsic ``cut(block) -> tuple of 1-D arrays``: views of ``block`` at constant offsets, no bounds clamp."""
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.cgutils import pack_array
    from numba.cuda.extending import intrinsic
    from numba.cuda.np.arrayobj import make_array, populate_array

    @intrinsic
    def cut(typingctx, block):
        tile = types.Array(block.dtype, 1, "C")
        result = types.UniTuple(tile, len(sizes))

        def codegen(context, builder, sig, args):
            src = make_array(block)(context, builder, args[0])
            itemsize = context.get_abi_sizeof(context.get_data_type(block.dtype))
            intp = context.get_value_type(types.intp)
            views = []
            for start, size in zip(starts, sizes):
                view = make_array(tile)(context, builder)
                data = builder.gep(src.data, [ir.Constant(ir.IntType(64), start)], inbounds=True)
                populate_array(view, data=data, shape=pack_array(builder, [ir.Constant(intp, size)]),
                               strides=pack_array(builder, [ir.Constant(intp, itemsize)]),
                               itemsize=ir.Constant(intp, itemsize), meminfo=None)
                views.append(view._getvalue())
            return context.make_tuple(builder, result, views)

        return result(block), codegen

    return cut
