"""What every figure shares: its sizes, the run it belongs to, and how it writes PNG and CSV files.

Every PNG names the device and the date in its footer (:func:`save`); every
CSV starts with ``#`` lines saying the same (:func:`header`,
written by :func:`flash_numba.tools.csvfile.write_csv`).  While a figure is
made, each row it measures goes at once to its :class:`Points` file, which
keeps the measured rows when the figure fails or is interrupted.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field, replace
from pathlib import Path

from ... import __version__, kernels
from .. import passes, timing
from ..csvfile import RowWriter, read_csv, write_csv

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
    slow_s: float = 2.0  # a series stops once one point takes longer than this


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
    kernels: tuple = tuple(n for n in kernels.NAMES if "float32" in kernels.get(n).dtypes)  # the figures' dtype
    date: str = field(default_factory=lambda: datetime.date.today().isoformat())
    points: Points | None = None  # the figure being made: where its rows go as they are measured

    @property
    def stamp(self) -> str:
        return f"{self.label} | {self.date} | flash_numba {__version__}"

    def record(self, row: dict) -> dict:
        """``row``, written at once to :attr:`points` (when a figure is being made by ``main``)."""
        if self.points is not None:
            self.points.add(row)
        return row


class Points:
    """``<out>/fig<n>_points.csv``: the rows of figure n as they are measured, each flushed at once.

    One line per value (``point``: the row's number, ``column``, ``value``),
    so rows of any columns fit one file.  The file is made at the first row;
    :meth:`remove` deletes it once the figure's own CSV is written, so it is
    left only by a figure that failed or was interrupted, holding what it measured.
    """

    FIELDS = ("point", "column", "value")

    def __init__(self, out: Path, figure: int):
        self.path = Path(out) / f"fig{figure}_points.csv"
        self.figure = figure
        self.count = 0
        self._file: RowWriter | None = None

    def add(self, row: dict) -> None:
        if self._file is None:
            note = "rows measured, kept because the figure did not finish; point numbers a row"
            self._file = RowWriter(self.path, [f"figure {self.figure}: {note}"], self.FIELDS)
        for column, value in row.items():
            self._file.write({"point": self.count, "column": column, "value": value})
        self.count += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def read_points(path) -> list:
    """The rows of a :class:`Points` file, as dicts of strings."""
    rows: dict = {}
    for line in read_csv(path):
        rows.setdefault(line["point"], {})[line["column"]] = line["value"]
    return list(rows.values())


class Skipped(Exception):
    """A figure that cannot be made here; the message says why."""


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no window)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def save(run: Run, fig, stem: str) -> Path:
    """``fig`` as ``<out>/<stem>.png`` with the run's stamp in its footer; the figure is closed."""
    fig.text(0.995, 0.005, run.stamp, ha="right", va="bottom", fontsize=7, color="0.4")
    path = run.out / f"{stem}.png"
    fig.savefig(path, dpi=130)
    pyplot().close(fig)
    return path


def header(run: Run, title: str, *notes) -> list:
    """The comment lines of a figure's CSV: title, device, date, version, then ``notes``."""
    return [title, f"device: {run.label}; date: {run.date}; flash_numba {__version__}", *notes]


def write_data(run: Run, stem: str, rows: list, title: str, *notes) -> Path:
    """``rows`` as ``<out>/<stem>.csv`` under the :func:`header` lines of ``title`` and ``notes``."""
    return write_csv(run.out / f"{stem}.csv", header(run, title, *notes), rows)


def gb(x) -> float:
    return x / 1e9


def sig(x: float) -> float:
    """``x`` to 5 significant digits, for the CSV files."""
    return float(f"{x:.5g}")


def series(run: Run, figure: int, key: dict, Ns, measure, slow_s: float, **fixed) -> list:
    """Rows ``{**key, "N": N, **fixed, **values}`` for ``measure(N) -> (values, seconds)`` over ``Ns``,
    each recorded (:meth:`Run.record`) as it is measured.

    The series stops after an out-of-memory error (its row gets a ``note`` and
    no values) or after a point whose ``seconds`` exceed ``slow_s``; any other
    error propagates.
    """
    name = next(iter(key.values()))
    rows = []
    for N in Ns:
        row = {**key, "N": N, **fixed}
        try:
            values, seconds = measure(N)
        except Exception as exc:  # only out of memory ends a series quietly
            if not timing.out_of_memory(exc):
                raise
            timing.free_pending()
            row["note"] = f"out of memory at N = {N}"
            rows.append(run.record(row))
            print(f"figure {figure}: {name}: {row['note']}; series stopped")
            break
        rows.append(run.record({**row, **values}))
        if seconds > slow_s:
            print(f"figure {figure}: {name}: stopped after N = {N} (slow)")
            break
    return rows


def kernel_series(run: Run, figure: int, Ns, measure, key: str = "kernel", **fixed) -> list:
    """:func:`series` of ``measure(kernel, N)`` for every kernel of the run, each compiled first
    (:func:`~flash_numba.tools.passes.warm_up`) so that no point times a compile."""
    rows = []
    for kernel in run.kernels:
        passes.warm_up(kernel, run.sizes.d)
        rows += series(run, figure, {key: kernel}, Ns, lambda N, kernel=kernel: measure(kernel, N), run.sizes.slow_s,
                       **fixed)
    return rows


def against_n(ax, ylabel: str, title: str, legend_size: int = 8) -> None:
    """Style ``ax`` for a quantity against sequence length: log2 x, log y, labels, title, legend."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=legend_size)
