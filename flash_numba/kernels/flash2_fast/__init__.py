"""flash2_fast: FlashAttention-2 (the algorithm of :mod:`flash_numba.kernels.flash2`) register-tiled for speed.

Forward: a thread block owns Br query rows, walks over the K/V blocks, keeps O_i,
m_i, l_i on chip and writes O and L once.  Backward: D = rowsum(dO * O), then one pass
over the key blocks, the dK/dV kernel adding dS K_j into dQ with atomics: into one dQ
with ``deterministic=False`` (FlashAttention-2's way), or, deterministic, into S copies
of dQ, block s of a head into copy s, the key tiles dealt out one launch per round of S,
then summed in a fixed order ("split").  Where S copies would not fill the GPU within
:data:`.layout.DQ_COPIES_LIMIT`, two passes: D and dQ per query block (the dQ kernel
computes D_i from the dO_i it loads, and writes D), then dK/dV per key block (7 block
products instead of 5, and two launches: at small N a call's time is the host's).  Blocks the
fast backward kernels cannot run (not micro-tile shapes, or too large, e.g. float64
at d = 128) run flash2's backward.

How the kernels spend their time on multiply-adds:

* **Micro-tiles.**  128 threads as an 8 x 16 grid; each thread owns a TM x TN tile
  of S_ij and a TM x TD tile of the accumulator (:mod:`.layout`).
* **Transposed tiles, vector loads.**  Shared memory holds the tiles so that the TM (TN, TD) values a thread
  needs at each step of a product are adjacent: one 16-byte ``LDS.128`` feeds four FMAs (16-byte aligned
  arrays and *unsigned* indices: with a signed index Numba handles Python's negative indices and the four
  loads stay apart).  The forward holds Q_i^T, K_j (row-major), V_j and P_ij^T; its threads own keys 16
  apart (tx, tx + 16, ...), so that a warp's 16-byte stores of P_ij^T and its 16-byte reads of K_j fall on
  all 32 banks (:mod:`.forward`).
* **16-byte global loads** (:mod:`flash_numba.kernels._vec`): the forward reads full K/V tiles 16 bytes a
  thread and stores them 16 bytes at a time, where every row of k and v starts on 16 bytes.
* **Loops the compiler unrolls**: ``while`` loops over uint32 offsets
  (:mod:`flash_numba.kernels._tile_ops`); full K/V tiles loaded with unsigned indices,
  every load of a thread before its first shared store.
* **Strided inputs, global loads.**  q, k, v, dO come as flat 1-D arrays with their
  ``(H, stride_B, stride_H, stride_N)`` layouts (:func:`flash_numba._views.flat_input`):
  any layout whose rows are contiguous is read in place (a transposed ``(B, N, H, d)``
  tensor, a packed qkv), with no compile-time specialisation per layout.  An index into a
  C-contiguous array compiles to arithmetic on its pointer, so the loads stay global
  loads (the 4-D layout-'A' arrays of the readable kernels index through integer
  arithmetic on the address: generic loads, and 38 more registers in the forward, which
  spilled under its cap of 128).  The head's start (one 32-bit division, shared by K and
  V) is computed once per tile load; offsets within a head are 32-bit (row strides as
  uint32: ``_views.flat_input`` copies the rare input whose head spans 2^32 elements).
* **Typed constants** (``-inf``, 0, 1 in the accumulation dtype) and **exp2** with
  log2(e) folded into the scale; ``fastmath`` without the no-inf/no-NaN flags, so
  masked rows keep their -inf.
* **Row reductions in registers** (four ``shfl_xor`` over the 16 threads of a row).
* **Causal**: a 1-D grid, the longest row tiles of every head first.
* **Dynamic shared memory**: blocks from the device's opt-in limit (227 KB on an H200, from cc 9.0),
  chosen by head dim from measured tile shapes (:mod:`.layout`); tiles above 48 KB live in dynamic
  shared memory (:mod:`flash_numba.kernels._smem`), d = 128 runs 8 x 3 tiles (97 KB) instead of 4 x 1.

The measurements behind each choice are in docs/PERFORMANCE.md.  Kernels:
:mod:`.forward` and :mod:`.backward`; shapes and block rules: :mod:`.layout`.

Counters: "flash2_fast forward"; "D = rowsum(dO*O)", "flash2_fast zero dQ copies",
"flash2_fast dK, dV, dQ (split)" and "flash2_fast sum dQ copies" (split backward), or
"flash2_fast dQ" (with D) and "flash2_fast dK, dV" (two-pass); "D = rowsum(dO*O)", "flash2_fast zero dQ",
"flash2_fast dK, dV, dQ (atomic)" and, for float16, "flash2_fast dQ to storage dtype"
(atomic backward).  :mod:`flash_numba.iomodel.flash2_fast` predicts them.
"""

from __future__ import annotations

import itertools

import numpy as np
from numba import cuda, types

from ... import _inputs, _launch_plan, _views
from ...compile_check import compile_kernel, count_variants
from ...device import SIMULATOR, dynamic_shared_limit
from .. import _dropout, _rowsum, _smem, _tile_ops, _vec
from .. import flash2 as _flash2
from .._common import COUNTER_TYPE, LAYOUT_TYPE, acc_nb_type, array_type, head_grid
from .._spec import KernelSpec, launch_flops
from .backward import (ELEMWISE_THREADS, ZEROS_PER_THREAD, cast_kernel, dkdv_kernel, dq_kernel, sum_copies_kernel,
                       zero_kernel)
from . import layout
from .forward import forward_kernel
from .layout import (
    BACKWARD_KV_NAME,
    BACKWARD_KVQ_NAME,
    BACKWARD_KVQ_SPLIT_NAME,
    BACKWARD_Q_NAME,
    CAST_DQ_NAME,
    FORWARD_NAME,
    LOG2E,
    MAX_REGISTERS,
    NT,
    TX,
    TY,
    SUM_DQ_NAME,
    ZERO_DQ_COPIES_NAME,
    ZERO_DQ_NAME,
    backward_smem,
    block_limits,
    check_block,
    choose_atomic_block,
    choose_block,
    geometry,
    geometry_kv,
    geometry_q,
    register_cap,
    shared_bytes,
    uses_fast_backward,
)

__all__ = [
    "SPEC", "forward", "backward", "backward_atomic", "compile_all", "forward_kernel", "dkdv_kernel", "dq_kernel",
    "zero_kernel", "cast_kernel", "geometry", "geometry_kv", "geometry_q", "backward_smem", "shared_bytes",
    "block_limits", "check_block", "choose_block", "choose_atomic_block", "uses_fast_backward", "NT", "LOG2E",
]


def grids(prob, block) -> dict:
    """The 1-D launch grid of each launch, by launch name (B*H folded into axis x, see head_grid); the split
    backward's for the number of dQ copies it would run with here (one where it would not run)."""
    Br, Bc = block
    Tr, Tc = -(-prob.Nq // Br), -(-prob.Nk // Bc)
    n = prob.BH * prob.Nq * prob.d
    elementwise = -(-n // ELEMWISE_THREADS)
    copies = max(1, _split_copies(prob, block))
    return {FORWARD_NAME: head_grid(Tr, prob.BH), _rowsum.NAME: _rowsum.grid(prob),
            BACKWARD_KV_NAME: head_grid(Tc, prob.BHkv), BACKWARD_Q_NAME: head_grid(Tr, prob.BH),
            BACKWARD_KVQ_NAME: head_grid(Tc, prob.BHkv), ZERO_DQ_NAME: head_grid(_zero_blocks(n), 1),
            CAST_DQ_NAME: head_grid(elementwise, 1), SUM_DQ_NAME: head_grid(elementwise, 1),
            ZERO_DQ_COPIES_NAME: head_grid(_zero_blocks(copies * n), 1),
            BACKWARD_KVQ_SPLIT_NAME: head_grid(copies, prob.BHkv)}


def _zero_blocks(n: int) -> int:
    """Blocks of :func:`.backward.zero_kernel` for n elements."""
    return -(-n // (ELEMWISE_THREADS * ZEROS_PER_THREAD))


def _split_copies(prob, block) -> int:
    """The dQ copies of the split deterministic backward for this call (0: it runs the two-pass one)."""
    Br, Bc = block
    if not uses_fast_backward(Br, Bc, prob.d, prob.dtype):
        return 0
    return layout.split_dq_copies(prob.BH, prob.G, prob.Nq, prob.Nk, prob.d, prob.dtype, block)


def forward(prob, ops, block, counters):
    """O and L: one launch, a 1-D grid of Tr * B*H blocks, 128 threads."""
    Br, Bc = block
    dropout, drop_args = _dropout.launch_args(prob)
    dyn = _dynamic_bytes(geometry, prob.d, Br // TY, Bc // TX, prob.dtype)
    (q, q_lay), (k, k_lay), (v, v_lay) = (_views.flat_input(ops[name].dev, name) for name in ("q", "k", "v"))
    # 16-byte K/V loads where every row allows them (the usual contiguous tensor)
    aligned = (_vector_build(Bc, prob.d, prob.dtype.name, counters.enabled)
               and _vec.aligned16(k, k_lay) and _vec.aligned16(v, v_lay))
    kernel, _ = forward_kernel(prob.d, Br // TY, Bc // TX, prob.dtype.name, prob.causal, counters.enabled,
                               dropout=dropout, dynamic=bool(dyn), aligned=aligned)
    o = _inputs.empty((prob.BH, prob.Nq, prob.d), prob.dtype)
    lse = _inputs.empty((prob.BH, prob.Nq), prob.acc)
    _smem.configure(kernel, grids(prob, block)[FORWARD_NAME], NT, dyn)(
        q, k, v, o, lse, prob.Nq, prob.Nk, prob.G, prob.acc.type(prob.scale * LOG2E), counters.array(FORWARD_NAME),
        q_lay, k_lay, v_lay, *drop_args)
    return o, lse


def _vector_build(Bc: int, d: int, dtype_name: str, count: bool) -> bool:
    """Whether the forward has a build with 16-byte K/V loads (``aligned``) for tiles of Bc keys: where 16-byte
    loads cover the tile (:func:`.._tile_ops.vector_columns`) and the run is not counted (counted runs are not
    timed: they read the same bytes element by element, one build fewer).  The launcher and the compile tier ask."""
    return not count and _tile_ops.vector_columns(Bc, d, dtype_name)[0]


def _dynamic_bytes(geometry_of, d: int, TM: int, TN: int, dtype) -> int:
    """Bytes of dynamic shared memory a kernel of that geometry launches with (0: its tiles are static)."""
    nbytes = geometry_of(d, TM, TN, dtype)["smem"]
    return nbytes if _smem.is_dynamic(nbytes) else 0


def _backward_inputs(prob, ops, counters, launch_d: bool = True):
    """(q, k, v, do, lse, D, dk, dv, scale, scale_log2, layouts): D = rowsum(dO * O) launched (allocated only,
    without ``launch_d``: the two-pass dQ kernel computes it), dk and dv allocated; q, k, v, do flat and
    ``layouts`` their layouts (:func:`flash_numba._views.flat_input`)."""
    if launch_d:
        D = _rowsum.rowsum(prob, ops["o"].dev, ops["do"].dev, counters)
    else:
        D = _inputs.empty((prob.BH, prob.Nq), prob.acc)
    (q, q_lay), (k, k_lay), (v, v_lay), (do, do_lay) = (_views.flat_input(ops[name].dev, name)
                                                        for name in ("q", "k", "v", "do"))
    dk = _inputs.empty((prob.BHkv, prob.Nk, prob.d), prob.dtype)
    dv = _inputs.empty((prob.BHkv, prob.Nk, prob.d), prob.dtype)
    return (q, k, v, do, ops["lse"].dev, D, dk, dv, prob.acc.type(prob.scale), prob.acc.type(prob.scale * LOG2E),
            (q_lay, k_lay, v_lay, do_lay))


def backward(prob, ops, block, counters):
    """dQ, dK, dV, deterministic: the split backward where it keeps the GPU busy
    (:func:`.layout.split_dq_copies`), else the two-pass one.

    Split: D = rowsum(dO*O), S zeroed copies of dQ, the dK/dV/dQ kernel on a grid of S * B*Hkv blocks, block s
    adding into copy s only (one block, one order), then dq = copy 0 + copy 1 + ... in that order.  Two-pass:
    D and dQ per query block (the dQ kernel computes D_i from the dO_i it loads, and writes D), then dK/dV
    per key block (1-D grid of Tc * B*Hkv): two launches, the fewest host work of any backward at small N.
    Blocks the fast kernels cannot run (:func:`uses_fast_backward`) run flash2's backward.
    """
    Br, Bc = block
    BH, Nq, Nk, d, dt = prob.BH, prob.Nq, prob.Nk, prob.d, prob.dtype
    if not uses_fast_backward(Br, Bc, d, dt):
        return _flash2.backward(prob, ops, block, counters)
    copies = _split_copies(prob, block)
    if copies:
        return _backward_dq_copies(prob, ops, block, counters, copies)
    count = counters.enabled
    q, k, v, do, lse, D, dk, dv, scale, scale_log2, layouts = _backward_inputs(prob, ops, counters, launch_d=False)
    o, o_lay = _views.flat_input(ops["o"].dev, "o")
    dropout, drop_args = _dropout.launch_args(prob)
    grid = grids(prob, block)
    dq = _inputs.empty((BH, Nq, d), dt)
    q_dyn = _dynamic_bytes(geometry_q, d, Br // TY, Bc // TX, dt)
    qk, _ = dq_kernel(d, Br // TY, Bc // TX, dt.name, prob.causal, count, dropout, dynamic=bool(q_dyn))
    _smem.configure(qk, grid[BACKWARD_Q_NAME], NT, q_dyn)(  # D_i and dQ_i: D for the dK/dV kernel
        q, k, v, do, o, lse, D, dq, Nq, Nk, prob.G, scale, scale_log2, counters.array(BACKWARD_Q_NAME), *layouts,
        o_lay, *drop_args)
    kv_dyn = _dynamic_bytes(geometry_kv, d, Bc // TY, Br // TX, dt)
    kv, _ = dkdv_kernel(d, Bc // TY, Br // TX, dt.name, prob.causal, count, dropout=dropout, dynamic=bool(kv_dyn))
    _smem.configure(kv, grid[BACKWARD_KV_NAME], NT, kv_dyn)(
        q, k, v, do, lse, D, dk, dv, _unused_dq(prob.acc), Nq, Nk, prob.G, 0, scale, scale_log2,
        counters.array(BACKWARD_KV_NAME), *layouts, *drop_args)
    return dq, dk, dv


def _backward_dq_copies(prob, ops, block, counters, copies):
    """The split deterministic backward (see :func:`backward`) with ``copies`` copies of dQ."""
    Br, Bc = block
    BH, Nq, d, dt, acc = prob.BH, prob.Nq, prob.d, prob.dtype, prob.acc
    count = counters.enabled
    q, k, v, do, lse, D, dk, dv, scale, scale_log2, layouts = _backward_inputs(prob, ops, counters)
    n = BH * Nq * d
    grid = grids(prob, block)
    dq_acc = _inputs.empty((copies * BH, Nq, d), acc)
    zero_kernel(acc.name, count)[grid[ZERO_DQ_COPIES_NAME], ELEMWISE_THREADS](
        dq_acc.reshape(copies * n), copies * n, counters.array(ZERO_DQ_COPIES_NAME))
    dropout, drop_args = _dropout.launch_args(prob)
    kv_dyn = _dynamic_bytes(geometry_kv, d, Bc // TY, Br // TX, dt)
    kv, _ = dkdv_kernel(d, Bc // TY, Br // TX, dt.name, prob.causal, count, atomic_dq=True, dropout=dropout,
                        dynamic=bool(kv_dyn))
    launch = _smem.configure(kv, grid[BACKWARD_KVQ_SPLIT_NAME], NT, kv_dyn)
    Tc = -(-prob.Nk // Bc)
    for rnd in range(-(-Tc // copies)):  # rounds of ``copies`` key tiles, one launch after the other
        launch(q, k, v, do, lse, D, dk, dv, dq_acc, Nq, prob.Nk, prob.G, rnd, scale, scale_log2,
               counters.array(BACKWARD_KVQ_SPLIT_NAME), *layouts, *drop_args)
    dq = _inputs.empty((BH, Nq, d), dt)
    sum_copies_kernel(acc.name, dt.name, count)[grid[SUM_DQ_NAME], ELEMWISE_THREADS](
        dq_acc.reshape(copies * n), dq.reshape(n), n, copies, counters.array(SUM_DQ_NAME))
    return dq, dk, dv


def backward_atomic(prob, ops, block, counters):
    """dK, dV and dQ in one pass over the key blocks, dQ added with atomics (``deterministic=False``).

    A zeroed accumulator of the accumulation dtype takes the atomic adds (float32 even for
    float16 inputs) and, for float16, is cast to dq at the end.  Blocks the fast kernels
    cannot run fall back to flash2's (deterministic) backward.
    """
    Br, Bc = block
    BH, Nq, Nk, d, dt, acc = prob.BH, prob.Nq, prob.Nk, prob.d, prob.dtype, prob.acc
    if not uses_fast_backward(Br, Bc, d, dt):
        return _flash2.backward(prob, ops, block, counters)
    count = counters.enabled
    q, k, v, do, lse, D, dk, dv, scale, scale_log2, layouts = _backward_inputs(prob, ops, counters)
    n = BH * Nq * d
    grid = grids(prob, block)
    dq_acc = _inputs.empty((BH, Nq, d), acc)
    zero_kernel(acc.name, count)[grid[ZERO_DQ_NAME], ELEMWISE_THREADS](dq_acc.reshape(n), n,
                                                                     counters.array(ZERO_DQ_NAME))
    dropout, drop_args = _dropout.launch_args(prob)
    kv_dyn = _dynamic_bytes(geometry_kv, d, Bc // TY, Br // TX, dt)
    kv, _ = dkdv_kernel(d, Bc // TY, Br // TX, dt.name, prob.causal, count, atomic_dq=True, dropout=dropout,
                        dynamic=bool(kv_dyn))
    _smem.configure(kv, grid[BACKWARD_KVQ_NAME], NT, kv_dyn)(
        q, k, v, do, lse, D, dk, dv, dq_acc, Nq, Nk, prob.G, 0, scale, scale_log2, counters.array(BACKWARD_KVQ_NAME),
        *layouts, *drop_args)
    if dt == acc:
        return dq_acc, dk, dv
    dq = _inputs.empty((BH, Nq, d), dt)
    cast_kernel(acc.name, dt.name, count)[grid[CAST_DQ_NAME], ELEMWISE_THREADS](dq_acc.reshape(n), dq.reshape(n), n,
                                                                             counters.array(CAST_DQ_NAME))
    return dq, dk, dv


def _unused_dq(acc):
    """The ``dq`` argument of the deterministic dK/dV kernel, which never touches it (one per context)."""
    key = (0 if SIMULATOR else id(cuda.current_context()), np.dtype(acc).name)
    if key not in _UNUSED:
        _UNUSED[key] = _launch_plan.persistent(cuda.device_array((1, 1, 1), dtype=acc))
    return _UNUSED[key]


_UNUSED: dict = {}


def compile_all(ccs, dtypes, ds):
    """The compile tier's :class:`~flash_numba.compile_check.Compiled` list: the forward and, where its
    blocks are micro-tile shapes, the dK/dV, dQ and atomic dK/dV/dQ kernels (else the backward is
    flash2's, compiled by that module), at the blocks chosen for each d, causal or not, counting or not; with
    dropout for :data:`flash_numba.kernels._dropout.COMPILED_WITH_DROPOUT`.  Blocks are those each cc runs:
    within what a block gets there (:func:`flash_numba.device.dynamic_shared_limit`: 48 KB of static shared
    memory below cc 9.0, so sm_75 builds the 48 KB blocks); a kernel whose tiles are dynamic is labelled
    ``dynamic=<bytes>``."""
    return [item for cc in ccs for item in _compile_for_cc(cc, dtypes, ds)]


def _dynamic_tag(nbytes: int) -> str:
    return f" dynamic={nbytes}" if nbytes else ""


def _compile_for_cc(cc, dtypes, ds):
    """compile_all's list for one cc, with the blocks chosen for the shared memory a block gets there."""
    budget = dynamic_shared_limit(cc)
    out = []
    I64 = types.int64
    for dtype in dtypes:
        dt = np.dtype(dtype)
        acc = _inputs.acc_dtype(dt)
        X3, A2, A3, ACC = array_type(dt, 3), array_type(acc, 2), array_type(acc, 3), acc_nb_type(dt)
        X1, LAY = array_type(dt, 1), LAYOUT_TYPE  # q, k, v, do: flat, with their layouts (_views.flat_input)
        DROP = _dropout.arg_types(ACC)
        fwd_sig = (X1, X1, X1, X3, A2, I64, I64, I64, ACC, COUNTER_TYPE, LAY, LAY, LAY, *DROP)
        kv_sig = (X1, X1, X1, X1, A2, A2, X3, X3, A3, I64, I64, I64, I64, ACC, ACC, COUNTER_TYPE, LAY, LAY, LAY,
                  LAY, *DROP)
        q_sig = (X1, X1, X1, X1, X1, A2, A2, X3, I64, I64, I64, ACC, ACC, COUNTER_TYPE, LAY, LAY, LAY, LAY, LAY,
                 *DROP)
        for d in ds:
            Br, Bc = choose_block(d, dt, budget)
            bBr, bBc = choose_block(d, dt, budget, "backward")
            fast_bwd = uses_fast_backward(bBr, bBc, d, dt, budget)
            aBr, aBc = choose_atomic_block(d, dt, budget)  # deterministic=False's block, where it differs
            own_atomic = (aBr, aBc) != (bBr, bBc) and uses_fast_backward(aBr, aBc, d, dt, budget)
            a_dyn = _dynamic_bytes(geometry_kv, d, aBc // TY, aBr // TX, dt)
            fwd_dyn = _dynamic_bytes(geometry, d, Br // TY, Bc // TX, dt)
            kv_dyn = _dynamic_bytes(geometry_kv, d, bBc // TY, bBr // TX, dt)
            q_dyn = _dynamic_bytes(geometry_q, d, bBr // TY, bBc // TX, dt)
            variants = ((count, causal, drop)
                        for count, causal in itertools.product(count_variants(dt, d), (False, True))
                        for drop in _dropout.compile_variants(dt, d, count))
            for count, causal, drop in variants:
                tag = f"{' causal' * causal} {dt}{' count' * count}{' dropout' * drop}"
                fwd, bwd = f"d={d} Br={Br} Bc={Bc}{tag}", f"d={d} Br={bBr} Bc={bBc}{tag}"
                # (launch, label, kernel, signature); built uncapped, assembled with each cc's cap below
                specs = [(FORWARD_NAME, f"{FORWARD_NAME} {fwd}{' aligned' * aligned}{_dynamic_tag(fwd_dyn)}",
                          forward_kernel(d, Br // TY, Bc // TX, dt.name, causal, count, None, drop, bool(fwd_dyn),
                                         aligned)[0], fwd_sig)
                         for aligned in ((False, True) if _vector_build(Bc, d, dt.name, count) else (False,))]
                # the dK/dV kernels are built with this cc's cap: it decides their code (layout.split_s_dp)
                kv_cap, kvq_cap, a_cap = (register_cap(launch, cc, d, dt, bool(dyn), count) for launch, dyn in (
                    (BACKWARD_KV_NAME, kv_dyn), (BACKWARD_KVQ_NAME, kv_dyn), (BACKWARD_KVQ_NAME, a_dyn)))
                if fast_bwd:
                    kv_args = (d, bBc // TY, bBr // TX, dt.name, causal, count)
                    kv_tag, q_tag = _dynamic_tag(kv_dyn), _dynamic_tag(q_dyn)
                    specs += [
                        (BACKWARD_KV_NAME, f"{BACKWARD_KV_NAME} {bwd}{kv_tag}",
                         dkdv_kernel(*kv_args, kv_cap, dropout=drop,
                                     dynamic=bool(kv_dyn))[0], kv_sig),
                        (BACKWARD_Q_NAME, f"{BACKWARD_Q_NAME} {bwd}{q_tag}",
                         dq_kernel(d, bBr // TY, bBc // TX, dt.name, causal, count, drop, bool(q_dyn))[0], q_sig),
                        (BACKWARD_KVQ_NAME, f"{BACKWARD_KVQ_NAME} {bwd}{kv_tag}",
                         dkdv_kernel(*kv_args, kvq_cap, atomic_dq=True, dropout=drop,
                                     dynamic=bool(kv_dyn))[0], kv_sig),
                    ]  # the atomic kernel at the deterministic block: the split backward's
                if own_atomic:
                    a_label = f"{BACKWARD_KVQ_NAME} d={d} Br={aBr} Bc={aBc}{tag}{_dynamic_tag(a_dyn)}"
                    specs.append((BACKWARD_KVQ_NAME, a_label,
                                  dkdv_kernel(d, aBc // TY, aBr // TX, dt.name, causal, count,
                                              a_cap, atomic_dq=True, dropout=drop,
                                              dynamic=bool(a_dyn))[0], kv_sig))
                if fast_bwd and causal and d == ds[0] and not drop:  # the element-wise kernels (atomic, split), once
                    A1, c = array_type(acc, 1), " count" * count
                    specs.append((ZERO_DQ_NAME, f"{ZERO_DQ_NAME} {dt}{c}", zero_kernel(acc.name, count),
                                  (A1, I64, COUNTER_TYPE)))
                    if dt != acc:
                        specs.append((CAST_DQ_NAME, f"{CAST_DQ_NAME} {dt}{c}", cast_kernel(acc.name, dt.name, count),
                                      (A1, X1, I64, COUNTER_TYPE)))
                    specs.append((SUM_DQ_NAME, f"{SUM_DQ_NAME} {dt}{c}", sum_copies_kernel(acc.name, dt.name, count),
                                  (A1, X1, I64, I64, COUNTER_TYPE)))
                out += [compile_kernel(label, kernel, sig, cc, register_cap(launch, cc, d, dt, 'dynamic=' in label,
                                                                             ' count' in label))
                        for launch, label, kernel, sig in specs]
    return out


#: FLOPs per launch (see :func:`flash_numba.kernels._spec.launch_flops`); the deterministic backward runs
#: the two-pass or the split launches (or flash2's, for blocks that are not micro-tile shapes).
FLOPS = launch_flops(
    forward={FORWARD_NAME: (4, 5, 0)},
    backward={
        # flash2's backward (and its D), for blocks that are not micro-tile shapes
        **_flash2.BACKWARD_FLOPS,
        BACKWARD_KV_NAME: (8, 5, 0),  # flash2's backward, register-tiled
        BACKWARD_Q_NAME: (6, 5, 0),
        ZERO_DQ_COPIES_NAME: (0, 0, 0),
        BACKWARD_KVQ_SPLIT_NAME: (10, 5, 0),  # Q K^T, dV, dP, dK, dQ
        SUM_DQ_NAME: (0, 0, 0),  # (copies - 1) d adds per query row: lower order
    },
    atomic={_rowsum.NAME: (0, 0, 2), ZERO_DQ_NAME: (0, 0, 0), BACKWARD_KVQ_NAME: (10, 5, 0), CAST_DQ_NAME: (0, 0, 0)},
)

SPEC = KernelSpec(
    name="flash2_fast", flops=FLOPS,
    # d = 96 (TD = 6) has blocks of its own (its forward once spilled under its cap unnoticed), d = 16 the smallest TD
    compile_groups=((("float32",), (16, 96)),),
    doc=__doc__, forward=forward, backward=backward, compile_all=compile_all,
    backward_atomic=backward_atomic,  # deterministic=False
    forward_launches=(FORWARD_NAME,),
    # two-pass (dQ with D, then dK/dV) or split (D, zeroed copies, dK/dV/dQ, their sum): split_dq_copies picks
    backward_launches=(BACKWARD_Q_NAME, BACKWARD_KV_NAME, _rowsum.NAME, ZERO_DQ_COPIES_NAME, BACKWARD_KVQ_SPLIT_NAME,
                       SUM_DQ_NAME),
    atomic_backward_launches=(_rowsum.NAME, ZERO_DQ_NAME, BACKWARD_KVQ_NAME, CAST_DQ_NAME),
    shared_bytes=shared_bytes, block_limits=block_limits, choose_block=choose_block, check_block=check_block,
    max_registers=MAX_REGISTERS, register_rule=register_cap, dynamic_shared=True,
    choose_atomic_block=choose_atomic_block,
)
