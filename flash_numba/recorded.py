"""Measurements recorded on a real GPU and committed to the repository, for lessons run without one.

In the simulator nothing can be timed.  The lessons then show what the project
measured on an NVIDIA H200 (``benchmarks/results/h200-2026-11-30-s3/``, see its
README for every command), loaded from the committed files, never typed into a
lesson, and always printed with where they come from and the words "recorded,
not measured now".

* :func:`bench_rows`: rows of the benchmark CSV (``final/D/bench.csv``: every
  kernel and PyTorch SDPA, N = 1024, 4096, 8192, forward and forward+backward).
* :func:`hierarchy`: lesson 1's measured HBM and shared-memory bandwidths and
  float32 peak (``C/lesson_01.log``), with the GPU's SMs and memory.
* :func:`provenance`: the device, date and command lines of a recorded file.

The files are part of the git repository, not of the installed package: from a
clone (``pip install -e .``) they are found; elsewhere :func:`available` is False.
"""

from __future__ import annotations

import re
from pathlib import Path

SESSION = "h200-2026-11-30-s3"
RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / SESSION
BENCH_CSV = RESULTS / "final" / "D" / "bench.csv"
LESSON1_LOG = RESULTS / "C" / "lesson_01.log"
LABEL = "recorded, not measured now"


def available() -> bool:
    """True when the committed results are on disk (a clone of the repository)."""
    return BENCH_CSV.exists() and LESSON1_LOG.exists()


def provenance(path: Path = BENCH_CSV) -> dict:
    """``{"device", "date", "command", "file"}`` from a recorded CSV's ``# key: value`` header lines."""
    out = {"file": str(path.relative_to(RESULTS.parents[2]))}
    for line in path.read_text().splitlines():
        m = re.match(r"# (device|date|command): (.*)", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def bench_rows(implementations=None, pass_: str | None = None, N: int | None = None) -> list[dict]:
    """Rows of the recorded benchmark (strings as in the CSV), filtered by implementation, pass and N."""
    from .tools.bench_report import read_csv

    _, rows = read_csv(str(BENCH_CSV))
    return [
        r for r in rows
        if (implementations is None or r["implementation"] in implementations)
        and (pass_ is None or r["pass"] == pass_)
        and (N is None or int(r["N"]) == N)
        and r["causal"] == "False"
    ]


def bench_table(implementations=None, pass_: str = "fwd", N: int = 4096) -> str:
    """A fixed-width table of recorded times, with its provenance, labelled as recorded."""
    rows = bench_rows(implementations, pass_, N)
    p = provenance()
    lines = [f"{LABEL}: {p.get('device', '?')}", f"  on {p.get('date', '?')}, {p['file']}",
             f"  command: {p.get('command', '?')}",
             f"{'implementation':<20} {'B*H':>4} {'N':>6} {'d':>3} {'pass':>8} {'ms':>9} {'TFLOP/s':>8} {'of peak':>8}"]
    for r in rows:
        bh = int(r["B"]) * int(r["H"])
        peak = f"{float(r['peak_fraction']):.0%}" if r["peak_fraction"] else "-"
        lines.append(f"{r['implementation']:<20} {bh:>4} {int(r['N']):>6} {int(r['d']):>3} {r['pass']:>8} "
                     f"{float(r['ms']):>9.3f} {float(r['tflops']):>8.2f} {peak:>8}")
    return "\n".join(lines)


def hierarchy() -> dict:
    """Lesson 1's measurements on the recorded GPU: {"gpu": line, "sm_count", "shared_per_sm" (bytes),
    "hbm_bytes" (bytes), "hbm_gbs", "shared_gbs", "fp32_tflops"}."""
    text = LESSON1_LOG.read_text()

    def number(pattern):
        return float(re.search(pattern, text).group(1).replace(",", ""))

    gpu = text.splitlines()[0]
    return {
        "gpu": gpu,
        "sm_count": int(number(r"(\d+) SMs")),
        "shared_per_sm": int(number(r"(\d+) KB per SM")) * 1024,
        "hbm_bytes": int(number(r"(\d+) GiB")) * 2**30,
        "hbm_gbs": number(r"HBM bandwidth: ([\d,.]+) GB/s"),
        "shared_gbs": number(r"shared-memory bandwidth: ([\d,.]+) GB/s"),
        "fp32_tflops": number(r"FP32 peak: ([\d,.]+) TFLOP/s"),
    }


def hierarchy_levels() -> dict:
    """The recorded GPU's memory levels for :func:`flash_numba.pictures.memory_hierarchy`."""
    h = hierarchy()
    return {
        "shared memory, all SMs": (h["sm_count"] * h["shared_per_sm"], h["shared_gbs"] * 1e9),
        "HBM": (h["hbm_bytes"], h["hbm_gbs"] * 1e9),
    }
