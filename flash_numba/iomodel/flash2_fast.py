"""IO model of :mod:`flash_numba.kernels.flash2_fast`.

Forward: the block that owns query block i reads Q_i once, then the K and V rows
of every K/V block it visits (all Tc of them, or, when causal, the blocks up to
the one holding the last key visible to its last row), and writes O_i and L_i
once.  Per (batch, head), with item sizes s (storage) and a (accumulation)::

    read    = s Nq d + sum_i 2 s d min(n_i Bc, Nk)     n_i = Tc, or causal: ceil((i Br + Br + Nk - Nq) / Bc)
    written = s Nq d + a Nq

so Theta(N d + N^2 d / Br) as for flash2.

Backward (when the block is a micro-tile shape; otherwise flash2's backward and
model): D = rowsum(dO * O) (flash2's kernel); the dK/dV kernel reads K_j, V_j once
and, for every query block it visits (from the first one that sees key block j),
Q_i, dO_i, L_i, D_i, then writes dK_j, dV_j; the dQ kernel reads Q_i, dO_i, L_i,
D_i once and the K, V rows of every key block it visits, then writes dQ_i.

By term (:mod:`.terms`): the forward's re-reads are flash2's, ``2 s d (sum_i n_i Bc - Nk)``
(K and V again per query block); the backward's re-reads include D, the second pass's
Q, dO, L, D and K, V per pair, or the atomic adds; no S/P term.

With ``deterministic=False`` the dQ kernel is gone: a zeroing kernel writes the
dQ accumulator (accumulation dtype) once, the dK/dV kernel adds dS_ij K_j into it
with one atomic add per element per visited (key block, query row): each counted
as a read and a write of the accumulation item size, and float16 calls cast the
accumulator to dq (one read, one write per element).
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


def visited_queries(Nq: int, Nk: int, Br: int, Bc: int, causal: bool) -> int:
    """Sum over key blocks j of the query rows the dK/dV kernel loads."""
    Tr, Tc = -(-Nq // Br), -(-Nk // Bc)
    if not causal:
        return Tc * Nq
    total = 0
    off = Nk - Nq
    for j in range(Tc):
        first = j * Bc - off  # first query row that sees key j * Bc
        i0 = 0 if first <= 0 else min(first // Br, Tr)
        total += max(0, Nq - i0 * Br)
    return total


def backward(BH, Nq, Nk, d, dtype, causal=False, block=None, deterministic=True) -> HBMCount:
    from ..kernels import flash2_fast as kernel

    Br, Bc = block
    flash2_model = _flash2.backward(BH, Nq, Nk, d, dtype, causal, block)
    if not kernel.uses_fast_backward(Br, Bc, d, dtype):
        return flash2_model
    s, a = np.dtype(dtype).itemsize, acc_dtype(dtype).itemsize
    rowsum = flash2_model.per_kernel[kernel.BACKWARD_NAMES[0]]
    kv_read = BH * (2 * s * d * Nk + (2 * s * d + 2 * a) * visited_queries(Nq, Nk, Br, Bc, causal))
    kv_written = BH * 2 * s * Nk * d
    if not deterministic:
        # one atomic add (a read and a write of a bytes) per dQ element per (key block, query row) visited
        atomics = BH * d * visited_queries(Nq, Nk, Br, Bc, causal)
        model = {
            kernel.BACKWARD_NAMES[0]: rowsum,
            kernel.ZERO_DQ_NAME: KernelBytes(0, BH * Nq * d * a),
            kernel.BACKWARD_KVQ_NAME: KernelBytes(kv_read + a * atomics, kv_written + a * atomics),
        }
        if s != a:
            model[kernel.CAST_DQ_NAME] = KernelBytes(BH * Nq * d * a, BH * Nq * d * s)
        return HBMCount(model)
    q_read = BH * ((2 * s * d + 2 * a) * Nq + 2 * s * d * visited_keys(Nq, Nk, Br, Bc, causal))
    q_written = BH * s * Nq * d
    return HBMCount(
        {
            kernel.BACKWARD_NAMES[0]: rowsum,
            kernel.BACKWARD_KV_NAME: KernelBytes(kv_read, kv_written),
            kernel.BACKWARD_Q_NAME: KernelBytes(q_read, q_written),
        }
    )
