"""The rebuilt standard kernel on a GPU (issue 14): times, per-kernel times, and DRAM/L2 bytes beside our counts.

    python benchmarks/standard_h200.py bench --out DIR   # validate (float64), time vs torch-math and flash2_fast
    python benchmarks/standard_h200.py ncu --out DIR     # Nsight Compute DRAM and L2 bytes, two sizes
    python benchmarks/standard_h200.py child --BH 8 --N 1024   # (what ncu watches: one forward of each)

``bench`` runs ``flash-numba bench`` (float64 validation first, then CUDA events, median of 20 calls rotating
input sets) for standard, flash2_fast and PyTorch's math SDPA at B*H = 32, N = 4096, d = 64, float32, causal and
not, forward and forward + backward, then times each standard kernel alone.  ``ncu`` profiles the standard and
flash2_fast forwards at B*H = 8, N = 1024 (S fits in the H200's 50 MB L2) and B*H = 32, N = 4096 (S is 2 GB)
and writes DRAM and L2 bytes next to the counted and modelled bytes, per launch, and the model's bytes by term.
"""
# ruff: noqa: E402

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from flash_numba import api, device, iomodel
from flash_numba.iomodel import terms
from flash_numba.kernels import standard
from flash_numba.tools import profile

KERNELS = ("standard", "flash2_fast")
D = 64
SIZES = ((8, 1024), (32, 4096))  # (B*H, N): below and far above the 50 MB L2


def _inputs(BH, N, seed=0):
    from numba import cuda

    rng = np.random.default_rng(seed)
    return [cuda.to_device(rng.standard_normal((BH, N, D), dtype=np.float32)) for _ in range(4)]


def _forward(kernel, q, k, v, count=False):
    return api._forward(kernel, q, k, v, False, None, None, count)


def per_kernel_times(out: Path, BH=32, N=4096, repeats=20) -> None:
    """Each standard kernel alone (CUDA events, median of ``repeats``), forward and backward."""
    from numba import cuda

    from flash_numba.kernels import flash2 as f2

    rows = []
    sets = [_inputs(BH, N, seed) for seed in range(3)]
    f32 = np.dtype(np.float32)
    cnt = cuda.to_device(np.zeros(2, np.int64))
    scale = np.float32(1 / np.sqrt(D))
    for causal in (False, True):
        Br, Bc = standard.choose_block(D, f32, 48 * 1024, "forward")
        bBr, bBc = standard.choose_block(D, f32, 48 * 1024, "backward")
        Tr, bTr, bTc = -(-N // Br), -(-N // bBr), -(-N // bBc)
        S, P, dS = (cuda.device_array((BH, N, N), f32) for _ in range(3))
        L, Dv, ml = cuda.device_array((BH, N), f32), cuda.device_array((BH, N), f32), cuda.device_array((BH, 2, N), f32)
        O, dQ, dK, dV = (cuda.device_array((BH, N, D), f32) for _ in range(4))
        sc = standard.scores_kernel(D, Br, Bc, "float32", causal, False)
        sm = standard.softmax_kernel(Br, Bc, "float32", causal, False)
        pv = standard.rowprod_kernel(D, Br, Bc, "float32", causal, False)
        gs = standard.grad_scores_kernel(D, bBr, bBc, "float32", causal, False)
        cp = standard.colprod_kernel(D, bBr, bBc, "float32", causal, False)
        rp = standard.rowprod_kernel(D, bBr, bBc, "float32", causal, False)
        rs = f2._rowsum_kernel(D, f32, False)
        steps = {
            "S = scale*Q@K^T": lambda q, k, v, do: sc[Tr * BH, 128](q, k, S, L, ml, N, N, scale, cnt),
            "P = softmax(S)": lambda q, k, v, do: sm[-(-BH * N // standard.SOFTMAX_ROWS), 128](S, ml, P, N, N, cnt),
            "O = P@V": lambda q, k, v, do: pv[Tr * BH, 128](P, v, O, N, N, np.float32(1), cnt),
            "D = rowsum(dO*O)": lambda q, k, v, do: rs[(-(-N // f2.TY), BH), f2.NT](O, do, Dv, cnt, N),
            "P, dS = P*(dP-D)": lambda q, k, v, do: gs[bTr * BH, 128](q, k, v, do, L, Dv, P, dS, N, N,
                                                                      scale, cnt),
            "dV = P^T@dO": lambda q, k, v, do: cp[bTc * BH, 128](P, do, dV, N, N, np.float32(1), cnt),
            "dK = scale*dS^T@Q": lambda q, k, v, do: cp[bTc * BH, 128](dS, q, dK, N, N, scale, cnt),
            "dQ = scale*dS@K": lambda q, k, v, do: rp[bTr * BH, 128](dS, k, dQ, N, N, scale, cnt),
        }
        for name, step in steps.items():
            for i in range(3):
                step(*sets[i % 3])
            times = []
            for r in range(repeats):
                start, stop = cuda.event(), cuda.event()
                start.record()
                step(*sets[r % 3])
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop))
            ms = statistics.median(times)
            print(f"{'causal' if causal else 'no mask':8} {name:22} {ms:8.3f} ms", flush=True)
            rows.append({"BH": BH, "N": N, "d": D, "causal": causal, "kernel": name, "ms_median": round(ms, 4),
                         "repeats": repeats})
    with open(out / "standard_kernels.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def bench(out: Path) -> int:
    from flash_numba import bench as fb

    rc = fb.main(["--n", "4096", "--bh", "32", "--d", str(D), "--dtype", "float32", "--causal", "both",
                  "--pass", "both", "--kernels", "standard", "flash2_fast", "torch-math", "--repeats", "20",
                  "--csv", str(out / "bench.csv")])
    if rc == 0:
        per_kernel_times(out)
    return rc


def child(BH: int, N: int) -> int:
    from numba import cuda

    q, k, v, _ = _inputs(BH, N)
    for kernel in KERNELS:
        _forward(kernel, q, k, v)
    cuda.synchronize()
    return 0


def ncu(out: Path) -> int:
    exe = shutil.which("ncu")
    if exe is None:
        print("ncu: not on PATH")
        return 1
    rows, lines = [], []
    for BH, N in SIZES:
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "ncu.csv")
            cmd = [exe, "--clock-control", "none", "--metrics", ",".join(profile.METRICS), "--csv", "--print-units",
                   "base", "--log-file", log, sys.executable, __file__, "child", "--BH", str(BH), "--N", str(N)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            text = Path(log).read_text() if os.path.exists(log) else ""
        launches = profile.parse_ncu_csv(text) or profile.parse_ncu_csv(proc.stdout)
        print(f"B*H = {BH}, N = {N}: ncu rc={proc.returncode}, {len(launches)} launches", flush=True)
        if not launches:
            print(proc.stdout[-3000:], proc.stderr[-3000:])
        q, k, v, _ = _inputs(BH, N)
        counted = []
        for kernel in KERNELS:
            res = _forward(kernel, q, k, v, count=True)
            model = iomodel.forward(kernel, BH, N, N, D, np.float32, False, res.block)
            for name, kb in res.hbm.per_kernel.items():
                counted.append((kernel, name, kb, model.per_kernel[name], res.block))
            t = model.terms  # flash2_fast results carry no split yet (its module calls no describe)
            lines.append(f"| {BH} | {N} | {kernel} | {res.block} | {res.hbm.total:,} | {model.total:,} | "
                         + " | ".join(f"{t[x]:,}" for x in terms.TERMS) + " |")
        for i, (kernel, name, kb, m, block) in enumerate(counted):
            hw = launches[i].metrics if len(launches) == len(counted) else {}
            rows.append({
                "BH": BH, "N": N, "d": D, "kernel": kernel, "launch": name, "Br": block[0], "Bc": block[1],
                "counted_read": kb.bytes_read, "counted_written": kb.bytes_written,
                "model_read": m.bytes_read, "model_written": m.bytes_written,
                "ncu_dram_read": int(hw.get(profile.METRICS[0], -1)),
                "ncu_dram_write": int(hw.get(profile.METRICS[1], -1)),
                "ncu_l2_bytes": int(hw.get(profile.METRICS[2], -1)),
                "ncu_kernel": launches[i].kernel_name[:50] if hw else "",
            })
    with open(out / "ncu_bytes.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    md = ["# Forward HBM bytes: counted, model, Nsight Compute (H200, float32, d = 64, no mask)", "",
          "| B*H | N | kernel | launch | counted | model | DRAM read | DRAM write | L2 | DRAM / counted |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["counted_read"] + r["counted_written"]
        dram = r["ncu_dram_read"] + r["ncu_dram_write"]
        md.append(f"| {r['BH']} | {r['N']} | {r['kernel']} | {r['launch']} | {c:,} | "
                  f"{r['model_read'] + r['model_written']:,} | {r['ncu_dram_read']:,} | {r['ncu_dram_write']:,} | "
                  f"{r['ncu_l2_bytes']:,} | {dram / c:.3f} |")
    md += ["", "Per call, by term (the model's attribution of the counted total):", "",
           "| B*H | N | kernel | block | counted | model | " + " | ".join(terms.TERMS) + " |",
           "|---|---|---|---|---|---|---|---|---|", *lines, "", profile.GAP]
    (out / "ncu_bytes.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("bench", "ncu", "child"))
    p.add_argument("--out", default="figures/out")
    p.add_argument("--BH", type=int, default=8)
    p.add_argument("--N", type=int, default=1024)
    args = p.parse_args(argv)
    print(device.describe() if args.mode != "child" else "", flush=True)
    if args.mode == "child":
        return child(args.BH, args.N)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return bench(out) if args.mode == "bench" else ncu(out)


if __name__ == "__main__":
    sys.exit(main())
