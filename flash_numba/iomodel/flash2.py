"""HBM bytes of the flash2 kernels, in closed form.

Forward (one launch, "flash2 forward").  Q is read once, K and V once per query
block (Tr times), O and L are written once.  Per (batch, head), with item size
s of q, k, v, o and a of L, and no mask:

    reads  = Nq d s + Tr * 2 Nk d s,    Tr = ceil(Nq / Br)
    writes = Nq d s + Nq a

which is Theta(N d + N^2 d / Br) for N = Nq = Nk.  flash1 (the paper's
Algorithm 1) reads Q_i and reads and writes O_i, l_i, m_i once per pair of
blocks: Theta(N^2 d / Bc), which the paper's Theorem 2 writes Theta(N^2 d^2 / M)
with Bc = Theta(M / d) for M elements of SRAM.  The two orders agree when Br
is Theta(M / d) too; per pair of blocks flash2 then moves two tiles (K_j, V_j)
against flash1's three (Q_i, and O_i read and written) plus l_i and m_i, and it
writes nothing but the final O and L.  The paper's rule caps Br at d (Br = min(Bc, d)),
which makes the N^2 d / Br term Theta(N^2) for flash2: a larger query block
cuts its K/V traffic, a knob that later tuning can turn.

Backward (three launches).  "D = rowsum(dO*O)" reads dO and O once and writes
D.  "dK, dV" reads K_j, V_j once per key block and Q_i, dO_i, L_i, D_i once per
(query block, key block) pair it visits, and writes dK, dV once.  "dQ" reads
Q_i, dO_i, L_i, D_i once per query block and K_j, V_j once per pair, and writes
dQ once.

By term (:mod:`.terms`): compulsory ``s (2 Nq d + 2 Nk d) + a Nq``; the forward's
re-reads are ``2 s d (sum_i kv_i - Nk)``, K and V read again by every query block
after the first (``2 s N d (Tr - 1)`` without a mask), the Theta(N^2 d / Br) term;
no S/P term.

Causal attention visits only the pairs (i, j) whose key block holds a key that
some row of the query block sees (key c is visible to query r iff
c <= r + Nk - Nq); the sums below run over exactly those pairs, about half of
them for Nq = Nk.
"""

from __future__ import annotations

import numpy as np

from .._inputs import acc_dtype
from ..hbm import HBMCount, KernelBytes
from ..kernels.causal import visible_kv_blocks
from ..kernels.flash2 import BACKWARD_NAMES, FORWARD_NAME


def _rows(start: int, size: int, n: int) -> int:
    """Rows of the block that starts at ``start`` (``size`` rows) that lie before ``n``."""
    return max(0, min(size, n - start))


def kv_rows_read(Nq: int, Nk: int, causal: bool, block) -> list[int]:
    """For each query block i, the rows of K (and of V) it reads: its visible key blocks."""
    Br, Bc = block
    return [min(visible_kv_blocks(i0, Br, Bc, Nq, Nk, causal) * Bc, Nk) for i0 in range(0, Nq, Br)]


def forward(BH, Nq, Nk, d, dtype, causal, block, G=1) -> HBMCount:
    """Bytes of "flash2 forward": Q once, K and V once per visible pair of blocks, O and L once.

    Every query head's blocks read K and V, so ``G`` (query heads per key/value head) changes nothing.
    """
    s, a = np.dtype(dtype).itemsize, acc_dtype(dtype).itemsize
    kv = sum(kv_rows_read(Nq, Nk, causal, block))
    reads = Nq * d * s + 2 * kv * d * s
    writes = Nq * d * s + Nq * a
    return HBMCount({FORWARD_NAME: KernelBytes(BH * reads, BH * writes)})


def backward(BH, Nq, Nk, d, dtype, causal, block, G=1) -> HBMCount:
    """The three backward kernels: "D = rowsum(dO*O)", "dK, dV" and "dQ".

    With ``G`` query heads per key/value head a "dK, dV" block (BH / G key/value heads) reads
    K_j, V_j and writes dK_j, dV_j once, and the query side of each of its G query heads.
    """
    Br, Bc = block
    s, a = np.dtype(dtype).itemsize, acc_dtype(dtype).itemsize
    row_q = 2 * d * s + 2 * a  # one row of Q, dO, L and D
    # "dK, dV" visits the same pairs as "dQ", seen from the key side: query block i is
    # paired with the ceil(kv_rows[i] / Bc) key blocks it sees, each reading its rows once.
    kv_rows = kv_rows_read(Nq, Nk, causal, block)
    q_rows = 0
    for i, kv in enumerate(kv_rows):
        n_key_blocks = -(-kv // Bc)
        q_rows += n_key_blocks * _rows(i * Br, Br, Nq)
    rowsum = KernelBytes(BH * 2 * Nq * d * s, BH * Nq * a)
    BHkv = BH // G
    dkdv = KernelBytes(BHkv * 2 * Nk * d * s + BH * q_rows * row_q, BHkv * 2 * Nk * d * s)
    dq = KernelBytes(BH * (Nq * row_q + 2 * sum(kv_rows) * d * s), BH * Nq * d * s)
    return HBMCount({BACKWARD_NAMES[0]: rowsum, BACKWARD_NAMES[1]: dkdv, BACKWARD_NAMES[2]: dq})
