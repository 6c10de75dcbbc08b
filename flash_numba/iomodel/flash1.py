"""HBM bytes of the flash1 kernels (the paper's Algorithms 1 and 4), in closed form.

Theorem 2 written out.  Take one (batch, head), N = Nq = Nk, no mask, and count
elements as the proof of Theorem 2 does (Dao et al. 2022, Appendix C).
Algorithm 1 loads every element of K and V once (line 6) and makes Tc passes
over the query side, each reading Q, O, l, m (line 8) and writing O, l, m
(lines 12-13).  With Tc = ceil(N / Bc):

    reads  = 2 N d + Tc (2 N d + 2 N)        K, V once; Q, O, l, m every pass
    writes =         Tc (  N d + 2 N)        O, l, m every pass
    total  = 2 N d + Tc (3 N d + 4 N)

Br does not appear: the Tr query blocks of one pass add up to N rows whatever
their size.  It only has to make the Br x Bc score tile fit next to the Br x d
and Bc x d tiles.  The paper takes Bc = Theta(M / d) (K_j and V_j fill SRAM of M
elements) and Br = Theta(min(M / d, d)) (Br Bc <= M for S_ij).  Then
Tc = Theta(N d / M) and, as M <= N d makes N d <= N^2 d^2 / M,

    total = Theta(N d + N d Tc) = Theta(N^2 d^2 / M).

The backward pass (Algorithm 4, Theorem 5) has the same form: K, V read and dK,
dV written once; per pass Q, O, dO, dQ and L read and dQ written:
2 N d + 2 N d + Tc (5 N d + N) elements, again Theta(N^2 d^2 / M).

By term (:mod:`.terms`): compulsory ``2 N d + 2 N d`` elements (Q, K, V read, O written once,
and L); everything else is re-reads, Theta(Tc N d) = Theta(N^2 d^2 / M): Q, O, l, m read and O,
l, m written once per pass; no S/P term.

What this model counts that the big-O drops: the constant factors (3 N d + 4 N
per pass instead of Theta(N d)); the 2 N d for K and V; the rounding up in
Tc; the init kernels (O, l, m and dQ written once); the final pass that turns
(m, l) into L = m + log(l) (2 N read, N written); the B*H independent heads;
item sizes (inputs and outputs in the storage dtype, l, m, L and, for float16,
the float32 O and dQ accumulators, 4 bytes each; the float16 outputs cost one
more pass converting O and dQ: N d read, N d written).  With a causal mask only
the block pairs (i, j) not wholly above the diagonal move data, which replaces
Tc N (the rows processed over all passes) by the sum over i of rows_i times the
number of visible blocks j: :func:`query_rows_processed`.

What is not counted: whatever the hardware does beyond the code's requests (L2
hits, 32-byte sectors); see :mod:`flash_numba.hbm`.
"""

from __future__ import annotations

import numpy as np

from .._inputs import acc_dtype
from ..hbm import HBMCount, KernelBytes
from ..kernels.causal import visible_kv_blocks


def query_rows_processed(Nq: int, Nk: int, Br: int, Bc: int, causal: bool) -> int:
    """Query rows loaded over all visible block pairs: Tc * Nq without a mask.

    Query block i (rows r0 .. r0 + rows_i - 1) meets the key blocks that some of
    its rows see: :func:`flash_numba.kernels.causal.visible_kv_blocks` of them.
    """
    total = 0
    for r0 in range(0, Nq, Br):
        total += min(Br, Nq - r0) * visible_kv_blocks(r0, Br, Bc, Nq, Nk, causal)
    return total


def _sizes(dtype) -> tuple[int, int, bool]:
    isz = np.dtype(dtype).itemsize
    asz = acc_dtype(dtype).itemsize
    return isz, asz, isz != asz


def _block(d, dtype, block, pass_):
    if block is not None:
        return block
    from ..kernels import flash1

    return flash1.SPEC.block(d, dtype, pass_)


def forward(BH, Nq, Nk, d, dtype, causal=False, block=None, G=1) -> HBMCount:
    """Bytes of "init O, l, m" and "Algorithm 1" (block None: the default block).

    A block per query head reads all of K and V, so ``G`` (query heads per key/value head)
    changes nothing here.
    """
    Br, Bc = _block(d, dtype, block, "forward")
    isz, asz, convert = _sizes(dtype)
    R = query_rows_processed(Nq, Nk, Br, Bc, causal)
    init_written = Nq * d * asz + 2 * Nq * asz  # O, l, m
    read = (
        2 * Nk * d * isz  # line 6: K_j, V_j, once each
        + R * (d * isz + 2 * asz + d * asz)  # line 8: Q_i, l_i, m_i; line 12: O_i
        + 2 * Nq * asz  # l, m for L = m + log(l)
        + convert * Nq * d * asz  # float16: O read for the conversion
    )
    written = (
        R * (d * asz + 2 * asz)  # lines 12-13: O_i, l_i, m_i
        + Nq * asz  # L
        + convert * Nq * d * isz  # float16: o
    )
    return HBMCount(
        {
            "init O, l, m": KernelBytes(0, BH * init_written),
            "Algorithm 1": KernelBytes(BH * read, BH * written),
        }
    )


def backward(BH, Nq, Nk, d, dtype, causal=False, block=None, G=1) -> HBMCount:
    """Bytes of "init dQ" and "Algorithm 4" (block None: the default block).

    ``G`` query heads per key/value head: a block per key/value head (BH / G of them) reads
    K_j, V_j and writes dK_j, dV_j once; the query side is per query head, as without groups.
    """
    Br, Bc = _block(d, dtype, block, "backward")
    isz, asz, convert = _sizes(dtype)
    R = query_rows_processed(Nq, Nk, Br, Bc, causal)
    kv = 2 * Nk * d * isz  # line 7: K_j, V_j read once each; line 24: dK_j, dV_j written once each
    read = (
        R * (3 * d * isz + asz + d * asz)  # line 10: Q_i, dO_i, O_i, L_i; line 21: dQ_i
        + convert * Nq * d * asz  # float16: dQ read for the conversion
    )
    written = (
        R * d * asz  # line 21: dQ_i
        + convert * Nq * d * isz  # float16: dq
    )
    return HBMCount(
        {
            "init dQ": KernelBytes(0, BH * Nq * d * asz),
            "Algorithm 4": KernelBytes(BH * read + BH // G * kv, BH * written + BH // G * kv),
        }
    )
