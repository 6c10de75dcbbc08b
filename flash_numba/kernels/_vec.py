"""16-byte loads and stores: ``load16(a, i)``, the elements ``a[i .. i + n - 1]`` as a tuple (n = 16 / itemsize),
and ``store16(A, i, src, j)``: ``A[i .. i + n - 1] = src[j .. j + n - 1]`` in one store.

Numba has no vector loads: ``a[i]; a[i + 1]; ...`` from a global array stays n scalar ``ld.global``
(NVVM does not know the address is 16-byte aligned).  This intrinsic reads them with one
``ld.global.v4.f32`` (``v2.f64``, ``v4.b32`` of float16 pairs): the caller promises that ``i`` is a
multiple of n and the array's start 16-byte aligned (:func:`aligned16`, checked on the host).

``store16`` writes a shared tile from a thread's registers (``src`` a local array): NVVM splits stores
it cannot prove 16-byte aligned into 8-byte ones (two bank passes where one would do); the caller
promises ``i`` a multiple of n in a tile that starts on 16 bytes.

In the simulator both are plain Python: the n elements, each read and written with its bounds check.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..device import SIMULATOR, jit

VECTOR_BYTES = 16


def lanes(dtype) -> int:
    """Elements in one 16-byte load of ``dtype``."""
    return VECTOR_BYTES // np.dtype(dtype).itemsize


def aligned16(arr, layout) -> bool:
    """True when every row of the flat input ``arr`` with ``layout`` ``(H, stride_B, stride_H, stride_N)``
    (:func:`flash_numba._views.flat_input`) starts on 16 bytes: its first element does and the strides are
    multiples of :func:`lanes` (a view that starts mid-row, or a packed buffer with an odd row stride, is not)."""
    n = lanes(arr.dtype)
    if SIMULATOR:
        start = arr._ary.__array_interface__["data"][0]
    else:
        start = int(arr.device_ctypes_pointer.value or 0)
    return start % VECTOR_BYTES == 0 and all(int(s) % n == 0 for s in layout[1:])


@lru_cache(maxsize=None)
def loader(dtype_name: str):
    """``load16(a, i) -> UniTuple(dtype, n)``: elements i .. i + n - 1 of the 1-D C array ``a`` in one load."""
    n = lanes(dtype_name)
    if SIMULATOR:  # the simulator runs device functions as Python: a tuple of n element reads
        @jit(device=True, forceinline=True)
        def load16(a, i):
            return tuple(a[i + e] for e in range(n))
        return load16
    return _intrinsic(n)


@lru_cache(maxsize=None)
def _intrinsic(n: int):
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic
    from numba.cuda.np.arrayobj import make_array

    @intrinsic
    def load16(typingctx, a, i):
        result = types.UniTuple(a.dtype, n)

        def codegen(context, builder, sig, args):
            arr = make_array(a)(context, builder, args[0])
            index = builder.zext(args[1], ir.IntType(64)) if args[1].type.width < 64 else args[1]
            ptr = builder.gep(arr.data, [index], inbounds=True)
            vec = ir.VectorType(context.get_data_type(a.dtype), n)
            value = builder.load(builder.bitcast(ptr, vec.as_pointer()), align=VECTOR_BYTES)
            items = [builder.extract_element(value, ir.Constant(ir.IntType(32), e)) for e in range(n)]
            return context.make_tuple(builder, result, items)

        return result(a, i), codegen

    return load16


@lru_cache(maxsize=None)
def storer(dtype_name: str):
    """``store16(A, i, src, j)``: ``A[i + e] = src[j + e]`` for e < n (n = :func:`lanes`), one 16-byte store."""
    n = lanes(dtype_name)
    if SIMULATOR:
        @jit(device=True, forceinline=True)
        def store16(A, i, src, j):
            for e in range(n):
                A[i + e] = src[j + e]
        return store16
    return _store_intrinsic(n)


@lru_cache(maxsize=None)
def _store_intrinsic(n: int):
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic
    from numba.cuda.np.arrayobj import make_array

    def index64(builder, value):
        return builder.zext(value, ir.IntType(64)) if value.type.width < 64 else value

    @intrinsic
    def store16(typingctx, A, i, src, j):
        def codegen(context, builder, sig, args):
            dst = make_array(A)(context, builder, args[0])
            s = make_array(src)(context, builder, args[2])
            ty = context.get_data_type(A.dtype)
            vec = ir.VectorType(ty, n)
            value = ir.Constant(vec, ir.Undefined)
            j0 = index64(builder, args[3])
            for e in range(n):
                at = builder.add(j0, ir.Constant(ir.IntType(64), e))
                item = builder.load(builder.gep(s.data, [at], inbounds=True))
                value = builder.insert_element(value, item, ir.Constant(ir.IntType(32), e))
            ptr = builder.gep(dst.data, [index64(builder, args[1])], inbounds=True)
            builder.store(value, builder.bitcast(ptr, vec.as_pointer()), align=VECTOR_BYTES)
            return context.get_dummy_value()

        return types.void(A, i, src, j), codegen

    return store16
