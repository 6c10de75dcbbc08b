"""How the bench reports: a fixed-width table per configuration, footnotes, CSV and a plot.

:class:`Row` is the result of one implementation on one configuration; the
table, the CSV (:func:`write_csv`, read back by :func:`read_csv`) and the
plot derive every number from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..device import SIMULATOR, CudaTimer
from . import csvfile
from .bench_cases import L2_MULTIPLE, MAX_SETS, MIN_SETS, WARMUP, Config

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



def fmt_bytes(n) -> str:
    """``n`` bytes in words: 1.5 GB, 20 kB, 7 B; "-" for None."""
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
        fmt_bytes(row.hbm_bytes),
        hbm_by,
        fmt_bytes(row.mem_bytes),
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
    records = []
    for r in rows:
        c = r.cfg
        frac = r.tflops / peak_tflops if r.tflops is not None and peak_tflops else None
        values = (r.impl, c.B, c.H, c.N, c.d, c.dtype, c.causal, c.pass_, r.ms, r.tflops, frac, int(c.flops),
                  r.hbm_bytes, r.hbm_source, r.mem_bytes, r.status)
        records.append(dict(zip(CSV_FIELDS, values)))
    csvfile.write_csv(path, header, records, CSV_FIELDS)


def read_csv(path: str) -> tuple[list[str], list[dict]]:
    """``(header comment lines, rows as dicts of strings)`` of a file from :func:`write_csv`."""
    return csvfile.read_comments(path), csvfile.read_csv(path)


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
