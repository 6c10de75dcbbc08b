"""Every kernel under NVIDIA compute-sanitizer: out-of-bounds accesses, races, barrier misuse.

Two modes.

The workload (default) runs every kernel version - standard, flash1, flash2,
flash2_fast - forward then backward, plain and counting (``count_hbm=True``),
causal and not, at awkward sizes, all in one process, so that one sanitizer
run checks them all::

    compute-sanitizer --tool memcheck  --error-exitcode 1 python benchmarks/sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python benchmarks/sanitize.py --quick
    compute-sanitizer --tool synccheck --error-exitcode 1 python benchmarks/sanitize.py

Full sizes: N = 17, 97, 1000 and d = 16, 80, 128, every combination with
causal / not and plain / counting (float32), plus float16 and float64 and
Nq != Nk cases and grouped-query attention (k and v with one head for the two
query heads) with dropout; B*H = 2 throughout.  ``--quick`` keeps seven cases per kernel
that still cover every N, every d, both flags, Nq > Nk, Nq < Nk, GQA and dropout (racecheck
slows shared-memory code down by orders of magnitude).  Each case prints one
``ok`` line with its time; the exit status is 1 if a case raised or produced a
non-finite value (uninitialised memory shows up that way).

The driver runs the three sanitizer tools as subprocesses, side by side unless
``--jobs 1`` (they share the GPU and overlap their kernel compilation), and
writes a summary::

    python benchmarks/sanitize.py --matrix OUTDIR [--quick] [--tools memcheck racecheck] [--jobs 1]

It streams progress, keeps each tool's full log (``OUTDIR/<tool>.log``), reads
the ``ERROR SUMMARY: N errors`` line and writes ``OUTDIR/sanitize.md`` and
``OUTDIR/sanitize.csv`` (tool, kernels covered, errors, exit status, wall time,
date, GPU, command).  It exits 0 only if every tool finished every case with 0 errors.

Without a GPU both modes say so, list what they would run and exit 0.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import datetime as _dt
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np



def _kernel_names() -> tuple[str, ...]:
    """Every kernel of the registry, and ``NAME-atomic`` (deterministic=False) where a kernel has that path."""
    from flash_numba import kernels

    names = []
    for name in kernels.NAMES:
        names.append(name)
        if kernels.get(name).supports_atomic:
            names.append(f"{name}-atomic")
    return tuple(names)


KERNELS = _kernel_names()  # standard, flash1, flash2, flash2_fast(-atomic), flash2_tc(-atomic)
TOOLS = ("memcheck", "racecheck", "synccheck")
LEAD = (1, 2)  # (B, H): B*H = 2
OK = "ok"  # first word of a workload line for a case that passed


@dataclass(frozen=True)
class Case:
    kernel: str
    dtype: str
    Nq: int
    Nk: int
    d: int
    causal: bool
    count: bool
    Hkv: int = LEAD[1]  # heads of k and v: 1 is grouped-query attention, both query heads on one
    dropout: float = 0.0  # dropout_p (the paper's dropout, its mask regenerated in the backward)

    @property
    def label(self) -> str:
        flags = " causal" * self.causal + " count" * self.count + f" Hkv={self.Hkv}" * (self.Hkv != LEAD[1])
        flags += f" dropout={self.dropout}" * (self.dropout > 0)
        return f"{self.kernel} {self.dtype} Nq={self.Nq} Nk={self.Nk} d={self.d}{flags}"


def _fit(case: Case) -> Case | None:
    """The case as its kernel runs it: float32 becomes the kernel's first dtype where it has no float32
    (flash2_tc: float16); None where the kernel does not run the dtype or head dim at all."""
    from flash_numba import kernels

    spec = kernels.get(case.kernel.removesuffix("-atomic"))
    dtype = case.dtype if case.dtype in spec.dtypes or case.dtype != "float32" else spec.dtypes[0]
    if spec.supports(case.d, dtype) is not None:
        return None
    return Case(case.kernel, dtype, case.Nq, case.Nk, case.d, case.causal, case.count, case.Hkv, case.dropout)


def cases(quick: bool = False, kernels=KERNELS) -> list[Case]:
    """The workload: full (every combination) or quick (a covering subset per kernel), each case in a dtype
    and head dim its kernel runs (:func:`_fit`)."""
    fitted = [_fit(c) for c in _cases(quick, kernels)]
    return list(dict.fromkeys(c for c in fitted if c is not None))  # float16 cases may repeat after the fit


def _cases(quick: bool, kernels) -> list[Case]:
    out = []
    for kernel in kernels:
        if quick:
            out += [
                Case(kernel, "float32", 17, 17, 128, True, True),
                Case(kernel, "float32", 97, 97, 16, False, False),
                Case(kernel, "float32", 97, 17, 80, True, False),  # Nq > Nk: rows with no visible key
                Case(kernel, "float32", 17, 97, 80, False, True),
                Case(kernel, "float32", 1000, 1000, 16, True, False),
                Case(kernel, "float16", 17, 17, 80, True, False),
                Case(kernel, "float32", 97, 97, 16, True, True, Hkv=1, dropout=0.25),  # GQA and dropout
            ]
            continue
        for N in (17, 97, 1000):
            for d in (16, 80, 128):
                for causal in (False, True):
                    for count in (False, True):
                        out.append(Case(kernel, "float32", N, N, d, causal, count))
        out += [
            Case(kernel, "float16", 97, 97, 80, True, False),
            Case(kernel, "float64", 97, 97, 80, True, False),
            Case(kernel, "float32", 97, 17, 80, True, True),
            Case(kernel, "float32", 17, 97, 80, True, False),
            Case(kernel, "float32", 97, 97, 16, True, True, Hkv=1),
            Case(kernel, "float32", 17, 97, 80, False, False, Hkv=1, dropout=0.5),
        ]
    return out


def run_case(case: Case, seed: int = 0) -> str:
    """Forward then backward of one case; returns a problem description, or '' when all is well."""
    import flash_numba as fn

    rng = np.random.default_rng(seed)
    dt = np.dtype(case.dtype)
    q = rng.standard_normal(LEAD + (case.Nq, case.d)).astype(dt)
    k, v = (rng.standard_normal(LEAD[:-1] + (case.Hkv, case.Nk, case.d)).astype(dt) for _ in range(2))
    do = rng.standard_normal(q.shape).astype(dt)
    kw = dict(causal=case.causal, count_hbm=case.count, dropout_p=case.dropout, dropout_seed=seed + 1)
    kernel, atomic = case.kernel.removesuffix("-atomic"), case.kernel.endswith("-atomic")
    f = fn.attention_forward(q, k, v, kernel=kernel, **kw)
    b = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel=kernel, deterministic=not atomic, **kw)
    bad = [name for name, x in (("o", f.o), ("dq", b.dq), ("dk", b.dk), ("dv", b.dv)) if not np.isfinite(x).all()]
    return f"non-finite {', '.join(bad)}" if bad else ""


def workload(quick: bool, kernels) -> int:
    """Run every case in this process; 0 if all passed, 1 otherwise."""
    import flash_numba as fn

    todo = cases(quick, kernels)
    print(f"sanitize workload: {len(todo)} cases on {fn.device.describe()}", flush=True)
    failed = 0
    start = time.perf_counter()
    for i, case in enumerate(todo, 1):
        t = time.perf_counter()
        try:
            problem = run_case(case)
        except Exception as exc:  # keep going: the sanitizer report names the kernel
            problem = f"{type(exc).__name__}: {exc}"
        took = time.perf_counter() - t
        if problem:
            failed += 1
            print(f"FAILED [{i}/{len(todo)}] {case.label}: {problem}", flush=True)
        else:
            print(f"{OK} [{i}/{len(todo)}] {case.label} ({took:.1f} s)", flush=True)
    print(f"done: {len(todo) - failed}/{len(todo)} cases passed in {time.perf_counter() - start:.0f} s", flush=True)
    return 1 if failed else 0


# ------------------------------------------------------------------------------------ the driver


def find_sanitizer(explicit: str | None = None) -> str | None:
    """compute-sanitizer: the given path, on PATH, or under $CUDA_HOME / /usr/local/cuda."""
    if explicit:
        return explicit if os.path.isfile(explicit) else None
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            cand = os.path.join(root, "bin", "compute-sanitizer")
            if os.path.isfile(cand):
                return cand
    return None


def tool_command(sanitizer: str, tool: str, quick: bool, kernels) -> list[str]:
    """The command line that checks the whole workload with one tool."""
    cmd = [sanitizer, "--tool", tool, "--error-exitcode", "1", sys.executable, os.path.abspath(__file__)]
    if quick:
        cmd.append("--quick")
    if tuple(kernels) != KERNELS:
        cmd += ["--kernels", *kernels]
    return cmd


def parse_errors(log: str) -> int | None:
    """N from the sanitizer's last summary line; None if there is none.

    memcheck and synccheck end with ``ERROR SUMMARY: N error(s)``; racecheck
    (compute-sanitizer 2025) ends with ``RACECHECK SUMMARY: H hazards displayed
    (N errors, W warnings)`` instead.
    """
    pattern = r"ERROR SUMMARY:\s*([\d,]+)\s+errors?|RACECHECK SUMMARY:.*?\(([\d,]+)\s+errors?"
    found = [a or b for a, b in re.findall(pattern, log)]  # in order of appearance: the last one counts
    return int(found[-1].replace(",", "")) if found else None


def parse_covered(log: str) -> dict[str, int]:
    """Kernel name -> number of workload cases that finished ``ok`` in a log."""
    covered: dict[str, int] = {}
    for m in re.finditer(rf"^{OK} \[\d+/\d+\] (\S+) ", log, flags=re.M):
        covered[m.group(1)] = covered.get(m.group(1), 0) + 1
    return covered


@dataclass
class ToolResult:
    tool: str
    covered: dict
    cases: int  # cases in the workload
    errors: int | None  # from ERROR SUMMARY; None if the tool did not get that far
    returncode: int | None  # None on timeout
    wall_s: float
    date: str
    gpu: str
    command: str

    def row(self) -> dict:
        ok = sum(self.covered.values())
        kernels = ", ".join(f"{k} ({n})" for k, n in self.covered.items()) or "none"
        return {
            "tool": self.tool,
            "kernels covered (cases ok)": f"{kernels}; {ok}/{self.cases} cases",
            "errors": "?" if self.errors is None else self.errors,
            "exit status": "timeout" if self.returncode is None else self.returncode,
            "wall time (s)": f"{self.wall_s:.0f}",
            "date": self.date,
            "GPU": self.gpu,
            "command": self.command,
        }

    @property
    def clean(self) -> bool:
        return self.errors == 0 and self.returncode == 0 and sum(self.covered.values()) == self.cases


def run_tool(cmd: list[str], log_path: str, timeout_s: float, tag: str) -> tuple[str, int | None, float]:
    """Run one sanitizer command, echo progress, save the whole log; (log, returncode or None on timeout, seconds)."""
    start = time.perf_counter()
    killed = threading.Event()
    lines, shown = [], 0
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:

        def kill():
            killed.set()
            proc.kill()

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        with open(log_path, "w") as log:
            for line in proc.stdout:
                log.write(line)
                lines.append(line)
                # workload progress and the summaries; the first 40 sanitizer reports, the rest in the log
                detail = line.startswith("=========") and "SUMMARY" not in line
                if not detail or shown < 40:
                    shown += detail
                    print(f"[{tag} {time.perf_counter() - start:6.0f} s] {line}", end="", flush=True)
        proc.wait()
        timer.cancel()
    if shown >= 40:
        print(f"[{tag}] ... more sanitizer output in {log_path}", flush=True)
    return "".join(lines), (None if killed.is_set() else proc.returncode), time.perf_counter() - start


def write_summary(results: list[ToolResult], outdir: str) -> tuple[str, str]:
    """``sanitize.md`` and ``sanitize.csv`` in ``outdir``; returns their paths."""
    rows = [r.row() for r in results]
    fields = list(rows[0]) if rows else list(ToolResult("", {}, 0, None, None, 0.0, "", "", "").row())
    csv_path = os.path.join(outdir, "sanitize.csv")
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    md_path = os.path.join(outdir, "sanitize.md")
    with open(md_path, "w") as f:
        f.write("# compute-sanitizer matrix\n\n")
        f.write("| " + " | ".join(fields) + " |\n|" + "---|" * len(fields) + "\n")
        for row in rows:
            f.write("| " + " | ".join(str(row[k]).replace("|", "\\|") for k in fields) + " |\n")
        verdict = "clean" if results and all(r.clean for r in results) else "NOT clean: see the logs"
        f.write(f"\n{verdict}; full logs: " + ", ".join(f"`{r.tool}.log`" for r in results) + "\n")
    return md_path, csv_path


def matrix(outdir: str, quick: bool, tools, kernels, sanitizer: str | None, timeout_s: float, jobs: int) -> int:
    """The driver: one sanitizer run per tool (``jobs`` at a time), then the summary; 1 unless all clean."""
    import flash_numba as fn

    todo = cases(quick, kernels)
    exe = find_sanitizer(sanitizer) or "compute-sanitizer"
    if fn.device.SIMULATOR:
        print("no CUDA GPU here (flash_numba runs in the simulator): compute-sanitizer needs a GPU.")
        print(f"On a GPU this would run ({jobs} at a time), writing {outdir}/sanitize.md and sanitize.csv:")
        for tool in tools:
            print("  " + " ".join(tool_command(exe, tool, quick, kernels)))
        print(f"each over {len(todo)} cases:")
        for case in todo:
            print(f"  {case.label}")
        return 0
    if find_sanitizer(sanitizer) is None:
        print("compute-sanitizer not found (looked on PATH, $CUDA_HOME/bin, /usr/local/cuda/bin); use --sanitizer")
        return 2
    os.makedirs(outdir, exist_ok=True)
    gpu = fn.device.info().name

    def check(tool):
        cmd = tool_command(exe, tool, quick, kernels)
        print(f"== {tool}: {' '.join(cmd)}", flush=True)
        date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        log, rc, wall = run_tool(cmd, os.path.join(outdir, f"{tool}.log"), timeout_s, tool)
        return ToolResult(tool, parse_covered(log), len(todo), parse_errors(log), rc, wall, date, gpu, " ".join(cmd))

    # The tools are separate processes: running them side by side shares the GPU and overlaps
    # their CPU-bound kernel compilation.
    done = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for future in concurrent.futures.as_completed([pool.submit(check, tool) for tool in tools]):
            result = future.result()
            done[result.tool] = result
            row = result.row()
            print(
                f"== {result.tool}: {row['errors']} errors, exit {row['exit status']}, {result.wall_s:.0f} s",
                flush=True,
            )
            write_summary([done[t] for t in tools if t in done], outdir)  # as each ends: a later hang loses nothing
    results = [done[t] for t in tools]
    md_path, csv_path = write_summary(results, outdir)
    with open(md_path) as f:
        print(f.read())
    print(f"written: {md_path}, {csv_path}")
    return 0 if all(r.clean for r in results) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrix", metavar="OUTDIR", help="run the sanitizer tools as subprocesses, summary in OUTDIR")
    parser.add_argument("--quick", action="store_true", help="the smaller covering set of cases (racecheck is slow)")
    parser.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    parser.add_argument("--tools", nargs="+", choices=TOOLS + ("initcheck",), default=list(TOOLS), help="driver only")
    parser.add_argument("--sanitizer", help="path of compute-sanitizer (driver only)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per tool before it is killed (driver)")
    parser.add_argument("--jobs", type=int, default=3, help="sanitizer runs at a time (driver; 1 = one after another)")
    args = parser.parse_args(argv)
    kernels = tuple(args.kernels)
    if args.matrix:
        return matrix(args.matrix, args.quick, args.tools, kernels, args.sanitizer, args.timeout, max(1, args.jobs))

    import flash_numba as fn

    if fn.device.SIMULATOR:
        todo = cases(args.quick, kernels)
        print("no CUDA GPU here (flash_numba runs in the simulator): nothing for compute-sanitizer to check.")
        print(f"On a GPU this workload runs {len(todo)} cases, forward then backward each:")
        for case in todo:
            print(f"  {case.label}")
        return 0
    return workload(args.quick, kernels)


if __name__ == "__main__":
    sys.exit(main())
