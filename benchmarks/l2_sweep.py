"""DRAM and L2 bytes against N for the standard and flash2_fast forwards, across the L2 cache (issue 14).

    python benchmarks/l2_sweep.py --out DIR             # B*H = 8, d = 64, float32, N = 256 .. 8192
    python benchmarks/l2_sweep.py child --Ns 256 512    # (what Nsight Compute watches: one forward of each)

Runs Nsight Compute twice over a child process that calls each forward once per N
(``ncu --clock-control none --cache-control none|all --metrics dram__bytes_read.sum,
dram__bytes_write.sum,lts__t_bytes.sum -k regex:... -c LAUNCHES``): "warm", where each
launch finds the L2 cache as the previous launch left it (as in a real run: the softmax
can read S from L2 while S fits), and "flushed", ncu's default, where the L2 is emptied
before each launch.  Then it counts our bytes (``count_hbm=True``) and splits them by
term with the IO model, and writes, per (kernel, N, cache), counted bytes, the model's
terms, L2 bytes and DRAM bytes to ``DIR/l2_sweep.csv`` (per launch to
``DIR/l2_sweep_launches.csv``) and the figure of :func:`flash_numba.tools.l2.figure` to
``DIR/l2_sweep.png``.  S of the batch is ``B*H * N^2 * 4`` bytes: at B*H = 8 it
outgrows the H200's 50 MB L2 between N = 1024 (32 MB) and N = 2048 (128 MB).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from flash_numba import api, device
from flash_numba.iomodel import terms
from flash_numba.tools import csvfile, l2, profile

KERNELS = ("standard", "flash2_fast")
#: ncu's names of our kernels' launches, in the order the child makes them for one N.
LAUNCH_NAMES = {"standard": ("scores_kernel", "softmax_kernel", "rowprod_kernel"), "flash2_fast": ("flash2_fast",)}
KERNEL_REGEX = "|".join(name for names in LAUNCH_NAMES.values() for name in names)
NS = (256, 512, 1024, 2048, 4096, 8192)


def _inputs(BH, N, d, seed=0):
    from numba import cuda

    rng = np.random.default_rng(seed)
    return [cuda.to_device(rng.standard_normal((BH, N, d), dtype=np.float32)) for _ in range(3)]


def _forward(kernel, q, k, v, count):
    return api._forward(kernel, q, k, v, False, None, None, count)


def child(BH: int, d: int, Ns) -> int:
    """Each forward once per N, plain kernels, in the order of :data:`LAUNCH_NAMES`."""
    from numba import cuda

    for N in Ns:
        q, k, v = _inputs(BH, N, d)
        for kernel in KERNELS:
            _forward(kernel, q, k, v, False)
        cuda.synchronize()
        del q, k, v
    return 0


def _n_launches(Ns) -> int:
    return len(Ns) * sum(len(x) for x in LAUNCH_NAMES.values())


def run_ncu(exe: str, cache: str, BH: int, d: int, Ns, kernel_filter: bool = True) -> tuple[list, str]:
    """``(launches, note)``: ncu's launches of one child run with ``--cache-control cache``."""
    env = {key: value for key, value in os.environ.items() if key != "FLASH_NUMBA_POISON"}
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "ncu.csv")
        cmd = [exe, "--clock-control", "none", "--cache-control", cache, "--metrics", ",".join(profile.METRICS),
               *(["-k", f"regex:{KERNEL_REGEX}"] if kernel_filter else []), "-c", str(_n_launches(Ns)),
               "--csv", "--print-units", "base", "--log-file", log,
               sys.executable, __file__, "child", "--BH", str(BH), "--d", str(d), "--Ns", *map(str, Ns)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        text = Path(log).read_text() if os.path.exists(log) else ""
    launches = profile.parse_ncu_csv(text) or profile.parse_ncu_csv(proc.stdout)
    note = f"ncu --cache-control {cache}{'' if kernel_filter else ' (no -k)'}: rc={proc.returncode}, " \
           f"{len(launches)} of {_n_launches(Ns)} launches"
    if len(launches) != _n_launches(Ns):
        note += "\n" + "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
    return launches, note


def measure(BH: int, d: int, Ns, hw: dict) -> tuple[list, list]:
    """Count our bytes at each N (``count_hbm=True``) and attach ncu's ``hw[cache]`` launches in order:
    ``(rows, per_launch)``, rows as :data:`flash_numba.tools.l2.COLUMNS` (-1 where ncu gave nothing)."""
    hw = {cache: list(launches) for cache, launches in hw.items()}
    rows, per_launch = [], []
    for N in Ns:
        q, k, v = _inputs(BH, N, d)
        for kernel in KERNELS:
            res = _forward(kernel, q, k, v, True)
            split = terms.split(kernel, "forward", BH, N, N, d, np.float32, False, res.block)
            if sum(split.values()) != res.hbm.total:
                print(f"warning: {kernel} N = {N}: counted {res.hbm.total:,} != model {sum(split.values()):,}")
            for cache in l2.CACHE_MODES:
                got = hw.get(cache) or []
                launches = [got.pop(0) for _ in LAUNCH_NAMES[kernel]] if got else []
                for name, launch, (label, kb) in zip(LAUNCH_NAMES[kernel], launches, res.hbm.per_kernel.items()):
                    if name not in launch.kernel_name:
                        print(f"warning: ncu launch {launch.kernel_name[:60]!r} is not {name}: order differs")
                    per_launch.append({"kernel": kernel, "cache": cache, "BH": BH, "N": N, "launch": label,
                                       "counted": kb.total, "ncu_kernel": launch.kernel_name[:60],
                                       **{m: int(launch.metrics.get(m, -1)) for m in profile.METRICS}})
                hw_bytes = [sum(int(x.metrics.get(m, 0)) for x in launches) if launches else -1
                            for m in profile.METRICS]
                rows.append({"kernel": kernel, "cache": cache, "BH": BH, "N": N, "d": d, "dtype": "float32",
                             "Br": res.block[0], "Bc": res.block[1], "launches": len(res.hbm.per_kernel),
                             "counted_read": res.hbm.bytes_read, "counted_written": res.hbm.bytes_written, **split,
                             "dram_read": hw_bytes[0], "dram_write": hw_bytes[1], "l2_bytes": hw_bytes[2]})
        del q, k, v
    return rows, per_launch


def write(out: Path, rows: list, per_launch: list, argv) -> None:
    """``l2_sweep.csv`` (with device, date, command), ``l2_sweep_launches.csv``, a table and the figure."""
    header = {"device": device.describe().splitlines()[0],
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "command": "python benchmarks/l2_sweep.py " + " ".join(argv),
              "ncu": "--clock-control none --cache-control none (warm) / all (flushed), metrics "
                     + ",".join(profile.METRICS)}
    l2.write_sweep(out / "l2_sweep.csv", header, rows)
    if per_launch:
        csvfile.write_csv(out / "l2_sweep_launches.csv", [f"{key}: {value}" for key, value in header.items()],
                          per_launch)
    print(f"{'kernel':<12} {'cache':<8} {'N':>5} {'counted MB':>11} {'S/P MB':>9} {'L2 MB':>9} {'DRAM MB':>9}")
    for r in rows:
        counted, dram = r["counted_read"] + r["counted_written"], r["dram_read"] + r["dram_write"]
        print(f"{r['kernel']:<12} {r['cache']:<8} {r['N']:>5} {counted / 1e6:>11.1f} {r['S/P'] / 1e6:>9.1f} "
              f"{r['l2_bytes'] / 1e6:>9.1f} {dram / 1e6:>9.1f}")
    l2.figure(out / "l2_sweep.csv").savefig(out / "l2_sweep.png", dpi=120)
    print(f"wrote l2_sweep.csv, l2_sweep_launches.csv, l2_sweep.png in {out}")


def sweep(out: Path, BH: int, d: int, Ns, argv) -> int:
    exe = shutil.which("ncu")
    if exe is None:
        print("ncu: not on PATH (Nsight Compute comes with the CUDA toolkit)")
        return 1
    hw = {}
    for cache, mode in l2.CACHE_MODES.items():
        launches, note = run_ncu(exe, mode, BH, d, Ns)
        print(note, flush=True)
        if len(launches) != _n_launches(Ns):  # the name filter missed some: the child launches only ours anyway
            launches, note = run_ncu(exe, mode, BH, d, Ns, kernel_filter=False)
            print(note, flush=True)
        hw[cache] = launches if len(launches) == _n_launches(Ns) else []
    rows, per_launch = measure(BH, d, Ns, hw)
    write(out, rows, per_launch, argv)
    return 0 if all(r["dram_read"] >= 0 for r in rows) else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", default="sweep", choices=("sweep", "child"))
    p.add_argument("--out", default="figures/out")
    p.add_argument("--BH", type=int, default=8)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--Ns", type=int, nargs="+", default=list(NS))
    args = p.parse_args(argv)
    if args.mode == "child":
        return child(args.BH, args.d, args.Ns)
    print(device.describe(), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return sweep(out, args.BH, args.d, args.Ns, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
