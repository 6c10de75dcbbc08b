"""Measurements recorded on a real GPU and committed to the repository, for lessons run without one.

In the simulator nothing can be timed.  The lessons then show what the project
measured on an NVIDIA H200, loaded from the recorded files, never typed into a
lesson, and always printed with the GPU, the date or commit, the file they come
from and the words "recorded, not measured now".

The files ship inside the package (``flash_numba/course/data/``, package data in
``pyproject.toml``): copies of files committed under ``benchmarks/results/``, at
the same relative paths, with the ``commit.txt`` and ``smi.csv`` that say which
tree ran on which GPU.  ``data/README.md`` lists every file with its date, GPU,
commit and command.  So the course works from an installed wheel, and every
number names the repository file it comes from (:func:`source_file`).

* :func:`bench_rows`, :func:`bench_table`: the benchmark harness's rows (every kernel and PyTorch SDPA).
* :func:`hierarchy`: lesson 1's measured HBM and shared-memory bandwidths and float32 peak.
* :func:`provenance`, :func:`folder_provenance`: the device, date, command or commit of a recorded file.
* The standard kernel: :data:`STANDARD_BENCH_CSV`, :func:`standard_kernel_times` (each launch alone),
  :func:`ncu_rows` / :func:`ncu_table` (Nsight Compute's DRAM and L2 bytes beside the counted bytes).
* The appendix's tuning story of flash2_fast: :func:`shared_store_conflicts`, :func:`swizzle_rows`,
  :func:`forward_step_rows`, :func:`block_sweep_rows`, :func:`backward_path_rows`, :func:`atomic_block_rows`,
  :func:`host_rows`, :func:`shared_tile_rows`, :func:`split_s_dp_rows`, :func:`dq_lane_rows`.
* Lesson 12's GPT runs: :func:`gpt_csvs`, :func:`gpt_provenance`.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

LABEL = "recorded, not measured now"
#: The copies of the committed results (``benchmarks/results/<folder>/...`` is ``DATA/<folder>/...``).
DATA = Path(__file__).resolve().parent / "data"
_NOV30, _DEC01 = "h200-2026-11-30-s", "h200-2026-12-01-s"  # the results folders are named by date and run
RESULTS = DATA / f"{_NOV30}3"
#: Every kernel and PyTorch SDPA, N = 1024, 4096, 8192, forward and forward + backward (2026-11-30, 243f9c8).
BENCH_CSV = RESULTS / "final" / "D" / "bench.csv"
#: Lesson 1 run as a script on the H200: bandwidths and float32 peak (2026-11-30, 243f9c8).
LESSON1_LOG = RESULTS / "C" / "lesson_01.log"
#: The rebuilt standard kernel (2026-11-30, 48d6ef9): the harness, each launch alone, Nsight Compute's bytes.
STANDARD = DATA / f"{_NOV30}4" / "standard"
STANDARD_BENCH_CSV = STANDARD / "bench.csv"
STANDARD_KERNELS_CSV = STANDARD / "standard_kernels.csv"
NCU_CSV = STANDARD / "ncu_bytes.csv"
#: The latest harness run (2026-12-01 14:30, f932572): flash2_fast (both backwards) and PyTorch's SDPA at d = 32, 64,
#: 80, 96 and 128, N = 4096.
LATEST_BENCH_CSV = DATA / f"{_DEC01}15" / "F" / "run_4096.csv"
#: flash2_fast at explicit blocks, 48 KB of static shared memory against dynamic (2026-11-30, 60cd760).
BLOCK_SWEEP_CSV = DATA / f"{_NOV30}7" / "A" / "sweep.csv"
#: flash2_fast's backward paths: two-pass, split copies of dQ, atomic (2026-11-30, 5386c34).
BACKWARD_PATHS_CSV = DATA / f"{_NOV30}8" / "B" / "paths.csv"
#: Nsight Compute on flash2_fast's forward, d = 64, 64 x 32 blocks, N = 4096, B*H = 32, before the conflict fix
#: (2026-11-30, 3308399): the shipped build first, then two runs of a tensor-core experiment.
FORWARD_NCU_TXT = DATA / f"{_NOV30}9" / "C" / "ncu.txt"
#: The forward with P_ij^T stored swizzled against the one before, alternating twice (2026-11-30, 349728d).
SWIZZLE_CSV = DATA / f"{_NOV30}9" / "G" / "swz.csv"
#: flash2_fast's forward, change by change (2026-12-01): bench.py CSVs ``<tree>_<run>.csv``, the trees alternating,
#: two runs each; ``commit.txt`` lists ``tree commit``.
FORWARD_STEP_FOLDERS = (DATA / f"{_DEC01}10" / "A", DATA / f"{_DEC01}10" / "B")
#: Nsight Compute on the forward after the fix (2026-12-01, b9afcbd): d = 64, the 64 x 64 block it chooses, N = 4096.
FORWARD_NCU_AFTER_TXT = DATA / f"{_DEC01}10" / "C" / "ncu.txt"
#: flash2_fast's backward at explicit blocks (``benchmarks/block_sweep.py``, N = 4096, B*H = 32), 2026-12-01: d = 64
#: (the sweep that chose the atomic backward's 32 x 64 block, 4c03fad) and d = 32 (e39bb8a).
ATOMIC_BLOCK_CSVS = (DATA / f"{_DEC01}11" / "A" / "sweep64.csv", DATA / f"{_DEC01}11" / "C" / "sweep32.csv")
#: Host time of one call (``benchmarks/host_overhead.py``, N = 128, B*H = 32, d = 64), 2026-12-01: before (ab3ab04:
#: flash2_fast's deterministic backward launched D, dK/dV, dQ) and after (fb32521: its dQ kernel computes D),
#: alternating, two runs each.
HOST_CSVS = {(tree, run): DATA / f"{_DEC01}12" / "C" / f"host_{tree}_{run}.csv"
             for tree in ("before", "after") for run in (1, 2)}
#: The d = 128 backward at 32 x 32, N = 4096, B*H = 32 (``benchmarks/block_sweep.py``), 2026-12-01: P and dS in two
#: shared tiles (``old1.csv``, 6b979fe) and in one (``new1.csv``, ``new2.csv``, 75e2f03), alternating.
SHARED_TILE_CSVS = {("two", 1): DATA / f"{_DEC01}13" / "F" / "old1.csv",
                    ("one", 1): DATA / f"{_DEC01}13" / "F" / "new1.csv",
                    ("one", 2): DATA / f"{_DEC01}13" / "F" / "new2.csv"}
#: The d = 128 backward with S^T and dP^T in every thread ("both", e6533b3) or in separate warps ("split", 4f81286),
#: 2026-12-01.
SPLIT_S_DP_CSVS = {"both": DATA / f"{_DEC01}14" / "A" / "old128.csv",
                   "split": DATA / f"{_DEC01}14" / "A" / "new128a.csv"}
#: The d = 64 backward at 32 x 32 and 32 x 64 (``benchmarks/block_sweep.py``, N = 4096, B*H = 32), 2026-12-01
#: (0cf1fe6): the dQ loop's lanes in two groups and in one (``layout.FORCE_DQ_LANE_GROUPS``), alternating.
DQ_LANE_CSVS = {(groups, run): DATA / f"{_DEC01}15" / "E" / f"g{groups}{run}.csv" for groups in (1, 2) for run in "ab"}
#: Lesson 12's GPT trained 500 steps on the H200 with SDPA and with ours (``benchmarks/train_gpt_h200.sh``).
GPT_FOLDER = DATA / "gpt-h200"
GPT_PROVENANCE = {"device": "NVIDIA H200 (sm_90)", "date": "2026-11-30", "commit": "90fa9dd",
                  "command": "bash benchmarks/train_gpt_h200.sh (500 steps, batch 64, N = 256, float32, seed 0)"}
#: L2 cache sizes (bytes; NVIDIA's datasheets and whitepapers) of the GPUs the course talks about.
L2_BYTES = {"T4": 4 * 2**20, "A100": 40 * 2**20, "H200": 50 * 2**20}


#: Date, commit and command of each recorded folder (``data/README.md`` in full), for :func:`cite`.
RUNS = {
    f"{_NOV30}3/final/D": ("2026-11-30", "243f9c8", "python benchmarks/bench.py --n 1024 4096 8192 --kernels ..."),
    f"{_NOV30}3/C": ("2026-11-30", "243f9c8", "lesson 1 run as a script (python lessons/_src/01_memory_hierarchy.py)"),
    f"{_NOV30}4/standard": ("2026-11-30", "48d6ef9", "benchmarks/standard_h200.py bench / ncu "
                                                      "(git show 649aee7:benchmarks/standard_h200.py)"),
    f"{_NOV30}7/A": ("2026-11-30", "60cd760", "the first form of benchmarks/block_sweep.py, N = 4096, B*H = 32"),
    f"{_NOV30}8/B": ("2026-11-30", "5386c34", "python benchmarks/backward_paths.py --shapes 4096x64x32 ..."),
    f"{_NOV30}9/C": ("2026-11-30", "3308399", "ncu on flash2_fast's forward, d = 64, N = 4096, B*H = 32"),
    f"{_NOV30}9/G": ("2026-11-30", "349728d", "benchmarks/bench.py in each tree, alternating twice"),
    f"{_DEC01}10/A": ("2026-12-01", "per tree", "benchmarks/bench.py in each tree, alternating twice"),
    f"{_DEC01}10/B": ("2026-12-01", "per tree", "benchmarks/bench.py in each tree, alternating twice"),
    f"{_DEC01}10/C": ("2026-12-01", "b9afcbd", "ncu on flash2_fast's forward, d = 64, N = 4096"),
    f"{_DEC01}11/A": ("2026-12-01", "4c03fad", "python benchmarks/block_sweep.py --d 64, N = 4096, B*H = 32"),
    f"{_DEC01}11/C": ("2026-12-01", "e39bb8a", "python benchmarks/block_sweep.py --d 32, N = 4096, B*H = 32"),
    f"{_DEC01}12/C": ("2026-12-01", "ab3ab04 / fb32521", "python benchmarks/host_overhead.py --kernels flash2_fast "
                                                        "flash2, alternating"),
    f"{_DEC01}13/F": ("2026-12-01", "6b979fe / 75e2f03", "python benchmarks/block_sweep.py --d 128 --bwd 32x32"),
    f"{_DEC01}14/A": ("2026-12-01", "e6533b3 / 4f81286", "python benchmarks/block_sweep.py --repeats 10, d = 128"),
    f"{_DEC01}15/E": ("2026-12-01", "0cf1fe6", "block_sweep.py --d 64 --bwd 32x32 32x64, lanes forced"),
    f"{_DEC01}15/F": ("2026-12-01", "f932572", "python benchmarks/bench.py --n 4096 --d 32 64 80 96 128 ..."),
}


def cite(path: Path, device: str = "NVIDIA H200 (sm_90)") -> str:
    """One line for a recorded number: "recorded, not measured now", the GPU, date, commit, command and file."""
    rel = Path(path).resolve().relative_to(DATA)
    folder = next((f for f in RUNS if rel.as_posix().startswith(f + "/")), None)
    date, commit, command = RUNS.get(folder, ("?", "?", "?"))
    return f"{LABEL}: {device}, {date}, commit {commit}, {command}; {source_file(path)}"


def source_file(path: Path) -> str:
    """The repository file a packaged copy was taken from: ``benchmarks/results/...``."""
    return "benchmarks/results/" + Path(path).resolve().relative_to(DATA).as_posix()


def available() -> bool:
    """True when the packaged copies of the recorded results are installed (they ship with the package)."""
    return all(p.exists() for p in (BENCH_CSV, LESSON1_LOG, STANDARD_BENCH_CSV, STANDARD_KERNELS_CSV, NCU_CSV,
                                    LATEST_BENCH_CSV, BLOCK_SWEEP_CSV, BACKWARD_PATHS_CSV, *ATOMIC_BLOCK_CSVS,
                                    *HOST_CSVS.values(), *SHARED_TILE_CSVS.values(), *SPLIT_S_DP_CSVS.values()))


def provenance(path: Path = BENCH_CSV) -> dict:
    """``{"device", "date", "command", "file"}`` from a recorded CSV's ``# key: value`` header lines."""
    out = {"file": source_file(path)}
    for line in path.read_text().splitlines():
        m = re.match(r"# (device|date|command): (.*)", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def bench_rows(implementations=None, pass_: str | None = None, N: int | None = None, path: Path = BENCH_CSV,
               d: int | None = None) -> list[dict]:
    """Rows of a recorded benchmark (strings as in the CSV), not causal, filtered by implementation, pass, N and d."""
    from ..tools.bench_report import read_csv

    _, rows = read_csv(str(path))
    return [
        r for r in rows
        if (implementations is None or r["implementation"] in implementations)
        and (pass_ is None or r["pass"] == pass_)
        and (N is None or int(r["N"]) == N)
        and (d is None or int(r["d"]) == d)
        and r["causal"] == "False"
    ]


def bench_table(implementations=None, pass_: str = "fwd", N: int = 4096, path: Path = BENCH_CSV,
                d: int | None = None) -> str:
    """A fixed-width table of recorded times, with its provenance, labelled as recorded."""
    rows = bench_rows(implementations, pass_, N, path, d)
    p = provenance(path)
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
    """The recorded GPU's memory levels for :func:`flash_numba.course.pictures.memory_hierarchy`."""
    h = hierarchy()
    return {
        "shared memory, all SMs": (h["sm_count"] * h["shared_per_sm"], h["shared_gbs"] * 1e9),
        "HBM": (h["hbm_bytes"], h["hbm_gbs"] * 1e9),
    }


def _csv_rows(path: Path) -> list[dict]:
    """The rows of a recorded CSV as dicts of strings, its ``# key: value`` header lines skipped."""
    return list(csv.DictReader(ln for ln in Path(path).read_text().splitlines() if not ln.startswith("#")))


def standard_kernel_times(causal: bool = False) -> dict:
    """``{launch name: ms}``: each standard kernel alone at B*H = 32, N = 4096, d = 64, float32
    (median of 20 calls, CUDA events; :data:`STANDARD_KERNELS_CSV`)."""
    return {r["kernel"]: float(r["ms_median"]) for r in _csv_rows(STANDARD_KERNELS_CSV)
            if (r["causal"] == "True") == causal}


def ncu_rows() -> list[dict]:
    """Nsight Compute's bytes per forward launch (:data:`NCU_CSV`), as ints: ``BH, N, d, kernel, launch,
    counted`` (bytes the code requested, = the IO model), ``dram`` (DRAM read + write), ``l2``
    (``lts__t_bytes.sum``: bytes the L2 slices served)."""
    out = []
    for r in _csv_rows(NCU_CSV):
        x = {key: int(r[key]) for key in r if key not in ("kernel", "launch", "ncu_kernel")}
        out.append({"BH": x["BH"], "N": x["N"], "d": x["d"], "kernel": r["kernel"], "launch": r["launch"],
                    "counted": x["counted_read"] + x["counted_written"],
                    "dram": x["ncu_dram_read"] + x["ncu_dram_write"], "l2": x["ncu_l2_bytes"]})
    return out


def ncu_per_call() -> list[dict]:
    """:func:`ncu_rows` summed over the launches of each forward: ``BH, N, d, kernel, counted, dram, l2``."""
    calls = {}
    for r in ncu_rows():
        key = (r["BH"], r["N"], r["d"], r["kernel"])
        c = calls.setdefault(key, dict(zip(("BH", "N", "d", "kernel"), key), counted=0, dram=0, l2=0))
        for x in ("counted", "dram", "l2"):
            c[x] += r[x]
    return list(calls.values())


def ncu_table() -> str:
    """Counted bytes beside DRAM and L2 bytes per forward launch, labelled as recorded on the H200."""
    gpu = (NCU_CSV.parent / "ncu.txt").read_text().splitlines()[0].removeprefix("gpu: ")
    lines = [f"recorded on the H200, not measured now: {gpu}",
             f"  Nsight Compute, 2026-11-30, commit 48d6ef9, {source_file(NCU_CSV)}",
             f"{'B*H':>4} {'N':>5} {'launch':<20} {'counted MB':>11} {'L2 MB':>9} {'DRAM MB':>9} {'DRAM/counted':>13}"]
    for r in ncu_rows():
        lines.append(f"{r['BH']:>4} {r['N']:>5} {r['launch']:<20} {r['counted'] / 1e6:>11.1f} {r['l2'] / 1e6:>9.1f} "
                     f"{r['dram'] / 1e6:>9.1f} {r['dram'] / r['counted']:>13.2f}")
    return "\n".join(lines)


def block_sweep_rows(d: int | None = None, pass_: str = "forward", path: Path = BLOCK_SWEEP_CSV) -> list[dict]:
    """Rows of the recorded block sweep (:data:`BLOCK_SWEEP_CSV`): d, Br, Bc, mode, causal, ms (strings)."""
    return [r for r in _csv_rows(path) if (d is None or int(r["d"]) == d) and r["pass_"] == pass_]


def backward_path_rows(N: int | None = None, d: int | None = None, path: Path | None = None) -> list[dict]:
    """Rows of the recorded backward paths (:data:`BACKWARD_PATHS_CSV`): N, d, BH, causal, path, copies, ms,
    peak_MB, bitwise_repeat (strings), at ``N`` and ``d`` where given."""
    return [r for r in _csv_rows(path or BACKWARD_PATHS_CSV)
            if (N is None or r["N"] == str(N)) and (d is None or r["d"] == str(d))]


def atomic_block_rows(Bcs=(32, 64), paths=ATOMIC_BLOCK_CSVS) -> list[dict]:
    """The atomic backward (``deterministic=False``) at Br = 32 and key blocks ``Bcs``, from the backward block sweeps:
    d, Br, Bc, causal, ms (strings), and ``file``, ``device`` of the file they come from."""
    out = []
    for path in paths:
        where = folder_provenance(path)
        out += [dict(r, file=where["file"], device=where["device"]) for r in _csv_rows(path)
                if r["mode"] == "atomic" and r["Br"] == "32" and int(r["Bc"]) in Bcs]
    return out


def host_rows(paths=HOST_CSVS) -> list[dict]:
    """The host time of one call on PyTorch tensors (launch plans replayed): ``tree`` (before / after),
    ``run``, ``kernel``, ``pass``, ``host_us`` (float), ``file`` and ``device`` of the file."""
    out = []
    for (tree, run), path in paths.items():
        where = folder_provenance(path)
        out += [dict(r, tree=tree, run=run, host_us=float(r["host_us"]), file=where["file"], device=where["device"])
                for r in _csv_rows(path) if r["inputs"] == "torch"]
    return out


def shared_tile_rows(paths=SHARED_TILE_CSVS) -> list[dict]:
    """The d = 128 backward with P and dS in two shared tiles or one: ``tiles`` ("two" / "one"), ``run``,
    ``mode``, ``causal``, ``dynamic_bytes``, ``ms`` (float), and ``file``, ``device``, ``commit`` of the file."""
    return [r for (tiles, run), path in paths.items()
            for r in _side_by_side_rows(path, tiles == "two", tiles=tiles, run=run)]


def split_s_dp_rows(paths=SPLIT_S_DP_CSVS) -> list[dict]:
    """The d = 128 backward, S^T and dP^T computed by every thread or split across warps: ``threads``
    ("both" / "split"), ``mode``, ``causal``, ``ms`` (float), and ``file``, ``device``, ``commit`` of the file."""
    return [r for threads, path in paths.items()
            for r in _side_by_side_rows(path, threads == "both", threads=threads)]


def dq_lane_rows(paths=DQ_LANE_CSVS) -> list[dict]:
    """The d = 64 backward with the dQ loop's lanes in ``groups`` (1 or 2) groups, ``run`` a or b: the
    block_sweep columns (``ms`` a float), and ``file``, ``device``, ``commit`` of the file (one build, forced)."""
    return [dict(r, groups=groups, run=run, ms=float(r["ms"]), **folder_provenance(path))
            for (groups, run), path in paths.items() for r in _csv_rows(path)]


def _side_by_side_rows(path: Path, old: bool, **fields) -> list[dict]:
    """The rows of a CSV from a run of two trees side by side, each with ``fields``, ``ms`` as a float and the file's
    provenance; ``old``: the tree before the change, whose commit is ``commit_old.txt`` beside it."""
    where = folder_provenance(path)
    if old:
        where["commit"] = (path.parent / "commit_old.txt").read_text().strip()[:7]
    return [dict(r, **fields, ms=float(r["ms"]), **where) for r in _csv_rows(path)]


def shared_store_conflicts(path: Path = FORWARD_NCU_TXT) -> list[dict]:
    """Per kernel Nsight Compute profiled, in the file's order: ``ways`` (the average bank conflict of its shared
    stores), ``store_requests``, ``conflicts``, ``store_wavefronts`` (passes, conflicts included), ``ms`` and the
    device's compute capability ``cc``, from an ``ncu`` text report (its Memory Workload Analysis hint)."""
    out = []
    for report in re.split(r"\n  kernel\[", path.read_text())[1:]:
        m = re.search(r"on average a ([\d.]+) - way bank\s+conflict across all (\d+) shared store requests.*?"
                      r"results in (\d+) bank conflicts.*?of the overall (\d+) wavefronts", report, re.S)
        if m is None:
            continue
        ms = re.search(r"Duration\s+ms\s+([\d.]+)", report)
        cc = re.search(r"CC (\d+\.\d+)", report)
        out.append(dict(ways=float(m[1]), store_requests=int(m[2]), conflicts=int(m[3]), store_wavefronts=int(m[4]),
                        ms=float(ms[1]) if ms else None, cc=cc[1] if cc else None))
    return out


def folder_provenance(path: Path) -> dict:
    """``{"file", "device", "commit"}`` of a result folder: the GPU's name from ``smi.csv`` and the commit
    from ``commit.txt`` beside it (None where absent)."""
    folder = path.parent
    smi, commit = folder / "smi.csv", folder / "commit.txt"
    device = smi.read_text().splitlines()[1].split(",")[0].strip() if smi.exists() else None
    return {"file": source_file(path), "device": device,
            "commit": commit.read_text().strip()[:7] if commit.exists() else None}


def swizzle_rows(path: Path = SWIZZLE_CSV) -> list[dict]:
    """The swizzle experiment's timings: ``tree`` (swizzled / before), ``d``, ``block``, ``causal``, ``ms``."""
    return _csv_rows(path)


def forward_step_rows(folders=FORWARD_STEP_FOLDERS) -> list[dict]:
    """The forward's timings, change by change: bench.py's rows (strings) with ``folder``, ``tree``,
    ``commit`` and ``run`` added, from every ``<tree>_<run>.csv`` in ``folders``."""
    out = []
    for folder in folders:
        commits = dict(line.split() for line in (folder / "commit.txt").read_text().splitlines() if line.strip())
        for path in sorted(folder.glob("*_[0-9].csv")):
            tree, run = path.stem.rsplit("_", 1)
            for r in _csv_rows(path):
                out.append(dict(r, folder=folder.name, tree=tree, commit=commits[tree], run=run))
    return out


def gpt_csvs(attentions) -> list[Path]:
    """The recorded training runs of lesson 12's GPT, one CSV per attention (``gpt_<attn>.csv``)."""
    return [GPT_FOLDER / f"gpt_{attn}.csv" for attn in attentions]


def gpt_provenance() -> str:
    """One line: where the recorded GPT runs come from (GPU, date, commit, command, files)."""
    p = GPT_PROVENANCE
    return (f"{LABEL}: {p['device']}, {p['date']}, commit {p['commit']}, {p['command']}; "
            f"files {source_file(GPT_FOLDER)}/gpt_*.csv")
