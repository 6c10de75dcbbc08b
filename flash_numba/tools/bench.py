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
   time, TFLOP/s, the fraction of the fp32 peak (:func:`flash_numba.tools.microbench.fp32_peak`,
   once per run, or ``--peak``), the HBM bytes the kernels' code moves and the
   device memory the call allocates; ``--csv`` and ``--plot`` save them.  The
   CSV gets each row as soon as it is measured, so a sweep that fails (one
   line names the configuration; the sweep stops, exit status 1) or is
   interrupted keeps what it measured.  Every option and output path is
   checked before step 1 (docs/RELIABILITY.md, "The command line").

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
import dataclasses
import datetime
import importlib.util
import itertools
import math
import os
import shlex
import statistics
import sys

import numpy as np

from .. import device, iomodel, kernels, reference
from ..api import resolve_block
from ..device import SIMULATOR
from . import timing
from .bench_cases import (
    COUNT_LIMIT,
    DEFAULT_BH,
    DEFAULT_D,
    DEFAULT_N,
    DEFAULT_REPEATS,
    DTYPES,
    PASSES,
    QUICK_N,
    QUICK_REPEATS,
    REFERENCE_MAX_N,
    SIMULATOR_BH,
    SIMULATOR_D,
    SIMULATOR_N,
    SMALL_PROBLEM,
    TOLERANCE,
    TORCH_BACKENDS,
    VARIANTS,
    WARMUP,
    Config,
    Impl,
    Inputs,
    backward_runs,
    flash_numba_impl,
    host_inputs,
    implementation_names,
    input_sets,
    kernel_of,
    split_bh,
    to_device,
    to_host,
    torch_backends,
    torch_impl,
    workspace_bytes,
)
from .argcheck import MAX_D, Parser, head_dim, output_file, positive, positive_float
from .bench_report import Row, csv_rows, fmt_bytes, footnotes, format_table, plot

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


def no_room(name: str, cfg: Config, torch=None) -> str | None:
    """Why ``name``'s N x N buffers for ``cfg`` do not fit in free device memory, or None.

    Always None in the simulator, which has no device memory to run out of.
    """
    if SIMULATOR:
        return None
    from numba import cuda

    if torch is not None:
        torch.cuda.empty_cache()  # PyTorch's cached blocks count as free for everyone
    timing.free_pending()
    need, free = workspace_bytes(name, cfg), cuda.current_context().get_memory_info().free
    if need > 0.9 * free:
        return f"its N x N buffers need {fmt_bytes(need)}, {fmt_bytes(free)} free"
    return None


def _unavailable(exc: Exception) -> bool:
    """True for PyTorch's refusal to run a backend on this GPU or problem."""
    return isinstance(exc, RuntimeError) and "no available kernel" in str(exc).lower()


class Failed(Exception):
    """An implementation raised on one configuration; the message names both and the error, on one line."""

    def __init__(self, name: str, cfg: Config, exc: BaseException):
        first = (str(exc).splitlines() or [""])[0]
        super().__init__(f"{name} on {cfg.describe()}: {type(exc).__name__}: {first}")


def validate(impls: list[Impl], cfgs: list[Config], torch=None) -> tuple[list[str], list[str]]:
    """Check every implementation against the float64 reference before anything is timed.

    Per (d, causal) the small problem, then (on a GPU) every benchmark size;
    only the fuller pass of those benchmarked is checked (fwd+bwd covers fwd).
    Returns ``(mismatch lines, notes)``; a PyTorch backend that refuses to run
    here is removed from ``impls`` with a note.  Any other error raises
    :class:`Failed`.
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
        inputs = to_device(host, torch, cfg.dtype)
        ref = reference_outputs({n: x if heads is None else x[heads] for n, x in host.items()}, cfg.causal, cfg.pass_)
        for impl in list(impls):
            checked = cfg if backward_runs(impl.name, cfg.dtype) else dataclasses.replace(cfg, pass_="fwd")
            step += 1
            _progress(step, total, f"{impl.name} {cfg.describe()}", "validate ")
            reason = None if heads is None else no_room(impl.name, cfg, torch)
            if reason is None:
                try:
                    outs, _ = impl.call(inputs, checked)
                except Exception as exc:
                    if impl.is_torch and _unavailable(exc):
                        impls.remove(impl)
                        notes.append(f"{impl.name}: not available here ({str(exc).splitlines()[0]})")
                        continue
                    if heads is None or not timing.out_of_memory(exc):
                        raise Failed(impl.name, cfg, exc) from exc
                    reason = "out of memory"
            if reason is not None:
                notes.append(f"{impl.name}: not checked at N = {cfg.N}: {reason}")
                continue
            where = f"(B, H, N, d) = {(cfg.B, cfg.H, cfg.N, cfg.d)} {'causal' if cfg.causal else 'no mask'}"
            mismatches += compare(impl.name, where, outs, ref, TOLERANCE[cfg.dtype], heads)
    return mismatches, notes




def hbm_bytes(impl: Impl, inp: Inputs, cfg: Config) -> tuple[int | None, str]:
    """``(bytes, source)``: a counted run, or the IO model above :data:`COUNT_LIMIT`; PyTorch is not counted."""
    if impl.is_torch:
        return None, "n/a"
    if cfg.BH * cfg.N * cfg.N > COUNT_LIMIT:
        kernel, options = kernel_of(impl.name)
        model = iomodel.forward(kernel, cfg.BH, cfg.N, cfg.N, cfg.d, cfg.dtype, cfg.causal)
        if cfg.pass_ == "fwd+bwd":
            model = model + iomodel.backward(kernel, cfg.BH, cfg.N, cfg.N, cfg.d, cfg.dtype, cfg.causal, **options)
        return model.total, "model"
    _, counted = impl.call(inp, cfg, True)
    return counted.total, "counted"


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

    timing.free_pending()  # what earlier calls left behind
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
        timing.free_pending()
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
    if cfg.pass_ == "fwd+bwd" and not backward_runs(impl.name, cfg.dtype):
        row.status = f"skipped: no backward in {cfg.dtype}"
        return row
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
        if timing.out_of_memory(exc):
            row.status = "out of memory"
        elif impl.is_torch and _unavailable(exc):
            row.status = f"not available: {str(exc).splitlines()[0]}"
        else:
            raise
    return row


# ---------------------------------------------------------------------------- command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``flash-numba bench``; argparse refuses a bad value while it parses."""
    p.add_argument("--n", type=positive, nargs="+", help="sequence lengths N (default 1024 2048 4096 8192)")
    p.add_argument("--d", type=head_dim, nargs="+", help=f"head dims, 1 to {MAX_D} (default {DEFAULT_D})")
    p.add_argument("--bh", type=positive, help=f"B*H, split as (B, H) with H = gcd(B*H, 8) (default {DEFAULT_BH})")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="storage dtype (default float32)")
    p.add_argument("--causal", choices=("false", "true", "both"), default="both", help="mask (default both)")
    p.add_argument("--pass", dest="pass_", choices=(*PASSES, "both", "decode"),
                   help="fwd, fwd+bwd or both (default both); decode: one decoding step over a KV cache "
                        "(tools.bench_decode: B = 8, Hq = 32, Hkv = 8, d = 128, float16, --n cache lengths)")
    p.add_argument("--kernels", nargs="+", metavar="NAME", help="implementations to run (default: all available)")
    p.add_argument("--repeats", type=positive, help=f"timed calls per row (default {DEFAULT_REPEATS})")
    p.add_argument("--peak", type=positive_float, metavar="TFLOPS", help="fp32 peak in TFLOP/s (default: measured)")
    p.add_argument("--csv", type=output_file, metavar="PATH",
                   help="also write the results as CSV, each row as it is measured (its directory must exist)")
    p.add_argument("--plot", type=output_file, metavar="PATH",
                   help="also plot time and TFLOP/s against N (needs matplotlib; its directory must exist)")
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
    """What argparse cannot check alone: implementation names, blocks that fit, matplotlib for --plot."""
    known = list(kernels.NAMES) + list(VARIANTS) + list(TORCH_BACKENDS)
    for name in args.kernels or ():
        if name not in known:
            parser.error(f"argument --kernels: unknown implementation {name!r}; choose from {', '.join(known)}")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error("argument --plot: needs matplotlib, which is not installed (pip install matplotlib)")
    if args.csv and args.plot and os.path.abspath(args.csv) == os.path.abspath(args.plot):
        parser.error("argument --plot: the same path as --csv")
    cfgs = configs(args)
    ours = {kernel_of(n)[0] for n in args.kernels or implementation_names(args.dtype) if n not in TORCH_BACKENDS}
    for kernel in sorted(ours):
        for d in sorted({c.d for c in cfgs}):
            backward = any(c.pass_ == "fwd+bwd" for c in cfgs) and kernels.get(kernel).has("backward", args.dtype)
            for pass_ in ("forward", "backward") if backward else ("forward",):
                try:
                    resolve_block(kernel, d, args.dtype, pass_=pass_)
                except ValueError as exc:
                    parser.error(f"argument --d: {kernel} cannot run d = {d} in {args.dtype} ({pass_}): {exc}")


def _choose_impls(args: argparse.Namespace, torch) -> tuple[list[Impl], list[str]]:
    """The implementations to run, and notes on those asked for that cannot run here."""
    if args.dtype == "bfloat16" and torch is None:
        return [], ["bfloat16: its inputs are PyTorch tensors (Numba has no bfloat16 arrays), and PyTorch with a "
                    "GPU is not available here"]
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


def sweep(cfgs: list[Config], impls: list[Impl], repeats: int, peak, torch, rows: list[Row], save) -> None:
    """Measure every implementation on every configuration: each row is appended to ``rows`` and
    given to ``save`` as soon as it is measured.

    One table per configuration is printed as it completes.  An error that is
    not a row's status (out of memory, a PyTorch backend unavailable) stops the
    sweep: the failing configuration is saved as a row whose status is
    ``error: ...`` and :class:`Failed` is raised.  The sweep does not go on,
    because such an error is a bug or a broken CUDA context (an illegal
    address poisons it), which every later configuration would meet again.
    """
    step, total = 0, len(cfgs) * len(impls)
    for _, same_shape in itertools.groupby(cfgs, key=lambda c: (c.N, c.d)):  # one set of inputs per shape
        same_shape = list(same_shape)
        sets = input_sets(same_shape[0], torch)
        for cfg in same_shape:
            table = []
            for impl in impls:
                step += 1
                _progress(step, total, f"{impl.name} N={cfg.N} d={cfg.d} causal={cfg.causal} {cfg.pass_}")
                try:
                    row = measure(impl, sets, cfg, repeats, torch)
                except Exception as exc:  # not swallowed: saved as the last row, then raised as one line
                    failed = Failed(impl.name, cfg, exc)
                    row = Row(impl.name, cfg, status=f"error: {failed}")
                    save(row)
                    print()
                    print(format_table(table + [row], peak))
                    raise failed from exc
                save(row)
                table.append(row)
                rows.append(row)
            print()
            print(format_table(table, peak))
        del sets  # free this shape's inputs before the next is made


def run(args: argparse.Namespace, command: str = "flash-numba bench") -> int:
    """Validate, time and report; 0 on success, 1 if an implementation disagrees with the reference or fails.

    The CSV gets each row as it is measured; a failure or Ctrl-C keeps the rows
    measured before it (one line on stderr says what happened).
    """
    torch = timing.torch_cuda()
    cfgs = configs(args)
    impls, notes = _choose_impls(args, torch)
    repeats = args.repeats or (QUICK_REPEATS if args.quick else DEFAULT_REPEATS)
    print(device.describe())
    if not impls:
        print("nothing to run: " + "; ".join(notes))
        return 1

    try:
        mismatches, more_notes = validate(impls, cfgs, torch)
    except Failed as failed:
        print(f"flash-numba bench: validation failed: {failed}; nothing was timed", file=sys.stderr)
        return 1
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
        peak_line = f"{peak:.1f} TFLOP/s measured by flash_numba.tools.microbench.fp32_peak()"

    name = device.info().name
    date = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    header = [f"device: {device.describe()}", f"date: {date}", f"command: {command}"]
    rows, failure = [], None
    kept = f"; the rows measured so far are in {args.csv}" if args.csv else ""
    try:
        with csv_rows(args.csv, header + footnotes(repeats, peak_line), peak) as save:
            sweep(cfgs, impls, repeats, peak, torch, rows, save)
    except Failed as failed:
        failure = failed
    except KeyboardInterrupt:
        print(f"\nflash-numba bench: interrupted after {len(rows)} row(s){kept}", file=sys.stderr)
        return 130

    print()
    for note in footnotes(repeats, peak_line):
        print("* " + note)
    if args.csv:
        print(f"wrote {args.csv}" + (" (up to the failure)" if failure else ""))
    if args.plot:
        first = cfgs[0]
        title = f"{name}, {date}: attention, B*H = {first.BH}"
        if plot(rows, args.plot, title):
            print(f"wrote {args.plot}")
        else:
            print("no plot: no times were measured (the simulator does not time kernels)")
    if failure is not None:
        print(f"flash-numba bench: failed: {failure}{kept}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``flash-numba bench [options]``: ``argv`` holds the options only (default ``sys.argv[1:]``).

    Every option and output path is checked before anything runs; a bad one
    exits with status 2 and one line on stderr naming it.
    """
    parser = Parser(prog="flash-numba bench", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    command = shlex.join(sys.argv) if argv is None else shlex.join(["flash-numba", "bench", *argv])
    if args.pass_ == "decode":  # its own sizes, implementations and columns (bench_decode's docstring)
        from . import bench_decode

        forwarded = [*(["--n", *map(str, args.n)] if args.n else []), *(["--kernels", *args.kernels] if args.kernels
                     else []), *(["--repeats", str(args.repeats)] if args.repeats else []),
                     *(["--csv", args.csv] if args.csv else [])]
        return bench_decode.main(forwarded, command)
    _check_args(parser, args)
    return run(args, command)


if __name__ == "__main__":
    sys.exit(main())
