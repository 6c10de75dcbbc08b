"""IO model of :mod:`flash_numba.kernels.flash2_tc`.

Forward: flash2's loop order with Br = Bc = 64, so flash2_fast's count: the block that owns query block i
reads Q_i once (rows past Nq are zero-filled, not read), then the K and V rows of every K/V block it visits
(all Tc, or when causal up to the block of the last key its last row sees; rows past Nk are zero-filled), and
writes O_i and L_i once.  Per query head, with item sizes s (the 16-bit storage) and a = 4 (L in float32)::

    read    = s Nq d + sum_i 2 s d min(n_i Bc, Nk)
    written = s Nq d + a Nq

Backward: until flash2_tc has its own, the float16 backward is flash2_fast's (its model).
"""

from __future__ import annotations

from ..hbm import HBMCount
from ..kernels.flash2_tc import layout
from . import flash2_fast as _fast


def forward(BH, Nq, Nk, d, dtype, causal=False, block=None, G=1) -> HBMCount:
    """Bytes of the forward; every query head's blocks read K and V, so ``G`` changes nothing."""
    model = _fast.forward(BH, Nq, Nk, d, dtype, causal, block or (layout.Br, layout.Bc), G)
    return HBMCount({layout.FORWARD_NAME: next(iter(model.per_kernel.values()))})


def backward(BH, Nq, Nk, d, dtype, causal=False, block=None, G=1) -> HBMCount:
    """flash2_fast's deterministic backward (what runs for float16 until the tensor-core backward lands)."""
    return _fast.backward(BH, Nq, Nk, d, dtype, causal, block, G)


def backward_atomic(BH, Nq, Nk, d, dtype, causal=False, block=None, G=1) -> HBMCount:
    return _fast.backward_atomic(BH, Nq, Nk, d, dtype, causal, block, G)
