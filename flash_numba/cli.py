"""The ``flash-numba`` command (also ``python -m flash_numba``).

    flash-numba info     where the kernels run, the device's numbers, and the
                         block sizes (Br, Bc) each FlashAttention kernel picks
    flash-numba tour     standard attention and every FlashAttention kernel on
                         one random problem: error against the float64
                         reference, HBM bytes read and written, and on a GPU
                         the time of one call

Each subcommand is an entry of :data:`SUBCOMMANDS`; a new one (bench, figures,
profile) adds a function and a line there.  :func:`main` takes ``argv`` so tests
call it directly.  Every option is checked before any work starts, and a bad
one is a one-line error naming it, exit status 2
(:mod:`flash_numba.tools.argcheck`; docs/RELIABILITY.md, "The command line").
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import api, device, kernels
from .api import attention_forward, resolve_block
from .hbm import HBMCount
from .tools.argcheck import Parser, non_negative

INFO_DS = (16, 32, 64, 128)
DTYPES = ("float16", "float32", "float64")

#: Largest error (relative to max |reference|) the tour accepts per storage dtype.
TOUR_TOLERANCE = {"float16": 1e-2, "float32": 1e-5, "float64": 1e-12}




# ---------------------------------------------------------------------------- info


def _device_lines() -> list[str]:
    d = device.info()
    kind = " (stand-in numbers)" if d.simulated else ""
    mem = f"{d.total_memory / 2**30:.1f} GiB" if d.total_memory else "unknown"
    sms = f"{d.sm_count} SM" + ("" if d.sm_count == 1 else "s")
    return [
        f"device: {d.name}{kind}",
        f"  compute capability {d.compute_capability[0]}.{d.compute_capability[1]}, {sms}, "
        f"warp size {d.warp_size}, memory {mem}",
        f"  shared memory: {d.shared_mem_per_block // 1024} KB per block (static limit applied), "
        f"{d.shared_mem_per_sm // 1024} KB per SM",
    ]


def _block_table(mods: dict) -> list[str]:
    w = max([len(name) for name in mods] + [6])
    head = f"{'kernel':<{w}}  {'pass':<8}  {'dtype':<8}" + "".join(f"  {'d=' + str(d):>9}" for d in INFO_DS)
    lines = ["block sizes (Br, Bc) chosen by flash_numba.resolve_block:", head]
    for name, mod in mods.items():
        if not mod.uses_blocks:
            continue
        for pass_ in ("forward", "backward"):
            for dtype in (t for t in DTYPES if t in mod.dtypes):  # the dtypes the kernel runs (its spec)
                cells = []
                for d in INFO_DS:
                    try:
                        Br, Bc = resolve_block(name, d, dtype, pass_=pass_)
                        cells.append(f"({Br}, {Bc})")
                    except ValueError:
                        cells.append("none fits" if mod.supports(d, dtype) is None else "-")
                lines.append(f"{name:<{w}}  {pass_:<8}  {dtype:<8}" + "".join(f"  {c:>9}" for c in cells))
    return lines


def cmd_info(args: argparse.Namespace) -> int:
    """Print the mode line, the device's numbers and the block sizes of each kernel."""
    mods = {name: kernels.get(name) for name in kernels.NAMES}
    gpu = None if device.SIMULATOR else device.info()
    lines = [device.describe(), *_device_lines(), *_block_table(mods),
             "default kernel by dtype (kernel=None) on this " + ("GPU:" if gpu else "simulator (every cc):"),
             *api.default_kernels_text(gpu and gpu.compute_capability, gpu and gpu.name)]
    print("\n".join(lines))
    return 0


# ---------------------------------------------------------------------------- tour


def tour_shape() -> tuple[int, int, int, int]:
    """``(B, H, N, d)`` for the tour: tiny in the simulator, a real problem on a GPU."""
    return (1, 1, 40, 16) if device.SIMULATOR else (2, 4, 1024, 64)


def rel_error(x, ref) -> float:
    """``max |x - ref| / max |ref|`` over the finite entries of ``ref``.

    Entries where ``ref`` is -inf (an lse row with no visible key) must be -inf
    in ``x`` too, else the error is infinite.
    """
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    finite = np.isfinite(ref)
    if not np.array_equal(x[~finite], ref[~finite]):
        return float("inf")
    if not finite.any():
        return 0.0
    scale = max(float(np.abs(ref[finite]).max()), np.finfo(np.float64).tiny)
    return float(np.abs(x[finite] - ref[finite]).max()) / scale


@dataclass
class TourRow:
    kernel: str
    err_o: float
    err_lse: float
    hbm: HBMCount
    ms: float | None


def _tour_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--causal", action="store_true", help="mask future keys (bottom-right aligned)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="storage dtype of q, k, v (default float32)")
    p.add_argument("--seed", type=non_negative, default=0, help="seed of the random q, k, v, >= 0 (default 0)")


def cmd_tour(args: argparse.Namespace) -> int:
    """Run every kernel on one problem; print errors, HBM bytes and (on a GPU) times."""
    from . import reference

    B, H, N, d = tour_shape()
    rng = np.random.default_rng(args.seed)
    q, k, v = (rng.standard_normal((B, H, N, d)).astype(args.dtype) for _ in range(3))
    o_ref, lse_ref = reference.attention_forward(q, k, v, causal=args.causal)

    def call(name, q, k, v, count_hbm):
        return attention_forward(q, k, v, kernel=name, causal=args.causal, count_hbm=count_hbm)

    if not device.SIMULATOR:
        from numba import cuda

        q_dev, k_dev, v_dev = (cuda.to_device(x) for x in (q, k, v))

    rows = []
    for name in kernels.NAMES:
        if kernels.get(name).supports(d, args.dtype) is not None:  # e.g. flash2_tc in float32: not this tour's
            continue
        res = call(name, q, k, v, True)
        ms = None
        if not device.SIMULATOR:  # time the plain kernels on device arrays: no copies, no counting
            times = device.time_ms(lambda: call(name, q_dev, k_dev, v_dev, False))
            ms = statistics.median(times)
        rows.append(TourRow(name, rel_error(res.o, o_ref), rel_error(res.lse, lse_ref), res.hbm, ms))

    print(device.describe())
    print(f"q, k, v: (B, H, N, d) = {(B, H, N, d)}, {args.dtype}, causal={args.causal}, seed {args.seed}")
    print(_tour_table(rows))
    tol = TOUR_TOLERANCE[args.dtype]
    bad = [r.kernel for r in rows if not (r.err_o <= tol and r.err_lse <= tol)]
    if bad:
        print(f"MISMATCH: {', '.join(bad)} differ from the float64 reference by more than {tol:g}")
    else:
        print(f"all results match the float64 reference (relative error <= {tol:g})")
    if device.SIMULATOR:
        print("times are not measured in the simulator (it runs each CUDA thread as Python code)")
    else:
        print("time: median of 10 calls on device arrays, counting off (after 3 warm-up calls)")
    for r in rows:
        print()
        print(r.hbm.table(title=f"{r.kernel}: HBM bytes per kernel launch"))
    return 1 if bad or not rows else 0


def _tour_table(rows: list[TourRow]) -> str:
    base = next((r.hbm.total for r in rows if r.kernel == "standard"), None)
    timed = any(r.ms is not None for r in rows)
    w = max([len(r.kernel) for r in rows] + [6])
    head = (
        f"{'kernel':<{w}}  {'err O':>8}  {'err lse':>8}  {'HBM read':>14}  {'written':>14}  {'total':>14}"
        f"  {'vs standard':>11}"
    )
    lines = [head + (f"  {'time ms':>9}" if timed else "")]
    for r in rows:
        ratio = f"{r.hbm.total / base:.3f}x" if base else "-"
        line = (
            f"{r.kernel:<{w}}  {r.err_o:>8.1e}  {r.err_lse:>8.1e}  {r.hbm.bytes_read:>14,}  "
            f"{r.hbm.bytes_written:>14,}  {r.hbm.total:>14,}  {ratio:>11}"
        )
        lines.append(line + (f"  {r.ms:>9.3f}" if timed else ""))
    return "\n".join(lines)


# ---------------------------------------------------------------------------- main


@dataclass(frozen=True)
class Subcommand:
    help: str
    run: Callable[[argparse.Namespace], int]
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None


SUBCOMMANDS: dict[str, Subcommand] = {
    "info": Subcommand("where the kernels run, the device, and the block sizes each kernel picks", cmd_info),
    "tour": Subcommand(
        "run standard attention and each FlashAttention kernel: error, HBM bytes, time", cmd_tour, _tour_arguments
    ),
}


#: Subcommands whose module parses its own options: ``flash-numba NAME ...`` runs ``module.main([...])``.
DELEGATED: dict[str, tuple[str, str]] = {
    "bench": (
        "flash_numba.tools.bench", "validate, then time every kernel (and PyTorch SDPA) on this GPU; table, CSV, plot"
    ),
    "figures": (
        "flash_numba.tools.figures", "regenerate the article's and the paper's figures (PNG + CSV) into figures/out"
    ),
    "profile": ("flash_numba.tools.profile", "our HBM byte counters beside Nsight Compute's DRAM bytes, per kernel"),
}


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line), run the subcommand, return its exit status."""
    import importlib
    import sys

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in DELEGATED:
        return _interruptible(argv[0], lambda: importlib.import_module(DELEGATED[argv[0]][0]).main(argv[1:]))
    parser = Parser(
        prog="flash-numba", description="FlashAttention from scratch in Numba CUDA: run, check and measure."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    for name, cmd in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.run.__doc__)
        if cmd.add_arguments is not None:
            cmd.add_arguments(p)
        p.set_defaults(run=cmd.run)
    for name, (_, help_) in DELEGATED.items():  # listed in --help; their options: flash-numba NAME --help
        sub.add_parser(name, help=help_, add_help=False)
    args = parser.parse_args(argv)
    return _interruptible(args.command, lambda: args.run(args))


def _interruptible(command: str, run: Callable[[], int | None]) -> int:
    """``run()``'s exit status; Ctrl-C is one line and status 130 (bench and figures have saved what they measured)."""
    import sys

    try:
        return int(run() or 0)
    except KeyboardInterrupt:
        print(f"\nflash-numba {command}: interrupted", file=sys.stderr)
        return 130
