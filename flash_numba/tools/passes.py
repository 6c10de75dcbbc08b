"""One pass of a kernel, as the tools run it: random device inputs, counted and modelled HBM bytes, FLOPs.

:func:`counted` runs a kernel's forward and backward with ``count_hbm=True``;
:func:`model` asks the IO model (:mod:`flash_numba.iomodel`) for the same
passes without running anything.  :func:`flops` gives the arithmetic of each
kernel launch, by the name under which it counts its bytes (each kernel's spec holds its own:
``KernelSpec.flops``).  Everything here
is float32, non-causal, ``N = Nq = Nk``, the default block unless one is given.
"""

from __future__ import annotations

import numpy as np

from .. import device, iomodel, kernels
from ..api import attention_backward, attention_forward, resolve_block

DTYPE = np.dtype(np.float32)


def _all_flops(BH: int, N: int, d: int) -> dict:
    """FLOPs of every launch of every kernel (both passes, both backwards), non-causal, by counter name, from the
    kernels' ``KernelSpec.flops``."""
    out = {}
    for name in kernels.NAMES:
        spec_flops = kernels.get(name).flops
        for pass_, deterministic in (("forward", True), ("backward", True), ("backward", False)):
            out.update(spec_flops(pass_, BH, N, N, d, False, deterministic))
    return out


def dtype_for(kernel: str, dtype=DTYPE):
    """``dtype``, or where ``kernel`` does not run it the first storage dtype it runs (flash2_tc: float16)."""
    names = kernels.get(kernel).dtypes
    return dtype if np.dtype(dtype).name in names else np.dtype(names[0])


def block_for(kernel: str, d: int, pass_: str, dtype=DTYPE):
    """The (Br, Bc) a call picks by default (None for the standard kernels)."""
    return resolve_block(kernel, d, dtype_for(kernel, dtype), None, pass_)


def model(kernel: str, pass_: str, BH: int, N: int, d: int, dtype=DTYPE, block=None):
    """The IO model's :class:`~flash_numba.hbm.HBMCount` of one pass (default block if None), in ``dtype`` or,
    for a kernel that does not run it, in the first dtype it runs."""
    dtype = dtype_for(kernel, dtype)
    if block is None:
        block = block_for(kernel, d, pass_, dtype)
    fn = iomodel.forward if pass_ == "forward" else iomodel.backward
    return fn(kernel, BH, N, N, d, dtype, False, block)


def differences(counted, modelled) -> str:
    """The launches whose (read, written) bytes differ between two HBMCounts, in words."""

    def pair(hbm, name):
        kb = hbm.per_kernel.get(name)
        return "-" if kb is None else f"{kb.bytes_read:,}/{kb.bytes_written:,}"

    names = dict.fromkeys([*counted.per_kernel, *modelled.per_kernel])
    return "; ".join(f"{n!r} counted {pair(counted, n)}, model {pair(modelled, n)} (read/written)"
                     for n in names if pair(counted, n) != pair(modelled, n))


def flops(names, BH: int, N: int, d: int) -> dict:
    """FLOPs of each launch in ``names`` (counter names, from the kernels' ``KernelSpec.flops``) for N = Nq = Nk,
    non-causal.

    KeyError names a launch that no spec's table has (the tests check that none lacks one).
    """
    every = _all_flops(BH, N, d)
    return {name: every[name] for name in names}


def elementwise(name: str) -> bool:
    """Whether launch ``name`` runs no matrix product: the FLOPs it adds per unit of d grow with N, not N^2."""

    def per_d(N):
        return _all_flops(1, N, 2)[name] - _all_flops(1, N, 1)[name]

    return per_d(8) == 2 * per_d(4)


def random_inputs(BH: int, N: int, d: int, seed: int = 0):
    """q, k, v, dO: device arrays (BH, N, d) of float32 normal numbers."""
    from numba import cuda

    rng = np.random.default_rng(seed)
    return tuple(cuda.to_device(rng.standard_normal((BH, N, d), dtype=np.float32)) for _ in range(4))


def forward(kernel: str, q, k, v, count: bool = False):
    return attention_forward(q, k, v, kernel=kernel, count_hbm=count)


def backward(kernel: str, q, k, v, o, lse, do, count: bool = False, deterministic: bool = True):
    return attention_backward(q, k, v, o, lse, do, kernel=kernel, count_hbm=count, deterministic=deterministic)


def counted(kernel: str, BH: int, N: int, d: int):
    """(forward, backward) HBMCount of the instrumented kernels."""
    q, k, v, do = random_inputs(BH, N, d)
    f = forward(kernel, q, k, v, count=True)
    b = backward(kernel, q, k, v, f.o, f.lse, do, count=True)
    return f.hbm, b.hbm


def warm_up(kernel: str, d: int) -> None:
    """Compile the kernels of both passes (a tiny call), so later wall times are run times."""
    q, k, v, do = random_inputs(1, 64, d)
    f = forward(kernel, q, k, v)
    backward(kernel, q, k, v, f.o, f.lse, do)
    device.synchronize()


def run_pass(kernel: str, pass_: str, arrays: dict, counters):
    """One pass of ``kernel`` through its module, with ``counters`` of our choosing.

    ``arrays``: q, k, v (and o, lse, do for the backward) as device arrays.
    """
    from .. import _inputs

    mod = kernels.get(kernel)
    extra = {n: arrays[n] for n in ("o", "lse", "do")} if pass_ == "backward" else None
    prob, ops = _inputs.prepare({n: arrays[n] for n in ("q", "k", "v")}, causal=False, scale=None, extra=extra)
    block = block_for(kernel, prob.d, pass_)
    if pass_ == "forward":
        return mod.forward(prob, ops, block, counters)
    return mod.backward(prob, ops, block, counters)


def device_label(model_only: bool = False) -> str:
    """What the tools name as the device: the GPU's name and sm_XY, or the simulator."""
    if device.SIMULATOR:
        return "Numba CUDA simulator (no GPU)"
    d = device.info()
    name = f"{d.name} (sm_{d.compute_capability[0]}{d.compute_capability[1]})"
    return f"{name}, IO model only (nothing run)" if model_only else name
