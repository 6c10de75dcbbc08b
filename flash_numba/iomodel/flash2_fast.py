"""IO model of :mod:`flash_numba.kernels.flash2_fast`.

Forward: the block that owns query block i reads Q_i once, then the K and V rows
of every K/V block it visits (all Tc of them, or, when causal, the blocks up to
the one holding the last key visible to its last row), and writes O_i and L_i
once.  Per (batch, head), with item sizes s (storage) and a (accumulation)::

    read    = s Nq d + sum_i 2 s d min(n_i Bc, Nk)     n_i = Tc, or causal: ceil((i Br + Br + Nk - Nq) / Bc)
    written = s Nq d + a Nq

so Theta(N d + N^2 d / Br) as for flash2.  The backward is flash2's.
"""

from __future__ import annotations

import numpy as np

from .._inputs import acc_dtype
from ..hbm import HBMCount, KernelBytes
from . import flash2 as _flash2

FORWARD_NAME = "flash2_fast forward"


def visited_keys(Nq: int, Nk: int, Br: int, Bc: int, causal: bool) -> int:
    """Sum over query blocks of the number of key rows loaded (K and V each)."""
    Tr, Tc = -(-Nq // Br), -(-Nk // Bc)
    if not causal:
        return Tr * Nk
    total = 0
    off = Nk - Nq
    for i in range(Tr):
        last = i * Br + Br - 1 + off  # last key visible to the block's last row
        n_j = 0 if last < 0 else min(Tc, last // Bc + 1)
        total += min(n_j * Bc, Nk)
    return total


def forward(BH, Nq, Nk, d, dtype, causal=False, block=None) -> HBMCount:
    Br, Bc = block
    s, a = np.dtype(dtype).itemsize, acc_dtype(dtype).itemsize
    read = BH * (s * Nq * d + 2 * s * d * visited_keys(Nq, Nk, Br, Bc, causal))
    written = BH * (s * Nq * d + a * Nq)
    return HBMCount({FORWARD_NAME: KernelBytes(read, written)})


def backward(BH, Nq, Nk, d, dtype, causal=False, block=None) -> HBMCount:
    return _flash2.backward(BH, Nq, Nk, d, dtype, causal, block)
