"""Counted bytes against the DRAM bytes the L2 cache lets through: the sweep's CSV and its figure.

The counters (:mod:`flash_numba.hbm`) count the bytes a kernel's code requests
from global memory: the paper's HBM accesses, in a model with two levels (SRAM
and HBM).  A GPU has a third level between them, the L2 cache, shared by all
SMs.  A re-read whose data is still in L2 (flash2's K_j and V_j, read once per
query block) never reaches DRAM; a matrix far larger than L2 (standard's S of
the whole batch) goes to DRAM and comes back.  ``benchmarks/l2_sweep.py``
measures both with Nsight Compute over N, across the point where S of the batch
outgrows L2, and writes the CSV that :func:`read_sweep` reads and
:func:`figure` draws.
"""

from __future__ import annotations

import math

from . import csvfile

#: L2 cache per GPU in bytes (NVIDIA's datasheets and architecture whitepapers).
L2_BYTES = {"T4": 4 * 2**20, "A100": 40 * 2**20, "H200": 50 * 2**20}
#: Columns of the sweep's CSV, one row per (kernel, N, cache): the launches of one forward summed.
#: ``cache``: "warm" (``ncu --cache-control none``: each launch finds L2 as the previous one left it, as in
#: a real run) or "flushed" (``--cache-control all``, ncu's default: L2 emptied before each launch).
#: ``counted_*``: our counters; ``compulsory``, ``re-reads``, ``S/P``: the IO model's split of the same total.
COLUMNS = ("kernel", "cache", "BH", "N", "d", "dtype", "Br", "Bc", "launches", "counted_read", "counted_written",
           "compulsory", "re-reads", "S/P", "l2_bytes", "dram_read", "dram_write")
CACHE_MODES = {"warm": "none", "flushed": "all"}  # our name -> ncu --cache-control


def crossing_N(BH: int, l2_bytes: int, itemsize: int = 4) -> float:
    """The N at which S of the batch, ``BH * N^2 * itemsize`` bytes, equals ``l2_bytes``."""
    return math.sqrt(l2_bytes / (BH * itemsize))


def write_sweep(path, header: dict, rows: list[dict]) -> None:
    """Write a sweep CSV: ``# key: value`` lines (device, date, command...), then :data:`COLUMNS`."""
    csvfile.write_csv(path, [f"{key}: {value}" for key, value in header.items()], rows, COLUMNS)


def read_sweep(path) -> tuple[dict, list[dict]]:
    """``(header, rows)`` of a sweep CSV: the ``# key: value`` lines, and the rows with numbers as ints."""
    header = dict(line.split(": ", 1) for line in csvfile.read_comments(path) if ": " in line)
    rows = []
    for r in csvfile.read_csv(path):
        missing = [c for c in COLUMNS if c not in r]
        if missing:
            raise ValueError(f"path: {path} lacks the columns {missing}")
        rows.append({c: (r[c] if c in ("kernel", "cache", "dtype") else int(r[c])) for c in COLUMNS})
    return header, rows


def figure(path, l2_bytes: int = L2_BYTES["H200"], l2_name: str = "H200"):
    """DRAM bytes against N for each kernel of the sweep at ``path`` (solid: L2 warm, as in a real run;
    dotted: L2 flushed before each launch), its counted bytes (dashed), and the N where S of the batch
    outgrows the L2 cache (``l2_bytes``) marked.  Returns the Figure."""
    import matplotlib.pyplot as plt

    header, rows = read_sweep(path)
    if not rows:
        raise ValueError(f"path: {path} has no rows")
    BH, d, dtype = rows[0]["BH"], rows[0]["d"], rows[0]["dtype"]
    itemsize = {"float16": 2, "float32": 4, "float64": 8}[dtype]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, kernel in enumerate(dict.fromkeys(r["kernel"] for r in rows)):
        for cache, style in (("warm", "o-"), ("flushed", "x:")):
            sel = sorted((r for r in rows if r["kernel"] == kernel and r["cache"] == cache), key=lambda r: r["N"])
            if sel:
                ax.loglog([r["N"] for r in sel], [r["dram_read"] + r["dram_write"] for r in sel], style,
                          color=f"C{i}", label=f"{kernel}: DRAM, L2 {cache}")
        sel = sorted({r["N"]: r for r in rows if r["kernel"] == kernel}.values(), key=lambda r: r["N"])
        ax.loglog([r["N"] for r in sel], [r["counted_read"] + r["counted_written"] for r in sel], "--",
                  color=f"C{i}", label=f"{kernel}: counted (requested)")
    x = crossing_N(BH, l2_bytes, itemsize)
    ax.axvline(x, color="k", ls=":", lw=1)
    ax.annotate(f"S of the batch = {l2_name} L2 ({l2_bytes / 2**20:.0f} MB)\nat N = {x:,.0f}", (x, 0.97),
                xycoords=("data", "axes fraction"), ha="left", va="top", fontsize=8, xytext=(4, 0),
                textcoords="offset points")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("bytes, one forward")
    ax.set_title(f"forward, B*H = {BH}, d = {d}, {dtype}" + (f": {header['device']}" if "device" in header else ""),
                 fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig
