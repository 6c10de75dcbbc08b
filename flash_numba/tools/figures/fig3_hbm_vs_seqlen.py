"""Figure 3: HBM bytes against sequence length per kernel, log-log, with the Theta slopes.

B*H = 1, d = 64, float32, N from 16 to 65536: the IO model's bytes, and where
kernels may run, bytes counted at the small sizes (equal to the model, which
this figure also checks and reports).
"""

from __future__ import annotations

import numpy as np

from ... import device
from .. import passes
from .common import COLORS, Run, against_n, pyplot, save, write_data


def make(run: Run) -> list:
    """HBM bytes against N per kernel (B*H = 1), modelled and counted, log-log, with Theta slopes."""
    s = run.sizes
    d = s.d
    rows, n_counted, n_differ = [], 0, 0
    for kernel in run.kernels:
        for N in s.seq_N:
            for pass_ in ("forward", "backward"):
                rows.append(_bytes_row(kernel, pass_, N, d, "model", passes.model(kernel, pass_, 1, N, d)))
            if run.count and N <= s.seq_count_max:
                for pass_, hbm in zip(("forward", "backward"), passes.counted(kernel, 1, N, d)):
                    rows.append(_bytes_row(kernel, pass_, N, d, "counted", hbm))
                    n_counted += 1
                    if hbm != passes.model(kernel, pass_, 1, N, d):
                        n_differ += 1
                        print(f"figure 3: MISMATCH {kernel} {pass_} N = {N}: "
                              + passes.differences(hbm, passes.model(kernel, pass_, 1, N, d)))
    if n_counted:
        print(f"figure 3: {n_counted} passes counted, {n_counted - n_differ} equal to the IO model")
    csv_path = write_data(run, "fig3_hbm_vs_seqlen", rows,
        f"Figure 3: HBM bytes vs sequence length (B*H = 1, d = {d}, float32)",
        "source: model = flash_numba.iomodel, counted = count_hbm=True")
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    M = device.STATIC_SHARED_LIMIT // passes.DTYPE.itemsize  # SRAM elements of one block
    for ax, pass_ in zip(axes, ("forward", "backward")):
        ref = {}
        for kernel in run.kernels:
            pts = [r for r in rows if r["kernel"] == kernel and r["pass"] == pass_]
            mod = [r for r in pts if r["source"] == "model"]
            cnt = [r for r in pts if r["source"] == "counted"]
            color = COLORS.get(kernel)
            ax.plot([r["N"] for r in mod], [r["total"] for r in mod], color=color, label=f"{kernel} (model)")
            if cnt:
                ax.plot([r["N"] for r in cnt], [r["total"] for r in cnt], "o", color=color, mfc="none",
                        label=f"{kernel} (counted)")
            ref[kernel] = mod[-1]
        N = np.array(s.seq_N, dtype=float)
        if "standard" in ref:
            top = ref["standard"]
            c = top["total"] / (top["N"] * d + top["N"] ** 2)
            ax.plot(N, c * (N * d + N**2), "k--", lw=0.8, label="Theta(N d + N^2)")
        anchor = next((ref[k] for k in ("flash1", "flash2") if k in ref), None)
        if anchor is not None:
            c = anchor["total"] / (anchor["N"] ** 2 * d**2 / M)
            ax.plot(N, c * N**2 * d**2 / M, "k:", lw=0.8, label=f"Theta(N^2 d^2 / M), M = {M}")
        against_n(ax, "HBM bytes read + written", f"{pass_}, d = {d}, one head, float32", 7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return [csv_path, save(run, fig, "fig3_hbm_vs_seqlen")]


def _bytes_row(kernel, pass_, N, d, source, hbm) -> dict:
    return {"kernel": kernel, "pass": pass_, "N": N, "d": d, "BH": 1, "source": source,
            "bytes_read": hbm.bytes_read, "bytes_written": hbm.bytes_written, "total": hbm.total}
