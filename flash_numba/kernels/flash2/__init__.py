"""flash2: the FlashAttention-2 loop order (Dao 2023), forward and backward.

What it does.  Forward (FA2's Algorithm 1): one thread block per query block
Q_i (Br rows) and (batch, head), a grid of (B*H, Tr) blocks, the last query block of each
head first (under a causal mask it sees the most keys).  The block loads Q_i into
shared memory once and walks over the key/value blocks K_j, V_j (Bc rows each,
in shared memory, our SRAM): S_ij = scale Q_i K_j^T, the online-softmax update
of m_i and l_i, the rescale of the accumulator O_i when the row maximum moves,
and O_i += P~_ij V_j.  m_i, l_i and O_i stay on chip (registers, accumulation
dtype) and normalisation is delayed: O_i / l_i and L_i = m_i + log(l_i) are
written once, at the end.

Backward (FA2's Algorithm 2, split in three kernels, no atomics on floats):

1. "D = rowsum(dO*O)": 8 rows per block, 16 threads per row.
2. "dK, dV": a grid of (B*H, Tc) blocks.  A block owns K_j, V_j, keeps dK_j, dV_j in
   registers and walks over the query blocks i that see its keys, recomputing
   S_ij, P_ij = exp(S_ij - L_i), dV_j += P_ij^T dO_i, dP_ij = dO_i V_j^T,
   dS_ij = P_ij * (dP_ij - D_i), dK_j += scale dS_ij^T Q_i.
3. "dQ": a grid of (B*H, Tr) blocks.  A block owns Q_i, dO_i, L_i, D_i, keeps dQ_i in
   registers and walks over the visible key blocks j, recomputing S, P, dP, dS
   and dQ_i += scale dS_ij K_j.

Grouped-query attention (G = Hq / Hkv query heads per key/value head): query head bh
reads K and V of head bh // G; the "dK, dV" grid has (B*Hkv, Tc) blocks, each walking
over the query blocks of the G query heads of its group in turn (one sum, fixed order).
The forward and dQ kernels are compiled apart for G = 1 (``grouped`` False), where the key/value
head is the query head and no register holds it across the loop over key blocks.

Why it is deterministic: every output element is written once, by one thread,
from a sum taken in a fixed order, so repeated calls give bitwise identical
results.  FlashAttention-2 instead adds each pair's dS_ij K_j into dQ_i with
float atomics from kernel 2.  That saves kernel 3: recomputing S_ij and dP_ij
(two of the backward's seven block matrix products, about 30% of its FLOPs)
and reading K and V once more per query block.  It costs a float32 dQ buffer in
HBM that each dQ_i is added to Tc times (atomic read-modify-writes, contended
when key blocks finish together), and the order of those additions changes from
run to run, so dQ changes in its last bits.

What changed since ``flash1``.  The loops are swapped: the outer loop runs over
query blocks, in parallel, one thread block each (flash1 runs one block per
(batch, head) and leaves most SMs idle), and O_i, l_i, m_i stay on chip
instead of being read and written in HBM at every K/V step.  Forward HBM
traffic becomes Theta(N d + N^2 d / Br) (see :mod:`flash_numba.iomodel.flash2`).
Causal attention visits only the K/V blocks that are not wholly masked for the
query block (about half of them; the rest are never loaded) and masks inside
the blocks that cross the diagonal.  A query row with no visible key (causal
with Nq > Nk) gives O = 0 and L = -inf.

Threads.  128 threads per block, an 8 x 16 grid: thread t is (ty, tx) =
(t // 16, t % 16).  Every (rows x columns) tile a block computes is dealt out
the same way; for S_ij with Br = 16, Bc = 32, entry (r, c) belongs to thread
(r % 8, c % 16)::

                c:   0      1    ...   15      16     17    ...   31
        r =  0     (0,0)  (0,1)  ...  (0,15)  (0,0)  (0,1)  ...  (0,15)
        r =  1     (1,0)  (1,1)  ...  (1,15)  (1,0)  (1,1)  ...  (1,15)
         ...
        r =  7     (7,0)  (7,1)  ...  (7,15)  (7,0)  (7,1)  ...  (7,15)
        r =  8     (0,0)  (0,1)  ...  (0,15)  (0,0)  (0,1)  ...  (0,15)
         ...
        r = 15     (7,0)  (7,1)  ...  (7,15)  (7,0)  (7,1)  ...  (7,15)

so thread (ty, tx) holds a register tile of RA x CB = 2 x 2 entries, rows
{ty, ty + 8}, columns {tx, tx + 16}; the accumulator O_i (Br x d) is dealt out
with columns x = tx, tx + 16, ...  In each step of a product a thread loads
RA + CB values from shared memory and does RA * CB multiply-adds.  A thread
whose rows or columns run past the tile works on a repeat of the tile's last
row or column and never stores the result, so any (Br, Bc) works.  The 16
threads of a row (half a warp) find the row's max and sum through shared
memory: each writes its partial, and after a barrier each reads the row's 16
partials.  (Warp shuffles would need no barrier, but Numba's simulator emulates
each shuffle with two block-wide barriers, which would make learners' runs on a
laptop several times slower.)  Tiles are loaded cooperatively: thread t copies
elements t, t + 128, ... of the tile, which is contiguous in HBM, so a warp
reads 32 consecutive elements.  Shared tiles that the 16 threads of a row read
down a column get an odd row stride (d | 1), so they hit 16 different banks.
Tiles are held in the accumulation dtype (float32, float64 for float64 storage).

Modules: :mod:`.forward` (the forward kernel), :mod:`.backward` (the dK, dV and dQ kernels),
:mod:`.thread_tiles` (their device functions), :mod:`.layout` (thread grid, shared memory, block rule).

Counters (``count_hbm=True``).  Bytes the kernels' code reads from and writes to
global arrays, per launch: "flash2 forward"; "D = rowsum(dO*O)", "dK, dV" and
"dQ" for the backward.  :mod:`flash_numba.iomodel.flash2` predicts the same
numbers in closed form.
"""

from __future__ import annotations

import itertools

import numpy as np
from numba import types

from ... import _inputs
from ...compile_check import compile_kernel, count_variants
from ...device import STATIC_SHARED_LIMIT
from .. import _dropout, _rowsum
from .._common import COUNTER_TYPE, acc_nb_type, array_type, head_grid_2d, input_type
from .._spec import KernelSpec, launch_flops
from .backward import _dkdv_kernel, _dq_kernel
from .forward import _forward_kernel
from .layout import BACKWARD_NAMES, FORWARD_NAME, NT, block_limits, cdiv, shared_bytes
from .layout import MAX_TILE, TX, TY  # noqa: F401  (flash2's thread grid, imported from here)


def grids(prob, block) -> dict:
    """The launch grid of each launch, by launch name: (B*H, blocks per head), see head_grid_2d."""
    Br, Bc = block
    Tr, Tc = cdiv(prob.Nq, Br), cdiv(prob.Nk, Bc)
    return {FORWARD_NAME: head_grid_2d(Tr, prob.BH), BACKWARD_NAMES[0]: _rowsum.grid(prob),
            BACKWARD_NAMES[1]: head_grid_2d(Tc, prob.BHkv), BACKWARD_NAMES[2]: head_grid_2d(Tr, prob.BH)}


def forward(prob, ops, block, counters):
    """O and L = m + log(l): one launch of Tr * B*H blocks."""
    Br, Bc = block
    dropout, drop_args = _dropout.launch_args(prob)
    kernel = _forward_kernel(prob.d, Br, Bc, prob.dtype, prob.causal, counters.enabled, dropout, prob.G > 1)
    o = _inputs.empty((prob.BH, prob.Nq, prob.d), prob.dtype)
    lse = _inputs.empty((prob.BH, prob.Nq), prob.acc)
    q, k, v = (ops[name].dev for name in ("q", "k", "v"))
    kernel[grids(prob, block)[FORWARD_NAME], NT](q, k, v, o, lse, counters.array(FORWARD_NAME), prob.Nq, prob.Nk,
                                                 prob.G, prob.acc.type(prob.scale), *drop_args)
    return o, lse


def backward(prob, ops, block, counters):
    """dQ, dK, dV: D = rowsum(dO * O), then dK, dV (Tc * B*H blocks), then dQ (Tr * B*H blocks)."""
    Br, Bc = block
    BH, Nq, Nk, d, dt, acc = prob.BH, prob.Nq, prob.Nk, prob.d, prob.dtype, prob.acc
    count = counters.enabled
    q, k, v, o, lse, do = (ops[name].dev for name in ("q", "k", "v", "o", "lse", "do"))
    scale = acc.type(prob.scale)
    D = _rowsum.rowsum(prob, o, do, counters)
    dq = _inputs.empty((BH, Nq, d), dt)
    dk = _inputs.empty((prob.BHkv, Nk, d), dt)
    dv = _inputs.empty((prob.BHkv, Nk, d), dt)
    dropout, drop_args = _dropout.launch_args(prob)
    dkdv = _dkdv_kernel(d, Br, Bc, dt, prob.causal, count, dropout)
    grid = grids(prob, block)
    dkdv[grid[BACKWARD_NAMES[1]], NT](q, k, v, do, lse, D, dk, dv, counters.array(BACKWARD_NAMES[1]), Nq, Nk, prob.G,
                                      scale, *drop_args)
    dq_kernel = _dq_kernel(d, Br, Bc, dt, prob.causal, count, dropout, prob.G > 1)
    dq_kernel[grid[BACKWARD_NAMES[2]], NT](q, k, v, do, lse, D, dq, counters.array(BACKWARD_NAMES[2]), Nq, Nk, prob.G,
                                           scale, *drop_args)
    return dq, dk, dv


def compile_all(ccs, dtypes, ds):
    """PTX of every specialisation: default blocks for each d, causal or not, counting or not, the forward and dQ
    kernels for G = 1 and, not counting, for grouped-query attention (G > 1, "grouped"); with dropout only for
    :data:`flash_numba.kernels._dropout.COMPILED_WITH_DROPOUT` (not counting).

    Returns ``[(label, ptx)]``; the label names the kernel, d, dtype, (Br, Bc),
    causal, count, dropout, grouped and ``sm_XY``.  Needs ``NUMBA_ENABLE_CUDASIM=0``.
    """
    out = []
    I64 = types.int64
    for dtype in dtypes:
        dt = np.dtype(dtype)
        X3, A2, ACC = array_type(dt, 3), array_type(_inputs.acc_dtype(dt), 2), acc_nb_type(dt)
        DROP = _dropout.arg_types(ACC)
        XI = input_type(dt)  # q, k, v, do: (B, H, N, d), any strides with contiguous rows
        fwd_sig = (XI, XI, XI, X3, A2, COUNTER_TYPE, I64, I64, I64, ACC, *DROP)
        dkdv_sig = (XI, XI, XI, XI, A2, A2, X3, X3, COUNTER_TYPE, I64, I64, I64, ACC, *DROP)
        dq_sig = (XI, XI, XI, XI, A2, A2, X3, COUNTER_TYPE, I64, I64, I64, ACC, *DROP)
        for d in ds:
            fwd, bwd = (SPEC.block(d, dt, pass_, budget=STATIC_SHARED_LIMIT) for pass_ in ("forward", "backward"))
            for count in count_variants(dt, d):
                tail = f"d={d} {dt}{' count' * count}"
                specs = [(f"{BACKWARD_NAMES[0]} {tail}", _rowsum.rowsum_kernel(d, dt, count), _rowsum.signature(dt))]
                # grouped (G > 1) builds, not counting: they differ from G = 1's in one line (the key/value head),
                # the counters in none of it; the counting builds are checked at G = 1 (the tier's time: 8 minutes)
                variants = itertools.product((False, True), _dropout.compile_variants(dt, d, count),
                                             (False,) if count else (False, True))
                for causal, drop, grouped in variants:
                    tag = f"{tail}{' causal' * causal}{' dropout' * drop}{' grouped' * grouped}"
                    fwd_tag, bwd_tag = f"{tag} Br={fwd[0]} Bc={fwd[1]}", f"{tag} Br={bwd[0]} Bc={bwd[1]}"
                    fwd_kernel = _forward_kernel(d, *fwd, dt, causal, count, drop, grouped)
                    dq_kernel = _dq_kernel(d, *bwd, dt, causal, count, drop, grouped)
                    specs.append((f"forward {fwd_tag}", fwd_kernel, fwd_sig))
                    if not grouped:  # one dK, dV kernel serves every G
                        dkdv = _dkdv_kernel(d, *bwd, dt, causal, count, drop)
                        specs.append((f"{BACKWARD_NAMES[1]} {bwd_tag}", dkdv, dkdv_sig))
                    specs.append((f"{BACKWARD_NAMES[2]} {bwd_tag}", dq_kernel, dq_sig))
                out += [compile_kernel(f"flash2 {name}", kernel, sig, cc) for name, kernel, sig in specs for cc in ccs]
    return out


#: The backward's arithmetic per launch (see :func:`flash_numba.kernels._spec.launch_flops`).
BACKWARD_FLOPS = {
    BACKWARD_NAMES[0]: (0, 0, 2),  # D = rowsum(dO * O)
    BACKWARD_NAMES[1]: (8, 5, 0),  # Q K^T, dV, dP, dK
    BACKWARD_NAMES[2]: (6, 5, 0),  # Q K^T again, dP again, dQ
}
FLOPS = launch_flops(forward={FORWARD_NAME: (4, 5, 0)}, backward=BACKWARD_FLOPS)  # forward: Q K^T, P V; 5 on a score

SPEC = KernelSpec(
    name="flash2", flops=FLOPS, doc=__doc__, forward=forward, backward=backward, compile_all=compile_all,
    forward_launches=(FORWARD_NAME,), backward_launches=BACKWARD_NAMES,
    shared_bytes=shared_bytes, block_limits=block_limits,  # the paper's block rule (blocks.choose)
)
