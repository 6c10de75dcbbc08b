"""The article's figures, regenerated on this machine: ``flash-numba figures`` (also ``python figures/make_all.py``).

    flash-numba figures [--only N ...] [--quick] [--model-only] [--out DIR]

One module per figure, each with ``make(run) -> [paths]``; every figure is a
PNG with its data beside it as CSV (figure 1 also as Markdown), the CSV
written first.  While a figure is made, each row it measures goes at once to
``fig<n>_points.csv`` (:class:`~.common.Points`), removed when the figure is
done: a figure that fails or is interrupted leaves what it measured.  ``--out``
is checked, and made if missing, before any figure starts.

1. :mod:`.fig1_paper_table`: the FlashAttention paper's Figure 2 (left) table,
   GPT-2 medium, beside the paper's numbers, with the reasons they differ.
2. :mod:`.fig2_block_size`: block size against HBM bytes and runtime.
3. :mod:`.fig3_hbm_vs_seqlen`: HBM bytes against sequence length, with the Theta slopes.
4. :mod:`.fig4_memory`: peak device memory against sequence length.
5. :mod:`.fig5_runtime`: runtime against sequence length, and the standard path's time per kernel.
6. :mod:`.fig6_roofline`: the roofline of this GPU with every kernel launch placed on it.

What runs where.  Bytes come from the IO model (:mod:`flash_numba.iomodel`),
which the tests hold equal to the counters; on a GPU they are also counted
(``count_hbm=True``) and in the simulator counted at a tiny size (figure 3) to
confirm the model.  Times and memory need a GPU: without one, or with
``--model-only`` (which runs no kernel at all), figures 4 and 5 are skipped
with a message, figures 1 and 2 have no runtime, and figure 6 places each
kernel at its roofline bound instead of at its measured speed.  FLOPs (figures
1, 5 and 6) follow each kernel's ``KernelSpec.flops`` (:func:`flash_numba.tools.passes.flops`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ... import device
from ..argcheck import Parser, make_dir, output_dir
from ..passes import device_label
from . import (
    fig1_paper_table,
    fig2_block_size,
    fig3_hbm_vs_seqlen,
    fig4_memory,
    fig5_runtime,
    fig6_roofline,
)
from .common import Points, Run, Skipped, sizes_for

FIGURES = {
    1: fig1_paper_table.make,
    2: fig2_block_size.make,
    3: fig3_hbm_vs_seqlen.make,
    4: fig4_memory.make,
    5: fig5_runtime.make,
    6: fig6_roofline.make,
}


def _kept(points: Points) -> str:
    return f" ({points.count} row(s) it measured are in {points.path})" if points.count else ""


def main(argv=None, default_out: str | Path = "figures/out") -> int:
    """Make the figures; 0 if every selected figure was made or skipped with a reason, 1 if one failed.

    The options and ``--out`` are checked before any figure is made (a bad one:
    exit status 2, one line naming it).  Each figure writes its CSV before its
    PNG; one that fails is reported in one line, the others are still made,
    and the exit status is 1.  Ctrl-C keeps the figures already written.
    """
    parser = Parser(prog="flash-numba figures", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", type=int, nargs="+", choices=sorted(FIGURES), metavar="N",
                        help="make only these figures (1-6)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes (a minute or two on a GPU)")
    parser.add_argument("--model-only", action="store_true",
                        help="run no kernel: bytes from the IO model, no times (figures 4, 5 skipped)")
    parser.add_argument("--out", type=output_dir, default=str(default_out),
                        help=f"output folder, made if missing (default {default_out})")
    args = parser.parse_args(argv)

    out = make_dir(parser, "--out", args.out)
    print(device.describe())
    run = Run(
        out=out,
        sizes=sizes_for(args.quick, device.SIMULATOR),
        count=not args.model_only,
        gpu=not args.model_only and not device.SIMULATOR,
        label=device_label(args.model_only),
    )
    failed, made = [], []
    for n in args.only or sorted(FIGURES):
        start = time.perf_counter()
        run.points = Points(out, n)
        try:
            paths = FIGURES[n](run)
        except Skipped as why:
            run.points.remove()
            print(f"figure {n}: skipped: {why}")
            continue
        except KeyboardInterrupt:
            run.points.close()
            done = f"; figure(s) {', '.join(map(str, made))} are in {out}" if made else ""
            print(f"\nflash-numba figures: interrupted during figure {n}{_kept(run.points)}{done}", file=sys.stderr)
            return 130
        except Exception as exc:  # one broken figure does not stop the others; the run still fails
            run.points.close()
            failed.append(n)
            first = (str(exc).splitlines() or [""])[0]
            print(f"figure {n}: FAILED: {type(exc).__name__}: {first}{_kept(run.points)}")
            continue
        run.points.remove()
        made.append(n)
        print(f"figure {n} ({time.perf_counter() - start:.1f} s): " + ", ".join(str(p) for p in paths))
    if failed:
        print(f"flash-numba figures: failed: figure(s) {', '.join(map(str, failed))}; the others are in {out}",
              file=sys.stderr)
    return 1 if failed else 0
