"""Figure 4: peak device memory of forward + backward against sequence length (GPU only).

Standard attention holds N x N matrices and runs out of memory first;
FlashAttention holds O(N d).  Each series stops at its first out-of-memory
error (marked on the plot) or once a point is slow.
"""

from __future__ import annotations

import time

from .. import timing
from .common import COLORS, Run, Skipped, against_n, kernel_series, pyplot, save, sig, write_data


def _peak_mib(kernel: str, BH: int, N: int, d: int):
    """({"peak_mib": MiB at the peak of forward + backward}, wall seconds it took)."""
    start = time.perf_counter()
    mib = sig(timing.peak_memory(kernel, BH, N, d) / 2**20)
    return {"peak_mib": mib}, time.perf_counter() - start


def make(run: Run) -> list:
    """Peak device memory of forward + backward against N, up to where standard attention runs out."""
    if not run.gpu:
        raise Skipped("needs a GPU: device memory is measured, not modelled")
    s = run.sizes
    d, BH = s.d, s.mem_BH
    rows = kernel_series(run, 4, s.mem_N, lambda kernel, N: _peak_mib(kernel, BH, N, d), d=d, BH=BH)
    std = {r["N"]: r["peak_mib"] for r in rows if r["kernel"] == "standard" and "peak_mib" in r}
    for r in rows:
        if "peak_mib" in r and r["N"] in std:
            r["standard_over_this"] = sig(std[r["N"]] / r["peak_mib"])
    csv_path = write_data(run, "fig4_memory", rows,
        f"Figure 4: peak device memory of forward + backward (B*H = {BH}, d = {d}, float32)",
        "peak_mib: inputs q, k, v, dO included; measured from the free device memory with frees deferred")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for kernel in run.kernels:
        pts = [r for r in rows if r["kernel"] == kernel and "peak_mib" in r]
        ax.plot([r["N"] for r in pts], [r["peak_mib"] for r in pts], marker="o", color=COLORS.get(kernel),
                label=kernel)
        oom = [r for r in rows if r["kernel"] == kernel and "out of memory" in r.get("note", "")]
        if oom:
            ax.axvline(oom[0]["N"], color=COLORS.get(kernel), ls=":", lw=0.8)
            ax.text(oom[0]["N"], 0.03, f"{kernel}: out of memory", transform=ax.get_xaxis_transform(),
                    fontsize=7, rotation=90, va="bottom", ha="right")
    for r in rows:
        if r["kernel"] == "flash2" and "standard_over_this" in r:
            ax.annotate(f"{r['standard_over_this']:.0f}x", (r["N"], r["peak_mib"]), fontsize=7,
                        textcoords="offset points", xytext=(0, -11), ha="center")
    against_n(ax, "peak device memory (MiB)", f"Memory of forward + backward, B*H = {BH}, d = {d}, float32"
              + (" (labels: standard / flash2)" if std else ""))
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return [csv_path, save(run, fig, "fig4_memory")]
