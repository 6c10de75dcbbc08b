"""Figure 6: the roofline of this GPU with every kernel launch placed on it.

N = 4096, d = 64, B*H = 32.  Ceilings measured by :mod:`flash_numba.tools.microbench`
on a GPU (else a datasheet's).  A launch sits at (FLOPs / byte requested,
FLOPs / time); without a GPU each is drawn, hollow, at its roofline bound.
"""

from __future__ import annotations

import math

import numpy as np

from ... import device
from .. import passes, timing
from .common import COLORS, Run, pyplot, save, sig, write_data

#: Datasheet ceilings (HBM GB/s, float32 TFLOP/s, non-tensor) for when nothing is measured.
DATASHEETS = {"H200": (4800.0, 67.0), "H100": (3350.0, 67.0), "A100": (2039.0, 19.5), "T4": (320.0, 8.1)}


def ceilings(run: Run):
    """(HBM GB/s, float32 TFLOP/s, where they come from): measured on a GPU, else a datasheet."""
    if run.gpu:
        from .. import microbench

        bw, peak = microbench.hbm_bandwidth(), microbench.fp32_peak()
        if bw.value is not None and peak.value is not None:
            return bw.value, peak.value, "measured (flash_numba.tools.microbench)"
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
        hbm = dict(zip(("forward", "backward"), passes.counted(kernel, BH, N, d)))
        q, k, v, do = passes.random_inputs(BH, N, d)
        f = passes.forward(kernel, q, k, v)
        arrays = {"q": q, "k": k, "v": v, "o": f.o, "lse": f.lse, "do": do}
    rows = []
    for pass_ in ("forward", "backward"):
        bytes_ = hbm[pass_] if run.gpu else passes.model(kernel, pass_, BH, N, d)
        fl = passes.flops(bytes_.per_kernel, BH, N, d)
        ms = None
        if run.gpu:
            names, ms = timing.launch_times(kernel, pass_, arrays)
            if names != list(bytes_.per_kernel):
                raise RuntimeError(f"{kernel} {pass_}: timed launches {names} differ from the counted "
                                   f"{list(bytes_.per_kernel)}")
        for name, kb in bytes_.per_kernel.items():
            if fl[name] == 0:  # initialisation kernels: no arithmetic, no place on a roofline
                continue
            intensity = fl[name] / kb.total
            row = {"implementation": kernel, "pass": pass_, "launch": name, "flops": fl[name],
                   "bytes": kb.total, "bytes_source": "counted" if run.gpu else "model",
                   "intensity": sig(intensity), "roof_tflops": sig(min(peak, bw * intensity / 1000))}
            if ms is not None:
                row["ms"] = sig(ms[name])
                row["tflops"] = sig(fl[name] / (ms[name] * 1e-3) / 1e12)
            rows.append(row)
    return rows


def make(run: Run) -> list:
    """Roofline: every kernel launch at (FLOPs / bytes, FLOPs / time), N = 4096, d = 64, B*H = 32."""
    s = run.sizes
    BH, N = s.roof
    d = s.d
    bw, peak, source = ceilings(run)
    rows = []
    for kernel in run.kernels:
        rows += _roofline_rows(run, kernel, bw, peak)
    csv_path = write_data(run, "fig6_roofline", rows,
        f"Figure 6: roofline (N = {N}, d = {d}, B*H = {BH}, float32)",
        f"ceilings: HBM {bw:.0f} GB/s, float32 {peak:.1f} TFLOP/s ({source})",
        "intensity: FLOPs / bytes requested by the code (re-reads included; the L2 cache serves some, "
        "so a kernel can sit above the bandwidth roof)")
    plt = pyplot()
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
    return [csv_path, save(run, fig, "fig6_roofline")]
