"""HBM bytes of the 16 x 16 tiled matrix product (:mod:`flash_numba.kernels.matmul16`), lesson 4.

The product ``C (M, N) = op(A) (M, K) @ op(B) (K, N)``, per batch index, with
``e`` bytes per element and ``T = 16``: the thread block of each C tile stages
the K-strip of A of its tile row and of B of its tile column, so A is read once
per tile column and B once per tile row::

    read  = e * (ceil(N/T) * M * K  +  ceil(M/T) * K * N)
    write = e * M * N
"""

from __future__ import annotations

import numpy as np

from ..hbm import KernelBytes

TILE = 16  # as flash_numba.kernels.matmul16.TILE


def _tiles(x: int) -> int:
    return -(-x // TILE)


def matmul(BH, M, N, K, dtype) -> KernelBytes:
    """Bytes of one launch of the tiled product ``(BH, M, K) @ (BH, K, N)`` (any transposes)."""
    e = np.dtype(dtype).itemsize
    return KernelBytes(BH * e * (_tiles(N) * M * K + _tiles(M) * K * N), BH * e * M * N)
