"""IO model of :mod:`flash_numba.kernels.flash2_fast`.

Forward: the block that owns query block i reads Q_i once, then the K and V rows
of every K/V block it visits (all Tc of them, or, when causal, the blocks up to
the one holding the last key visible to its last row), and writes O_i and L_i
once.  Per (batch, head), with item sizes s (storage) and a (accumulation)::

    read    = s Nq d + sum_i 2 s d min(n_i Bc, Nk)     n_i: kernels.causal.visible_kv_blocks
    written = s Nq d + a Nq

so Theta(N d + N^2 d / Br) as for flash2.

Backward (when the block is a micro-tile shape; otherwise flash2's backward and
model), two-pass: the dQ kernel reads Q_i, dO_i, L_i and O_i once (it computes
D_i = rowsum(dO_i * O_i) itself and writes it) and the K, V rows of every key block
it visits, then writes dQ_i; the dK/dV kernel reads K_j, V_j once and, for every
query block it visits (from the first one that sees key block j), Q_i, dO_i, L_i,
D_i, then writes dK_j, dV_j.  The other backwards start with flash2's
D = rowsum(dO * O) kernel.

By term (:mod:`.terms`): the forward's re-reads are flash2's, ``2 s d (sum_i n_i Bc - Nk)``
(K and V again per query block); the backward's re-reads include D, the second pass's
Q, dO, L, D and K, V per pair, or the atomic adds; no S/P term.

The split deterministic backward (where it keeps the GPU busy, see
:func:`flash_numba.kernels.flash2_fast.layout.dq_copies`) writes S zeroed copies of dQ (a
bytes each element), adds into them as the atomic kernel below does (the same bytes), then reads
the S copies and writes dq once: its bytes depend on S, so on the device's SM count.

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
from ..kernels import _rowsum
from ..kernels.flash2_fast import layout
from ..kernels.causal import first_visible_q_block, visible_kv_blocks
from . import flash2 as _flash2



def visited_keys(Nq: int, Nk: int, Br: int, Bc: int, causal: bool) -> int:
    """Sum over query blocks of the number of key rows loaded (K and V each)."""
    return sum(min(visible_kv_blocks(i0, Br, Bc, Nq, Nk, causal) * Bc, Nk) for i0 in range(0, Nq, Br))


def forward(BH, Nq, Nk, d, dtype, causal=False, block=None, G=1) -> HBMCount:
    """Bytes of the forward; every query head's blocks read K and V, so ``G`` changes nothing."""
    Br, Bc = block
    s, a = np.dtype(dtype).itemsize, acc_dtype(dtype).itemsize
    read = BH * (s * Nq * d + 2 * s * d * visited_keys(Nq, Nk, Br, Bc, causal))
    written = BH * (s * Nq * d + a * Nq)
    return HBMCount({layout.FORWARD_NAME: KernelBytes(read, written)})


def visited_queries(Nq: int, Nk: int, Br: int, Bc: int, causal: bool) -> int:
    """Sum over key blocks j of the query rows the dK/dV kernel loads."""
    return sum(max(0, Nq - first_visible_q_block(j0, Br, Nq, Nk, causal) * Br) for j0 in range(0, Nk, Bc))


def _fast_parts(BH, Nq, Nk, d, dtype, causal, block, G):
    """None when ``block`` runs flash2's backward; else the parts the fast backward passes share: (item sizes s
    and a, D's bytes, the dK/dV kernel's reads and writes without atomics, the bytes of its dQ atomics: one add,
    a read and a write of a bytes, per dQ element per (key block, query row) visited)."""
    Br, Bc = block
    if not layout.uses_fast_backward(Br, Bc, d, dtype):
        return None
    s, a = np.dtype(dtype).itemsize, acc_dtype(dtype).itemsize
    rows = visited_queries(Nq, Nk, Br, Bc, causal)
    rowsum = _flash2.backward(BH, Nq, Nk, d, dtype, causal, block).per_kernel[_rowsum.NAME]
    BHkv = BH // G  # a dK/dV block per key/value head reads K_j, V_j once and the query side of G heads
    return (s, a, rowsum, BHkv * 2 * s * d * Nk + BH * (2 * s * d + 2 * a) * rows, BHkv * 2 * s * Nk * d,
            a * BH * d * rows)


def backward(BH, Nq, Nk, d, dtype, causal=False, block=None, G=1) -> HBMCount:
    """"dQ" (with D) and "dK, dV" (two-pass), or D = rowsum(dO*O), the split backward's zeroed copies, its
    dK/dV/dQ kernel and their sum (:func:`~flash_numba.kernels.flash2_fast.layout.split_dq_copies` picks, by
    the device); flash2's model for blocks that run flash2's backward.  ``G`` query heads per key/value head."""
    parts = _fast_parts(BH, Nq, Nk, d, dtype, causal, block, G)
    if parts is None:
        return _flash2.backward(BH, Nq, Nk, d, dtype, causal, block, G)
    s, a, rowsum, kv_read, kv_written, atomics = parts
    copies = layout.split_dq_copies(BH, G, Nq, Nk, d, dtype, block)
    if copies:  # the split backward: S copies of dQ zeroed, added into, summed
        n = BH * Nq * d
        return HBMCount({_rowsum.NAME: rowsum, layout.ZERO_DQ_COPIES_NAME: KernelBytes(0, copies * n * a),
                         layout.BACKWARD_KVQ_SPLIT_NAME: KernelBytes(kv_read + atomics, kv_written + atomics),
                         layout.SUM_DQ_NAME: KernelBytes(copies * n * a, n * s)})
    keys = visited_keys(Nq, Nk, *block, causal)
    # Q_i, dO_i, O_i and L_i read once, K and V per visited key block; dQ_i and D_i written
    dq = KernelBytes(BH * ((3 * s * d + a) * Nq + 2 * s * d * keys), BH * (s * d + a) * Nq)
    return HBMCount({layout.BACKWARD_Q_NAME: dq, layout.BACKWARD_KV_NAME: KernelBytes(kv_read, kv_written)})


def backward_atomic(BH, Nq, Nk, d, dtype, causal=False, block=None, G=1) -> HBMCount:
    """``deterministic=False``: D, the zeroed dQ accumulator, dK/dV/dQ with atomics and (float16) the cast.

    One atomic add (a read and a write of a bytes) per dQ element per (key block, query row) visited.
    """
    parts = _fast_parts(BH, Nq, Nk, d, dtype, causal, block, G)
    if parts is None:
        return _flash2.backward(BH, Nq, Nk, d, dtype, causal, block, G)
    s, a, rowsum, kv_read, kv_written, atomics = parts
    n = BH * Nq * d
    model = {
        _rowsum.NAME: rowsum,
        layout.ZERO_DQ_NAME: KernelBytes(0, n * a),
        layout.BACKWARD_KVQ_NAME: KernelBytes(kv_read + atomics, kv_written + atomics),
    }
    if s != a:
        model[layout.CAST_DQ_NAME] = KernelBytes(n * a, n * s)
    return HBMCount(model)
