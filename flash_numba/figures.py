"""The article's figures, regenerated on this machine.

    python figures/make_all.py [--only N ...] [--quick] [--model-only] [--out DIR]

Each figure is a PNG with its data beside it as CSV (figure 1 also as Markdown).
Every PNG names the device and the date in its footer; every CSV starts with
``#`` lines saying the same (:func:`read_csv` skips them).

1. The FlashAttention paper's Figure 2 (left) table: GFLOPs, HBM bytes and
   runtime of standard attention and FlashAttention for GPT-2 medium, beside
   the paper's numbers, with the reasons they differ.
2. Block size against HBM bytes and runtime (the paper's Figure 2, middle).
3. HBM bytes against sequence length, log-log, with the Theta slopes.
4. Peak device memory against sequence length, standard against flash.
5. Runtime against sequence length, and the standard path's time per kernel.
6. The roofline of this GPU with every kernel launch placed on it.

What runs where.  Bytes come from the IO model (:mod:`flash_numba.iomodel`),
which the tests hold equal to the counters; on a GPU they are also counted
(``count_hbm=True``) and in the simulator counted at a tiny size (figure 3) to
confirm the model.  Times and memory need a GPU: without one, or with
``--model-only`` (which runs no kernel at all), figures 4 and 5 are skipped
with a message, figures 1 and 2 have no runtime, and figure 6 places each
kernel at its roofline bound instead of at its measured speed.

FLOPs (figures 1 and 6) follow :data:`FLOPS`: 2 per multiply-add of a matrix
product and 1 per elementwise operation on a score.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from . import __version__, device, iomodel, kernels
from .api import attention_backward, attention_forward, resolve_block
from .hbm import Counters

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
}

#: The paper's Figure 2 (left), arXiv v2 (June 2022): A100, float16, dropout, GPT-2 medium.
PAPER = {"standard": (66.6, 40.3, 41.7), "flash2": (75.2, 4.4, 7.3)}  # GFLOPs, HBM GB, ms
#: Another version of the paper: key-padding mask, no dropout (GB, ms).
PAPER_OTHER = {"standard": (35.3, 35.1), "flash2": (4.4, 11.7)}

#: Datasheet ceilings (HBM GB/s, float32 TFLOP/s, non-tensor) for when nothing is measured.
DATASHEETS = {"H200": (4800.0, 67.0), "H100": (3350.0, 67.0), "A100": (2039.0, 19.5), "T4": (320.0, 8.1)}

#: Figure 2 sweeps the kernels that take any (Br, Bc): the paper's Algorithm 1 and the FlashAttention-2 order.
BLOCK_SWEEP = ("flash1", "flash2")

COLORS = {"standard": "C3", "flash1": "C0", "flash2": "C2", "flash2_fast": "C1", "torch SDPA": "0.3"}


@dataclass(frozen=True)
class Sizes:
    """The problem sizes of every figure (float32 throughout, head dim ``d``)."""

    d: int = 64
    table: tuple = (64, 16, 1024)  # fig 1: B, H, N (GPT-2 medium)
    table_count_BH: int = 16  # fig 1: counted at this B*H and scaled
    block_N: int = 1024  # fig 2
    block_BH: int = 128
    block_Br: tuple = (16, 32, 64)
    block_Bc: tuple = (16, 32, 48, 64, 80)  # the pairs that fit 48 KB of shared memory are kept
    seq_N: tuple = tuple(2**p for p in range(4, 17))  # fig 3: modelled, B*H = 1
    seq_count_max: int = 4096  # fig 3: counted up to this N
    mem_N: tuple = tuple(2**p for p in range(9, 16))  # fig 4
    mem_BH: int = 16
    time_N: tuple = tuple(2**p for p in range(8, 14))  # fig 5
    time_BH: int = 16
    breakdown_N: tuple = (1024, 4096)
    roof: tuple = (32, 4096)  # fig 6: B*H, N
    slow_s: float = 2.0  # a series stops once one call takes longer than this


def sizes_for(quick: bool, simulator: bool) -> Sizes:
    """The sizes of a full run, trimmed by ``--quick``; the simulator only counts tiny sizes."""
    s = Sizes()
    if quick:
        s = replace(
            s,
            block_Br=(16, 32),
            block_Bc=(16, 32, 64),
            seq_count_max=1024,
            mem_N=(512, 1024, 2048, 4096),
            time_N=(512, 1024, 2048),
            breakdown_N=(1024,),
        )
    if simulator:
        s = replace(s, seq_count_max=16 if quick else 32)
    return s


@dataclass
class Run:
    """One regeneration: where the files go and what may run here.

    ``count``: kernels may run to count bytes; ``gpu``: they may also be timed and
    their memory measured (a real GPU, and not ``--model-only``).
    """

    out: Path
    sizes: Sizes
    count: bool
    gpu: bool
    label: str
    kernels: tuple = field(default_factory=tuple)
    date: str = field(default_factory=lambda: datetime.date.today().isoformat())

    @property
    def stamp(self) -> str:
        return f"{self.label} | {self.date} | flash_numba {__version__}"


class Skipped(Exception):
    """A figure that cannot be made here; the message says why."""


# ---------------------------------------------------------------------------- models


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
    """FLOPs of each launch in ``names`` (counter names, see :data:`FLOPS`) for N = Nq = Nk."""
    out = {}
    for name in names:
        a, b, c = FLOPS[name]
        out[name] = BH * (N * N * (a * d + b) + c * N * d)
    return out


def modelled_kernels() -> tuple:
    """The kernel modules whose IO model and FLOP table cover them (others are reported)."""
    ok = []
    for name in kernels.NAMES:
        try:
            for pass_ in ("forward", "backward"):
                flops(model(name, pass_, 1, 16, 16).per_kernel, 1, 16, 16)
        except Exception as exc:  # a module under construction is left out, not fatal
            print(f"{name}: left out of the figures ({type(exc).__name__}: {exc})")
            continue
        ok.append(name)
    return tuple(ok)


# ---------------------------------------------------------------------------- running kernels


def random_inputs(BH: int, N: int, d: int, seed: int = 0):
    """q, k, v, dO: device arrays (BH, N, d) of float32 normal numbers."""
    from numba import cuda

    rng = np.random.default_rng(seed)
    return tuple(cuda.to_device(rng.standard_normal((BH, N, d), dtype=np.float32)) for _ in range(4))


def forward(kernel: str, q, k, v, count: bool = False):
    return attention_forward(q, k, v, kernel=kernel, count_hbm=count)


def backward(kernel: str, q, k, v, o, lse, do, count: bool = False):
    return attention_backward(q, k, v, o, lse, do, kernel=kernel, count_hbm=count)


def counted(kernel: str, BH: int, N: int, d: int):
    """(forward, backward) HBMCount of the instrumented kernels."""
    q, k, v, do = random_inputs(BH, N, d)
    f = forward(kernel, q, k, v, count=True)
    b = backward(kernel, q, k, v, f.o, f.lse, do, count=True)
    return f.hbm, b.hbm


def median_ms(fn) -> float:
    """Median GPU time of ``fn()`` in ms: one untimed call, then 3 to 10 timed ones (about a second)."""
    fn()
    device.synchronize()
    times = []
    while len(times) < 3 or (len(times) < 10 and sum(times) < 1000.0):
        with device.CudaTimer() as t:
            fn()
        times.append(t.ms)
    return statistics.median(times)


class LaunchTimer(Counters):
    """Stands in for :class:`~flash_numba.hbm.Counters` to time each kernel launch.

    Every kernel module asks ``counters.array(name)`` for the counter of launch
    ``name`` while it builds that launch's arguments, right before launching.
    Here that call records a CUDA event; :meth:`stop` records one more, and the
    time between consecutive events is the launch named by the first (the host's
    work in between is hidden while the GPU is busy, as it is for the
    millisecond kernels timed here).  The kernels run uncounted.
    """

    def __init__(self) -> None:
        super().__init__(False)
        self.names: list[str] = []
        self._events = []

    def array(self, name: str):
        self.names.append(name)
        if not device.SIMULATOR:  # the simulator has no clock (see device.CudaTimer)
            from numba import cuda

            event = cuda.event(timing=True)
            event.record()
            self._events.append(event)
        return super().array(name)

    def stop(self) -> dict | None:
        """Milliseconds per launch name (None in the simulator)."""
        if device.SIMULATOR:
            return None
        from numba import cuda

        end = cuda.event(timing=True)
        end.record()
        end.synchronize()
        ms = {}
        for name, a, b in zip(self.names, self._events, self._events[1:] + [end]):
            ms[name] = ms.get(name, 0.0) + cuda.event_elapsed_time(a, b)
        return ms


def run_pass(kernel: str, pass_: str, arrays: dict, counters):
    """One pass of ``kernel`` through its module, with ``counters`` of our choosing.

    ``arrays``: q, k, v (and o, lse, do for the backward) as device arrays.
    """
    from . import _inputs as checks

    mod = kernels.get(kernel)
    extra = {n: arrays[n] for n in ("o", "lse", "do")} if pass_ == "backward" else None
    prob, ops = checks.prepare({n: arrays[n] for n in ("q", "k", "v")}, causal=False, scale=None, extra=extra)
    block = block_for(kernel, prob.d, pass_)
    if pass_ == "forward":
        return mod.forward(prob, ops, block, counters)
    return mod.backward(prob, ops, block, counters)


#: Timed passes per :func:`launch_times` (after one untimed pass).
LAUNCH_REPEATS = 3


def launch_times(kernel: str, pass_: str, arrays: dict):
    """``(names, ms per name)``: each launch of one pass timed with :class:`LaunchTimer`
    (median of :data:`LAUNCH_REPEATS` passes after an untimed one); ms is None in the simulator."""
    run_pass(kernel, pass_, arrays, Counters(False))
    samples = []
    for _ in range(LAUNCH_REPEATS):
        timer = LaunchTimer()
        run_pass(kernel, pass_, arrays, timer)
        samples.append(timer.stop())
    if samples[0] is None:
        return timer.names, None
    return timer.names, {n: statistics.median(s[n] for s in samples) for n in timer.names}


def _free_bytes() -> int:
    """Free device memory as seen by this process: Numba's own table where it keeps one (so other
    processes on the GPU do not disturb it, see :func:`device.numba_device_bytes`), else the GPU's."""
    from numba import cuda

    held = device.numba_device_bytes()
    if held is not None:
        return -held
    return cuda.current_context().get_memory_info().free


def _flush_frees() -> None:
    """Free what Numba has queued for freeing (the simulator frees at once)."""
    from numba import cuda

    pending = getattr(cuda.current_context(), "deallocations", None)
    if pending is not None:
        pending.clear()


def peak_memory(kernel: str, BH: int, N: int, d: int) -> int:
    """Device bytes in use at the peak of forward + backward, inputs included.

    Numba frees device arrays lazily; inside ``cuda.defer_cleanup()`` it frees
    none, so the free memory just after a pass, against a baseline taken before
    the inputs were allocated, counts every buffer the pass held.  The forward's
    temporaries (S and P for the standard path) are freed before the backward;
    O and L stay, as they would for training.
    """
    from numba import cuda

    _flush_frees()
    free0 = _free_bytes()
    q, k, v, do = random_inputs(BH, N, d)
    with cuda.defer_cleanup():
        f = forward(kernel, q, k, v)
        device.synchronize()
        peak = free0 - _free_bytes()
    _flush_frees()
    with cuda.defer_cleanup():
        backward(kernel, q, k, v, f.o, f.lse, do)
        device.synchronize()
        peak = max(peak, free0 - _free_bytes())
    del q, k, v, do, f
    _flush_frees()
    return peak


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a CUDA out-of-memory error (Numba's or PyTorch's)."""
    text = f"{type(exc).__name__} {exc}".upper().replace(" ", "_")
    return "OUT_OF_MEMORY" in text or "OUTOFMEMORY" in text


def warm_up(kernel: str, d: int) -> None:
    """Compile the kernels of both passes (a tiny call), so later wall times are run times."""
    q, k, v, do = random_inputs(1, 64, d)
    f = forward(kernel, q, k, v)
    backward(kernel, q, k, v, f.o, f.lse, do)
    device.synchronize()


def _torch():
    """PyTorch when importable with a CUDA device, else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


# ---------------------------------------------------------------------------- output


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(run: Run, fig, stem: str) -> Path:
    fig.text(0.995, 0.005, run.stamp, ha="right", va="bottom", fontsize=7, color="0.4")
    path = run.out / f"{stem}.png"
    fig.savefig(path, dpi=130)
    _plt().close(fig)
    return path


def write_csv(path: Path, comments: list, rows: list) -> Path:
    """``rows`` (dicts) as CSV, after ``# `` comment lines; columns in first-seen order."""
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        for line in comments:
            f.write(f"# {line}\n")
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_csv(path) -> list:
    """A figure's CSV as a list of dicts (strings), its ``#`` lines skipped."""
    with open(path, newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def _header(run: Run, title: str, *notes) -> list:
    return [title, f"device: {run.label}; date: {run.date}; flash_numba {__version__}", *notes]


def _gb(x) -> float:
    return x / 1e9


def _sig(x: float) -> float:
    """``x`` to 5 significant digits, for the CSV files."""
    return float(f"{x:.5g}")


# ---------------------------------------------------------------------------- figure 1


def figure1(run: Run) -> list:
    """The paper's Figure 2 (left): GFLOPs, HBM GB and ms, standard vs FlashAttention, GPT-2 medium."""
    s = run.sizes
    B, H, N = s.table
    BH, d = B * H, s.d
    rows = []
    for kernel in run.kernels:
        per_pass = {}
        for pass_ in ("forward", "backward"):
            m32 = model(kernel, pass_, BH, N, d)
            m16 = model(kernel, pass_, BH, N, d, np.float16)
            per_pass[pass_] = {
                "gflops": sum(flops(m32.per_kernel, BH, N, d).values()) / 1e9,
                "read": m32.bytes_read,
                "written": m32.bytes_written,
                "gb": _gb(m32.total),
                "gb16": _gb(m16.total),
            }
        note = ""
        if run.gpu:
            # Bytes are linear in B*H (every (batch, head) moves the same): count few, scale exactly.
            BHc = min(s.table_count_BH, BH)
            fwd, bwd = counted(kernel, BHc, N, d)
            for pass_, hbm in (("forward", fwd), ("backward", bwd)):
                per_pass[pass_]["counted"] = _gb(hbm.total * BH / BHc)
                if hbm != model(kernel, pass_, BHc, N, d):
                    print(f"figure 1: MISMATCH {kernel} {pass_}: " + differences(hbm, model(kernel, pass_, BHc, N, d)))
            (t_fwd, t_bwd), BHt = _time_passes(kernel, BH, N, d)
            per_pass["forward"]["ms"], per_pass["backward"]["ms"] = t_fwd, t_bwd
            if BHt != BH:
                note = f"timed at B*H = {BHt} (out of memory at {BH}), times scaled by {BH // BHt}"
        for pass_ in ("forward", "backward", "total"):
            if pass_ == "total":
                p = {key: per_pass["forward"][key] + per_pass["backward"][key] for key in per_pass["forward"]}
            else:
                p = per_pass[pass_]
            paper = PAPER.get(kernel, (None,) * 3) if pass_ == "total" else (None,) * 3
            rows.append(
                {
                    "implementation": kernel,
                    "pass": pass_,
                    "gflops": _sig(p["gflops"]),
                    "model_bytes_read": p["read"],
                    "model_bytes_written": p["written"],
                    "model_gb": _sig(p["gb"]),
                    "model_gb_fp16": _sig(p["gb16"]),
                    "counted_gb": _sig(p["counted"]) if "counted" in p else "",
                    "ms": _sig(p["ms"]) if "ms" in p else "",
                    "paper_gflops": "" if paper[0] is None else paper[0],
                    "paper_gb": "" if paper[1] is None else paper[1],
                    "paper_ms": "" if paper[2] is None else paper[2],
                    "note": note,
                }
            )
    title = f"Figure 1: standard attention vs FlashAttention, GPT-2 medium (B = {B}, H = {H}, N = {N}, d = {d})"
    csv_path = write_csv(
        run.out / "fig1_paper_table.csv",
        _header(
            run,
            title,
            "model_*: IO model, float32 unless _fp16; counted_gb: counted at a smaller B*H and scaled (exact); "
            "paper_*: arXiv v2 (A100, float16) on the total rows",
        ),
        rows,
    )
    md_path = run.out / "fig1_paper_table.md"
    md_path.write_text(_figure1_markdown(run, rows, title))
    return [csv_path, _figure1_png(run, rows, title), md_path]


def _time_passes(kernel: str, BH: int, N: int, d: int, shrink: bool = True):
    """((forward ms, backward ms) scaled to B*H, B*H timed); ``shrink``: halve B*H while out of memory."""
    BHt = BH
    while True:
        try:
            q, k, v, do = random_inputs(BHt, N, d)
            f = forward(kernel, q, k, v)
            t_fwd = median_ms(lambda: forward(kernel, q, k, v))
            t_bwd = median_ms(lambda: backward(kernel, q, k, v, f.o, f.lse, do))
            return (t_fwd * BH / BHt, t_bwd * BH / BHt), BHt
        except Exception as exc:
            if not (shrink and out_of_memory(exc)) or BHt == 1:
                raise
            q = k = v = do = f = None
            _flush_frees()
            BHt //= 2


_TABLE_COLUMNS = (
    ("implementation", "implementation", ""),
    ("pass", "pass", ""),
    ("gflops", "GFLOPs", ".1f"),
    ("model_gb", "HBM GB\nmodel fp32", ".2f"),
    ("model_gb_fp16", "HBM GB\nmodel fp16", ".2f"),
    ("counted_gb", "HBM GB\ncounted", ".2f"),
    ("ms", "ms (fp32)\nthis GPU", ".2f"),
    ("paper_gflops", "paper\nGFLOPs", ".1f"),
    ("paper_gb", "paper\nHBM GB", ".1f"),
    ("paper_ms", "paper ms\n(A100)", ".1f"),
)


def _cell(row, key, spec) -> str:
    value = row[key]
    return value if not spec or value == "" else format(value, spec)


def _figure1_png(run: Run, rows: list, title: str) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.3 * len(rows)))
    ax.axis("off")
    cells = [[_cell(r, key, spec) for key, _, spec in _TABLE_COLUMNS] for r in rows]
    table = ax.table(cellText=cells, colLabels=[label for _, label, _ in _TABLE_COLUMNS], loc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.scale(1, 1.4)
    for (r, _), cell in table.get_celld().items():
        if r == 0:
            cell.set_height(cell.get_height() * 1.8)
    ax.set_title(title, fontsize=10)
    return _save(run, fig, "fig1_paper_table")


def _figure1_markdown(run: Run, rows: list, title: str) -> str:
    B, H, N = run.sizes.table
    BH, d = B * H, run.sizes.d
    head = [label.replace("\n", " ") for _, label, _ in _TABLE_COLUMNS]
    lines = [f"# {title}", "", f"{run.label}, {run.date}. No mask, no dropout.", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cell(r, key, spec) for key, _, spec in _TABLE_COLUMNS) + " |" for r in rows]
    lines += [f"\n{r['implementation']}: {r['note']}" for r in rows if r["pass"] == "total" and r["note"]]
    total = {r["implementation"]: r for r in rows if r["pass"] == "total"}
    matmul_gflops = 12 * N * N * d * BH / 1e9  # the 2 forward and 4 backward products, 2 FLOPs per multiply-add
    once_elems = 14 * N * N * BH  # each N x N matrix once per standard kernel that touches it
    lines += [
        "",
        "Paper (arXiv v2, June 2022; A100, float16, with dropout): standard attention 66.6 GFLOPs, "
        "40.3 GB, 41.7 ms; FlashAttention 75.2 GFLOPs, 4.4 GB, 7.3 ms.  Another version of the paper "
        "(key-padding mask, no dropout): 35.3 GB, 35.1 ms against 4.4 GB, 11.7 ms.",
        "",
        "## Why the numbers differ",
        "",
        f"* **FLOP convention.**  Ours: 2 FLOPs per multiply-add of every matrix product plus one per "
        f"elementwise operation on a score (`FLOPS` in `flash_numba/figures.py`).  The paper does not state "
        f"its convention: the matrix products of standard attention alone (4 N^2 d forward, 8 N^2 d backward, "
        f"per head) come to {matmul_gflops:.0f} GFLOPs here, {matmul_gflops / 66.6:.0f}x its 66.6.  Compare "
        f"ratios instead: the paper's FlashAttention does 75.2 / 66.6 = 1.13x the work of standard attention.",
    ]
    if "standard" in total and "flash2" in total:
        ratio = total["flash2"]["gflops"] / total["standard"]["gflops"]
        lines += [
            f"  Ours: {ratio:.2f}x, because our flash2 backward recomputes S and dP in both of its kernels "
            "(dK, dV and dQ: 14 N^2 d against the paper's 10 N^2 d), and our standard backward recomputes S "
            "(2 N^2 d more than a standard backward that keeps P).",
        ]
    lines += [
        "* **float32 vs float16.**  Our kernels run in float32 here, 4 bytes an element against the paper's 2: "
        "the fp16 column is the same model with 2-byte storage (L and accumulators stay float32).",
        "* **Counting convention.**  Our bytes are the bytes the code *requests*, every re-read included: the "
        "standard matrix product stages 16 x 16 tiles, so it reads each input N / 16 times, and flash1 reads "
        "and writes O, l, m once per K/V block.  The paper's bytes are (we take it) measured DRAM traffic, in "
        "which the L2 cache absorbs most re-reads; `flash-numba profile` shows Nsight Compute's DRAM bytes "
        "beside our counts.  Reading or writing each N x N matrix once per kernel that uses it, our standard "
        f"path moves 14 N^2 elements per head (4 forward, 10 backward): {once_elems * 4 / 1e9:.1f} GB in "
        f"float32, {once_elems * 2 / 1e9:.1f} GB in float16, the paper's order of magnitude.",
        "* **Dropout and mask.**  The paper's standard attention (PyTorch) writes a dropout mask in the forward "
        "pass and reads it back in the backward, and the other version applies a key-padding mask; ours has "
        "neither.",
        "* **Our standard backward recomputes S and P** (the API keeps nothing between passes): S written and "
        "read again and P written, 3 N^2 elements per head that an autograd which saves P does not move.",
        "* **Runtime.**  The paper's kernels run float16 on an A100's tensor cores; ours are float32 Numba "
        "kernels on CUDA cores" + ("" if run.gpu else " (not timed here: no GPU)") + ".",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- figure 2


def figure2(run: Run) -> list:
    """Block size (Br, Bc) against forward HBM bytes and runtime, N = 1024, d = 64."""
    s = run.sizes
    N, d, BH = s.block_N, s.d, s.block_BH
    flash = [k for k in BLOCK_SWEEP if k in run.kernels]
    if not flash:
        raise Skipped(f"none of {', '.join(BLOCK_SWEEP)} has an IO model")
    rows = []
    for kernel in flash:
        if run.gpu:
            q, k, v, _ = random_inputs(BH, N, d)
        for Br in s.block_Br:
            for Bc in s.block_Bc:
                try:
                    block = resolve_block(kernel, d, DTYPE, (Br, Bc), "forward")
                except ValueError:  # does not fit the shared memory or the kernel's limits
                    continue
                m = model(kernel, "forward", BH, N, d, block=block)
                row = {"kernel": kernel, "Br": Br, "Bc": Bc, "N": N, "d": d, "BH": BH}
                row.update(model_bytes_read=m.bytes_read, model_bytes_written=m.bytes_written)
                row["model_gb"] = _sig(_gb(m.total))
                if run.gpu:  # every block size is a new kernel: its first call compiles it (untimed)
                    row["ms"] = _sig(median_ms(lambda: attention_forward(q, k, v, kernel=kernel, block=block)))
                rows.append(row)
    csv_path = write_csv(
        run.out / "fig2_block_size.csv",
        _header(run, f"Figure 2: block size vs forward HBM bytes and runtime (N = {N}, d = {d}, B*H = {BH}, float32)",
                "model_*: IO model (equal to the counters: figure 3 and the tests check it)"),
        rows,
    )
    plt = _plt()
    timed = run.gpu
    fig, axes = plt.subplots(2 if timed else 1, len(flash), figsize=(4.5 * len(flash), 6.5 if timed else 3.6),
                             squeeze=False)
    for col, kernel in enumerate(flash):
        mine = [r for r in rows if r["kernel"] == kernel]
        ax = axes[0][col]
        for i, Br in enumerate(sorted({r["Br"] for r in mine})):
            pts = [r for r in mine if r["Br"] == Br]
            ax.plot([r["Bc"] for r in pts], [r["model_gb"] for r in pts], marker="o", color=f"C{i}",
                    label=f"Br = {Br}")
            if timed:
                axes[1][col].plot([r["Bc"] for r in pts], [r["ms"] for r in pts], marker="s", color=f"C{i}",
                                  label=f"Br = {Br}")
        ax.set_title(f"{kernel} forward", fontsize=10)
        ax.set_ylabel("HBM bytes (GB), IO model")
        ax.set_xlabel("Bc")
        ax.legend(fontsize=7)
        ax.set_ylim(bottom=0)
        if timed:
            axes[1][col].set_ylabel("runtime (ms)")
            axes[1][col].set_xlabel("Bc")
            axes[1][col].set_ylim(bottom=0)
    fig.suptitle(f"Block size vs HBM accesses{' and runtime' if timed else ''} (N = {N}, d = {d}, B*H = {BH})",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return [csv_path, _save(run, fig, "fig2_block_size")]


# ---------------------------------------------------------------------------- figure 3


def figure3(run: Run) -> list:
    """HBM bytes against N per kernel (B*H = 1), modelled and counted, log-log, with Theta slopes."""
    s = run.sizes
    d = s.d
    rows, n_counted, n_differ = [], 0, 0
    for kernel in run.kernels:
        for N in s.seq_N:
            for pass_ in ("forward", "backward"):
                rows.append(_bytes_row(kernel, pass_, N, d, "model", model(kernel, pass_, 1, N, d)))
            if run.count and N <= s.seq_count_max:
                for pass_, hbm in zip(("forward", "backward"), counted(kernel, 1, N, d)):
                    rows.append(_bytes_row(kernel, pass_, N, d, "counted", hbm))
                    n_counted += 1
                    if hbm != model(kernel, pass_, 1, N, d):
                        n_differ += 1
                        print(f"figure 3: MISMATCH {kernel} {pass_} N = {N}: "
                              + differences(hbm, model(kernel, pass_, 1, N, d)))
    if n_counted:
        print(f"figure 3: {n_counted} passes counted, {n_counted - n_differ} equal to the IO model")
    csv_path = write_csv(
        run.out / "fig3_hbm_vs_seqlen.csv",
        _header(run, f"Figure 3: HBM bytes vs sequence length (B*H = 1, d = {d}, float32)",
                "source: model = flash_numba.iomodel, counted = count_hbm=True"),
        rows,
    )
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    M = device.STATIC_SHARED_LIMIT // DTYPE.itemsize  # SRAM elements of one block
    for ax, pass_ in zip(axes, ("forward", "backward")):
        ref = {}
        for kernel in run.kernels:
            pts = [r for r in rows if r["kernel"] == kernel and r["pass"] == pass_]
            mod = [r for r in pts if r["source"] == "model"]
            cnt = [r for r in pts if r["source"] == "counted"]
            color = COLORS.get(kernel)
            ax.plot([r["N"] for r in mod], [r["total"] for r in mod], color=color, label=f"{kernel} (model)")
            if cnt:
                ax.plot([r["N"] for r in cnt], [r["total"] for r in cnt], "o", color=color, mfc="none",
                        label=f"{kernel} (counted)")
            ref[kernel] = mod[-1]
        N = np.array(s.seq_N, dtype=float)
        if "standard" in ref:
            top = ref["standard"]
            c = top["total"] / (top["N"] * d + top["N"] ** 2)
            ax.plot(N, c * (N * d + N**2), "k--", lw=0.8, label="Theta(N d + N^2)")
        anchor = next((ref[k] for k in ("flash1", "flash2") if k in ref), None)
        if anchor is not None:
            c = anchor["total"] / (anchor["N"] ** 2 * d**2 / M)
            ax.plot(N, c * N**2 * d**2 / M, "k:", lw=0.8, label=f"Theta(N^2 d^2 / M), M = {M}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("HBM bytes read + written")
        ax.set_title(f"{pass_}, d = {d}, one head, float32", fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return [csv_path, _save(run, fig, "fig3_hbm_vs_seqlen")]


def _bytes_row(kernel, pass_, N, d, source, hbm) -> dict:
    return {"kernel": kernel, "pass": pass_, "N": N, "d": d, "BH": 1, "source": source,
            "bytes_read": hbm.bytes_read, "bytes_written": hbm.bytes_written, "total": hbm.total}


# ---------------------------------------------------------------------------- figure 4


def figure4(run: Run) -> list:
    """Peak device memory of forward + backward against N, up to where standard attention runs out."""
    if not run.gpu:
        raise Skipped("needs a GPU: device memory is measured, not modelled")
    s = run.sizes
    d, BH = s.d, s.mem_BH
    rows = []
    for kernel in run.kernels:
        warm_up(kernel, d)
        stop = None
        for N in s.mem_N:
            if stop:
                break
            row = {"kernel": kernel, "N": N, "d": d, "BH": BH}
            start = time.perf_counter()
            try:
                row["peak_mib"] = _sig(peak_memory(kernel, BH, N, d) / 2**20)
            except Exception as exc:
                if not out_of_memory(exc):
                    raise
                _flush_frees()
                stop = row["note"] = f"out of memory at N = {N}"
                rows.append(row)
                print(f"figure 4: {kernel}: {stop}; series stopped")
                continue
            rows.append(row)
            if time.perf_counter() - start > s.slow_s:
                stop = f"stopped after N = {N} (slow)"
                print(f"figure 4: {kernel}: {stop}")
    std = {r["N"]: r["peak_mib"] for r in rows if r["kernel"] == "standard" and "peak_mib" in r}
    for r in rows:
        if "peak_mib" in r and r["N"] in std:
            r["standard_over_this"] = _sig(std[r["N"]] / r["peak_mib"])
    csv_path = write_csv(
        run.out / "fig4_memory.csv",
        _header(run, f"Figure 4: peak device memory of forward + backward (B*H = {BH}, d = {d}, float32)",
                "peak_mib: inputs q, k, v, dO included; measured from the free device memory with frees deferred"),
        rows,
    )
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for kernel in run.kernels:
        pts = [r for r in rows if r["kernel"] == kernel and "peak_mib" in r]
        ax.plot([r["N"] for r in pts], [r["peak_mib"] for r in pts], marker="o", color=COLORS.get(kernel),
                label=kernel)
        oom = [r for r in rows if r["kernel"] == kernel and "out of memory" in r.get("note", "")]
        if oom:
            ax.axvline(oom[0]["N"], color=COLORS.get(kernel), ls=":", lw=0.8)
            ax.text(oom[0]["N"], 0.03, f"{kernel}: out of memory", transform=ax.get_xaxis_transform(),
                    fontsize=7, rotation=90, va="bottom", ha="right")
    for r in rows:
        if r["kernel"] == "flash2" and "standard_over_this" in r:
            ax.annotate(f"{r['standard_over_this']:.0f}x", (r["N"], r["peak_mib"]), fontsize=7,
                        textcoords="offset points", xytext=(0, -11), ha="center")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("peak device memory (MiB)")
    ax.set_title(f"Memory of forward + backward, B*H = {BH}, d = {d}, float32"
                 + (" (labels: standard / flash2)" if std else ""), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return [csv_path, _save(run, fig, "fig4_memory")]


# ---------------------------------------------------------------------------- figure 5


def figure5(run: Run) -> list:
    """Runtime against N for every implementation (and PyTorch SDPA), and the standard path per kernel."""
    if not run.gpu:
        raise Skipped("needs a GPU: runtimes are measured")
    s = run.sizes
    d, BH = s.d, s.time_BH
    rows = []
    for kernel in run.kernels:
        warm_up(kernel, d)
        rows += _time_series(kernel, s, lambda N, kernel=kernel: _time_passes(kernel, BH, N, d, False)[0])
    torch = _torch()
    if torch is not None:
        rows += _time_series("torch SDPA", s, lambda N: _torch_ms(torch, BH, N, d))
        torch.cuda.empty_cache()  # hand PyTorch's cached blocks back before Numba allocates again
    else:
        print("figure 5: PyTorch with CUDA not importable; no SDPA series")
    for r in rows:
        r.update(BH=BH, d=d)
    paths = [write_csv(
        run.out / "fig5_runtime.csv",
        _header(run, f"Figure 5: runtime vs sequence length (B*H = {BH}, d = {d}, float32)",
                "median of 3-10 calls after one untimed call, CUDA events; torch SDPA: backend chosen by PyTorch"),
        rows,
    )]
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for ax, key, what in zip(axes, ("fwd_ms", "total_ms"), ("forward", "forward + backward")):
        for name in dict.fromkeys(r["implementation"] for r in rows):
            pts = [r for r in rows if r["implementation"] == name and r.get(key, "") != ""]
            ax.plot([r["N"] for r in pts], [r[key] for r in pts], marker="o", color=COLORS.get(name), label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("time (ms)")
        ax.set_title(f"{what}, B*H = {BH}, d = {d}, float32", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    paths.append(_save(run, fig, "fig5_runtime"))
    if "standard" in run.kernels:
        paths += _standard_breakdown(run)
    return paths


def _time_series(name: str, s: Sizes, time_fn) -> list:
    """Rows of (forward, backward) ms over s.time_N; stops after an out-of-memory error or a slow call."""
    rows, stop = [], None
    for N in s.time_N:
        if stop:
            break
        row = {"implementation": name, "N": N}
        try:
            t_fwd, t_bwd = time_fn(N)
        except Exception as exc:
            if not out_of_memory(exc):
                raise
            _flush_frees()
            stop = row["note"] = f"out of memory at N = {N}"
            print(f"figure 5: {name}: {stop}; series stopped")
            rows.append(row)
            continue
        row.update(fwd_ms=_sig(t_fwd), bwd_ms=_sig(t_bwd), total_ms=_sig(t_fwd + t_bwd))
        rows.append(row)
        if (t_fwd + t_bwd) / 1000 > s.slow_s:
            stop = f"stopped after N = {N} (slow)"
            print(f"figure 5: {name}: {stop}")
    return rows


def _torch_ms(torch, BH: int, N: int, d: int):
    """(forward ms, backward ms) of torch.nn.functional.scaled_dot_product_attention, float32."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(1, BH, N, d, device="cuda", generator=gen) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_(True)

    def fwd():
        with torch.no_grad():
            sdpa(q, k, v)

    def fwd_bwd():
        sdpa(q, k, v).backward(do)

    def ms(fn):
        fn()
        times = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        return statistics.median(times)

    t_fwd = ms(fwd)
    return t_fwd, ms(fwd_bwd) - t_fwd


def _standard_breakdown(run: Run) -> list:
    """Time of each kernel launch of the standard path, forward and backward."""
    s = run.sizes
    d, BH = s.d, s.time_BH
    rows = []
    for N in s.breakdown_N:
        try:
            q, k, v, do = random_inputs(BH, N, d)
            f = forward("standard", q, k, v)
            arrays = {"q": q, "k": k, "v": v, "o": f.o, "lse": f.lse, "do": do}
            for pass_ in ("forward", "backward"):
                names, ms = launch_times("standard", pass_, arrays)
                total = sum(ms.values())
                for name in names:
                    flop = flops([name], BH, N, d)[name]
                    rows.append({"pass": pass_, "N": N, "BH": BH, "d": d, "launch": name, "ms": _sig(ms[name]),
                                 "share": _sig(ms[name] / total), "gflops": _sig(flop / 1e9)})
        except Exception as exc:
            if not out_of_memory(exc):
                raise
            print(f"figure 5: standard breakdown: out of memory at N = {N}")
            _flush_frees()
    if not rows:
        return []
    paths = [write_csv(
        run.out / "fig5_standard_breakdown.csv",
        _header(run, f"Figure 5b: standard attention, time per kernel launch (B*H = {BH}, d = {d}, float32)",
                f"CUDA events around each launch (figures.LaunchTimer), median of {LAUNCH_REPEATS} passes"),
        rows,
    )]
    plt = _plt()
    bars = list(dict.fromkeys((r["pass"], r["N"]) for r in rows))
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.6 * len(bars)))
    names = list(dict.fromkeys(r["launch"] for r in rows))
    labelled = set()
    for y, (pass_, N) in enumerate(bars):
        left = 0.0
        for r in (r for r in rows if (r["pass"], r["N"]) == (pass_, N)):
            name = r["launch"]
            elementwise = FLOPS[name][0] == 0  # no matrix product
            ax.barh(y, r["share"], left=left, color=f"C{names.index(name) % 10}", hatch="//" if elementwise else None,
                    edgecolor="white", label=None if name in labelled else name)
            labelled.add(name)
            if r["share"] > 0.06:
                ax.text(left + r["share"] / 2, y, f"{100 * r['share']:.0f}%", ha="center", va="center", fontsize=7)
            left += r["share"]
    ax.set_yticks(range(len(bars)), [f"{p}, N = {n}" for p, n in bars])
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the pass's time (hatched: elementwise kernels, no matrix product)")
    ax.set_title(f"Standard attention: where the time goes (B*H = {BH}, d = {d}, float32)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    paths.append(_save(run, fig, "fig5_standard_breakdown"))
    return paths


# ---------------------------------------------------------------------------- figure 6


def ceilings(run: Run):
    """(HBM GB/s, float32 TFLOP/s, where they come from): measured on a GPU, else a datasheet."""
    if run.gpu:
        from . import microbench

        bw, peak = microbench.hbm_bandwidth(), microbench.fp32_peak()
        if bw.value is not None and peak.value is not None:
            return bw.value, peak.value, "measured (flash_numba.microbench)"
        name = device.info().name
    else:
        name = "" if device.SIMULATOR else device.info().name
    for key, (gbs, tflops) in DATASHEETS.items():
        if key in name:
            return gbs, tflops, f"{key} datasheet, not measured"
    gbs, tflops = DATASHEETS["H200"]
    return gbs, tflops, "H200 datasheet, not measured"


def _roofline_rows(run: Run, kernel: str, bw: float, peak: float) -> list:
    """One row per launch of both passes: FLOPs, bytes (counted on a GPU, else modelled), time."""
    BH, N = run.sizes.roof
    d = run.sizes.d
    if run.gpu:
        hbm = dict(zip(("forward", "backward"), counted(kernel, BH, N, d)))
        q, k, v, do = random_inputs(BH, N, d)
        f = forward(kernel, q, k, v)
        arrays = {"q": q, "k": k, "v": v, "o": f.o, "lse": f.lse, "do": do}
    rows = []
    for pass_ in ("forward", "backward"):
        bytes_ = hbm[pass_] if run.gpu else model(kernel, pass_, BH, N, d)
        fl = flops(bytes_.per_kernel, BH, N, d)
        ms = None
        if run.gpu:
            names, ms = launch_times(kernel, pass_, arrays)
            if names != list(bytes_.per_kernel):
                raise RuntimeError(f"{kernel} {pass_}: timed launches {names} differ from the counted "
                                   f"{list(bytes_.per_kernel)}")
        for name, kb in bytes_.per_kernel.items():
            if fl[name] == 0:  # initialisation kernels: no arithmetic, no place on a roofline
                continue
            intensity = fl[name] / kb.total
            row = {"implementation": kernel, "pass": pass_, "launch": name, "flops": fl[name],
                   "bytes": kb.total, "bytes_source": "counted" if run.gpu else "model",
                   "intensity": _sig(intensity), "roof_tflops": _sig(min(peak, bw * intensity / 1000))}
            if ms is not None:
                row["ms"] = _sig(ms[name])
                row["tflops"] = _sig(fl[name] / (ms[name] * 1e-3) / 1e12)
            rows.append(row)
    return rows


def figure6(run: Run) -> list:
    """Roofline: every kernel launch at (FLOPs / bytes, FLOPs / time), N = 4096, d = 64, B*H = 32."""
    s = run.sizes
    BH, N = s.roof
    d = s.d
    bw, peak, source = ceilings(run)
    rows = []
    for kernel in run.kernels:
        try:
            rows += _roofline_rows(run, kernel, bw, peak)
        except KeyError as exc:  # a launch name that FLOPS does not know
            print(f"figure 6: {kernel} left out: no FLOP count for launch {exc} (see figures.FLOPS)")
    csv_path = write_csv(
        run.out / "fig6_roofline.csv",
        _header(run, f"Figure 6: roofline (N = {N}, d = {d}, B*H = {BH}, float32)",
                f"ceilings: HBM {bw:.0f} GB/s, float32 {peak:.1f} TFLOP/s ({source})",
                "intensity: FLOPs / bytes requested by the code (re-reads included; the L2 cache serves some, "
                "so a kernel can sit above the bandwidth roof)"),
        rows,
    )
    plt = _plt()
    fig, ax = plt.subplots(figsize=(12, 5.5))
    x = np.logspace(-2, 3, 200)
    ax.plot(x, np.minimum(peak, bw * x / 1000), "k-", lw=1.2)
    ax.text(x[-1], peak * 1.08, f"float32 peak {peak:.1f} TFLOP/s", ha="right", fontsize=8)
    ax.text(0.012, bw * 0.012 / 1000 * 1.3, f"HBM {bw:.0f} GB/s", fontsize=8, rotation=22)
    markers = {"forward": "o", "backward": "s"}
    spots = {}  # points drawn at (about) the same place share one label
    for i, r in enumerate(rows, 1):  # measured: filled, at (intensity, achieved); not timed: hollow, on the roof
        y = r.get("tflops", r["roof_tflops"])
        ax.plot(r["intensity"], y, markers[r["pass"]], color=COLORS.get(r["implementation"]),
                mfc=None if "tflops" in r else "none", ms=6)
        spot = (round(math.log10(r["intensity"]) / 0.03), round(math.log10(max(y, 1e-9)) / 0.03))
        spots.setdefault(spot, (r["intensity"], y, []))[2].append(str(i))
    for x0, y0, labels in spots.values():
        ax.annotate(",".join(labels), (x0, y0), fontsize=6, textcoords="offset points", xytext=(4, 3))
    short = {"forward": "fwd", "backward": "bwd"}
    key = "\n".join(f"{i} {r['implementation']} {short[r['pass']]}: {r['launch']}" for i, r in enumerate(rows, 1))
    ax.text(1.02, 1.0, key, transform=ax.transAxes, fontsize=6, va="top", family="monospace")
    for name in dict.fromkeys(r["implementation"] for r in rows):
        ax.plot([], [], "-", color=COLORS.get(name), label=name)
    ax.plot([], [], "ko", mfc=None if run.gpu else "none", label="forward")
    ax.plot([], [], "ks", mfc=None if run.gpu else "none", label="backward")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs / byte requested)")
    ax.set_ylabel("TFLOP/s" + ("" if run.gpu else " (roofline bound)"))
    placed = "measured time" if run.gpu else "not timed: each kernel drawn at its roofline bound"
    ax.set_title(f"Roofline, N = {N}, d = {d}, B*H = {BH}, float32 ({placed})\nceilings: {source}", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return [csv_path, _save(run, fig, "fig6_roofline")]


# ---------------------------------------------------------------------------- main

FIGURES = {1: figure1, 2: figure2, 3: figure3, 4: figure4, 5: figure5, 6: figure6}


def device_label(model_only: bool = False) -> str:
    """What the figures name as the device: the GPU's name and sm_XY, or the simulator."""
    if device.SIMULATOR:
        return "Numba CUDA simulator (no GPU)"
    d = device.info()
    name = f"{d.name} (sm_{d.compute_capability[0]}{d.compute_capability[1]})"
    return f"{name}, IO model only (nothing run)" if model_only else name


def main(argv=None, default_out: str | Path = "figures/out") -> int:
    """Make the figures; 0 if every selected figure was made or skipped with a reason."""
    parser = argparse.ArgumentParser(prog="figures/make_all.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", type=int, nargs="+", choices=sorted(FIGURES), metavar="N",
                        help="make only these figures (1-6)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes (a minute or two on a GPU)")
    parser.add_argument("--model-only", action="store_true",
                        help="run no kernel: bytes from the IO model, no times (figures 4, 5 skipped)")
    parser.add_argument("--out", default=str(default_out), help=f"output folder (default {default_out})")
    args = parser.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(device.describe())
    run = Run(
        out=out,
        sizes=sizes_for(args.quick, device.SIMULATOR),
        count=not args.model_only,
        gpu=not args.model_only and not device.SIMULATOR,
        label=device_label(args.model_only),
        kernels=modelled_kernels(),
    )
    failed = []
    for n in args.only or sorted(FIGURES):
        start = time.perf_counter()
        try:
            paths = FIGURES[n](run)
        except Skipped as why:
            print(f"figure {n}: skipped: {why}")
            continue
        except Exception:  # one broken figure does not stop the others
            traceback.print_exc()
            failed.append(n)
            print(f"figure {n}: FAILED")
            continue
        print(f"figure {n} ({time.perf_counter() - start:.1f} s): " + ", ".join(str(p) for p in paths))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
