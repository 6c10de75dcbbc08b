"""HBM bytes of the flash2 kernels, in closed form.

Forward (one launch, "flash2 forward").  Each query block Q_i is read once and
O_i, L_i are written once; K and V are read once per query block that needs
them.  Without masking that is

    reads  = Nq d s + Tr * 2 Nk d s,    Tr = ceil(Nq / Br)
    writes = Nq d s + Nq a

per (batch, head), for item size s of q, k, v, o and a of L.  For N = Nq = Nk
this is Theta(N d + N^2 d / Br).  flash1 (Algorithm 1 as written) moves
Theta(N^2 d^2 / M) bytes for M elements of SRAM, because it also reads and
writes O, l and m once per K/V block; with the paper's Br = Theta(M / d) the two
bounds have the same order, and flash2's constant is smaller: K and V are read
Tr times, but O is never re-read.

Backward (three launches).  "D = rowsum(dO*O)" reads dO and O once and writes
D.  "dK, dV" reads K_j, V_j once per key block and Q_i, dO_i, L_i, D_i once per
(key block, query block) pair it visits, and writes dK, dV once.  "dQ" reads
Q_i, dO_i, L_i, D_i once per query block and K_j, V_j once per pair, and writes
dQ once.

Causal attention visits only the pairs (i, j) whose key block holds a key that
some row of the query block sees (key c visible to query r iff
c <= r + Nk - Nq): the sums below run over exactly those pairs.
"""

from __future__ import annotations

import numpy as np

from .._inputs import acc_dtype
from ..hbm import HBMCount, KernelBytes
from ..kernels.flash2 import BACKWARD_NAMES, FORWARD_NAME


def _rows(start: int, size: int, n: int) -> int:
    """Rows of the block that starts at ``start`` (``size`` rows) that lie before ``n``."""
    return max(0, min(size, n - start))


def kv_rows_read(Nq: int, Nk: int, causal: bool, block) -> list[int]:
    """For each query block i, the rows of K (and of V) it reads: its visible key blocks."""
    Br, Bc = block
    Tr = -(-Nq // Br)
    out = []
    for i in range(Tr):
        if not causal:
            out.append(Nk)
            continue
        last_key = min((i + 1) * Br, Nq) - 1 + (Nk - Nq)  # the last key the block's last row sees
        n_blocks = 0 if last_key < 0 else min(-(-Nk // Bc), last_key // Bc + 1)
        out.append(min(n_blocks * Bc, Nk))
    return out


def forward(BH, Nq, Nk, d, dtype, causal, block) -> HBMCount:
    s, a = np.dtype(dtype).itemsize, acc_dtype(dtype).itemsize
    kv = sum(kv_rows_read(Nq, Nk, causal, block))
    reads = Nq * d * s + 2 * kv * d * s
    writes = Nq * d * s + Nq * a
    return HBMCount({FORWARD_NAME: KernelBytes(BH * reads, BH * writes)})


def backward(BH, Nq, Nk, d, dtype, causal, block) -> HBMCount:
    Br, Bc = block
    s, a = np.dtype(dtype).itemsize, acc_dtype(dtype).itemsize
    row_q = 2 * d * s + 2 * a  # one row of Q, dO, L and D
    # Visible pairs: query block i and the key rows it reads; the same pairs seen from
    # the key blocks give the query rows that kernel "dK, dV" reads.
    kv_rows = kv_rows_read(Nq, Nk, causal, block)
    q_rows = 0
    for i, kv in enumerate(kv_rows):
        n_key_blocks = -(-kv // Bc)
        q_rows += n_key_blocks * _rows(i * Br, Br, Nq)
    rowsum = KernelBytes(BH * 2 * Nq * d * s, BH * Nq * a)
    dkdv = KernelBytes(BH * (2 * Nk * d * s + q_rows * row_q), BH * 2 * Nk * d * s)
    dq = KernelBytes(BH * (Nq * row_q + 2 * sum(kv_rows) * d * s), BH * Nq * d * s)
    return HBMCount({BACKWARD_NAMES[0]: rowsum, BACKWARD_NAMES[1]: dkdv, BACKWARD_NAMES[2]: dq})
