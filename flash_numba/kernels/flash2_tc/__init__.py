"""flash2_tc: FlashAttention-2's forward on tensor cores (mma.sync), float16 and bfloat16.

The same algorithm as :mod:`flash_numba.kernels.flash2` (a block owns Br query rows, walks over the K/V
blocks, keeps O_i, m_i, l_i on chip, writes O_i and L_i once), with both matrix products on tensor cores:
each warp owns 16 query rows and computes its S_ij = Q_i K_j^T and O_i += P_ij V_j with
``mma.sync.aligned.m16n8k16`` (PTX ISA 9.7.14.5), its operands loaded from shared memory with ``ldmatrix``
(9.7.9.25).  What changed since flash2_fast, and why:

* **Tensor cores.**  On the CUDA cores a multiply-add is one FMA per thread; one m16n8k16 is 2048 of them
  for the warp, in one instruction.  Half precision in, float32 accumulators (S_ij, O_i, m_i, l_i, L_i).
* **Q_i in registers.**  Loaded once (global -> shared -> ldmatrix) as the A fragments of S = Q K^T and
  kept for the whole loop: d/4 32-bit registers a lane.
* **P never leaves registers** (FA2): the accumulator layout of two n8 tiles of S_ij is the A-operand layout
  of one k16 step of P V (see :mod:`.forward`), so P_ij is rounded to the input's half type in place and fed
  to the next mma; flash2_fast writes P_ij^T to shared memory and reads it back.
* **The softmax on fragments.**  A row of S_ij lives in the 4 lanes of a quad: its max and sum take two
  ``shfl_xor`` (1, 2).  Base 2, log2(e) folded into the scale.
* **Everything else as the other kernels**: causal with block skipping (bottom-right, :mod:`..causal`), any
  Nq and Nk (edge rows zero-filled, edge keys masked), grouped-query attention (G), dropout (the same hash,
  :mod:`.._dropout`), strided inputs (flat arrays with their layouts), counted bytes equal to the IO model
  (:mod:`flash_numba.iomodel.flash2_tc`).

Head dims 16 to 128, multiples of 16 (whole k16 steps; others are refused by the spec).  float16 from a
T4 (cc 7.5: the "sm75" path, two m16n8k8 per k16 step), bfloat16 from cc 8.0.  Instruction path:
:func:`.layout.path`; ``FLASH_NUMBA_TC_PATH=sm75`` forces the T4's path on a newer GPU.

Backward (:mod:`.backward`): FA2's, on the same instructions: S recomputed with the forward's mma chain, dV,
dP, dS, dK per key block, dQ in a kernel of its own (deterministic) or by float32 atomics
(``deterministic=False``).

Counters: "flash2_tc forward"; "flash2_tc D" and "flash2_tc dQ | dK, dV" (deterministic backward up to d = 64: D,
then the dQ and dK/dV blocks in one launch), "flash2_tc dQ" and "flash2_tc dK, dV" (above d = 64);
"flash2_tc D, zero dQ", "flash2_tc dK, dV, dQ (atomic)" and "flash2_tc dQ to storage dtype" (atomic).
"""

from __future__ import annotations

import itertools

import numpy as np
from numba import types

from ... import _inputs, _views, device
from ...compile_check import compile_kernel
from .. import _dropout, _vec
from .._launch import launch
from .._common import COUNTER_TYPE, LAYOUT_TYPE, head_grid
from .._spec import KernelSpec, launch_flops
from . import backward as _bwd
from . import layout
from .forward import forward_kernel
from .layout import FORWARD_NAME, LOG2E, NT, Bc, Br

__all__ = ["SPEC", "grids", "forward", "backward", "compile_all", "forward_kernel", "layout"]

BF16_STORAGE = np.dtype(np.uint16)


def _gpu_cc():
    return None if device.SIMULATOR else device.info().compute_capability


def instruction_path(dtype_name: str) -> str:
    """The path a call runs here ("sm80" or "sm75"); ValueError for bfloat16 on the sm_75 path."""
    p = layout.path(_gpu_cc())
    if p == "sm75" and dtype_name == "bfloat16":
        raise ValueError("q: dtype bfloat16 is not supported on flash2_tc's sm_75 path (a T4 has no bfloat16 "
                         "tensor cores); unset FLASH_NUMBA_TC_PATH or use float16")
    return p


def grids(prob, block) -> dict:
    """The 1-D launch grid of each launch, by launch name: the forward's Tr * B*H blocks and the backward's
    (:func:`.backward.grids`)."""
    out = dict(_bwd.grids(prob))
    out[FORWARD_NAME] = head_grid(-(-prob.Nq // Br), prob.BH)
    return out


def forward(prob, ops, block, counters):
    """O and L: one launch, a 1-D grid of Tr * B*H blocks (the last row tile first), 128 threads (4 warps)."""
    name = prob.dtype_name
    path = instruction_path(name)
    dropout, drop_args = _dropout.launch_args(prob)
    (q, q_lay), (k, k_lay), (v, v_lay) = (_views.flat_input(ops[n].dev, n) for n in ("q", "k", "v"))
    aligned = all(_vec.aligned16(x, lay) for x, lay in ((q, q_lay), (k, k_lay), (v, v_lay)))
    kernel = forward_kernel(prob.d, name, path, prob.causal, counters.enabled, dropout, aligned)
    o = _inputs.empty((prob.BH, prob.Nq, prob.d), prob.dtype)
    lse = _inputs.empty((prob.BH, prob.Nq), np.float32)
    launch(kernel, grids(prob, block)[FORWARD_NAME], NT)(
        q, k, v, o, lse, prob.Nq, prob.Nk, prob.G, np.float32(prob.scale * LOG2E), counters.array(FORWARD_NAME),
        q_lay, k_lay, v_lay, *drop_args)
    return o, lse


def backward(prob, ops, block, counters):
    """dQ, dK, dV on tensor cores, deterministic: up to d = 64 D, then the dQ and dK/dV kernels' blocks in one
    launch; above, the dQ kernel (which writes D), then the dK/dV kernel (:mod:`.backward`)."""
    return _bwd.run_backward(prob, ops, counters, instruction_path(prob.dtype_name) == "sm75")


def backward_atomic(prob, ops, block, counters):
    """dQ, dK, dV on tensor cores with dQ by float32 atomics (``deterministic=False``, :mod:`.backward`)."""
    return _bwd.run_backward_atomic(prob, ops, counters, instruction_path(prob.dtype_name) == "sm75")


def _bf16(dtype) -> bool:
    """Whether ``dtype`` (a name, or the storage dtype: uint16) is bfloat16."""
    return dtype == "bfloat16" if isinstance(dtype, str) else np.dtype(dtype) == BF16_STORAGE


def _fixed(pass_, d):
    """The forward's block, or the backward's as the spec reports it: the dK/dV kernel's (Br query rows a step,
    Bc keys a block, :func:`.backward.kv_block`); its dQ kernel runs 64 x 64 (:mod:`.backward`)."""
    return (Br, Bc) if pass_ == "forward" else _bwd.kv_block(d)


def choose_block(d, dtype, budget, pass_="forward"):
    return _fixed(pass_, d)


def choose_atomic_block(d, dtype, budget):
    return _fixed("backward", d)


def block_limits(d, dtype, pass_):
    return _fixed(pass_, d)


def shared_bytes(Br_, Bc_, d, dtype, pass_):
    if pass_ == "forward":
        return layout.shared_bytes_forward(d)
    return max(_bwd.kv_shared_bytes(d), _bwd.q_shared_bytes(d))


def check_block(block, d, dtype, pass_):
    fixed = _fixed(pass_, d)
    if block is not None and tuple(block) != fixed:
        raise ValueError(f"block: flash2_tc's {pass_} runs Br = {fixed[0]}, Bc = {fixed[1]} (fixed tiles of 4 warps); "
                         f"pass block=None or {fixed}")


def register_cap(launch, cc, d, dtype, dynamic=False, count=False):
    return None


def compile_all(ccs, dtypes, ds):
    """The compile tier's list: the forward for float16 (every cc; at cc >= 8.0 the sm80 path and the forced
    sm75 path) and bfloat16 (cc >= 8.0), head dims of ``ds`` that flash2_tc runs, causal or not, with
    16-byte copies or element copies, counting or not; dropout at d = 64 (not counting, aligned)."""
    out = []
    I64, F32 = types.int64, types.float32
    for cc in ccs:
        for name in (n for n in ("float16", "bfloat16") if n in dtypes):
            if name == "bfloat16" and tuple(cc) < (8, 0):
                continue
            X1 = types.Array(types.uint16 if name == "bfloat16" else types.float16, 1, "C")
            X3 = types.Array(X1.dtype, 3, "C")
            sig = (X1, X1, X1, X3, types.Array(F32, 2, "C"), I64, I64, I64, F32, COUNTER_TYPE, LAYOUT_TYPE,
                   LAYOUT_TYPE, LAYOUT_TYPE, *_dropout.arg_types(F32))
            paths = ("sm75",) if tuple(cc) < (8, 0) else (("sm80", "sm75") if name == "float16" else ("sm80",))
            for d in (d for d in ds if layout.runs_head_dim(d)):
                variants = [(causal, count, aligned, False) for causal, count, aligned in
                            itertools.product((False, True), (False, True), (True, False))
                            if not (count and not aligned)]
                if d == 64:
                    variants.append((False, False, True, True))
                for path, (causal, count, aligned, drop) in itertools.product(paths, variants):
                    label = (f"{FORWARD_NAME} d={d} {name} {path}{' causal' * causal}{' count' * count}"
                             f"{' aligned' * aligned}{' dropout' * drop}")
                    kernel = forward_kernel(d, name, path, causal, count, drop, aligned)
                    out.append(compile_kernel(label, kernel, sig, cc, None))
    dts = [n for n in ("float16", "bfloat16") if n in dtypes]
    return out + _bwd.compile_backward(ccs, dts, [d for d in ds if layout.runs_head_dim(d)])


#: FLOPs a score: the dQ blocks recompute S and dP and add dS K (6 d), the dK/dV blocks S, dP, P^T dO, dS^T Q
#: (8 d), both in one launch; the atomic kernel all five products (10 d); D = rowsum(dO * O) 2 d a row
FLOPS = launch_flops(forward={FORWARD_NAME: (4, 5, 0)},
                     backward={_bwd.D_NAME: (0, 0, 2), _bwd.BACKWARD_NAME: (14, 10, 0),
                               _bwd.BACKWARD_Q_NAME: (6, 5, 2), _bwd.BACKWARD_KV_NAME: (8, 5, 0)},
                     atomic={_bwd.D_ZERO_NAME: (0, 0, 2), _bwd.BACKWARD_KVQ_NAME: (10, 5, 0),
                             _bwd.CAST_DQ_NAME: (0, 0, 0)})
_flops = FLOPS


def _head_dims(d: int) -> bool:
    return layout.runs_head_dim(d)


SPEC = KernelSpec(
    name="flash2_tc", doc=__doc__, flops=_flops,
    forward=forward, backward=backward, backward_atomic=backward_atomic,
    forward_launches=(FORWARD_NAME,),
    backward_launches=(_bwd.D_NAME, _bwd.BACKWARD_NAME, _bwd.BACKWARD_Q_NAME, _bwd.BACKWARD_KV_NAME),
    atomic_backward_launches=(_bwd.D_ZERO_NAME, _bwd.BACKWARD_KVQ_NAME, _bwd.CAST_DQ_NAME),
    compile_all=compile_all,
    compile_groups=((("float16", "bfloat16"), (128,)), (("bfloat16",), (64,))),  # and GROUPS: float16 at d = 64
    shared_bytes=shared_bytes, block_limits=block_limits, choose_block=choose_block, check_block=check_block,
    choose_atomic_block=choose_atomic_block, register_rule=register_cap, dynamic_shared=True,
    dtypes=("float16", "bfloat16"), head_dims=_head_dims, head_dims_text=layout.HEAD_DIMS_TEXT,
    min_cc={"float16": (7, 5), "bfloat16": (8, 0)},
    lacks={"masked_nonfinite"},  # a masked P = 0 meets V (K, Q, dO) inside the mma: 0 * Inf = NaN (forward.py)
)
