"""Figure 4: peak device memory of forward + backward against sequence length (GPU only).

Standard attention holds N x N matrices and runs out of memory first;
FlashAttention holds O(N d).  Each series stops at its first out-of-memory
error (marked on the plot) or once a point is slow.

flash2_fast's default backward is deterministic: where the GPU has block slots to spare it runs the split
backward, which keeps one copy of dQ per key-block slot (up to
:data:`flash_numba.kernels.flash2_fast.layout.DQ_COPIES_LIMIT`, 1 GiB) and adds them in a fixed order, trading
memory for speed.  So its curve is drawn twice: as called by default, and with ``deterministic=False`` (the
atomic backward: one dQ, O(N d) like flash2).
"""

from __future__ import annotations

import time

from .. import timing
from .common import COLORS, Run, Skipped, against_n, kernel_series, pyplot, save, series, sig, write_data


ATOMIC = "flash2_fast (deterministic=False)"


def _peak_mib(kernel: str, BH: int, N: int, d: int, deterministic: bool = True):
    """({"peak_mib": MiB at the peak of forward + backward}, wall seconds it took)."""
    start = time.perf_counter()
    mib = sig(timing.peak_memory(kernel, BH, N, d, deterministic) / 2**20)
    return {"peak_mib": mib}, time.perf_counter() - start


def make(run: Run) -> list:
    """Peak device memory of forward + backward against N, up to where standard attention runs out."""
    if not run.gpu:
        raise Skipped("needs a GPU: device memory is measured, not modelled")
    s = run.sizes
    d, BH = s.d, s.mem_BH
    rows = kernel_series(run, 4, s.mem_N, lambda kernel, N: _peak_mib(kernel, BH, N, d), d=d, BH=BH)
    if "flash2_fast" in run.kernels:  # its atomic backward: one dQ, where the default may keep copies
        timing.peak_memory("flash2_fast", 1, 64, d, False)  # compiled first, so that no point times a compile
        rows += series(run, 4, {"kernel": ATOMIC}, s.mem_N, lambda N: _peak_mib("flash2_fast", BH, N, d, False),
                       s.slow_s, d=d, BH=BH)
    std = {r["N"]: r["peak_mib"] for r in rows if r["kernel"] == "standard" and "peak_mib" in r}
    for r in rows:
        if "peak_mib" in r and r["N"] in std:
            r["standard_over_this"] = sig(std[r["N"]] / r["peak_mib"])
    csv_path = write_data(run, "fig4_memory", rows,
        f"Figure 4: peak device memory of forward + backward (B*H = {BH}, d = {d}, float32)",
        "peak_mib: inputs q, k, v, dO included; measured from the free device memory with frees deferred")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for kernel in dict.fromkeys(r["kernel"] for r in rows):
        pts = [r for r in rows if r["kernel"] == kernel and "peak_mib" in r]
        ax.plot([r["N"] for r in pts], [r["peak_mib"] for r in pts], marker="o",
                color=COLORS.get(kernel, COLORS["flash2_fast"]), ls="--" if kernel == ATOMIC else "-",
                label=kernel + (" (default: copies of dQ)" if kernel == "flash2_fast" else ""))
        oom = [r for r in rows if r["kernel"] == kernel and "out of memory" in r.get("note", "")]
        if oom:
            ax.axvline(oom[0]["N"], color=COLORS.get(kernel, COLORS["flash2_fast"]), ls=":", lw=0.8)
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
