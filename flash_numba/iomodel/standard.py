"""HBM bytes of the standard-attention kernels (:mod:`flash_numba.kernels.standard`), in closed form.

Notation: ``e`` bytes per element of the storage dtype, ``e_L`` of L (4, or 8 for
float64), ``T = 16`` the tile side, ``ceil(x) = ceil(x / T)`` tile counts.

The tiled product ``C (M, N) = op(A) (M, K) @ op(B) (K, N)``, per batch index: the
thread block of each C tile stages the K-strip of A of its tile row and of B of
its tile column, so A is read once per tile column and B once per tile row::

    read  = e * (ceil(N/T) * M * K  +  ceil(M/T) * K * N)
    write = e * M * N

The softmax reads each row of S three times (max, sum, write passes) and writes P
and L; ``P = exp(S - L)`` reads S_ij and L_i per element; ``dS = P * (dP - D)``
reads P and dP twice (for D, then for dS).  Causal masking changes nothing: S is
computed in full and the masked entries are written as -inf.

Forward, per batch index (N = Nq = Nk, dividing T; bytes / e)::

    S = scale*Q@K^T     read 2 N^2 d / T          write N^2
    P = softmax(S)      read 3 N^2                write N^2 (+ N L)
    O = P@V             read N^2 ceil(d/T) + N^2 d / T   write N d

    total  = N d + (5 + ceil(d/T) + 3 d/T) N^2 = Theta(N d + N^2)

for a head dim d <= 128 (d / T <= 8): the paper's Theta(N d + N^2) for standard
attention, with the N^2 term from S and P going through HBM.  The tiles only set
the constant; the backward (seven kernels, four N x N matrices written) is again
Theta(N d + N^2).  These are bytes the code requests; on a GPU the L2 cache serves
many of the tile re-reads (see :mod:`flash_numba.hbm`).
"""

from __future__ import annotations

import numpy as np

from .._inputs import acc_dtype
from ..hbm import HBMCount, KernelBytes

TILE = 16  # as flash_numba.kernels.standard.TILE


def _tiles(x: int) -> int:
    return -(-x // TILE)


def matmul(BH, M, N, K, dtype) -> KernelBytes:
    """Bytes of one launch of the tiled product ``(BH, M, K) @ (BH, K, N)`` (any transposes)."""
    e = np.dtype(dtype).itemsize
    return KernelBytes(BH * e * (_tiles(N) * M * K + _tiles(M) * K * N), BH * e * M * N)


def forward(BH, Nq, Nk, d, dtype, causal=False, block=None) -> HBMCount:
    """Bytes of :func:`flash_numba.kernels.standard.forward`, per kernel."""
    e, e_L = np.dtype(dtype).itemsize, acc_dtype(dtype).itemsize
    rows, nn = BH * Nq, BH * Nq * Nk
    return HBMCount(
        {
            "S = scale*Q@K^T": matmul(BH, Nq, Nk, d, dtype),
            "P = softmax(S)": KernelBytes(3 * nn * e, nn * e + rows * e_L),
            "O = P@V": matmul(BH, Nq, d, Nk, dtype),
        }
    )


def backward(BH, Nq, Nk, d, dtype, causal=False, block=None) -> HBMCount:
    """Bytes of :func:`flash_numba.kernels.standard.backward`, per kernel."""
    e, e_L = np.dtype(dtype).itemsize, acc_dtype(dtype).itemsize
    nn = BH * Nq * Nk
    return HBMCount(
        {
            "S (recompute)": matmul(BH, Nq, Nk, d, dtype),
            "P = exp(S-L) (recompute)": KernelBytes(nn * (e + e_L), nn * e),
            "dV = P^T@dO": matmul(BH, Nk, d, Nq, dtype),
            "dP = dO@V^T": matmul(BH, Nq, Nk, d, dtype),
            "dS = P*(dP-D)": KernelBytes(4 * nn * e, nn * e),
            "dQ = scale*dS@K": matmul(BH, Nq, d, Nk, dtype),
            "dK = scale*dS^T@Q": matmul(BH, Nk, d, Nq, dtype),
        }
    )
