"""Figure 5: runtime against sequence length, and where standard attention's time goes (GPU only).

Every kernel (and PyTorch SDPA when it is installed with CUDA), forward and
forward + backward; then the time of each kernel launch of the standard path,
the elementwise kernels hatched.  Where PyTorch with CUDA is installed, our kernels
are called on PyTorch tensors, as SDPA is and as ``benchmarks/bench.py`` calls them: a
call replays its launch plan (about 25-45 us of host time on the H200's host).  Without
PyTorch they are called on Numba device arrays, and a call's host work (output
allocation with ``cudaMalloc``, Numba's dispatch: 0.5-1 ms there) is inside its events
and sets the floor at small N.
"""

from __future__ import annotations

import statistics

from .. import passes, timing
from .common import COLORS, Run, Skipped, against_n, kernel_series, pyplot, save, series, sig, write_data


def make(run: Run) -> list:
    """Runtime against N for every implementation (and PyTorch SDPA), and the standard path per kernel."""
    if not run.gpu:
        raise Skipped("needs a GPU: runtimes are measured")
    s = run.sizes
    d, BH = s.d, s.time_BH
    torch = timing.torch_cuda()  # ours on PyTorch tensors where it is there (launch plans), as SDPA
    rows = kernel_series(run, 5, s.time_N,
                         lambda kernel, N: _ms(*timing.time_passes(kernel, BH, N, d, False, torch)[0]),
                         key="implementation", BH=BH, d=d)
    if torch is not None:
        rows += series(run, 5, {"implementation": "torch SDPA"}, s.time_N, lambda N: _ms(*_torch_ms(torch, BH, N, d)),
                       s.slow_s, BH=BH, d=d)
        torch.cuda.empty_cache()  # hand PyTorch's cached blocks back before Numba allocates again
    else:
        print("figure 5: PyTorch with CUDA not importable; no SDPA series")
    paths = [write_data(run, "fig5_runtime", rows,
        f"Figure 5: runtime vs sequence length (B*H = {BH}, d = {d}, float32)",
        "median of 3-10 calls after one untimed call, CUDA events; "
        + ("ours and torch SDPA on PyTorch tensors (ours: launch plans, tens of us of host time a call), SDPA's "
           "backend chosen by PyTorch" if torch is not None else
           "ours on Numba device arrays (a call's host work, 0.5-1 ms, included: the floor at small N)"))]
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for ax, key, what in zip(axes, ("fwd_ms", "total_ms"), ("forward", "forward + backward")):
        for name in dict.fromkeys(r["implementation"] for r in rows):
            pts = [r for r in rows if r["implementation"] == name and r.get(key, "") != ""]
            ax.plot([r["N"] for r in pts], [r[key] for r in pts], marker="o", color=COLORS.get(name), label=name)
        against_n(ax, "time (ms)", f"{what}, B*H = {BH}, d = {d}, float32")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    paths.append(save(run, fig, "fig5_runtime"))
    if "standard" in run.kernels:
        paths += _standard_breakdown(run)
    return paths


def _ms(t_fwd: float, t_bwd: float):
    """A point of a :func:`~.common.series`: the three times, and its seconds (GPU time of both passes)."""
    return dict(fwd_ms=sig(t_fwd), bwd_ms=sig(t_bwd), total_ms=sig(t_fwd + t_bwd)), (t_fwd + t_bwd) / 1000


def _torch_ms(torch, BH: int, N: int, d: int):
    """(forward ms, backward ms) of torch.nn.functional.scaled_dot_product_attention, float32."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(1, BH, N, d, device="cuda", generator=gen) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_(True)

    def fwd():
        with torch.no_grad():
            sdpa(q, k, v)

    def fwd_bwd():
        sdpa(q, k, v).backward(do)

    def ms(fn):
        fn()
        times = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        return statistics.median(times)

    t_fwd = ms(fwd)
    return t_fwd, ms(fwd_bwd) - t_fwd


def _standard_breakdown(run: Run) -> list:
    """Time of each kernel launch of the standard path, forward and backward."""
    s = run.sizes
    d, BH = s.d, s.time_BH
    rows = []
    for N in s.breakdown_N:
        try:
            q, k, v, do = passes.random_inputs(BH, N, d)
            f = passes.forward("standard", q, k, v)
            arrays = {"q": q, "k": k, "v": v, "o": f.o, "lse": f.lse, "do": do}
            for pass_ in ("forward", "backward"):
                names, ms = timing.launch_times("standard", pass_, arrays)
                total = sum(ms.values())
                for name in names:
                    flop = passes.flops([name], BH, N, d)[name]
                    rows.append({"pass": pass_, "N": N, "BH": BH, "d": d, "launch": name, "ms": sig(ms[name]),
                                 "share": sig(ms[name] / total), "gflops": sig(flop / 1e9)})
        except Exception as exc:  # out of memory ends the breakdown; anything else propagates
            if not timing.out_of_memory(exc):
                raise
            print(f"figure 5: standard breakdown: out of memory at N = {N}")
            timing.free_pending()
    if not rows:
        return []
    paths = [write_data(run, "fig5_standard_breakdown", rows,
        f"Figure 5b: standard attention, time per kernel launch (B*H = {BH}, d = {d}, float32)",
        "CUDA events around each launch (flash_numba.tools.timing.LaunchTimer), "
        f"median of {timing.LAUNCH_REPEATS} passes")]
    plt = pyplot()
    bars = list(dict.fromkeys((r["pass"], r["N"]) for r in rows))
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.6 * len(bars)))
    names = list(dict.fromkeys(r["launch"] for r in rows))
    labelled = set()
    for y, (pass_, N) in enumerate(bars):
        left = 0.0
        for r in (r for r in rows if (r["pass"], r["N"]) == (pass_, N)):
            name = r["launch"]
            elementwise = passes.elementwise(name)  # no matrix product
            ax.barh(y, r["share"], left=left, color=f"C{names.index(name) % 10}", hatch="//" if elementwise else None,
                    edgecolor="white", label=None if name in labelled else name)
            labelled.add(name)
            if r["share"] > 0.06:
                ax.text(left + r["share"] / 2, y, f"{100 * r['share']:.0f}%", ha="center", va="center", fontsize=7)
            left += r["share"]
    ax.set_yticks(range(len(bars)), [f"{p}, N = {n}" for p, n in bars])
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the pass's time (hatched: elementwise kernels, no matrix product)")
    ax.set_title(f"Standard attention: where the time goes (B*H = {BH}, d = {d}, float32)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    paths.append(save(run, fig, "fig5_standard_breakdown"))
    return paths
