"""Pieces every kernel module shares.

The counting pattern (see :mod:`flash_numba.hbm`).  A kernel factory takes a
``count`` flag and closes over it as the constant ``COUNT``.  Inside the kernel::

    nr = 0                      # bytes this thread read from global memory
    nw = 0                      # bytes this thread wrote
    ...
    x = q[bh, row, c]
    if COUNT:
        nr += Q_BYTES           # item size of q, a closure constant
    ...
    if COUNT:
        add_counts(counter, nr, nw)

Numba folds ``if COUNT:`` away when COUNT is False, so the plain kernel pays
nothing.  ``counter`` is an ``int64[2]`` array from :class:`~flash_numba.hbm.Counters`.
A thread that leaves early must still add what it counted (or count nothing
before leaving).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, int64, types, uint32

from ..device import SIMULATOR, jit

_NB = {
    np.dtype(np.float16): types.float16,
    np.dtype(np.float32): types.float32,
    np.dtype(np.float64): types.float64,
    np.dtype(np.uint16): types.uint16,  # bfloat16 words (flash2_tc's shared tiles)
}


def nb_type(dtype):
    """The Numba scalar type of a NumPy dtype."""
    return _NB[np.dtype(dtype)]


def acc_nb_type(dtype):
    """Accumulation type: float64 for float64 storage, else float32."""
    return types.float64 if np.dtype(dtype) == np.float64 else types.float32


def array_type(dtype, ndim: int):
    """A C-contiguous Numba array type, for compile-tier signatures."""
    return types.Array(nb_type(dtype), ndim, "C")


COUNTER_TYPE = types.Array(types.int64, 1, "C")
#: The layout of a flat input, ``(H, stride_B, stride_H, stride_N)`` in elements (flash2_fast's kernels).
LAYOUT_TYPE = types.UniTuple(types.int64, 4)


def input_type(dtype):
    """The Numba type of every input array a kernel reads (q, k, v, o, dO): 4-D ``(B, H, N, d)``, layout 'A'.

    Layout 'A' makes Numba read the strides from the array at run time, so one compiled
    kernel serves every layout whose rows hold d adjacent elements: contiguous,
    ``(B, N, H, d)`` transposed, a packed qkv, a slice.  :func:`flash_numba._inputs.prepare`
    hands every kernel arrays of exactly this type (a C-contiguous array too), so no second
    specialisation appears at run time.
    """
    return types.Array(nb_type(dtype), 4, "A")


def batch_head(x, bh):
    """``(b, h)`` of head ``bh = b*H + h`` of a ``(B, H, N, d)`` input ``x`` (H = x.shape[1]).

    The kernels number heads 0 .. B*H - 1 (grid axis x) and flatten the arrays they
    allocate to ``(B*H, ...)``; their inputs keep the caller's ``(B, H, N, d)`` strides
    (:func:`input_type`), so a tile load splits ``bh`` first (one 32-bit division) and
    then reads ``x[b, h, row, col]``.
    """
    return divmod(bh, x.shape[1])


def element(x, bh, row, col):
    """``x[b, h, row, col]`` of a ``(B, H, N, d)`` input (:func:`batch_head`), ``x[bh, row, col]`` of a 3-D array.

    For helpers that read both the inputs and arrays the kernels allocate (the
    ``standard`` kernels' S and P); the compiler computes b and h once per tile.
    """
    if x.ndim == 4:
        b, h = batch_head(x, bh)
        return x[b, h, row, col]
    return x[bh, row, col]


if not SIMULATOR:  # the simulator runs the Python above; compiled kernels get these versions
    from numba.extending import overload

    @overload(batch_head, target="cuda", jit_options={"forceinline": True})
    def _batch_head_cuda(x, bh):
        def split(x, bh):
            H = max(uint32(x.shape[1]), uint32(1))  # >= 1: a division without a zero test
            b = uint32(bh) // H
            return b, uint32(bh) - b * H
        return split

    @overload(element, target="cuda", jit_options={"forceinline": True})
    def _element_cuda(x, bh, row, col):
        if x.ndim == 4:
            def four(x, bh, row, col):
                b, h = batch_head(x, bh)
                return x[b, h, row, col]
            return four

        def three(x, bh, row, col):
            return x[bh, row, col]
        return three


# ------------------------------------------------------------------ non-finite values (docs/RELIABILITY.md, section 2)


@jit(device=True, forceinline=True)
def nan_max(a, b):
    """The larger of a and b, NaN if either is NaN (the kernels' row maxima: NaN in, NaN out).

    Not ``max``: on a GPU Numba lowers a float ``max`` to fmax, which drops a NaN operand,
    and Python's ``max`` (the simulator) drops it on one side only.  This is the same on both.
    """
    return a if (a > b or a != a) else b


if SIMULATOR:
    @jit(device=True, forceinline=True)
    def fmax(a, b):
        """The larger of a and b; a NaN operand is dropped (the other one returned): C's ``fmax``."""
        return b if a != a else (a if b != b else max(a, b))
else:
    @jit(device=True, forceinline=True)
    def fmax(a, b):
        """The larger of a and b; a NaN operand is dropped (the other one returned): C's ``fmax``.

        One ``max.f32`` on a GPU (Numba lowers a float ``max`` to it), where :func:`nan_max` costs four
        instructions (two compares, an ``or``, a select).  flash2_fast's forward takes its row maxima with it:
        a NaN score still gives a NaN row (``p = exp2(NaN - m)`` is NaN, and so are l_i, O_i and L_i), and
        m_i, which it leaves finite, is never written out on its own.
        """
        return max(a, b)


@jit(device=True, forceinline=True)
def madd_if(c, a, b, seen):
    """``c + a * b`` where ``seen``, else ``c``: a masked (query, key) entry adds nothing, even against an Inf or
    NaN in ``b``; a visible one always multiplies, so a P (dS, dropout's Zs P) of exactly 0 against Inf or NaN
    gives NaN, as IEEE arithmetic, the reference and PyTorch do (docs/RELIABILITY.md, section 2).  The test is
    the mask's, never the value's."""
    return c + a * b if seen else c


_EXP_MAX, _EXP2_MAX, _INF32 = np.float32(709.78), np.float32(1023.99), np.float32(np.inf)

if SIMULATOR:
    # The simulator runs math.exp and math.exp2 on Python floats, which raise OverflowError past
    # float64's range where a GPU returns inf: +inf there (x * inf, in x's own dtype), the same answer.
    @jit(device=True, forceinline=True)
    def exp_ieee(x):
        """``exp(x)`` with IEEE overflow (+inf), in the simulator as on a GPU."""
        return math.exp(x) if not x > _EXP_MAX else x * _INF32

    @jit(device=True, forceinline=True)
    def exp2_ieee(x):
        """``2**x`` with IEEE overflow (+inf), in the simulator as on a GPU."""
        return math.exp2(x) if not x > _EXP2_MAX else x * _INF32
else:  # a GPU's exp and exp2 overflow to inf already: no extra instruction
    @jit(device=True, forceinline=True)
    def exp_ieee(x):
        """``exp(x)`` (a GPU's, which overflows to +inf)."""
        return math.exp(x)

    @jit(device=True, forceinline=True)
    def exp2_ieee(x):
        """``2**x`` (a GPU's, which overflows to +inf)."""
        return math.exp2(x)


def rounded_mul(acc_dtype):
    """Device function ``(a, b) -> a * b`` rounded to the accumulation dtype ``acc_dtype``, never fused.

    Where a forward stores ``scale * S`` (rounded) and subtracts the row max from it, the
    backward that recomputes ``P = exp(scale * S - L)`` must round the product the same way.
    A GPU compiler turns ``a * b - c`` into one FMA, which does not round ``a * b``: with scores
    of 1e4 that moves each P_ij by up to half an ulp of 1e4 (~5e-4 in float32), differently per
    entry, and dQ's cancellations (the sum of dS_ij K_j) fail by ~1e-2
    (``test_large_scores_backward`` on the H200).  libdevice's ``fmul_rn`` / ``dmul_rn`` is a
    multiply the compiler never fuses.  The simulator multiplies NumPy scalars of the
    accumulation dtype, rounded once already.
    """
    return _MUL_RN[np.dtype(acc_dtype)]


if SIMULATOR:
    @jit(device=True, forceinline=True)
    def _mul(a, b):
        return a * b

    _MUL_RN = {np.dtype(np.float32): _mul, np.dtype(np.float64): _mul}
else:
    from numba.cuda import libdevice

    _MUL_RN = {np.dtype(np.float32): libdevice.fmul_rn, np.dtype(np.float64): libdevice.dmul_rn}


@jit(device=True, forceinline=True)
def add_counts(counter, nr, nw):
    """Add a thread's bytes read (``nr``) and written (``nw``) to a launch's ``int64[2]`` counter."""
    cuda.atomic.add(counter, 0, nr)
    cuda.atomic.add(counter, 1, nw)


@jit(device=True, forceinline=True)
def kv_head(bh, G):
    """The key/value head of query head ``bh`` (of B*Hq) with ``G`` query heads per key/value head.

    b*Hq + h = b*G*Hkv + h, so (b*Hq + h) // G = b*Hkv + h // G: grouped-query attention on
    flattened heads is one 32-bit division.
    """
    return int64(uint32(bh) // uint32(G))


@jit(device=True, forceinline=True)
def group_step(t, n_i, i_first, hkv, G):
    """``(bh, i)``: the query head and query block of step ``t`` of a key block's walk over its group.

    A dK/dV block of key/value head ``hkv`` visits query blocks ``i_first .. i_first + n_i - 1``
    of each of the G query heads ``hkv*G .. hkv*G + G - 1`` in turn: ``G * n_i`` steps, one loop
    (a fixed order, so the sums are deterministic).
    """
    g = uint32(t) // uint32(n_i)
    return hkv * G + int64(g), i_first + int64(uint32(t) - g * uint32(n_i))


GRID_LIMITS = (2**31 - 1, 65535, 65535)  # CUDA's largest grid (x, y, z)


def head_grid_2d(blocks_per_head: int, BH: int) -> tuple[int, int]:
    """A grid ``(B*H, blocks_per_head)``: the head on axis x (up to 2^31 - 1), the block of a head on axis y.

    The kernel reads its head and block from ``blockIdx`` without a division (decoding a
    1-D grid, ``bh = block // T``, cost a readable kernel 15-30 registers); axis y
    holds at most 65,535 blocks per head, a million query rows at Br = 16.
    """
    if BH > GRID_LIMITS[0]:
        raise ValueError(f"BH: {BH} heads, over CUDA's grid limit of {GRID_LIMITS[0]}")
    if blocks_per_head > GRID_LIMITS[1]:
        raise ValueError(f"N: {blocks_per_head} blocks per head, over CUDA's grid limit of {GRID_LIMITS[1]} "
                         "on axis y; use larger blocks or a shorter sequence")
    return BH, blocks_per_head


@jit(device=True, forceinline=True)
def heavy_first_block(rows):
    """The first row of this block in a :func:`head_grid_2d` grid, the last block of each head first.

    Under a causal mask the last query blocks see the most keys: starting them first
    leaves the short ones to fill the tail of the launch.
    """
    return int64(cuda.gridDim.y - 1 - cuda.blockIdx.y) * rows


def head_grid(blocks_per_head: int, BH: int) -> int:
    """A 1-D grid of ``blocks_per_head * BH`` blocks: B*H folded into axis x, whose limit is 2^31 - 1.

    Axes y and z stop at 65,535, so a grid ``(Tr, B*H)`` fails for a large batch; the
    kernels decode the head from ``blockIdx.x`` instead.
    """
    n = blocks_per_head * BH
    if n > GRID_LIMITS[0]:
        raise ValueError(f"BH: {BH} heads x {blocks_per_head} blocks per head = {n} blocks, over CUDA's "
                         f"grid limit of {GRID_LIMITS[0]}")
    return n
