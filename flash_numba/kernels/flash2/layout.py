"""flash2's thread grid, launch names, shared-memory sizes and block rule (host side), shared by its kernels."""

from __future__ import annotations

import numpy as np

from ... import _inputs
from .. import _rowsum
from .._common import acc_nb_type
from .._spec import check_pass

TY, TX = 8, 16  # thread grid of a block: TY rows of TX threads (a half warp each)
NT = TY * TX  # 128 threads per block

#: Values per thread in an accumulator tile of width d (O_i, dQ_i, dK_j, dV_j) that block_limits allows.
MAX_TILE = 32

FORWARD_NAME = "flash2 forward"
BACKWARD_NAMES = (_rowsum.NAME, "dK, dV", "dQ")


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive ints."""
    return -(-a // b)


def kernel_constants(dtype):
    """(ACC numba type, its NumPy type, storage item size, accumulation item size)."""
    acc = _inputs.acc_dtype(dtype)
    return acc_nb_type(dtype), acc.type, np.dtype(dtype).itemsize, acc.itemsize


def shared_bytes(Br: int, Bc: int, d: int, dtype, pass_: str = "forward") -> int:
    """Static shared memory the kernels of ``pass_`` declare (backward: the larger kernel)."""
    a = _inputs.acc_dtype(dtype).itemsize
    odd = d | 1
    if pass_ == "forward":
        # Q_i (Br, d); K_j (Bc, d|1); V_j (Bc, d); P~_ij (Br, Bc); row partials (Br, 16)
        return a * (Br * d + Bc * odd + Bc * d + Br * Bc + Br * TX)
    if pass_ == "backward":
        # dK, dV: K_j, V_j (Bc, d); Q_i, dO_i (Br, d|1); P_ij^T, dS_ij^T (Bc, Br); L_i, D_i (Br)
        dkdv = 2 * Bc * d + 2 * Br * odd + 2 * Bc * Br + 2 * Br
        # dQ: Q_i, dO_i (Br, d); K_j, V_j (Bc, d|1); dS_ij (Br, Bc); L_i, D_i (Br)
        dq = 2 * Br * d + 2 * Bc * odd + Br * Bc + 2 * Br
        return a * max(dkdv, dq)
    raise ValueError(f"pass_: expected 'forward' or 'backward', got {pass_!r}")


def block_limits(d: int, dtype, pass_: str = "forward") -> tuple[int, int]:
    """``(max_Br, max_Bc)``, so that a thread's register tiles stay small.

    A thread holds ceil(rows / 8) x ceil(d / 16) values of each (rows x d)
    accumulator (O_i or dQ_i: rows = Br; dK_j and dV_j: rows = Bc), at most
    :data:`MAX_TILE`, and ceil(Br / 8) x ceil(Bc / 16) values of S_ij (its
    transpose in the dK, dV kernel), with Br <= 64 and Bc <= 256 (backward: 128).
    Any block within the limits is correct; the default blocks compile without
    spills (see :func:`flash_numba.kernels.flash2.compile_all`).
    """
    check_pass(pass_)
    rows = TY * (MAX_TILE // cdiv(d, TX))  # rows of a (rows x d) accumulator within MAX_TILE
    if pass_ == "forward":
        return min(rows, 64), 256
    return min(rows, 64), min(rows, 128)
