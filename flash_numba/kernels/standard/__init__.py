"""Standard attention: the paper's baseline done well, S and P through HBM.

What it does.  The three lines of the FlashAttention paper's Algorithm 0, each a
kernel that reads its inputs from HBM and writes its result to HBM::

    S = scale * Q K^T; m, l, L = m + log l   (BH, Nq, Nk); (BH, Nq) each   "S = scale*Q@K^T"
    P = exp(S - m) / l  (= softmax(S))       (BH, Nq, Nk)                  "P = softmax(S)"
    O = P V                                  (BH, Nq, d)                   "O = P@V"

with the same blocks ``(Br, Bc)`` and the same on-chip discipline as the flash
kernels: the thread block of query block i keeps Q_i on chip while the K_j
stream past in Bc-row tiles, writes each S_ij tile to HBM and keeps the row
statistics m_i, l_i on chip, then writes them and L_i = m_i + log l_i once; the
softmax reads each row of S (and m_i, l_i) once and writes P; the product kernel
streams the P_ij and V_j tiles past an O_i held in registers and writes O once.  So Q is read once,
K and V once per query block, O and L written once, exactly as in
:mod:`flash2`; the only other bytes are S and P written and read back once
each, with their row statistics m and l: the S/P term of
:func:`flash_numba.iomodel.standard.sp_bytes`, which FlashAttention removes.
Causal attention visits the same (query block, key block) pairs as flash2: S
and P exist only in the visible tiles (masked entries inside them are -inf and
0), the other tiles are never written or read.

The backward is the paper's Algorithm 3 with the same blocks: D = rowsum(dO*O)
(flash2's kernel), then per query block the recomputed P = exp(S - L) and
dS = P * (dP - D) with dP = dO V^T (dP stays in registers; P and dS go to HBM),
then dV = P^T dO and dK = scale dS^T Q per key block, dQ = scale dS K per query
block.  The API is stateless, so P is recomputed from Q, K and L rather than
kept from the forward pass as PyTorch's autograd would, and it must be exp(S - L)
of exactly the forward's S: a float32 sum in another order rounds, now and then,
to the neighbouring float16 (P off by e^0.5 at |S| = 1e3), which D = rowsum(dO O)
no longer cancels.  So in float16, whose forward computes S on tensor cores, the
backward first runs the forward's own S launch again (the same kernel and mma path,
into P's buffer; :data:`BACKWARD_TC_NAMES`), and the P and dS kernel reads S
instead of Q and K; in float32 and float64 it recomputes S with the forward's
CUDA-core products (:data:`BACKWARD_NAMES`).

How it is fast.  Every kernel is register-tiled like :mod:`flash2_fast`: 128
threads as an 8 x 16 grid, each owning a TM x TN (or TM x TD) micro-tile, tiles
stored in shared memory so that a thread's values are adjacent (vector loads),
uint32 indices on whole tiles and fastmath; the pieces are the device functions
of :mod:`flash_numba.kernels._tile_ops`.  Blocks are multiples of (8, 16):
Br = 8 TM query rows, Bc = 16 TN keys.

In float16 the forward's two products run on tensor cores (:mod:`.tensor`: ``mma.sync``
m16n8k16, or m16n8k8 below compute capability 8.0, tiles moved in 16 bytes, fp32 accumulators)
at blocks (64, Bc), Bc = 16, 32 or 64; the softmax is the same kernel, and every byte is the
same, so float16 flash2_tc against standard differs in S and P going through HBM only, as in the
paper.  Measured on the H200 (benchmarks/results/h200-2026-12-01-standard-tc/, B*H = 32,
N = 4096, d = 64): 2.97 ms against 5.18 on CUDA cores; the softmax is 20% of it, the products 80%.
The backward's other kernels, float32 and float64 stay on CUDA cores.

What the counters count.  Each launch adds to ``counters.array(name)`` the bytes
its threads load from and store to global arrays (see :mod:`._common`): every
element of Q_i, K_j, V_j, S_ij, P_ij, dS_ij, dO_i, L_i, D_i, m_i, l_i it loads
and every element it stores.  :mod:`flash_numba.iomodel.standard` gives the same numbers
in closed form, per kernel.
"""

from __future__ import annotations

import numpy as np
from numba import types

from ... import _inputs
from ...device import STATIC_SHARED_LIMIT
from .. import _dropout, _rowsum
from .._launch import launch
from .._common import COUNTER_TYPE, acc_nb_type, array_type, head_grid, input_type
from .._spec import KernelSpec, launch_flops
from .._tile_ops import NT
from ..matmul16 import TILE, matmul, matmul_kernel  # noqa: F401  (lesson 4's kernel, imported from here before)
from .backward import colprod_kernel, grad_scores_from_s_kernel, grad_scores_kernel
from . import tensor
from .forward import rowprod_kernel, scores_kernel, softmax_kernel
from .halves import rows_aligned
from .layout import (  # noqa: F401  (the public names of standard, imported from here)
    BACKWARD_NAMES,
    BACKWARD_TC_NAMES,
    FORWARD_NAMES,
    SOFTMAX_ROWS,
    USES_BLOCKS,
    backward_names,
    block_limits,
    check_block,
    choose_block,
    geometry,
    mma_path,
    n_key_blocks,
    scores_block,
    shared_bytes,
    tensor_cores,
)


def grids(prob, block) -> dict:
    """The 1-D launch grid of each launch at ``block``, by launch name (B*H folded into axis x, see head_grid); the
    backward's S launch (:data:`BACKWARD_TC_NAMES`) runs at its own block, :func:`scores_block`."""
    Br, Bc = block
    Tr, Tc = -(-prob.Nq // Br), -(-prob.Nk // Bc)
    softmax = head_grid(-(-prob.BH * prob.Nq // SOFTMAX_ROWS), 1)
    by_row, by_col = head_grid(Tr, prob.BH), head_grid(Tc, prob.BHkv)  # by_col: dV, dK per key/value head
    return {**dict(zip(FORWARD_NAMES, (by_row, softmax, by_row))),
            **dict(zip(BACKWARD_NAMES, (_rowsum.grid(prob), by_row, by_col, by_col, by_row))),
            BACKWARD_TC_NAMES[2]: by_row}


def _forward_steps(prob, ops, block, counters):
    """The forward's three launches as ``[(name, run)]`` (``run()`` launches one kernel) and the
    device arrays they fill, ``{"S", "P", "O", "L", "ml"}``: allocated here, once."""
    Br, Bc = block
    BH, Nq, Nk, d, dt, acc = prob.BH, prob.Nq, prob.Nk, prob.d, prob.dtype, prob.acc
    q, k, v = (ops[name].dev for name in ("q", "k", "v"))
    count, causal = counters.enabled, prob.causal
    shape = grids(prob, block)
    out = dict(
        S=_inputs.empty((BH, Nq, Nk), dt), P=_inputs.empty((BH, Nq, Nk), dt), O=_inputs.empty((BH, Nq, d), dt),
        L=_inputs.empty((BH, Nq), acc), ml=_inputs.empty((BH, 2, Nq), acc),  # ml: m_i, l_i
    )
    S, P, O, L, ml = (out[x] for x in ("S", "P", "O", "L", "ml"))
    name = prob.dtype_name  # "bfloat16" for uint16 storage
    softmax = softmax_kernel(Br, Bc, name, causal, count)
    dropout, drop_args = _dropout.launch_args(prob)
    c0, c1, c2 = (counters.array(name) for name in FORWARD_NAMES)
    scale, one = acc.type(prob.scale), acc.type(1)
    G, grid = prob.G, (shape[FORWARD_NAMES[0]], shape[FORWARD_NAMES[1]], shape[FORWARD_NAMES[2]])
    if tensor_cores(dt):  # S = scale Q K^T and O = P V on mma.sync; 16-byte loads where the rows allow them
        sm75 = mma_path() == "sm75"
        scores = tensor.scores_kernel(d, Br, Bc, name, causal, count, sm75)
        vec_qk, vec_s, vec_v = rows_aligned(q) and rows_aligned(k), rows_aligned(S), rows_aligned(v)
        run_scores = lambda: launch(scores, grid[0], NT)(q, k, S, L, ml, Nq, Nk, G, scale, vec_qk, vec_s, c0)  # noqa: E731
        rowprod = tensor.rowprod_kernel(d, Br, Bc, name, causal, count, sm75, dropout)  # O = (Zs P) V on chip
        run_rowprod = lambda: launch(rowprod, grid[2], NT)(P, v, O, Nq, Nk, G, one, vec_s, vec_v, c2,  # noqa: E731
                                                             *drop_args)
    else:
        scores = scores_kernel(d, Br, Bc, dt.name, causal, count)
        rowprod = rowprod_kernel(d, Br, Bc, dt.name, causal, count, dropout)  # O = (Zs P) V: dropout on chip
        run_scores = lambda: launch(scores, grid[0], NT)(q, k, S, L, ml, Nq, Nk, G, scale, c0)  # noqa: E731
        run_rowprod = lambda: launch(rowprod, grid[2], NT)(P, v, O, Nq, Nk, G, one, c2, *drop_args)  # noqa: E731
    steps = [
        (FORWARD_NAMES[0], run_scores),
        (FORWARD_NAMES[1], lambda: launch(softmax, grid[1], NT)(S, ml, P, Nq, Nk, c1)),
        (FORWARD_NAMES[2], run_rowprod),
    ]
    return steps, out


def forward(prob, ops, block, counters):
    """S and L, P = softmax(S), O = P V: three launches, S and P in HBM.  Returns device arrays O, L."""
    steps, out = _forward_steps(prob, ops, block, counters)
    for _, run in steps:
        run()
    return out["O"], out["L"]


def forward_launches(q, k, v, *, causal=False, block=None, scale=None):
    """The forward of ``q, k, v`` as its three kernel launches, to run (and time) one at a time.

    ``q`` (..., Nq, d), ``k`` and ``v`` (..., Nk, d), device or host arrays as for
    :func:`flash_numba.attention_forward` (host arrays are copied to the device once, here; the
    kernels read q, k, v as ``(B, H, N, d)`` views, and write ``(BH, ...)`` arrays); ``causal``,
    ``scale`` and ``block`` as there (block None: the block the API would choose).
    Returns ``(launches, arrays)``: ``launches`` is ``[(name, run)]`` in order, ``name``
    as the counters call the kernel (:data:`FORWARD_NAMES`), ``run()`` one launch of the
    plain (uncounted) kernel; ``arrays`` the device arrays they read and fill,
    ``{"q", "k", "v", "S", "P", "O", "L", "ml"}`` (``ml``: m_i and l_i, (BH, 2, Nq)).
    Running the launches in order computes what :func:`forward` computes.
    """
    from ...hbm import Counters

    prob, ops = _inputs.prepare({"q": q, "k": k, "v": v}, causal=causal, scale=scale)
    SPEC.check_supported(prob.d, prob.dtype_name, arg="q")
    block = SPEC.block(prob.d, prob.dtype_name, "forward", block)
    steps, out = _forward_steps(prob, ops, block, Counters(False))
    return steps, {**{name: ops[name].dev for name in ("q", "k", "v")}, **out}


def backward(prob, ops, block, counters):
    """The paper's Algorithm 3 with blocks: D, then P and dS (to HBM), then dV, dK, dQ.  Returns dQ, dK, dV.

    Where the forward computes S on tensor cores (float16, :data:`BACKWARD_TC_NAMES`) P comes from exactly its
    S: the forward's S launch runs again (the same kernel, the same mma path, at :func:`scores_block`) into the
    P buffer, and the P and dS kernel reads S from there and writes P over it; its L, m and l go to scratch
    (counted: they are the launch's bytes).  Elsewhere the P and dS kernel recomputes S itself.
    """
    if prob.dtype_name == "bfloat16":
        raise TypeError("q: dtype bfloat16 is not supported by standard's backward (it runs float16, float32 and "
                        "float64, its products on CUDA cores); the forward runs bfloat16")
    Br, Bc = block
    BH, Nq, Nk, d, dt, acc = prob.BH, prob.Nq, prob.Nk, prob.d, prob.dtype, prob.acc
    q, k, v, o, lse, do = (ops[name].dev for name in ("q", "k", "v", "o", "lse", "do"))
    count, causal = counters.enabled, prob.causal
    names = backward_names(dt)
    grid = grids(prob, block)
    D = _rowsum.rowsum(prob, o, do, counters)
    P = _inputs.empty((BH, Nq, Nk), dt)
    dS = _inputs.empty((BH, Nq, Nk), dt)
    dropout, drop_args = _dropout.launch_args(prob)
    scale = acc.type(prob.scale)
    if names == BACKWARD_TC_NAMES:  # S = scale Q K^T as the forward computed it, bit for bit, into P's buffer
        sblock = scores_block(d, dt)
        scores = tensor.scores_kernel(d, *sblock, prob.dtype_name, causal, count, mma_path() == "sm75")
        L, ml = _inputs.empty((BH, Nq), acc), _inputs.empty((BH, 2, Nq), acc)  # the launch's L, m, l: unused
        launch(scores, grids(prob, sblock)[names[1]], NT)(
            q, k, P, L, ml, Nq, Nk, prob.G, scale, rows_aligned(q) and rows_aligned(k), rows_aligned(P),
            counters.array(names[1]))
        launch(grad_scores_from_s_kernel(d, Br, Bc, dt.name, causal, count, dropout), grid[names[2]], NT)(
            P, v, do, lse, D, P, dS, Nq, Nk, prob.G, counters.array(names[2]), *drop_args  # P over S: Zs P
        )
    else:
        launch(grad_scores_kernel(d, Br, Bc, dt.name, causal, count, dropout), grid[names[1]], NT)(  # P: Zs P
            q, k, v, do, lse, D, P, dS, Nq, Nk, prob.G, scale, counters.array(names[1]), *drop_args
        )
    dV_, dK_, dQ_ = names[-3:]
    colprod = colprod_kernel(d, Br, Bc, dt.name, causal, count)
    dV = _inputs.empty((prob.BHkv, Nk, d), dt)  # summed over the G query heads of each key/value head
    launch(colprod, grid[dV_], NT)(P, do, dV, Nq, Nk, prob.G, acc.type(1), counters.array(dV_))
    dK = _inputs.empty((prob.BHkv, Nk, d), dt)
    launch(colprod, grid[dK_], NT)(dS, q, dK, Nq, Nk, prob.G, scale, counters.array(dK_))
    dQ = _inputs.empty((BH, Nq, d), dt)
    launch(rowprod_kernel(d, Br, Bc, dt.name, causal, count), grid[dQ_], NT)(
        dS, k, dQ, Nq, Nk, prob.G, scale, counters.array(dQ_), *drop_args  # (unused: no dropout)
    )
    return dQ, dK, dV


def compile_all(ccs, dtypes, ds):
    """PTX of every kernel at the chosen blocks for each d, causal or not, counting or not (the dropout
    variants of rowprod and grad_scores for :data:`flash_numba.kernels._dropout.COMPILED_WITH_DROPOUT`
    only), as ``[(label, ptx)]``; then lesson 4's 16 x 16 product (:mod:`.matmul16`)."""
    from ...compile_check import compile_ptx, count_variants
    from .. import matmul16

    out = []
    I64 = types.int64
    for dtype in dtypes:
        if dtype == "bfloat16":  # the forward only, from sm_80 (a T4 has no bfloat16 tensor cores)
            out += _compile_bfloat16_forward([cc for cc in ccs if tuple(cc) >= (8, 0)], ds)
            continue
        dt = np.dtype(dtype)
        X3, A2, ACC = array_type(dt, 3), array_type(_inputs.acc_dtype(dt), 2), acc_nb_type(dt)
        XI = input_type(dt)  # q, k, v, do: (B, H, N, d), any strides with contiguous rows
        A3 = array_type(_inputs.acc_dtype(dt), 3)
        DROP = _dropout.arg_types(ACC)
        for d in ds:
            cc0 = min(ccs)  # (the compile tier builds for cc 7.5 and 9.0: tensor cores on both)
            fwd = choose_block(d, dt, STATIC_SHARED_LIMIT, "forward", cc0)
            bwd = choose_block(d, dt, STATIC_SHARED_LIMIT, "backward", cc0)
            for count in count_variants(dt, d):
                for causal in (False, True):
                    tag = f"d={d} {dt}{' causal' * causal}{' count' * count}"
                    f, b = f"{tag} Br={fwd[0]} Bc={fwd[1]}", f"{tag} Br={bwd[0]} Bc={bwd[1]}"
                    grad, grad_sig = "grad_scores", (XI, XI, XI, XI, A2, A2, X3, X3, I64, I64, I64, ACC, COUNTER_TYPE,
                                                     *DROP)
                    grad_kernel = grad_scores_kernel
                    if tensor_cores(dt, "forward", cc0):  # the products on mma.sync (m16n8k8 on sm_75)
                        # the backward: the forward's S launch (built here), then P and dS from that S
                        grad, grad_kernel = "grad_scores_from_s", grad_scores_from_s_kernel
                        grad_sig = (X3, XI, XI, A2, A2, X3, X3, I64, I64, I64, COUNTER_TYPE, *DROP)
                        def tc(factory, cc):
                            return factory(d, *fwd, dt.name, causal, count, mma_path(cc) == "sm75")
                        B = types.boolean
                        products = [
                            (f"scores_tc {f}", lambda cc: tc(tensor.scores_kernel, cc),
                             (XI, XI, X3, A2, A3, I64, I64, I64, ACC, B, B, COUNTER_TYPE)),
                            (f"rowprod_tc {f}", lambda cc: tc(tensor.rowprod_kernel, cc),
                             (X3, XI, X3, I64, I64, I64, ACC, B, B, COUNTER_TYPE, *DROP)),
                        ]
                        if d == 64 and not count:  # O = (Zs P) V: its dropout code assembled once per cc
                            products.append((
                                f"rowprod_tc {f} dropout",
                                lambda cc: tensor.rowprod_kernel(d, *fwd, dt.name, causal, False,
                                                                 mma_path(cc) == "sm75", True),
                                (X3, XI, X3, I64, I64, I64, ACC, B, B, COUNTER_TYPE, *DROP)))
                    else:
                        products = [
                            (f"scores {f}", scores_kernel(d, *fwd, dt.name, causal, count),
                             (XI, XI, X3, A2, A3, I64, I64, I64, ACC, COUNTER_TYPE)),
                            (f"rowprod {f}", rowprod_kernel(d, *fwd, dt.name, causal, count),
                             (X3, XI, X3, I64, I64, I64, ACC, COUNTER_TYPE, *DROP)),
                        ]
                    specs = products[:1] + [
                        (f"softmax {f}", softmax_kernel(*fwd, dt.name, causal, count),
                         (X3, A3, X3, I64, I64, COUNTER_TYPE)),
                    ] + products[1:] + [
                        (f"{grad} {b}", grad_kernel(d, *bwd, dt.name, causal, count), grad_sig),
                        (f"colprod {b}", colprod_kernel(d, *bwd, dt.name, causal, count),
                         (X3, XI, X3, I64, I64, I64, ACC, COUNTER_TYPE)),
                    ]
                    if bwd != fwd:
                        specs.append((f"rowprod {b}", rowprod_kernel(d, *bwd, dt.name, causal, count),
                                      (X3, XI, X3, I64, I64, I64, ACC, COUNTER_TYPE, *DROP)))
                    if True in _dropout.compile_variants(dt, d, count):  # O = (Zs P) V and Algorithm 4's dS
                        specs += [
                            (f"rowprod {f} dropout", rowprod_kernel(d, *fwd, dt.name, causal, count, True),
                             (X3, XI, X3, I64, I64, I64, ACC, COUNTER_TYPE, *DROP)),
                            (f"{grad} {b} dropout", grad_kernel(d, *bwd, dt.name, causal, count, True), grad_sig),
                        ]
                    for label, kernel, sig in specs:
                        for cc in ccs:
                            built = kernel(cc) if callable(kernel) and not hasattr(kernel, "py_func") else kernel
                            out.append((f"standard {label} sm_{cc[0]}{cc[1]}", compile_ptx(built.py_func, sig, cc)))
    return out + matmul16.compile_all(ccs, tuple(t for t in dtypes if t != "bfloat16"), ds)


#: FLOPs per launch (see :func:`flash_numba.kernels._spec.launch_flops`: ``a*d + b`` per score, ``c*d`` per row).
FLOPS = launch_flops(
    forward={
        FORWARD_NAMES[0]: (2, 5, 0),  # Q K^T; scale, online max, subtract, exp, add (L = m + log l)
        FORWARD_NAMES[1]: (0, 3, 0),  # subtract m, exp, multiply by 1/l
        FORWARD_NAMES[2]: (2, 0, 0),  # P V
    },
    backward={
        _rowsum.NAME: (0, 0, 2),
        BACKWARD_NAMES[1]: (4, 5, 0),  # Q K^T, dO V^T; scale, subtract, exp, subtract, multiply
        BACKWARD_TC_NAMES[1]: (2, 5, 0),  # the forward's S launch again (float16 on tensor cores)
        BACKWARD_TC_NAMES[2]: (2, 4, 0),  # dO V^T; subtract, exp, subtract, multiply
        BACKWARD_NAMES[2]: (2, 0, 0),
        BACKWARD_NAMES[3]: (2, 0, 0),
        BACKWARD_NAMES[4]: (2, 0, 0),
    },
)

def _compile_bfloat16_forward(ccs, ds):
    """PTX of the bfloat16 forward (tensor-core products, the softmax on uint16 words) for each cc and d."""
    from ...compile_check import compile_ptx, count_variants

    out = []
    I64, B = types.int64, types.boolean
    X3, XI = types.Array(types.uint16, 3, "C"), types.Array(types.uint16, 4, "A")
    A2, A3, ACC = array_type(np.float32, 2), array_type(np.float32, 3), types.float32
    for cc in ccs:
        for d in ds:
            fwd = choose_block(d, "bfloat16", STATIC_SHARED_LIMIT, "forward", cc)
            for count in count_variants("bfloat16", d):
                for causal in (False, True):
                    tag = f"d={d} bfloat16{' causal' * causal}{' count' * count} Br={fwd[0]} Bc={fwd[1]}"
                    specs = [
                        (f"scores_tc {tag}", tensor.scores_kernel(d, *fwd, "bfloat16", causal, count),
                         (XI, XI, X3, A2, A3, I64, I64, I64, ACC, B, B, COUNTER_TYPE)),
                        (f"softmax {tag}", softmax_kernel(*fwd, "bfloat16", causal, count),
                         (X3, A3, X3, I64, I64, COUNTER_TYPE)),
                        (f"rowprod_tc {tag}", tensor.rowprod_kernel(d, *fwd, "bfloat16", causal, count),
                         (X3, XI, X3, I64, I64, I64, ACC, B, B, COUNTER_TYPE, *_dropout.arg_types(ACC))),
                    ]
                    for label, kernel, sig in specs:
                        out.append((f"standard {label} sm_{cc[0]}{cc[1]}", compile_ptx(kernel.py_func, sig, cc)))
    return out


SPEC = KernelSpec(
    name="standard", flops=FLOPS, doc=__doc__, forward=forward, backward=backward, compile_all=compile_all,
    forward_launches=FORWARD_NAMES, backward_launches=BACKWARD_NAMES + BACKWARD_TC_NAMES[1:3],  # backward_names
    shared_bytes=shared_bytes, block_limits=block_limits, choose_block=choose_block, check_block=check_block,
    dtypes=("float16", "bfloat16", "float32", "float64"), min_cc={"bfloat16": (8, 0)},
    forward_only=("bfloat16",),  # the forward's products on tensor cores; no bfloat16 backward yet
    compile_groups=((("bfloat16",), (64,)),),
)
