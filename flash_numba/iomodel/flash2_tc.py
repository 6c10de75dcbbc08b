"""IO model of :mod:`flash_numba.kernels.flash2_tc`.

Forward: flash2's loop order with Br = Bc = 64, so flash2_fast's count: the block that owns query block i
reads Q_i once (rows past Nq are zero-filled, not read), then the K and V rows of every K/V block it visits
(all Tc, or when causal up to the block of the last key its last row sees; rows past Nk are zero-filled), and
writes O_i and L_i once.  Per query head, with item sizes s (the 16-bit storage) and a = 4 (L in float32)::

    read    = s Nq d + sum_i 2 s d min(n_i Bc, Nk)
    written = s Nq d + a Nq

Backward: :func:`backward` and :func:`backward_atomic` (their launches' bytes, :mod:`..kernels.flash2_tc.backward`).
"""

from __future__ import annotations

from ..hbm import HBMCount, KernelBytes
from ..kernels.flash2_tc.backward import io_backward, io_backward_atomic
from ..kernels.flash2_tc import layout
from . import flash2_fast as _fast


def forward(BH, Nq, Nk, d, dtype, causal=False, block=None, G=1) -> HBMCount:
    """Bytes of the forward; every query head's blocks read K and V, so ``G`` changes nothing."""
    model = _fast.forward(BH, Nq, Nk, d, dtype, causal, block or (layout.Br, layout.Bc), G)
    return HBMCount({layout.FORWARD_NAME: next(iter(model.per_kernel.values()))})


def backward(BH, Nq, Nk, d, dtype, causal=False, block=None, G=1) -> HBMCount:
    """The dQ kernel (Q_i, dO_i, O_i, L_i once, K and V per visited key block; dQ_i and D_i written) and the dK/dV
    kernel (K_j, V_j once; Q_i, dO_i, L_i, D_i per visited query block; dK_j, dV_j written)."""
    return HBMCount({name: KernelBytes(*rw) for name, rw in
                     io_backward(BH, Nq, Nk, d, dtype, causal, G).items()})


def backward_atomic(BH, Nq, Nk, d, dtype, causal=False, block=None, G=1) -> HBMCount:
    """D and the zeroed float32 dQ, the dK/dV kernel plus one float32 atomic add (a read and a write of 4 bytes)
    per dQ element per visited (key block, query row), the cast of dQ to the storage type."""
    return HBMCount({name: KernelBytes(*rw) for name, rw in
                     io_backward_atomic(BH, Nq, Nk, d, dtype, causal, G).items()})
