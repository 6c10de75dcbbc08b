"""One pass of a kernel, as the tools run it: random device inputs, counted and modelled HBM bytes, FLOPs.

:func:`counted` runs a kernel's forward and backward with ``count_hbm=True``;
:func:`model` asks the IO model (:mod:`flash_numba.iomodel`) for the same
passes without running anything.  :data:`FLOPS` gives the arithmetic of each
kernel launch, by the name under which it counts its bytes.  Everything here
is float32, non-causal, ``N = Nq = Nk``, the default block unless one is given.
"""

from __future__ import annotations

import numpy as np

from .. import device, iomodel, kernels
from ..api import attention_backward, attention_forward, resolve_block

DTYPE = np.dtype(np.float32)

#: FLOPs of each kernel launch, by its counter name: ``(a, b, c)`` means
#: ``a*d + b`` FLOPs per score (query row x key) and ``c*d`` per query row.
#: ``a`` is 2 per multiply-add of the matrix products over d; ``b`` counts the
#: elementwise operations on a score (scale, max, subtract, exp, add, multiply:
#: one each).  Terms of lower order (a rescale of O per block, flash1's D_i
#: recomputed per key block) are left out.  Non-causal attention.
FLOPS = {
    # standard forward
    "S = scale*Q@K^T": (2, 5, 0),  # Q K^T; scale, online max, subtract, exp, add (L = m + log l)
    "P = softmax(S)": (0, 3, 0),  # subtract m, exp, multiply by 1/l
    "O = P@V": (2, 0, 0),
    # standard backward
    "P, dS = P*(dP-D)": (4, 5, 0),  # Q K^T, dO V^T; scale, subtract, exp, subtract, multiply
    "dV = P^T@dO": (2, 0, 0),
    "dQ = scale*dS@K": (2, 0, 0),
    "dK = scale*dS^T@Q": (2, 0, 0),
    # flash1
    "init O, l, m": (0, 0, 0),
    "Algorithm 1": (4, 5, 0),  # Q K^T, P V; scale, max, subtract, exp, add
    "init dQ": (0, 0, 0),
    "Algorithm 4": (10, 5, 0),  # Q K^T, dV, dP, dQ, dK; scale, subtract, exp, subtract, multiply
    # flash2, flash2_fast
    "flash2 forward": (4, 5, 0),
    "flash2_fast forward": (4, 5, 0),
    "D = rowsum(dO*O)": (0, 0, 2),
    "dK, dV": (8, 5, 0),  # Q K^T, dV, dP, dK
    "dQ": (6, 5, 0),  # Q K^T again, dP again, dQ
    "flash2_fast dK, dV": (8, 5, 0),  # flash2's backward, register-tiled
    "flash2_fast dQ": (6, 5, 0),
    "flash2_fast zero dQ copies": (0, 0, 0),  # the split (deterministic) backward
    "flash2_fast dK, dV, dQ (split)": (10, 5, 0),  # Q K^T, dV, dP, dK, dQ
    "flash2_fast sum dQ copies": (0, 0, 0),  # (copies - 1) d adds per query row: lower order
}


def block_for(kernel: str, d: int, pass_: str):
    """The (Br, Bc) a call picks by default (None for the standard kernels)."""
    return resolve_block(kernel, d, DTYPE, None, pass_)


def model(kernel: str, pass_: str, BH: int, N: int, d: int, dtype=DTYPE, block=None):
    """The IO model's :class:`~flash_numba.hbm.HBMCount` of one pass (default block if None)."""
    if block is None:
        block = block_for(kernel, d, pass_)
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
    """FLOPs of each launch in ``names`` (counter names, see :data:`FLOPS`) for N = Nq = Nk.

    KeyError names a launch that :data:`FLOPS` lacks (the tests check that none does).
    """
    out = {}
    for name in names:
        a, b, c = FLOPS[name]
        out[name] = BH * (N * N * (a * d + b) + c * N * d)
    return out


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
