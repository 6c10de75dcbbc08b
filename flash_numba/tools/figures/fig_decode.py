"""The decode figure: time and KV-cache GB/s of one decoding step against the cache length.

It plots the rows of the decode benchmark (:mod:`flash_numba.tools.bench_decode`'s CSV: validate, time,
then plot), one row of two panels (time, GB/s) per dtype in the CSV: flash_decode with the split rule's choice
and without splits (``num_splits=1``), the same in a paged cache, the CUDA-core kernel, the prefill kernels
``flash2_fast`` and ``flash2_tc`` called with one query token (one block per query head, B*Hq = 256 blocks,
each reading its KV head's whole cache: each KV element read G = 4 times), and PyTorch SDPA's backends.  The
time is the benchmark's ``ms``: the GPU's time a call, calls queued back to back, the same for every row.  A
flash_decode label ends with the splits its points ran.  It writes ``fig_decode.png`` and ``fig_decode.csv``
(the plotted points) to ``--out``::

    python -m flash_numba.tools.bench_decode --csv decode.csv          # on a GPU (benchmarks/decode_sweep.sh)
    python -m flash_numba.tools.figures.fig_decode decode.csv --out figures/out

Measures nothing itself, so it runs anywhere (matplotlib needed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import csvfile
from .common import pyplot

#: (implementation in the CSV, label, colour, line style): what the figure shows, in legend order.
SERIES = (
    ("flash_decode", "flash_decode (num_splits=None)", "tab:blue", "-"),
    ("flash_decode-paged", "flash_decode, paged (256-row pages, shuffled)", "tab:cyan", "--"),
    ("flash_decode-s1", "flash_decode without splits (num_splits=1)", "tab:purple", ":"),
    ("flash_decode-paged-s1", "flash_decode, paged, without splits", "tab:pink", ":"),
    ("flash_decode-cuda", "flash_decode on CUDA cores (its rule's splits)", "tab:green", "-"),
    ("flash2_fast", "flash2_fast (prefill kernel) at Nq = 1", "tab:red", "-."),
    ("flash2_tc", "flash2_tc (tensor-core prefill kernel) at Nq = 1", "darkred", "-."),
    ("torch-flash", "torch flash (enable_gqa)", "black", "-"),
    ("torch-cudnn", "torch cuDNN (enable_gqa)", "0.45", "-"),
    ("torch-efficient", "torch memory-efficient (K, V repeated)", "tab:orange", "-"),
    ("torch-math", "torch math", "tab:brown", "-"),
)


def points(rows: list, splits_of: dict | None = None) -> list:
    """The plotted points: ``implementation, dtype, N, ms, kv_gbps, num_splits, row`` of the :data:`SERIES` rows
    measured ok (a row without a dtype is float16).

    ``splits_of`` maps an implementation to the ``flash_decode-s<S>`` rows that stand for it, by N (the rows
    the split rule now picks, where it changed after the run)."""
    out = []
    wanted = {name for name, *_ in SERIES}
    by = {(r["implementation"], r.get("dtype") or "float16", int(r["N"])): r for r in rows}
    for r in rows:
        name, N, dt = r["implementation"], int(r["N"]), r.get("dtype") or "float16"
        if name not in wanted or r["status"] != "ok" or not r["ms"]:
            continue
        src = by.get((f"flash_decode-s{splits_of[name][N]}", dt, N), r) if splits_of and name in splits_of else r
        out.append({"implementation": name, "dtype": dt, "N": N, "ms": float(src["ms"]),
                    "kv_gbps": float(src["kv_gbps"]), "num_splits": src.get("num_splits", ""),
                    "row": src["implementation"]})
    return out


def make(csv_path, out_dir, splits_of: dict | None = None) -> list[Path]:
    """The PNG and the CSV of the figure from a decode benchmark CSV (a row of two panels per dtype in it); returns
    their paths."""
    rows = csvfile.read_csv(csv_path)
    comments = csvfile.read_comments(csv_path)
    pts = points(rows, splits_of)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plt = pyplot()
    dtypes = list(dict.fromkeys(x["dtype"] for x in pts)) or ["float16"]
    fig, axes = plt.subplots(len(dtypes), 2, figsize=(15, 4.8 * len(dtypes)), squeeze=False)
    for (ax_t, ax_b), dt in zip(axes, dtypes):
        for name, label, color, style in SERIES:
            p = sorted((x for x in pts if x["implementation"] == name and x["dtype"] == dt), key=lambda x: x["N"])
            if not p:
                continue
            Ns = [x["N"] for x in p]
            splits = sorted({int(x["num_splits"]) for x in p if x["num_splits"] not in ("", None)})
            if splits:
                label += f" [{splits[0]}{'' if len(splits) == 1 else f'-{splits[-1]}'} splits]"
            ax_t.plot(Ns, [x["ms"] for x in p], style, marker="o", ms=3, color=color, label=label)
            ax_b.plot(Ns, [x["kv_gbps"] for x in p], style, marker="o", ms=3, color=color, label=label)
        for ax, ylabel in ((ax_t, f"GPU time of one step (ms), {dt}"), (ax_b, f"KV cache read (GB/s), {dt}")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("cache length N (tokens)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        ax_t.set_yscale("log")
        ax_b.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside the panel: no line hidden
    device = next((c for c in comments if c.startswith("device:")), "")
    fig.suptitle("One decoding step: B = 8, Hq = 32, Hkv = 8, d = 128, one new token; GPU time a call, calls queued "
                 "back to back (bench_decode's ms)\n" + device, fontsize=9)
    fig.tight_layout()
    png = out / "fig_decode.png"
    fig.savefig(png, dpi=130)
    plt.close(fig)
    notes = [f"from {Path(csv_path).name}: {c}" for c in comments] + [
        "row: the benchmark row plotted (flash_decode: the flash_decode-s<S> row of the split rule's choice "
        "where given)"]
    data = csvfile.write_csv(out / "fig_decode.csv", notes, pts)
    return [png, data]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flash_numba.tools.figures.fig_decode",
                                description=__doc__.split("\n")[0])
    p.add_argument("csv", help="the decode benchmark's CSV (python -m flash_numba.tools.bench_decode --csv ...)")
    p.add_argument("--out", default="figures/out", help="folder for fig_decode.png and fig_decode.csv")
    p.add_argument("--rule-splits", type=int, metavar="S",
                   help="plot flash_decode as its flash_decode-s<S> rows (the split rule's choice at every N, "
                        "where the rule changed after the run)")
    args = p.parse_args(argv)
    rows = csvfile.read_csv(args.csv)
    splits_of = None
    if args.rule_splits:
        splits_of = {"flash_decode": {int(r["N"]): args.rule_splits for r in rows}}
    for path in make(args.csv, args.out, splits_of):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
