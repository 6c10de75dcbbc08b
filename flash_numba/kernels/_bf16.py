"""bfloat16 as 16-bit words: conversions on the device (every cc, the simulator) and on the host.

A bfloat16 value is the upper half of a float32: 1 sign bit, 8 exponent bits, 7 mantissa bits.
Inside flash_numba a bfloat16 array is stored as ``uint16`` words (NumPy has no bfloat16; PyTorch's
``__cuda_array_interface__`` refuses it, so a torch bfloat16 tensor is read through an int16 view).

    bf16_to_f32(u16) -> float32      the word shifted into the upper half of a float32 (exact)
    f32_to_bf16(x)   -> uint16       round to nearest, ties to even; NaN stays NaN (quiet)

Both are integer arithmetic on the float's bits, so they run on a T4 (no bf16 instructions) and in
the simulator.  ``to_bf16_bits`` / ``from_bf16_bits`` are the NumPy versions (tests, references).
"""

from __future__ import annotations

import numpy as np

from ..device import SIMULATOR, jit


# ---------------------------------------------------------------- host (NumPy)
def to_bf16_bits(x) -> np.ndarray:
    """float array -> uint16 bfloat16 words, round to nearest even (through float32), NaN kept NaN."""
    bits = np.array(x, dtype=np.float32).view(np.uint32).astype(np.uint64)  # a contiguous copy, shape kept
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    return np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)


def from_bf16_bits(u) -> np.ndarray:
    """uint16 bfloat16 words -> float32 (exact)."""
    return (np.asarray(u, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to_bf16(x) -> np.ndarray:
    """``x`` rounded to bfloat16, returned as float32 (what a bfloat16 input holds)."""
    return from_bf16_bits(to_bf16_bits(x))


# ---------------------------------------------------------------- device
if SIMULATOR:
    def f32_bits(x):
        return np.uint32(np.float32(x).view(np.uint32))

    def bits_f32(u):
        return np.uint32(u).view(np.float32)
else:
    def _bitcast(src, dst):
        from numba.cuda.extending import intrinsic

        @intrinsic
        def cast(typingctx, x):
            sig = dst(src)

            def codegen(context, builder, sig, args):
                return builder.bitcast(args[0], context.get_value_type(dst))

            return sig, codegen

        return cast

    from numba.cuda import types as _types

    _f32_bits = _bitcast(_types.float32, _types.uint32)
    _bits_f32 = _bitcast(_types.uint32, _types.float32)

    @jit(device=True, forceinline=True)
    def f32_bits(x):
        return _f32_bits(np.float32(x))

    @jit(device=True, forceinline=True)
    def bits_f32(u):
        return _bits_f32(np.uint32(u))


@jit(device=True, forceinline=True)
def bf16_to_f32(u):
    """A bfloat16 word (uint16) as float32: its 16 bits become the float's upper half."""
    return bits_f32(np.uint32(u) << np.uint32(16))


@jit(device=True, forceinline=True)
def f32_to_bf16(x):
    """float32 -> bfloat16 word (uint16), round to nearest, ties to even; NaN stays a (quiet) NaN."""
    bits = f32_bits(x)
    if (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):  # NaN: keep the sign, set a mantissa bit
        return np.uint16((bits >> np.uint32(16)) | np.uint32(0x40))
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    return np.uint16((bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16))
