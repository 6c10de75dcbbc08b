"""Block sizes from the device's shared memory: the paper's rule, made to fit.

The FlashAttention paper (Algorithm 1, line 1) sets the block sizes from the
on-chip memory ``M`` (in elements):

    Bc = ceil(M / (4 d)),    Br = min(Bc, d)

so that the four tiles of one step (Q_i, K_j, V_j and O_i, each about
``Bc x d``) fill the shared memory.  Our kernels hold their tiles in the
accumulation dtype (float32, or float64 for float64 storage), so ``M`` is the
shared memory one block may use divided by that item size, and also keep a score
tile ``S`` (Br x Bc) and a few per-row values; each kernel module states its
exact footprint as ``shared_bytes(Br, Bc, d, dtype)``.  :func:`choose` starts
from the paper's numbers, caps them at the kernel's limits (threads per block),
rounds down to a multiple of 8 and shrinks until the footprint fits the
device's budget, never above 48 KB of static shared memory, so a T4 runs
every kernel.  A kernel that can hold its tiles in dynamic shared memory
(``spec.dynamic_shared``: flash2_fast) chooses within :func:`dynamic_budget`
instead, which is larger from cc 9.0 up.
"""

from __future__ import annotations

import math

import numpy as np

from . import device
from ._inputs import acc_dtype


def paper_block_sizes(M: int, d: int) -> tuple[int, int]:
    """The paper's ``(Br, Bc)`` for ``M`` elements of on-chip memory and head dim ``d``."""
    Bc = math.ceil(M / (4 * d))
    return min(Bc, d), Bc


def shared_budget() -> int:
    """Bytes of static shared memory one block may use on this device (<= 48 KB)."""
    return min(device.info().shared_mem_per_block, device.STATIC_SHARED_LIMIT)


def dynamic_budget() -> int:
    """Bytes of shared memory one block of a kernel that can use dynamic shared memory may use on this device:
    its opt-in limit from :data:`flash_numba.device.DYNAMIC_SHARED_FROM_CC` up, else :func:`shared_budget`."""
    info = device.info()
    return max(device.dynamic_shared_limit(info.compute_capability, info.shared_mem_per_block_optin), shared_budget())


def _round8(x: int) -> int:
    return x if x < 8 else (x // 8) * 8


def choose(d: int, dtype, shared_bytes, *, max_Br: int, max_Bc: int, budget: int | None = None) -> tuple[int, int]:
    """``(Br, Bc)`` for a kernel: the paper's rule, capped, rounded, shrunk to fit."""
    budget = shared_budget() if budget is None else budget
    M = budget // np.dtype(acc_dtype(dtype)).itemsize
    Br, Bc = paper_block_sizes(M, d)
    Bc = _round8(min(Bc, max_Bc))
    Br = _round8(min(Br, max_Br, Bc))
    while shared_bytes(Br, Bc, d, dtype) > budget:
        if Bc > Br:
            Bc = _round8(Bc - 8) if Bc > 8 else Bc - 1
        else:
            Br = _round8(Br - 8) if Br > 8 else Br - 1
            Bc = max(min(Bc, Br), 1) if Bc > Br else Bc
        if Br < 1 or Bc < 1:
            raise ValueError(f"no block size fits d = {d} ({np.dtype(dtype)}) in {budget} bytes of shared memory")
    return Br, Bc


def as_pair(block, *, max_Br: int, max_Bc: int) -> tuple[int, int]:
    """``block=(Br, Bc)`` as two Python ints (NumPy integers accepted), checked to be positive and
    within the kernel's limits; the first checks every kernel's own block rule can rely on."""
    try:
        Br, Bc = block
    except (TypeError, ValueError):
        raise TypeError(f"block: expected a pair (Br, Bc) of positive ints or None, got {block!r}") from None
    for name, x in (("Br", Br), ("Bc", Bc)):
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)) or x < 1:
            raise ValueError(f"block: {name} must be a positive int, got {x!r}")
    Br, Bc = int(Br), int(Bc)
    if Br > max_Br or Bc > max_Bc:
        raise ValueError(f"block: (Br, Bc) = ({Br}, {Bc}) exceeds this kernel's limits Br <= {max_Br}, Bc <= {max_Bc}")
    return Br, Bc


def validate(
    block, d: int, dtype, shared_bytes, *, max_Br: int, max_Bc: int, budget: int | None = None
) -> tuple[int, int]:
    """Check an explicit ``block=(Br, Bc)`` against the kernel's and the device's limits."""
    budget = shared_budget() if budget is None else budget
    Br, Bc = as_pair(block, max_Br=max_Br, max_Bc=max_Bc)
    need = shared_bytes(Br, Bc, d, dtype)
    if need > budget:
        raise ValueError(
            f"block: (Br, Bc) = ({Br}, {Bc}) needs {need} bytes of shared memory for d = {d} "
            f"({np.dtype(dtype)}), more than the {budget} bytes one block may use here"
        )
    return Br, Bc
