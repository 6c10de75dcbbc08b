"""What the bench runs: the sweep's sizes and tolerances, the configurations, the inputs and the implementations.

An implementation (:class:`Impl`) is one of our kernels called through the
public API, a :data:`VARIANTS` entry (a kernel with a backward option), or
PyTorch's ``scaled_dot_product_attention`` pinned to one backend.  Its inputs
are ``(B, H, N, d)`` device arrays, torch tensors when PyTorch is present
(our kernels take them zero-copy through ``__cuda_array_interface__``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .. import kernels
from ..api import attention_backward, attention_forward
from ..device import SIMULATOR

PASSES = ("fwd", "fwd+bwd")
DTYPES = ("float16", "bfloat16", "float32", "float64")  # bfloat16: PyTorch tensors only (Numba has no such dtype)

#: The default sweep on a GPU, the --quick one, and the tiny one of the simulator.
DEFAULT_N, QUICK_N, SIMULATOR_N = (1024, 2048, 4096, 8192), (1024, 2048), (8, 16)
DEFAULT_D, SIMULATOR_D = 64, 8
DEFAULT_BH, SIMULATOR_BH = 32, 1
DEFAULT_REPEATS, QUICK_REPEATS = 10, 5
WARMUP = 3

#: Largest ``max |x - ref| / max |ref|`` accepted, per storage dtype, for every output.
#: bfloat16 keeps 8 significant bits to float16's 11: its bound is float16's times 2^3 (0.16, 41 of its unit roundoffs,
#: as float16's 2e-2 is 41 of float16's).
TOLERANCE = {"float16": 2e-2, "bfloat16": 0.16, "float32": 1e-4, "float64": 1e-10}

#: The small validation problem (B, H, N): awkward N on a GPU, tiny in the simulator.
SMALL_PROBLEM = (1, 1, 9) if SIMULATOR else (1, 2, 97)
#: Largest N whose heads the float64 reference checks at the benchmark size.
REFERENCE_MAX_N = 8192

#: A ``count_hbm=True`` run at the benchmark size is made up to this many
#: (batch, head, query, key) entries, B*H*N^2; above it the IO model gives the
#: bytes (per-thread atomics make counted N x N kernels slow, and the simulator slower).
COUNT_LIMIT = 1024 if SIMULATOR else 2**28

#: Input sets rotated through while timing: together at least L2_MULTIPLE x L2, within these bounds.
MIN_SETS, MAX_SETS, L2_MULTIPLE = 2, 8, 3

#: PyTorch SDPA backends, by our name: the SDPBackend member.
TORCH_BACKENDS = {
    "torch-math": "MATH",
    "torch-efficient": "EFFICIENT_ATTENTION",
    "torch-flash": "FLASH_ATTENTION",
    "torch-cudnn": "CUDNN_ATTENTION",
}

#: N x N buffers of one (batch, head) an implementation allocates in a call, by pass
#: (the rest is O(N d)).  standard: S and P; its backward adds S, P, dP, dS while the
#: forward's are still held if Numba allocated them (it frees lazily; PyTorch's
#: allocator, used on torch tensors, has them back already).  torch-math: an estimate.
NXN_BUFFERS = {"standard": {"fwd": 2, "fwd+bwd": 6}, "torch-math": {"fwd": 2, "fwd+bwd": 5}}


# ---------------------------------------------------------------------------- what is run


@dataclass(frozen=True)
class Config:
    """One benchmark configuration: q, k, v of shape (B, H, N, d), dtype, mask and pass."""

    B: int
    H: int
    N: int
    d: int
    dtype: str
    causal: bool
    pass_: str  # "fwd" or "fwd+bwd"

    @property
    def BH(self) -> int:
        return self.B * self.H

    @property
    def flops(self) -> float:
        return attention_flops(self.BH, self.N, self.d, self.causal, self.pass_)

    def describe(self) -> str:
        mask = "causal" if self.causal else "no mask"
        shape = f"B*H = {self.BH} (B={self.B}, H={self.H}), N = {self.N}, d = {self.d}"
        return f"{shape}, {self.dtype}, {mask}, {self.pass_}"


def attention_flops(BH: int, N: int, d: int, causal: bool, pass_: str) -> float:
    """FLOPs of one call, FlashAttention-2's convention.

    Forward ``4 BH N^2 d``; backward 2.5x the forward; halved when causal.
    """
    fwd = 4.0 * BH * N * N * d
    total = fwd * 3.5 if pass_ == "fwd+bwd" else fwd
    return total / 2 if causal else total


def split_bh(bh: int) -> tuple[int, int]:
    """``(B, H)`` with ``B * H = bh`` and H = gcd(bh, 8): 32 -> (4, 8), 2 -> (1, 2)."""
    H = math.gcd(bh, 8)
    return bh // H, H


def torch_backends(dtype: str) -> tuple[str, ...]:
    """The PyTorch backends benchmarked for a storage dtype.

    MATH runs every dtype; EFFICIENT_ATTENTION float16 and float32;
    FLASH_ATTENTION and CUDNN_ATTENTION only float16 (and bfloat16).
    """
    if dtype == "float64":
        return ("torch-math",)
    if dtype == "float32":
        return ("torch-math", "torch-efficient")
    return tuple(TORCH_BACKENDS)


def workspace_bytes(name: str, cfg: Config) -> int:
    """Bytes of the N x N buffers ``name`` allocates for ``cfg`` (0 for the flash kernels)."""
    per_head = NXN_BUFFERS.get(name, {}).get(cfg.pass_, 0)
    return per_head * cfg.BH * cfg.N * cfg.N * itemsize(cfg.dtype)


def itemsize(dtype: str) -> int:
    """Bytes of one element of a storage dtype named ``dtype`` (NumPy has no bfloat16)."""
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def backward_runs(name: str, dtype: str) -> bool:
    """Whether implementation ``name`` has a backward in ``dtype`` (standard's bfloat16 runs forward only)."""
    kernel = kernel_of(name)[0]
    if kernel not in kernels.NAMES:  # PyTorch's backends (and stand-ins): every dtype they take
        return True
    return kernels.get(kernel).has("backward", dtype)


# ---------------------------------------------------------------------------- inputs


@dataclass
class Inputs:
    """q, k, v and the output gradient do, ``(B, H, N, d)`` device arrays (torch or Numba)."""

    q: object
    k: object
    v: object
    do: object
    _leaves: tuple | None = field(default=None, repr=False)

    def leaves(self) -> tuple:
        """q, k, v as torch leaf tensors that require grad (views of the same memory)."""
        if self._leaves is None:
            self._leaves = tuple(x.detach().requires_grad_() for x in (self.q, self.k, self.v))
        return self._leaves


def host_inputs(shape, dtype: str, seed: int) -> dict:
    """Random q, k, v, do as NumPy arrays; the same seed gives the same arrays.  bfloat16: float32 arrays that
    hold bfloat16 values (rounded to nearest, ties to even), so that the reference sees the inputs the kernels do."""
    rng = np.random.default_rng(seed)
    if dtype == "bfloat16":
        return {name: round_to_bfloat16(rng.standard_normal(shape, dtype=np.float32)) for name in ("q", "k", "v", "do")}
    return {name: rng.standard_normal(shape, dtype=np.float32).astype(dtype) for name in ("q", "k", "v", "do")}


def round_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 ``x`` rounded to bfloat16's 8 significant bits (nearest, ties to even), still as float32."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32)


def to_device(host: dict, torch=None, dtype: str | None = None) -> Inputs:
    """Copy host arrays to the GPU (as torch tensors when ``torch`` is given; ``dtype="bfloat16"``: converted to
    torch.bfloat16 there, exactly, from the float32 arrays of :func:`host_inputs`)."""
    if dtype == "bfloat16":
        if torch is None:
            raise ValueError("dtype: bfloat16 inputs are PyTorch tensors (Numba has no bfloat16 arrays); "
                             "install PyTorch with CUDA")
        return Inputs(**{n: torch.from_numpy(x).to("cuda").to(torch.bfloat16) for n, x in host.items()})
    if torch is not None:
        return Inputs(**{n: torch.from_numpy(x).to("cuda") for n, x in host.items()})
    from numba import cuda

    return Inputs(**{n: cuda.to_device(x) for n, x in host.items()})


def to_host(x) -> np.ndarray:
    """A Numba device array, torch tensor or NumPy array as a NumPy array."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "copy_to_host"):
        return x.copy_to_host()
    x = x.detach()
    if str(x.dtype) == "torch.bfloat16":  # NumPy has no bfloat16: as float32, exactly
        x = x.float()
    return x.cpu().numpy()


def input_sets(cfg: Config, torch=None) -> list[Inputs]:
    """Input sets to rotate through while timing; set i comes from seed i.

    At least :data:`MIN_SETS`, and enough that together they are
    :data:`L2_MULTIPLE` times the L2 cache; one in the simulator.
    """
    from .microbench import l2_cache_bytes

    shape = (cfg.B, cfg.H, cfg.N, cfg.d)
    l2 = l2_cache_bytes()
    if l2 is None:
        n = 1
    else:
        set_bytes = 4 * cfg.BH * cfg.N * cfg.d * itemsize(cfg.dtype)
        n = min(MAX_SETS, max(MIN_SETS, math.ceil(L2_MULTIPLE * l2 / set_bytes)))
    return [to_device(host_inputs(shape, cfg.dtype, seed), torch, cfg.dtype) for seed in range(n)]


# ---------------------------------------------------------------------------- implementations


@dataclass(frozen=True)
class Impl:
    """A named implementation: ``call(inputs, cfg, count_hbm)`` -> ``(outputs, HBMCount or None)``.

    ``outputs`` maps o (and lse, dq, dk, dv) to device arrays of the inputs' shape.
    """

    name: str
    call: Callable
    is_torch: bool = False


#: Implementations that are one of our kernels called with an option: name -> (kernel, backward options).
VARIANTS = {"flash2_fast-atomic": ("flash2_fast", {"deterministic": False}),
            "flash2_tc-atomic": ("flash2_tc", {"deterministic": False})}


def kernel_of(name: str) -> tuple[str, dict]:
    """The kernel module and backward options behind an implementation name."""
    return VARIANTS.get(name, (name, {}))


def flash_numba_impl(name: str) -> Impl:
    """One of our kernel modules (or a :data:`VARIANTS` entry), called through the public API."""
    kernel, bwd_options = kernel_of(name)

    def call(inp: Inputs, cfg: Config, count_hbm: bool = False):
        q, k, v, do = inp.q, inp.k, inp.v, inp.do
        fwd = attention_forward(q, k, v, kernel=kernel, causal=cfg.causal, count_hbm=count_hbm)
        out, hbm = {"o": fwd.o, "lse": fwd.lse}, fwd.hbm
        if cfg.pass_ == "fwd+bwd":
            bwd = attention_backward(q, k, v, fwd.o, fwd.lse, do, kernel=kernel, causal=cfg.causal,
                                     count_hbm=count_hbm, **bwd_options)
            out.update(dq=bwd.dq, dk=bwd.dk, dv=bwd.dv)
            hbm = hbm + bwd.hbm if count_hbm else None
        return out, hbm

    return Impl(name, call)


def torch_impl(name: str, torch) -> Impl:
    """PyTorch's scaled_dot_product_attention restricted to one backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdpa = torch.nn.functional.scaled_dot_product_attention
    backend = getattr(SDPBackend, TORCH_BACKENDS[name])

    def call(inp: Inputs, cfg: Config, count_hbm: bool = False):
        with sdpa_kernel(backend):
            if cfg.pass_ == "fwd":
                with torch.no_grad():
                    return {"o": sdpa(inp.q, inp.k, inp.v, is_causal=cfg.causal)}, None
            q, k, v = inp.leaves()
            o = sdpa(q, k, v, is_causal=cfg.causal)
            dq, dk, dv = torch.autograd.grad(o, (q, k, v), inp.do)
        return {"o": o.detach(), "dq": dq, "dk": dk, "dv": dv}, None

    return Impl(name, call, is_torch=True)


def implementation_names(dtype: str, torch=None) -> list[str]:
    """Every implementation that can run here: our kernels, then the PyTorch backends
    for ``dtype`` that this PyTorch has (none without ``torch``)."""
    # our kernels and their variants that run the dtype
    names = [n for n in [*kernels.NAMES, *VARIANTS] if dtype in kernels.get(kernel_of(n)[0]).dtypes]
    if torch is not None:
        from torch.nn.attention import SDPBackend

        names += [n for n in torch_backends(dtype) if hasattr(SDPBackend, TORCH_BACKENDS[n])]
    return names


