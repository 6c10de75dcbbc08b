"""The counters against the hardware: our byte counts beside Nsight Compute's.

    flash-numba profile [--kernels K ...] [--BH 8] [--N 1024] [--d 64] [--out DIR] [--no-ncu]

For every kernel launch of each kernel module's forward and backward pass
(float32) it tabulates:

* counted: the bytes the instrumented kernels count (``count_hbm=True``);
* model: the IO model's bytes (the tests hold the two equal);
* ncu DRAM read / write: ``dram__bytes_read.sum`` and ``dram__bytes_write.sum``,
  the bytes that actually crossed between the L2 cache and HBM;
* ncu L2: ``lts__t_bytes.sum``, all the bytes the L2 cache slices served.

The hardware numbers come from Nsight Compute.  When ``ncu`` is on the PATH the
script runs itself again under it::

    ncu --clock-control none --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
        --csv --print-units base --log-file FILE python -m flash_numba.tools.profile --child ...

and parses the CSV (:func:`parse_ncu_csv`).  The child runs each pass once with
the plain kernels; a pass launches exactly the kernels its counters name, in
the same order, so ncu's launches are matched to ours by position.  Without
ncu, in the simulator, or where the driver refuses access to the performance
counters (ERR_NVGPUCTRPERM), it says so and prints our counts alone.  The
table is also written as CSV and Markdown into ``--out``.  :data:`GAP`
explains why the hardware's bytes differ from ours.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import device, kernels
from . import passes
from .csvfile import write_csv

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum")

#: Bytes per unit of ncu's "Metric Unit" column (ncu scales by 1000; "KiB"-style units by 1024).
UNITS = {
    "byte": 1, "bytes": 1, "b": 1,
    "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
    "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}

GAP = """\
Why the hardware's bytes differ from ours:
* L2 hits.  We count the bytes the code requests, every re-read included: the
  standard kernels and flash2 read K and V once per query block (standard also
  writes S and P and reads them back), flash1 reads and writes O, l, m once per K/V block.  The L2
  cache (6 MB on a T4, 40 MB on an A100, 50 MB on an H100 or H200) serves a
  re-read when the data is still there, so DRAM reads fall below our count,
  towards one read of each array.
* L1 hits.  Loads that hit in an SM's L1 cache never reach the L2, so even the
  L2 traffic can be below our count.
* Sectors.  L2 and DRAM move 32-byte sectors.  A request that uses part of a
  sector (a row whose length is not a multiple of 32 bytes, one 4-byte L_i) costs
  the whole sector, so small or scattered accesses push the hardware's bytes
  above ours.
* Write-back.  The L2 holds written lines and writes them to DRAM when it evicts
  them, possibly after the kernel ends; a partial-sector write may first read the
  sector.  A launch's DRAM writes can be below or above the bytes it wrote.
* Replay.  ncu runs each kernel several times to collect the metrics and flushes
  the caches before each run, so every launch starts with a cold L2.
"""


@dataclass
class NcuLaunch:
    """One profiled kernel launch: ncu's ID and kernel name, metric values in bytes."""

    id: int
    kernel_name: str
    metrics: dict


def parse_ncu_csv(text: str) -> list:
    """The launches in ncu ``--csv`` output, in ID order.

    ncu writes one row per (launch, metric) under the header ``"ID","Process
    ID","Process Name","Host Name","Kernel Name",...,"Metric Name","Metric
    Unit","Metric Value"``.  Lines before the header (ncu's ``==PROF==``
    messages, the program's own output) and rows whose ID is not a number are
    skipped; values lose their thousands separators and are converted to bytes
    with :data:`UNITS`; a value that is not a number (``n/a``) is left out.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith('"ID"')), None)
    if start is None:
        return []
    launches: dict[int, NcuLaunch] = {}
    for row in csv.DictReader(lines[start:]):
        ident = (row.get("ID") or "").strip()
        if not ident.isdigit():
            continue
        launch = launches.setdefault(int(ident), NcuLaunch(int(ident), row.get("Kernel Name") or "", {}))
        unit = (row.get("Metric Unit") or "").strip().lower()
        try:
            value = float((row.get("Metric Value") or "").replace(",", ""))
        except ValueError:
            continue
        if unit not in UNITS:
            raise ValueError(f"ncu CSV: unknown unit {row.get('Metric Unit')!r} for {row.get('Metric Name')}")
        launch.metrics[row.get("Metric Name")] = value * UNITS[unit]
    return [launches[i] for i in sorted(launches)]


def ncu_command(ncu: str, log_file: str, args: argparse.Namespace) -> list:
    """The command that profiles the child run of this script."""
    return [
        ncu, "--clock-control", "none", "--metrics", ",".join(METRICS), "--csv", "--print-units", "base",
        "--log-file", log_file,
        sys.executable, "-m", "flash_numba.tools.profile", "--child", "--kernels", *args.kernels,
        "--BH", str(args.BH), "--N", str(args.N), "--d", str(args.d),
    ]


def run_ncu(ncu: str, args: argparse.Namespace) -> tuple:
    """``(launches, note)``: ncu's launches of the child run (empty when it failed) and what happened."""
    with tempfile.TemporaryDirectory() as tmp:
        log_file = os.path.join(tmp, "ncu.csv")
        proc = subprocess.run(ncu_command(ncu, log_file, args), capture_output=True, text=True)
        log = Path(log_file).read_text() if os.path.exists(log_file) else ""
    output = "\n".join((log, proc.stdout, proc.stderr))
    if "ERR_NVGPUCTRPERM" in output:
        return [], (
            "ncu: access to the GPU's performance counters was denied (ERR_NVGPUCTRPERM). Run as root, or "
            "load the driver with NVreg_RestrictProfilingToAdminUsers=0 "
            "(https://developer.nvidia.com/ERR_NVGPUCTRPERM); our counts alone follow."
        )
    launches = parse_ncu_csv(log) or parse_ncu_csv(proc.stdout)
    if not launches:
        tail = "\n".join(output.strip().splitlines()[-15:])
        return [], f"ncu ran (exit status {proc.returncode}) but reported no kernel; its last lines:\n{tail}"
    return launches, f"ncu: {len(launches)} launches profiled ({ncu})"


@dataclass
class Row:
    """One kernel launch: our counted and modelled bytes, and ncu's (None when not profiled)."""

    kernel: str
    pass_: str
    launch: str
    counted_read: int
    counted_written: int
    model_read: int
    model_written: int
    dram_read: float | None = None
    dram_write: float | None = None
    l2_bytes: float | None = None

    def fields(self) -> dict:
        def hw(x):
            return "" if x is None else int(round(x))

        dram = None if self.dram_read is None else self.dram_read + (self.dram_write or 0)
        counted = self.counted_read + self.counted_written
        return {
            "kernel": self.kernel,
            "pass": self.pass_,
            "launch": self.launch,
            "counted_read": self.counted_read,
            "counted_written": self.counted_written,
            "model_read": self.model_read,
            "model_written": self.model_written,
            "ncu_dram_read": hw(self.dram_read),
            "ncu_dram_write": hw(self.dram_write),
            "ncu_l2_bytes": hw(self.l2_bytes),
            "dram_over_counted": "" if dram is None or counted == 0 else round(dram / counted, 4),
        }


def our_counts(args: argparse.Namespace) -> list:
    """A :class:`Row` per launch: counted (instrumented kernels) and modelled bytes."""
    rows = []
    for kernel in args.kernels:
        for pass_, hbm in zip(("forward", "backward"), passes.counted(kernel, args.BH, args.N, args.d)):
            predicted = passes.model(kernel, pass_, args.BH, args.N, args.d).per_kernel
            for name, kb in hbm.per_kernel.items():
                m = predicted.get(name)
                rows.append(Row(kernel, pass_, name, kb.bytes_read, kb.bytes_written,
                                m.bytes_read if m else -1, m.bytes_written if m else -1))
    return rows


def attach(rows: list, launches: list) -> str | None:
    """Fill ncu's metrics into ``rows`` by launch order; a note when the counts do not line up."""
    if len(launches) != len(rows):
        return (f"ncu reported {len(launches)} launches but the passes make {len(rows)}: not matched "
                "(ncu's kernels: " + "; ".join(launch.kernel_name[:60] for launch in launches[:12]) + ")")
    for row, launch in zip(rows, launches):
        row.dram_read = launch.metrics.get(METRICS[0])
        row.dram_write = launch.metrics.get(METRICS[1])
        row.l2_bytes = launch.metrics.get(METRICS[2])
    return None


def _bytes(x) -> str:
    return "-" if x is None or x == "" or x < 0 else f"{x:,}"


_COLUMNS = (
    ("counted_read", "counted R"), ("counted_written", "counted W"), ("model_read", "model R"),
    ("model_written", "model W"), ("ncu_dram_read", "DRAM R"), ("ncu_dram_write", "DRAM W"),
    ("ncu_l2_bytes", "ncu L2"),
)


def table(rows: list) -> str:
    """Fixed-width table, bytes per launch."""
    short = {"forward": "fwd", "backward": "bwd"}
    names = [f"{r.kernel} {short[r.pass_]} {r.launch}" for r in rows]
    w = max([len(n) for n in names] + [6])
    lines = [f"{'launch':<{w}}" + "".join(f"  {label:>14}" for _, label in _COLUMNS) + f"  {'DRAM/counted':>12}"]
    for name, r in zip(names, rows):
        f = r.fields()
        ratio = "-" if f["dram_over_counted"] == "" else f"{f['dram_over_counted']:.3f}"
        lines.append(f"{name:<{w}}" + "".join(f"  {_bytes(f[k]):>14}" for k, _ in _COLUMNS) + f"  {ratio:>12}")
    return "\n".join(lines)


def markdown(rows: list, title: str, notes: list) -> str:
    head = ["kernel", "pass", "launch"] + [label + " (bytes)" for _, label in _COLUMNS] + ["DRAM / counted"]
    lines = [f"# {title}", "", *notes, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        f = r.fields()
        cells = [r.kernel, r.pass_, r.launch] + [_bytes(f[k]) for k, _ in _COLUMNS]
        cells.append("-" if f["dram_over_counted"] == "" else f"{f['dram_over_counted']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + GAP


def _child(args: argparse.Namespace) -> int:
    """Run each pass once, plain kernels, nothing printed (ncu is watching)."""
    for kernel in args.kernels:
        q, k, v, do = passes.random_inputs(args.BH, args.N, args.d)
        f = passes.forward(kernel, q, k, v)
        passes.backward(kernel, q, k, v, f.o, f.lse, do)
    device.synchronize()
    return 0


def main(argv=None) -> int:
    """Tabulate our counts, the model and (when ncu runs) the hardware's bytes; 0 unless something broke."""
    parser = argparse.ArgumentParser(prog="flash-numba profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", nargs="+", help="kernels (default: all)")
    parser.add_argument("--BH", type=int, help="batch x heads (default 8; 1 in the simulator)")
    parser.add_argument("--N", type=int, help="sequence length (default 1024; 32 in the simulator)")
    parser.add_argument("--d", type=int, help="head dim (default 64; 16 in the simulator)")
    parser.add_argument("--out", default="figures/out", help="folder for profile.csv and profile.md")
    parser.add_argument("--no-ncu", action="store_true", help="do not run Nsight Compute")
    parser.add_argument("--ncu", default=shutil.which("ncu"), help="path of ncu (default: from PATH)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    small = device.SIMULATOR  # the simulator runs Python threads: tiny sizes
    args.BH = args.BH or (1 if small else 8)
    args.N = args.N or (32 if small else 1024)
    args.d = args.d or (16 if small else 64)
    if args.child:
        return _child(args)
    args.kernels = args.kernels or list(kernels.NAMES)

    print(device.describe())
    rows = our_counts(args)
    if args.no_ncu:
        note = "ncu: not run (--no-ncu)"
    elif device.SIMULATOR:
        note = "ncu: not run (the simulator has no GPU to profile)"
    elif not args.ncu:
        note = "ncu: not found on PATH (Nsight Compute comes with the CUDA toolkit); our counts alone follow"
    else:
        launches, note = run_ncu(args.ncu, args)
        if launches:
            note = attach(rows, launches) or note
    title = (f"HBM bytes per kernel launch: counted, modelled, measured "
             f"(B*H = {args.BH}, N = {args.N}, d = {args.d}, float32)")
    differ = [f"{r.kernel} {r.pass_} {r.launch}" for r in rows
              if (r.counted_read, r.counted_written) != (r.model_read, r.model_written)]
    check = "counted == model for every launch" if not differ else "counted != model for: " + "; ".join(differ)
    notes = [f"{passes.device_label()}, {datetime.date.today().isoformat()}", note, check]
    print(title)
    print(table(rows))
    print("\n".join(notes[1:]))
    print()
    print(GAP)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "profile.csv", [title, *notes], [r.fields() for r in rows])
    (out / "profile.md").write_text(markdown(rows, title, notes))
    print(f"wrote {out / 'profile.csv'} and {out / 'profile.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
