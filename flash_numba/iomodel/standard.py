"""HBM bytes of the standard-attention kernels (:mod:`flash_numba.kernels.standard`), in closed form.

Notation, per (batch, head): item sizes ``s`` (storage dtype: q, k, v, o, S, P,
dS and the gradients) and ``a`` (L, D: float32, float64 for float64); for query
block i (``rows_i`` rows), ``kv_i`` the key rows of the tiles it visits (Nk, or
fewer when causal: the same pairs as flash2, :func:`flash2.kv_rows_read`);
``R = sum_i rows_i kv_i`` the elements of S in visited tiles (Nq Nk without a
mask); ``Q_R = sum_i rows_i * ceil(kv_i / Bc)`` the query rows the key-block
kernels load.

Forward::

    "S = scale*Q@K^T"  read  s Nq d + s d sum_i kv_i       write s R + 3 a Nq  (S; L, m, l)
    "P = softmax(S)"   read  s R + 2 a Nq                  write s R           (P; reads m, l)
    "O = P@V"          read  s R + s d sum_i kv_i          write s Nq d        (O)

Q read once, K and V once per query block, O and L written once: flash2's
forward bytes exactly (at the same block), plus the S/P term ``4 s R + 4 a Nq``
(S and P each written and read back once, and the softmax's row statistics m, l
written and read once).  For N = Nq = Nk without a mask that is
``2 s N d + 2 s N d Tr + s N d + a N`` plus ``4 s N^2 + 4 a N``: Theta(N^2 d / Br + N^2),
the N^2 of S and P that the paper's Theorem 2 says FlashAttention removes.

Backward::

    "D = rowsum(dO*O)"   read 2 s Nq d                          write a Nq
    "P, dS = P*(dP-D)"   read 2 s Nq d + 2 a Nq + 2 s d sum kv_i write 2 s R   (P and dS)
    "dV = P^T@dO"        read s R + s d Q_R                     write s Nk d
    "dK = scale*dS^T@Q"  read s R + s d Q_R                     write s Nk d
    "dQ = scale*dS@K"    read s R + s d sum_i kv_i              write s Nq d

with the N x N term ``5 s R`` (P and dS written once; P read once, dS twice).  In float16, where the
forward computes S on tensor cores, the backward's P must be exp(S - L) of exactly that S (a float32
sum in another order rounds, now and then, to the neighbouring float16), so it runs the forward's S
launch again, into P's buffer, at the forward's block ``(64, Bc')`` (sums ``kv'_i``, ``R'``:
:func:`flash_numba.kernels.standard.scores_block`), and the P and dS kernel reads S instead of Q and K::

    "S = scale*Q@K^T"           read s Nq d + s d sum kv'_i          write s R' + 3 a Nq  (as the forward's)
    "P, dS = P*(dP-D) from S"   read s Nq d + 2 a Nq + s d sum kv_i + s E    write 2 s R

``E`` the visible (row, key) pairs, the entries of S it reads (Nq Nk without a mask); the N x N term
is ``5 s R + s R' + s E``.  L, m and l of the S launch go to scratch and count as re-reads.
These are bytes the code requests; the L2 cache serves some of the re-reads
(see :mod:`flash_numba.hbm`).
"""

from __future__ import annotations

import numpy as np

from .._inputs import acc_dtype
from ..hbm import HBMCount, KernelBytes
from ..kernels._spec import visible_pairs
from ..kernels.standard import BACKWARD_NAMES, BACKWARD_TC_NAMES, FORWARD_NAMES, scores_block
from .flash2 import kv_rows_read
from .matmul16 import TILE, matmul  # noqa: F401  (lesson 4's product, imported from here before)


def _sums(Nq, Nk, causal, block):
    """(sum_i kv_i, R = sum_i rows_i kv_i, Q_R = sum_i rows_i ceil(kv_i / Bc))."""
    Br, Bc = block
    kv = kv_rows_read(Nq, Nk, causal, block)
    rows = [min(Br, Nq - i * Br) for i in range(len(kv))]
    R = sum(r * x for r, x in zip(rows, kv))
    QR = sum(r * -(-x // Bc) for r, x in zip(rows, kv))
    return sum(kv), R, QR


def forward(BH, Nq, Nk, d, dtype, causal=False, block=None, G=1) -> HBMCount:
    """Bytes of :func:`flash_numba.kernels.standard.forward`, per kernel (K and V are read per query
    head, so ``G`` changes nothing)."""
    s, a = np.dtype(dtype).itemsize, acc_dtype(dtype).itemsize
    kv, R, _ = _sums(Nq, Nk, causal, block)
    return HBMCount(
        {
            FORWARD_NAMES[0]: KernelBytes(BH * s * (Nq * d + kv * d), BH * (s * R + 3 * a * Nq)),
            FORWARD_NAMES[1]: KernelBytes(BH * (s * R + 2 * a * Nq), BH * s * R),
            FORWARD_NAMES[2]: KernelBytes(BH * s * (R + kv * d), BH * s * Nq * d),
        }
    )


def backward(BH, Nq, Nk, d, dtype, causal=False, block=None, G=1) -> HBMCount:
    """Bytes of :func:`flash_numba.kernels.standard.backward`, per kernel; dV and dK are written
    once per key/value head (BH / G of them, ``G`` query heads per key/value head).  float16 on this GPU's
    tensor cores (the simulator's: every cc) runs :data:`BACKWARD_TC_NAMES`, else :data:`BACKWARD_NAMES`."""
    s, a = np.dtype(dtype).itemsize, acc_dtype(dtype).itemsize
    kv, R, QR = _sums(Nq, Nk, causal, block)
    col = KernelBytes(BH * s * (R + d * QR), BH // G * s * Nk * d)
    sblock = scores_block(d, dtype)
    if sblock is None:  # P and dS recompute S from Q and K
        grad = {BACKWARD_NAMES[1]: KernelBytes(BH * (2 * s * Nq * d + 2 * a * Nq + 2 * s * d * kv), BH * 2 * s * R)}
    else:  # the forward's S launch again, then P and dS read S at the visible entries
        E = visible_pairs(Nq, Nk, causal)
        grad = {
            BACKWARD_TC_NAMES[1]: forward(BH, Nq, Nk, d, dtype, causal, sblock).per_kernel[FORWARD_NAMES[0]],
            BACKWARD_TC_NAMES[2]: KernelBytes(BH * (s * Nq * d + 2 * a * Nq + s * d * kv + s * E), BH * 2 * s * R),
        }
    return HBMCount(
        {
            BACKWARD_NAMES[0]: KernelBytes(BH * 2 * s * Nq * d, BH * a * Nq),
            **grad,
            BACKWARD_NAMES[2]: col,
            BACKWARD_NAMES[3]: col,
            BACKWARD_NAMES[4]: KernelBytes(BH * s * (R + kv * d), BH * s * Nq * d),
        }
    )


def sp_bytes(BH, Nq, Nk, d, dtype, causal, block, pass_="forward") -> int:
    """The S/P term: bytes of the N x N matrices through HBM (and the softmax's row statistics).

    Forward ``4 s R + 4 a Nq``: S written and read, P written and read, m and l written and read.
    Backward ``5 s R``: P and dS written, P read once, dS twice; in float16 on tensor cores also S, written
    by the forward's S launch at its block (``s R'``) and read at the visible entries (``s E``).
    """
    s, a = np.dtype(dtype).itemsize, acc_dtype(dtype).itemsize
    _, R, _ = _sums(Nq, Nk, causal, block)
    if pass_ == "forward":
        return BH * (4 * s * R + 4 * a * Nq)
    sblock = scores_block(d, dtype)
    S = 0 if sblock is None else s * (_sums(Nq, Nk, causal, sblock)[1] + visible_pairs(Nq, Nk, causal))
    return BH * (5 * s * R + S)
