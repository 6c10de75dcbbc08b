"""Figure 2: block size (Br, Bc) against forward HBM bytes and runtime (the paper's Figure 2, middle).

N = 1024, d = 64, B*H = 128, for the kernels that take any (Br, Bc); the pairs
that do not fit 48 KB of shared memory are left out.  Bytes from the IO model;
on a GPU each block size is also timed.
"""

from __future__ import annotations

from ...api import attention_forward, resolve_block
from .. import passes, timing
from .common import Run, Skipped, gb, pyplot, save, sig, write_data

#: The kernels that take any (Br, Bc): the paper's Algorithm 1 and the FlashAttention-2 order.
BLOCK_SWEEP = ("flash1", "flash2")


def make(run: Run) -> list:
    """Block size (Br, Bc) against forward HBM bytes and runtime, N = 1024, d = 64."""
    s = run.sizes
    N, d, BH = s.block_N, s.d, s.block_BH
    flash = [k for k in BLOCK_SWEEP if k in run.kernels]
    if not flash:
        raise Skipped(f"none of {', '.join(BLOCK_SWEEP)} has an IO model")
    rows = []
    for kernel in flash:
        if run.gpu:
            q, k, v, _ = passes.random_inputs(BH, N, d)
        for Br in s.block_Br:
            for Bc in s.block_Bc:
                try:
                    block = resolve_block(kernel, d, passes.DTYPE, (Br, Bc), "forward")
                except ValueError:  # does not fit the shared memory or the kernel's limits
                    continue
                m = passes.model(kernel, "forward", BH, N, d, block=block)
                row = {"kernel": kernel, "Br": Br, "Bc": Bc, "N": N, "d": d, "BH": BH}
                row.update(model_bytes_read=m.bytes_read, model_bytes_written=m.bytes_written)
                row["model_gb"] = sig(gb(m.total))
                if run.gpu:  # every block size is a new kernel: its first call compiles it (untimed)
                    row["ms"] = sig(timing.median_ms(lambda: attention_forward(q, k, v, kernel=kernel, block=block)))
                rows.append(row)
    csv_path = write_data(run, "fig2_block_size", rows,
        f"Figure 2: block size vs forward HBM bytes and runtime (N = {N}, d = {d}, B*H = {BH}, float32)",
        "model_*: IO model (equal to the counters: figure 3 and the tests check it)")
    plt = pyplot()
    timed = run.gpu
    fig, axes = plt.subplots(2 if timed else 1, len(flash), figsize=(4.5 * len(flash), 6.5 if timed else 3.6),
                             squeeze=False)
    for col, kernel in enumerate(flash):
        mine = [r for r in rows if r["kernel"] == kernel]
        ax = axes[0][col]
        for i, Br in enumerate(sorted({r["Br"] for r in mine})):
            pts = [r for r in mine if r["Br"] == Br]
            ax.plot([r["Bc"] for r in pts], [r["model_gb"] for r in pts], marker="o", color=f"C{i}",
                    label=f"Br = {Br}")
            if timed:
                axes[1][col].plot([r["Bc"] for r in pts], [r["ms"] for r in pts], marker="s", color=f"C{i}",
                                  label=f"Br = {Br}")
        ax.set_title(f"{kernel} forward", fontsize=10)
        ax.set_ylabel("HBM bytes (GB), IO model")
        ax.set_xlabel("Bc")
        ax.legend(fontsize=7)
        ax.set_ylim(bottom=0)
        if timed:
            axes[1][col].set_ylabel("runtime (ms)")
            axes[1][col].set_xlabel("Bc")
            axes[1][col].set_ylim(bottom=0)
    fig.suptitle(f"Block size vs HBM accesses{' and runtime' if timed else ''} (N = {N}, d = {d}, B*H = {BH})",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return [csv_path, save(run, fig, "fig2_block_size")]
