"""The benchmark harness: ``flash-numba bench`` (also ``python benchmarks/bench.py``).

It works in three steps, in the manner of llm.c's ``dev/cuda`` benchmarks:

1. **Validate.**  Every implementation runs on a small problem and is compared
   with the float64 reference (:mod:`flash_numba.reference`): O and L, and dQ,
   dK, dV when the backward is benchmarked.  On a GPU it then runs once at each
   benchmark size, where two heads (the first and the last) are compared with
   the reference (up to N = 8192).  Any error above :data:`TOLERANCE` prints a
   ``MISMATCH`` line and the run stops with exit status 1; otherwise it prints
   "All results match. Starting benchmarks."
2. **Time.**  CUDA events around each call: warm-up calls, then the median of
   ``--repeats`` calls.  The calls rotate among several input sets, together at
   least 3x the L2 cache, so that no call finds its inputs in L2.
3. **Report.**  A fixed-width table per configuration (N, d, causal, pass):
   time, TFLOP/s, the fraction of the fp32 peak (:func:`flash_numba.microbench.fp32_peak`,
   once per run, or ``--peak``), the HBM bytes the kernels' code moves and the
   device memory the call allocates; ``--csv`` and ``--plot`` save them.

Implementations: every kernel module in :data:`flash_numba.kernels.NAMES`, the
:data:`VARIANTS` (``flash2_fast-atomic``: flash2_fast's backward with
``deterministic=False``, dQ by atomics), and,
when PyTorch is importable and a GPU is present, PyTorch's
``scaled_dot_product_attention`` pinned to one backend with
``torch.nn.attention.sdpa_kernel`` (:func:`torch_backends`).  The inputs are
``(B, H, N, d)`` tensors; with PyTorch present they are torch tensors, which our
kernels use zero-copy through ``__cuda_array_interface__``.

FLOPs follow the FlashAttention-2 paper: the forward does ``4 N^2 d`` per head
(two matrix products), the backward 2.5 times that (``10 N^2 d``, recompute of S
included), and a causal mask halves both (Nq = Nk here), as if the masked half
were skipped.

In the simulator nothing is timed: validation runs on a tiny problem, and the
tables show "n/a (simulator)" for times, with HBM bytes from a counted run.  This
module imports neither PyTorch nor matplotlib until it needs them.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import itertools
import math
import shlex
import statistics
import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import device, iomodel, kernels, reference
from .api import (
    attention_backward,
    attention_forward,
)
from .device import SIMULATOR, CudaTimer

PASSES = ("fwd", "fwd+bwd")
DTYPES = ("float16", "float32", "float64")

#: The default sweep on a GPU, the --quick one, and the tiny one of the simulator.
DEFAULT_N, QUICK_N, SIMULATOR_N = (1024, 2048, 4096, 8192), (1024, 2048), (8, 16)
DEFAULT_D, SIMULATOR_D = 64, 8
DEFAULT_BH, SIMULATOR_BH = 32, 1
DEFAULT_REPEATS, QUICK_REPEATS = 10, 5
WARMUP = 3

#: Largest ``max |x - ref| / max |ref|`` accepted, per storage dtype, for every output.
TOLERANCE = {"float16": 2e-2, "float32": 1e-4, "float64": 1e-10}

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
    return per_head * cfg.BH * cfg.N * cfg.N * np.dtype(cfg.dtype).itemsize


def _torch():
    """The torch module when it is importable and a GPU runs our kernels, else None."""
    if SIMULATOR:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


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
    """Random q, k, v, do as NumPy arrays; the same seed gives the same arrays."""
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape, dtype=np.float32).astype(dtype) for name in ("q", "k", "v", "do")}


def to_device(host: dict, torch=None) -> Inputs:
    """Copy host arrays to the GPU (as torch tensors when ``torch`` is given)."""
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
    return x.detach().cpu().numpy()


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
        set_bytes = 4 * cfg.BH * cfg.N * cfg.d * np.dtype(cfg.dtype).itemsize
        n = min(MAX_SETS, max(MIN_SETS, math.ceil(L2_MULTIPLE * l2 / set_bytes)))
    return [to_device(host_inputs(shape, cfg.dtype, seed), torch) for seed in range(n)]


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
VARIANTS = {"flash2_fast-atomic": ("flash2_fast", {"deterministic": False})}


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
    names = list(kernels.NAMES) + list(VARIANTS)
    if torch is not None:
        from torch.nn.attention import SDPBackend

        names += [n for n in torch_backends(dtype) if hasattr(SDPBackend, TORCH_BACKENDS[n])]
    return names


# ---------------------------------------------------------------------------- validation


def max_rel_error(x, ref) -> float:
    """``max |x - ref| / max |ref|``; infinite entries of ``ref`` must be matched exactly."""
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if x.shape != ref.shape:
        return math.inf
    finite = np.isfinite(ref)
    if not np.array_equal(x[~finite], ref[~finite]):
        return math.inf
    if not finite.any():
        return 0.0
    scale = max(float(np.abs(ref[finite]).max()), np.finfo(np.float64).tiny)
    err = float(np.abs(x[finite] - ref[finite]).max()) / scale
    return math.inf if math.isnan(err) else err


def reference_outputs(host: dict, causal: bool, pass_: str) -> dict:
    """The float64 reference's o, lse (and dq, dk, dv for fwd+bwd) for host arrays."""
    q, k, v, do = (host[n] for n in ("q", "k", "v", "do"))
    o, lse = reference.attention_forward(q, k, v, causal=causal)
    out = {"o": o, "lse": lse}
    if pass_ == "fwd+bwd":
        out["dq"], out["dk"], out["dv"] = reference.attention_backward(q, k, v, o, lse, do, causal=causal)
    return out


def compare(name: str, where: str, outs: dict, ref: dict, tol: float, heads=None) -> list[str]:
    """MISMATCH lines for the outputs of ``name`` that differ from ``ref`` by more than ``tol``.

    ``heads`` = ``(b_index, h_index)`` restricts the comparison to those heads
    (``ref`` then holds only them).  An output an implementation does not give
    (PyTorch has no lse) is not compared.
    """
    lines = []
    for key, want in ref.items():
        if key not in outs:
            continue
        got = to_host(outs[key])
        if heads is not None:
            got = got[heads]
        err = max_rel_error(got, want)
        if not err <= tol:
            lines.append(f"MISMATCH {name} {where}: {key} max relative error {err:.2e} > {tol:g}")
    return lines


def _progress(step: int, total: int, text: str, tag: str = "") -> None:
    print(f"[{tag}{step}/{total}] {text}", file=sys.stderr, flush=True)


def _is_oom(exc: Exception) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or "out of memory" in text or "out_of_memory" in text


def no_room(name: str, cfg: Config, torch=None) -> str | None:
    """Why ``name``'s N x N buffers for ``cfg`` do not fit in free device memory, or None.

    Always None in the simulator, which has no device memory to run out of.
    """
    if SIMULATOR:
        return None
    from numba import cuda

    if torch is not None:
        torch.cuda.empty_cache()  # PyTorch's cached blocks count as free for everyone
    free_pending()
    need, free = workspace_bytes(name, cfg), cuda.current_context().get_memory_info().free
    if need > 0.9 * free:
        return f"its N x N buffers need {_fmt_bytes(need)}, {_fmt_bytes(free)} free"
    return None


def _unavailable(exc: Exception) -> bool:
    """True for PyTorch's refusal to run a backend on this GPU or problem."""
    return isinstance(exc, RuntimeError) and "no available kernel" in str(exc).lower()


def validate(impls: list[Impl], cfgs: list[Config], torch=None) -> tuple[list[str], list[str]]:
    """Check every implementation against the float64 reference before anything is timed.

    Per (d, causal) the small problem, then (on a GPU) every benchmark size;
    only the fuller pass of those benchmarked is checked (fwd+bwd covers fwd).
    Returns ``(mismatch lines, notes)``; a PyTorch backend that refuses to run
    here is removed from ``impls`` with a note.
    """
    passes = {cfg.pass_ for cfg in cfgs}
    pass_ = "fwd+bwd" if "fwd+bwd" in passes else "fwd"
    checks = []  # (cfg, heads); heads None = compare all of them
    B, H, N = SMALL_PROBLEM
    for d, dtype, causal in dict.fromkeys((c.d, c.dtype, c.causal) for c in cfgs):
        checks.append((Config(B, H, N, d, dtype, causal, pass_), None))
    if not SIMULATOR:
        for c in dict.fromkeys(Config(c.B, c.H, c.N, c.d, c.dtype, c.causal, pass_) for c in cfgs):
            if c.N <= REFERENCE_MAX_N:
                checks.append((c, ([0, c.B - 1], [0, c.H - 1])))

    mismatches, notes = [], []
    step, total = 0, len(checks) * len(impls)
    for cfg, heads in checks:
        host = host_inputs((cfg.B, cfg.H, cfg.N, cfg.d), cfg.dtype, seed=0)
        inputs = to_device(host, torch)
        ref = reference_outputs({n: x if heads is None else x[heads] for n, x in host.items()}, cfg.causal, cfg.pass_)
        for impl in list(impls):
            step += 1
            _progress(step, total, f"{impl.name} {cfg.describe()}", "validate ")
            reason = None if heads is None else no_room(impl.name, cfg, torch)
            if reason is None:
                try:
                    outs, _ = impl.call(inputs, cfg)
                except Exception as exc:
                    if impl.is_torch and _unavailable(exc):
                        impls.remove(impl)
                        notes.append(f"{impl.name}: not available here ({str(exc).splitlines()[0]})")
                        continue
                    if heads is None or not _is_oom(exc):
                        raise
                    reason = "out of memory"
            if reason is not None:
                notes.append(f"{impl.name}: not checked at N = {cfg.N}: {reason}")
                continue
            where = f"(B, H, N, d) = {(cfg.B, cfg.H, cfg.N, cfg.d)} {'causal' if cfg.causal else 'no mask'}"
            mismatches += compare(impl.name, where, outs, ref, TOLERANCE[cfg.dtype], heads)
    return mismatches, notes


# ---------------------------------------------------------------------------- measuring


@dataclass
class Row:
    """The result of one implementation on one configuration."""

    impl: str
    cfg: Config
    ms: float | None = None
    hbm_bytes: int | None = None
    hbm_source: str = "n/a"  # "counted", "model" or "n/a"
    mem_bytes: int | None = None
    status: str = "ok"  # or why it was not measured

    @property
    def tflops(self) -> float | None:
        return None if self.ms is None else self.cfg.flops / (self.ms * 1e-3) / 1e12


def hbm_bytes(impl: Impl, inp: Inputs, cfg: Config) -> tuple[int | None, str]:
    """``(bytes, source)``: a counted run, or the IO model above :data:`COUNT_LIMIT`.

    A kernel without an IO model is counted anyway on a GPU; PyTorch is not counted.
    """
    if impl.is_torch:
        return None, "n/a"
    if cfg.BH * cfg.N * cfg.N > COUNT_LIMIT:
        try:
            kernel, options = kernel_of(impl.name)
            model = iomodel.forward(kernel, cfg.BH, cfg.N, cfg.N, cfg.d, cfg.dtype, cfg.causal)
            if cfg.pass_ == "fwd+bwd":
                model = model + iomodel.backward(kernel, cfg.BH, cfg.N, cfg.N, cfg.d, cfg.dtype, cfg.causal,
                                                 **options)
            return model.total, "model"
        except ModuleNotFoundError:
            if SIMULATOR:
                return None, "n/a"
    _, counted = impl.call(inp, cfg, True)
    return counted.total, "counted"


def free_pending() -> None:
    """Free now the device memory of arrays already dropped, which Numba frees lazily; then synchronise."""
    from numba import cuda

    ctx = cuda.current_context()
    ctx.deallocations.clear()  # streams, events, modules
    memory = getattr(ctx.memory_manager, "deallocations", None)  # device memory, with Numba's own manager
    if memory is not None:
        memory.clear()
    cuda.synchronize()


def allocated_bytes(impl: Impl, inp: Inputs, cfg: Config, torch=None) -> int:
    """Device memory one call allocates beyond its inputs: outputs and workspace (GPU only).

    Numba's allocations: the bytes Numba's memory manager holds for this
    process after the call minus before it (:func:`device.numba_device_bytes`),
    with Numba's frees deferred, so every buffer the call allocated is still
    counted, and other processes on the GPU change nothing.  PyTorch's (its
    own calls, and ours on torch tensors, whose buffers come from PyTorch's
    caching allocator): the peak of ``torch.cuda.max_memory_allocated`` over
    the call.  With a memory manager that keeps no table, the difference of
    the GPU's free memory stands in (valid only with the GPU to ourselves).
    """
    from numba import cuda

    from flash_numba import device

    free_pending()  # what earlier calls left behind
    ctx = cuda.current_context()
    if torch is not None:
        torch.cuda.reset_peak_memory_stats()
        base, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    held_before, free_before = device.numba_device_bytes(), ctx.get_memory_info().free
    with cuda.defer_cleanup():
        impl.call(inp, cfg)
        cuda.synchronize()
        held_after, free_after = device.numba_device_bytes(), ctx.get_memory_info().free
    if held_before is not None and held_after is not None:
        by_numba = held_after - held_before
    else:
        by_numba = free_before - free_after
        if torch is not None:
            by_numba -= torch.cuda.memory_reserved() - reserved
    if torch is None:
        return by_numba
    return torch.cuda.max_memory_allocated() - base + by_numba


def time_calls(impl: Impl, sets: list[Inputs], cfg: Config, repeats: int) -> list[float]:
    """Milliseconds of ``repeats`` calls (after :data:`WARMUP`), each on the next input set (GPU only).

    Numba frees device memory lazily, and a free (cuMemFree) waits for the GPU;
    the buffers of earlier calls are freed between the timed calls, never in one.
    """
    from numba import cuda

    for i in range(WARMUP):
        impl.call(sets[i % len(sets)], cfg)
    times = []
    for r in range(repeats):
        inp = sets[(WARMUP + r) % len(sets)]
        free_pending()
        start, stop = cuda.event(), cuda.event()  # timing events (the default)
        with cuda.defer_cleanup():
            start.record()
            impl.call(inp, cfg)
            stop.record()
            stop.synchronize()
        times.append(start.elapsed_time(stop))
    return times


def measure(impl: Impl, sets: list[Inputs], cfg: Config, repeats: int, torch=None) -> Row:
    """HBM bytes, allocated memory and median time of ``impl`` on ``cfg`` (no times in the simulator)."""
    row = Row(impl.name, cfg)
    reason = no_room(impl.name, cfg, torch)
    if reason is not None:
        row.status = f"skipped: {reason}"
        return row
    try:
        row.hbm_bytes, row.hbm_source = hbm_bytes(impl, sets[0], cfg)
        if not SIMULATOR:
            row.mem_bytes = allocated_bytes(impl, sets[0], cfg, torch)
            row.ms = statistics.median(time_calls(impl, sets, cfg, repeats))
    except Exception as exc:
        if _is_oom(exc):
            row.status = "out of memory"
        elif impl.is_torch and _unavailable(exc):
            row.status = f"not available: {str(exc).splitlines()[0]}"
        else:
            raise
    return row


# ---------------------------------------------------------------------------- reporting


def _fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


COLUMNS = (
    ("implementation", 19),
    ("N", 6),
    ("d", 4),
    ("causal", 6),
    ("pass", 7),
    ("ms", 15),
    ("TFLOP/s", 8),
    ("% fp32 peak", 11),
    ("HBM bytes", 10),
    ("HBM by", 7),
    ("peak mem", 9),
)


def _cells(row: Row, peak_tflops: float | None) -> list[str]:
    cfg = row.cfg
    if row.ms is not None:
        ms, tflops = f"{row.ms:.3f}", f"{row.tflops:.2f}"
        frac = f"{100 * row.tflops / peak_tflops:.1f}%" if peak_tflops else "-"
    else:
        ms = "n/a (simulator)" if SIMULATOR and row.status == "ok" else "-"
        tflops = frac = "-"
    hbm_by = {"counted": "count", "model": "model"}.get(row.hbm_source, "-")
    return [
        row.impl,
        str(cfg.N),
        str(cfg.d),
        str(cfg.causal),
        cfg.pass_,
        ms,
        tflops,
        frac,
        _fmt_bytes(row.hbm_bytes),
        hbm_by,
        _fmt_bytes(row.mem_bytes),
    ]


def format_table(rows: list[Row], peak_tflops: float | None) -> str:
    """The fixed-width table of one configuration's rows, under a heading naming it."""
    line = "  ".join(f"{name:<{w}}" if i == 0 else f"{name:>{w}}" for i, (name, w) in enumerate(COLUMNS))
    out = [rows[0].cfg.describe() + ":", line, "-" * len(line)]
    for row in rows:
        cells = _cells(row, peak_tflops)
        text = "  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, (_, w)) in enumerate(zip(cells, COLUMNS)))
        out.append(text + ("" if row.status == "ok" else f"  {row.status}"))
    return "\n".join(out)


def footnotes(repeats: int, peak_line: str) -> list[str]:
    """What each column means, printed under the tables and written into the CSV header."""
    if SIMULATOR:
        timing = "ms: n/a (simulator): " + CudaTimer.note + "."
    else:
        timing = (
            f"ms: median of {repeats} calls timed with CUDA events after {WARMUP} warm-up calls, rotating among "
            f"{MIN_SETS}-{MAX_SETS} input sets (together >= {L2_MULTIPLE}x the L2 cache); one of our calls is one "
            "public-API call on device arrays, output allocation included."
        )
    return [
        "FLOPs: FlashAttention-2's convention: forward 4 N^2 d per head, backward 2.5x the forward "
        "(10 N^2 d, recompute included), fwd+bwd 14 N^2 d; halved when causal (Nq = Nk), "
        "as if the masked half were skipped.",
        timing,
        f"% fp32 peak: TFLOP/s over the fp32 peak, {peak_line}.",
        "HBM bytes: bytes the kernels' code reads + writes in global memory, from a count_hbm=True run at this "
        "size (count) or flash_numba.iomodel (model); not counted for PyTorch.",
        "peak mem: device memory one call allocates beyond its inputs (outputs and workspace): Numba's allocations "
        "from Numba's memory manager before and after the call (this process only), PyTorch's (its own calls, "
        "and ours on torch tensors) from torch.cuda.max_memory_allocated.",
    ]


CSV_FIELDS = (
    "implementation", "B", "H", "N", "d", "dtype", "causal", "pass", "ms", "tflops", "peak_fraction",
    "flops", "hbm_bytes", "hbm_source", "peak_mem_bytes", "status",
)  # fmt: skip


def write_csv(path: str, rows: list[Row], header: list[str], peak_tflops: float | None) -> None:
    """Rows as CSV under ``# `` comment lines (device, date, command line, conventions)."""

    def blank(x):
        return "" if x is None else x

    with open(path, "w", newline="") as f:
        for line in header:
            f.write(f"# {line}\n")
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in rows:
            c = r.cfg
            frac = r.tflops / peak_tflops if r.tflops is not None and peak_tflops else None
            w.writerow(
                [r.impl, c.B, c.H, c.N, c.d, c.dtype, c.causal, c.pass_, blank(r.ms), blank(r.tflops), blank(frac),
                 int(c.flops), blank(r.hbm_bytes), r.hbm_source, blank(r.mem_bytes), r.status]
            )  # fmt: skip


def read_csv(path: str) -> tuple[list[str], list[dict]]:
    """``(header comment lines, rows as dicts of strings)`` of a file from :func:`write_csv`."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    header = [line[2:] for line in lines if line.startswith("# ")]
    body = [line for line in lines if not line.startswith("#")]
    return header, list(csv.DictReader(body))


def plot(rows: list[Row], path: str, title: str) -> bool:
    """Time and TFLOP/s against N, log-log, one line per implementation, one column per
    (d, dtype, mask, pass); saved to ``path``.  False (and nothing written) without times."""
    timed = [r for r in rows if r.ms is not None]
    if not timed:
        return False
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    all_N = sorted({r.cfg.N for r in timed})
    panels = list(dict.fromkeys((r.cfg.d, r.cfg.dtype, r.cfg.causal, r.cfg.pass_) for r in timed))
    names = list(dict.fromkeys(r.impl for r in timed))
    fig = Figure(figsize=(4.5 * len(panels), 7.5), layout="constrained")
    axes = fig.subplots(2, len(panels), squeeze=False)
    for col, (d, dtype, causal, pass_) in enumerate(panels):
        top, bottom = axes[0][col], axes[1][col]
        for name in names:
            pts = sorted(
                (r.cfg.N, r.ms, r.tflops)
                for r in timed
                if r.impl == name and (r.cfg.d, r.cfg.dtype, r.cfg.causal, r.cfg.pass_) == (d, dtype, causal, pass_)
            )
            if pts:
                Ns, ms, tf = zip(*pts)
                top.plot(Ns, ms, marker="o", label=name)
                bottom.plot(Ns, tf, marker="o", label=name)
        top.set_title(f"d={d}, {dtype}, {'causal' if causal else 'no mask'}, {pass_}")
        top.set_ylabel("time per call (ms)")
        bottom.set_ylabel("TFLOP/s")
        bottom.set_xlabel("sequence length N")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(all_N, [str(n) for n in all_N])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize="small")
    fig.suptitle(title)
    fig.savefig(path, dpi=120)
    return True


# ---------------------------------------------------------------------------- command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``flash-numba bench``."""
    p.add_argument("--n", type=int, nargs="+", help="sequence lengths N (default 1024 2048 4096 8192)")
    p.add_argument("--d", type=int, nargs="+", help=f"head dims (default {DEFAULT_D})")
    p.add_argument("--bh", type=int, help=f"B*H, split as (B, H) with H = gcd(B*H, 8) (default {DEFAULT_BH})")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="storage dtype (default float32)")
    p.add_argument("--causal", choices=("false", "true", "both"), default="both", help="mask (default both)")
    p.add_argument("--pass", dest="pass_", choices=(*PASSES, "both"), help="fwd, fwd+bwd or both (default both)")
    p.add_argument("--kernels", nargs="+", metavar="NAME", help="implementations to run (default: all available)")
    p.add_argument("--repeats", type=int, help=f"timed calls per row (default {DEFAULT_REPEATS})")
    p.add_argument("--peak", type=float, metavar="TFLOPS", help="fp32 peak in TFLOP/s (default: measured)")
    p.add_argument("--csv", metavar="PATH", help="also write the results as CSV")
    p.add_argument("--plot", metavar="PATH", help="also plot time and TFLOP/s against N (needs matplotlib)")
    p.add_argument(
        "--quick", action="store_true", help=f"N in {QUICK_N}, forward only, {QUICK_REPEATS} repeats (unless given)"
    )


def configs(args: argparse.Namespace) -> list[Config]:
    """The sweep, from the options (defaults: the full sweep, --quick's, or the simulator's)."""
    if args.n:
        Ns = args.n
    else:
        Ns = SIMULATOR_N if SIMULATOR else QUICK_N if args.quick else DEFAULT_N
    ds = args.d or [SIMULATOR_D if SIMULATOR else DEFAULT_D]
    B, H = split_bh(args.bh or (SIMULATOR_BH if SIMULATOR else DEFAULT_BH))
    causals = {"false": (False,), "true": (True,), "both": (False, True)}[args.causal]
    pass_ = args.pass_ or ("fwd" if args.quick else "both")
    passes = PASSES if pass_ == "both" else (pass_,)
    return [Config(B, H, N, d, args.dtype, causal, p) for N in Ns for d in ds for causal in causals for p in passes]


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name, values in (("--n", args.n), ("--d", args.d), ("--bh", [args.bh]), ("--repeats", [args.repeats])):
        if any(v is not None and v < 1 for v in values or ()):
            parser.error(f"{name}: expected positive integers")
    if any(d > 128 for d in args.d or ()):
        parser.error("--d: flash_numba supports head dims up to 128")
    if args.peak is not None and not args.peak > 0:
        parser.error("--peak: expected a positive number of TFLOP/s")
    known = list(kernels.NAMES) + list(VARIANTS) + list(TORCH_BACKENDS)
    for name in args.kernels or ():
        if name not in known:
            parser.error(f"--kernels: unknown implementation {name!r}; choose from {', '.join(known)}")


def _choose_impls(args: argparse.Namespace, torch) -> tuple[list[Impl], list[str]]:
    """The implementations to run, and notes on those asked for that cannot run here."""
    available = implementation_names(args.dtype, torch)
    names = list(dict.fromkeys(args.kernels or available))
    notes = []
    for name in names:
        if name in TORCH_BACKENDS and name not in torch_backends(args.dtype):
            notes.append(f"{name}: not run, PyTorch's backend does not take {args.dtype}")
        elif name in TORCH_BACKENDS and torch is None:
            notes.append(f"{name}: not run, it needs PyTorch and a GPU")
        elif name not in available:
            notes.append(f"{name}: not run, this PyTorch has no {TORCH_BACKENDS[name]} backend")
    impls = [torch_impl(n, torch) if n in TORCH_BACKENDS else flash_numba_impl(n) for n in names if n in available]
    return impls, notes


def run(args: argparse.Namespace, command: str = "flash-numba bench") -> int:
    """Validate, time and report; 0 on success, 1 if an implementation disagrees with the reference."""
    torch = _torch()
    cfgs = configs(args)
    impls, notes = _choose_impls(args, torch)
    repeats = args.repeats or (QUICK_REPEATS if args.quick else DEFAULT_REPEATS)
    print(device.describe())
    if not impls:
        print("nothing to run: " + "; ".join(notes))
        return 1

    mismatches, more_notes = validate(impls, cfgs, torch)
    for note in notes + more_notes:
        print(note)
    if mismatches:
        print("\n".join(mismatches))
        print(f"VALIDATION FAILED: {len(mismatches)} mismatch(es) against the float64 reference; nothing was timed")
        return 1
    print("All results match. Starting benchmarks.")

    if args.peak is not None:
        peak, peak_line = args.peak, f"{args.peak:g} TFLOP/s as given (--peak)"
    elif SIMULATOR:
        peak, peak_line = None, "not measured in the simulator"
    else:
        from .microbench import fp32_peak

        peak = fp32_peak().value
        peak_line = f"{peak:.1f} TFLOP/s measured by flash_numba.microbench.fp32_peak()"

    rows, step, total = [], 0, len(cfgs) * len(impls)
    for _, same_shape in itertools.groupby(cfgs, key=lambda c: (c.N, c.d)):  # one set of inputs per shape
        same_shape = list(same_shape)
        sets = input_sets(same_shape[0], torch)
        for cfg in same_shape:
            table = []
            for impl in impls:
                step += 1
                _progress(step, total, f"{impl.name} N={cfg.N} d={cfg.d} causal={cfg.causal} {cfg.pass_}")
                table.append(measure(impl, sets, cfg, repeats, torch))
            print()
            print(format_table(table, peak))
            rows += table
        del sets  # free this shape's inputs before the next is made

    print()
    for note in footnotes(repeats, peak_line):
        print("* " + note)
    name = device.info().name
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    if args.csv:
        header = [f"device: {device.describe()}", f"date: {date}", f"command: {command}"]
        write_csv(args.csv, rows, header + footnotes(repeats, peak_line), peak)
        print(f"wrote {args.csv}")
    if args.plot:
        first = cfgs[0]
        title = f"{name}, {date}: attention, B*H = {first.BH}"
        if plot(rows, args.plot, title):
            print(f"wrote {args.plot}")
        else:
            print("no plot: no times were measured (the simulator does not time kernels)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``flash-numba bench [options]``: ``argv`` holds the options only (default ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(prog="flash-numba bench", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    _check_args(parser, args)
    command = shlex.join(sys.argv) if argv is None else shlex.join(["flash-numba", "bench", *argv])
    return run(args, command)


if __name__ == "__main__":
    sys.exit(main())
