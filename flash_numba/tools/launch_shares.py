"""Where standard attention's forward spends its time: each launch timed, its share of the total, a stacked bar.

The paper (and the seed article) say that in standard attention the elementwise steps, the softmax
reading S and writing P through HBM, take most of the wall-clock time once the matrix products run
on tensor cores.  This tool measures it on our kernels: the three launches of
:func:`flash_numba.kernels.standard.forward_launches` (``S = scale*Q@K^T``, ``P = softmax(S)``,
``O = P@V``), each bracketed by its own two CUDA events (:class:`~.timing.LaunchTimer`), median over
``--repeats`` passes after one untimed pass.  Beside each row: the launch's counted bytes (a counted
pass, equal to :mod:`flash_numba.iomodel.standard`, checked here) and its memory bound, those bytes
at the device-to-device copy bandwidth measured in the same run (:func:`.microbench.hbm_bandwidth`).

    python -m flash_numba.tools.launch_shares --dtype float16 --N 1024 4096 16384 --d 64 128 --out DIR

writes ``DIR/launch_shares.csv`` (one row per launch) and ``DIR/launch_shares.png`` (one stacked bar
per size: the launches' shares of the forward's time) and prints a table.  In the simulator the
launches run once on the given (tiny) sizes and nothing is timed.
"""

from __future__ import annotations

import datetime
import statistics
import sys
from pathlib import Path

import numpy as np

from .. import device, kernels
from .argcheck import Parser
from .csvfile import write_csv

COLORS = {"S = scale*Q@K^T": "C0", "P = softmax(S)": "C3", "O = P@V": "C2"}
FIELDS = ("dtype", "BH", "N", "d", "causal", "block", "mma_path", "launch", "ms", "share", "total_ms",
          "counted_bytes", "model_bytes", "copy_GBps", "bound_ms", "ms_over_bound", "total_bound_ms")


def _inputs(BH: int, N: int, d: int, dtype_name: str, seed: int = 0):
    """q, k, v of shape (1, BH, N, d), standard normal, in ``dtype_name`` (bfloat16: uint16 words)."""
    from .. import as_bfloat16

    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((1, BH, N, d)).astype(np.float32) for _ in range(3)]
    return [as_bfloat16(x) if dtype_name == "bfloat16" else x.astype(dtype_name) for x in xs]


def _storage(dtype_name: str) -> np.dtype:
    return np.dtype(np.uint16 if dtype_name == "bfloat16" else dtype_name)


def time_launches(launches, repeats: int):
    """Milliseconds per launch name (median of ``repeats`` passes, one untimed pass first); None in the simulator."""
    from .timing import LaunchTimer

    for _, run in launches:
        run()
    device.synchronize()
    samples = []
    for _ in range(repeats):
        with LaunchTimer() as timer:
            for name, run in launches:
                timer.array(name)  # the name of the launch that follows (LaunchTimer's protocol)
                run()
        samples.append(timer.stop())
    if samples[0] is None:
        return None
    return {name: statistics.median(s[name] for s in samples) for name, _ in launches}


def measure(BH: int, N: int, d: int, dtype="float16", causal: bool = False, repeats: int = 10, copy_GBps=None,
            count: bool = True):
    """Rows (one per launch) of standard's forward at ``(BH, N, d)``: time, share, counted (``count``: a counted
    pass, else None) and modelled bytes, memory bound at ``copy_GBps`` (None: not timed) of the counted bytes
    (of the modelled ones without ``count``: the tests hold the two equal)."""
    from .timing import free_pending

    from .. import attention_forward
    from ..kernels.standard import forward_launches, mma_path, tensor_cores

    spec = kernels.get("standard")
    q, k, v = _inputs(BH, N, d, dtype)
    block = spec.block(d, dtype if dtype == "bfloat16" else np.dtype(dtype), "forward")  # the block a call takes
    counted = attention_forward(q, k, v, causal=causal, kernel="standard", count_hbm=True).hbm if count else None
    model = spec.io_model("forward")(BH, N, N, d, _storage(dtype), causal, block)
    launches, _ = forward_launches(q, k, v, causal=causal)
    ms = time_launches(launches, repeats)
    total = sum(ms.values()) if ms else None
    path = mma_path() if tensor_cores(dtype) else "cuda-cores"
    rows = []
    for name, _ in launches:
        mbytes = model.per_kernel[name].total
        nbytes = None if counted is None else counted.per_kernel[name].total
        bound = None if copy_GBps is None else (mbytes if nbytes is None else nbytes) / (copy_GBps * 1e9) * 1e3
        t = None if ms is None else ms[name]
        rows.append(dict(
            dtype=dtype, BH=BH, N=N, d=d, causal=causal, block=f"{block[0]}x{block[1]}",
            mma_path=path, launch=name, ms=t, share=None if t is None else t / total, total_ms=total,
            counted_bytes=nbytes, model_bytes=mbytes, copy_GBps=copy_GBps, bound_ms=bound,
            ms_over_bound=None if (t is None or bound is None) else t / bound,
        ))
    del launches, q, k, v
    if not device.SIMULATOR:
        free_pending()
    bound_total = None if copy_GBps is None else sum(r["bound_ms"] for r in rows)
    for r in rows:
        r["total_bound_ms"] = bound_total
    return rows


def check(BH: int, N: int, d: int, dtype="float16", causal: bool = False) -> dict:
    """Validate first: standard's forward at this size against the float64 reference, beside attention done
    plainly in ``dtype`` (:func:`flash_numba.reference.plain_attention`): Dao-AILab's rule asks the kernel's
    max error to be at most about 2x the plain one's."""
    from .. import attention_forward, reference

    if dtype == "bfloat16":
        raise ValueError("check: runs float16, float32 and float64 (tests/test_standard_tc.py checks bfloat16)")
    q, k, v = _inputs(BH, N, d, dtype, seed=1)
    got = attention_forward(q, k, v, causal=causal, kernel="standard")
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    o_ref, lse_ref = reference.attention_forward(q64, k64, v64, causal=causal)
    plain = reference.plain_attention(q, k, v, causal=causal, dtype=np.dtype(dtype))
    err = float(np.abs(got.o.astype(np.float64) - o_ref).max())
    err_plain = float(np.abs(plain.astype(np.float64) - o_ref).max())
    err_lse = float(np.abs(got.lse.astype(np.float64) - lse_ref).max())
    return dict(BH=BH, N=N, d=d, causal=causal, kernel=got.kernel, err_o=err, err_plain=err_plain,
                ratio=err / err_plain, err_lse=err_lse, ok=bool(np.isfinite(got.o).all() and err <= 2 * err_plain))


def table(rows) -> str:
    """A fixed-width table: one line per launch, then the total of each size."""
    def f(x, spec):
        return format(x, spec) if x is not None else "-".rjust(int(spec.split(".")[0]))

    lines = [f"{'N':>6} {'d':>4} {'launch':<18} {'ms':>8} {'share':>6} {'MB':>9} {'bound ms':>9} {'x bound':>7}"]
    for r in rows:
        lines.append(f"{r['N']:>6} {r['d']:>4} {r['launch']:<18} {f(r['ms'], '8.3f')} {f(r['share'], '6.1%')} "
                     f"{r['model_bytes'] / 1e6:>9.1f} {f(r['bound_ms'], '9.3f')} {f(r['ms_over_bound'], '7.2f')}")
        if r["launch"] == "O = P@V":
            t, b = r["total_ms"], r["total_bound_ms"]
            ratio = None if t is None or b is None else t / b
            lines.append(f"{r['N']:>6} {r['d']:>4} {'forward':<18} {f(r['total_ms'], '8.3f')} {'':>6} {'':>9} "
                         f"{f(r['total_bound_ms'], '9.3f')} {f(ratio, '7.2f')}")
    return "\n".join(lines)


def figure(rows, path: Path, title: str) -> Path:
    """One stacked bar per (N, d): each launch's share of the forward's time, its ms written inside."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(dict.fromkeys((r["N"], r["d"]) for r in rows))
    names = list(dict.fromkeys(r["launch"] for r in rows))
    fig, ax = plt.subplots(figsize=(1.3 * len(sizes) + 3, 4.2))
    bottom = np.zeros(len(sizes))
    for name in names:
        mine = {(r["N"], r["d"]): r for r in rows if r["launch"] == name}
        share = np.array([mine[s]["share"] for s in sizes])
        ms = [mine[s]["ms"] for s in sizes]
        ax.bar(range(len(sizes)), 100 * share, bottom=100 * bottom, color=COLORS.get(name), label=name)
        for x, (b, h, t) in enumerate(zip(bottom, share, ms)):
            if h > 0.06:
                ax.text(x, 100 * (b + h / 2), f"{100 * h:.0f}%\n{t:.2f} ms", ha="center", va="center", fontsize=7)
        bottom += share
    totals = [next(r["total_ms"] for r in rows if (r["N"], r["d"]) == s) for s in sizes]
    ax.set_xticks(range(len(sizes)), [f"N={n}\nd={d}\n{t:.2f} ms" for (n, d), t in zip(sizes, totals)], fontsize=8)
    ax.set_ylabel("share of the forward's time (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.text(0.01, 0.01, f"{device.describe()}; {datetime.date.today()}", fontsize=6, color="0.4")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    parser = Parser(prog="python -m flash_numba.tools.launch_shares", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32", "float64"))
    parser.add_argument("--BH", type=int, default=32)
    parser.add_argument("--N", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--d", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--count", type=int, nargs="*", default=None,
                        help="count the bytes at these N only (default: every N; the model gives the others)")
    parser.add_argument("--check", type=int, nargs=2, metavar=("BH", "N"), default=None,
                        help="first check the values against float64 at this B*H and N (each d, causal or not)")
    parser.add_argument("--out", type=Path, default=None, help="folder for launch_shares.csv and .png")
    args = parser.parse_args(argv)
    from .microbench import hbm_bandwidth

    if args.check is not None:
        for d in args.d:
            for causal in (False, True):
                c = check(*args.check, d, args.dtype, causal)
                print(f"check {args.dtype} BH={c['BH']} N={c['N']} d={d} causal={causal}: max|o - o64| = "
                      f"{c['err_o']:.3e}, plain {args.dtype} {c['err_plain']:.3e} (ratio {c['ratio']:.2f}), "
                      f"max|lse - lse64| = {c['err_lse']:.2e}: {'ok' if c['ok'] else 'FAILS'}", flush=True)

    copy = hbm_bandwidth()
    copy_GBps = copy.value
    print(copy, flush=True)
    rows = []
    for d in args.d:
        for N in args.N:
            count = args.count is None or N in args.count
            rows += measure(args.BH, N, d, args.dtype, args.causal, args.repeats, copy_GBps, count)
            print(table(rows[-3:]).split("\n", 1)[1], flush=True)
    print(table(rows))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        note = (f"{datetime.date.today()}, {device.describe()}; B*H = {args.BH}, {args.dtype}, "
                f"causal = {args.causal}; each launch timed with its own CUDA events, median of {args.repeats}; "
                f"bound = counted bytes / copy bandwidth ({copy})")
        write_csv(args.out / "launch_shares.csv", [note], rows, FIELDS)
        if rows[0]["ms"] is not None:
            figure(rows, args.out / "launch_shares.png",
                   f"standard attention forward, {args.dtype}, B*H = {args.BH}: share of each launch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
