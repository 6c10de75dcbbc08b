"""Determinism and leak checks on a GPU; results as CSV and markdown.

    python benchmarks/reliability.py determinism OUTDIR [--repeats 20] [--N 1000] [--d 64]
    python benchmarks/reliability.py leaks OUTDIR [--calls 1000] [--every 100] [--N 256] [--d 64]

``determinism``: every kernel, forward and backward, causal and not (float32),
called ``--repeats`` times on the same inputs; each result is compared bit for
bit with the first (``identical`` = every byte equal, ``distinct`` = how many
different results were seen).  No kernel uses floating-point atomics (the only
atomics are the int64 HBM counters), so every row should say identical.

``leaks``: ``--calls`` forward + backward calls of the default kernel (what
``flash_attention_forward/backward`` run when no kernel is named); every
``--every`` calls the free device memory
(``cuda.current_context().get_memory_info()``) is recorded after
``gc.collect()`` and after Numba's pending deallocations are flushed, with the
number of live Numba allocations.  The drift is the free memory lost since the
first record.  It runs once with NumPy inputs and, when torch is importable,
once with torch CUDA tensors (zero-copy through ``__cuda_array_interface__``;
flash_numba then takes its buffers from PyTorch's caching allocator, so that run
also records ``torch.cuda.memory_allocated()``).  The verdict is ``flat`` when
neither count of live allocations grew and the final drift is below both one
call's allocations and 4 MiB (free memory moves in allocation pages); a buffer
leaked per call would add ``calls`` allocations.

Files: ``OUTDIR/determinism.md`` and ``determinism_results.csv``; ``OUTDIR/leaks.md`` and
``leaks_summary.csv``, ``leaks_numpy.csv``, ``leaks_torch.csv``.  Without a GPU
the script says so and exits 0.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import gc
import hashlib
import os
import sys
import time

import numpy as np

LEAD = (1, 2)  # (B, H)


def _forward(kernel, q, k, v, causal):
    import flash_numba as fn

    return fn.attention_forward(q, k, v, kernel=kernel, causal=causal)


def _backward(kernel, q, k, v, o, lse, do, causal):
    import flash_numba as fn

    return fn.attention_backward(q, k, v, o, lse, do, kernel=kernel, causal=causal)


def default_kernel() -> str:
    """The kernel a call runs when none is named."""
    import flash_numba as fn

    return fn.DEFAULT_KERNEL


def _digest(arrays) -> str:
    """A hash of the exact bytes of some host arrays."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _max_diff(runs) -> float:
    """Largest |difference| between any run and the first (inf where only one of them is NaN)."""
    worst = 0.0
    for run in runs[1:]:
        for a, b in zip(runs[0], run):
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))  # -inf == -inf on masked rows
            with np.errstate(invalid="ignore"):  # inf - inf where both runs overflowed alike
                diff = np.where(same, 0.0, np.abs(a64 - b64))
            worst = max(worst, float(np.nan_to_num(diff, nan=np.inf).max(initial=0.0)))
    return worst


def determinism_rows(kernels=None, N=1000, d=64, repeats=20, causals=(False, True), seed=0) -> list[dict]:
    """One row per (kernel, pass, causal): are ``repeats`` calls bitwise identical?"""
    from flash_numba import kernels as registry
    from flash_numba import reference

    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal(LEAD + (N, d)).astype(np.float32) for _ in range(4))
    rows = []
    for kernel in kernels or [n for n in registry.NAMES if "float32" in registry.get(n).dtypes]:  # float32 runs
        for causal in causals:
            o_ref, lse_ref = reference.attention_forward(q, k, v, causal=causal)
            fwd = [_forward(kernel, q, k, v, causal) for _ in range(repeats)]
            f_runs = [(r.o, r.lse) for r in fwd]
            o, lse = fwd[0].o, fwd[0].lse
            b_runs = [
                (b.dq, b.dk, b.dv) for b in (_backward(kernel, q, k, v, o, lse, do, causal) for _ in range(repeats))
            ]
            grads_ref = reference.attention_backward(q, k, v, o, lse, do, causal=causal)
            for pass_, runs, ref in (("forward", f_runs, (o_ref,)), ("backward", b_runs, grads_ref)):
                distinct = len({_digest(run) for run in runs})
                err = max(float(np.abs(got - want).max() / np.abs(want).max()) for got, want in zip(runs[0], ref))
                rows.append(
                    {
                        "kernel": kernel + " (default)" * (kernel == default_kernel()),
                        "pass": pass_,
                        "causal": causal,
                        "N": N,
                        "d": d,
                        "repeats": repeats,
                        "identical": distinct == 1,
                        "distinct results": distinct,
                        "max abs diff vs run 1": _max_diff(runs),
                        "max rel. error vs float64": f"{err:.1e}",
                    }
                )
    return rows


def _flush_and_free() -> tuple[float, int | None]:
    """(free device bytes, live Numba allocations) after garbage collection and Numba's deferred frees."""
    from numba import cuda

    cuda.synchronize()
    gc.collect()
    ctx = cuda.current_context()
    manager = getattr(ctx, "memory_manager", None)
    for owner in (manager, ctx):
        pending = getattr(owner, "deallocations", None)
        if pending is not None:
            pending.clear()
    live = getattr(manager, "allocations", None)
    return float(ctx.get_memory_info()[0]), (None if live is None else len(live))


#: Free memory moves in allocation pages: drift below this is not a leak by itself.
PAGE_SLACK = 4 * 2**20


def leak_rows(inputs="numpy", calls=1000, every=100, N=256, d=64, warmup=3, seed=0) -> tuple[list[dict], dict]:
    """Free memory and live allocations every ``every`` calls of forward + backward; (rows, summary)."""
    rng = np.random.default_rng(seed)
    host = [rng.standard_normal(LEAD + (N, d)).astype(np.float32) for _ in range(4)]
    torch = None
    if inputs == "torch":
        import torch

        q, k, v, do = (torch.as_tensor(x, device="cuda") for x in host)
    else:
        q, k, v, do = host

    def call():
        f = _forward(default_kernel(), q, k, v, False)
        _backward(default_kernel(), q, k, v, f.o, f.lse, do, False)

    def record(i, start):
        free, live = _flush_and_free()
        return {
            "inputs": inputs,
            "calls": i,
            "free MiB": round(free / 2**20, 2),
            "drift bytes": 0 if start is None else start - free,
            "live Numba allocations": live,
            # for torch inputs the outputs come from PyTorch's caching allocator: its live bytes
            "torch allocated bytes": None if torch is None else torch.cuda.memory_allocated(),
        }, free

    for _ in range(warmup):  # compile and let the allocators settle before the first record
        call()
    # device bytes one call allocates, at least: o, dq, dk, dv, lse, D, and for NumPy inputs
    # the copies of q, k, v (forward) and q, k, v, o, do, lse (backward)
    arr, row = host[0].nbytes, host[0].nbytes // d
    per_call = (4 * arr + 2 * row) + ((8 * arr + row) if inputs == "numpy" else 0)
    first, start = record(0, None)
    rows = [first]
    t = time.perf_counter()
    for i in range(1, calls + 1):
        call()
        if i % every == 0 or i == calls:
            rows.append(record(i, start)[0])
    last = rows[-1]
    if not np.isfinite(start):
        verdict = "n/a (no memory info)"
    else:
        grew = any(
            first[key] is not None and last[key] > first[key]
            for key in ("live Numba allocations", "torch allocated bytes")
        )
        verdict = "LEAK?" if grew or abs(last["drift bytes"]) >= max(per_call, PAGE_SLACK) else "flat"
    summary = {
        "inputs": inputs,
        "calls": calls,
        "N": N,
        "d": d,
        "final drift bytes": last["drift bytes"] if np.isfinite(start) else "n/a",
        "max drift bytes": max(r["drift bytes"] for r in rows) if np.isfinite(start) else "n/a",
        "live Numba allocations start/end": f"{first['live Numba allocations']}/{last['live Numba allocations']}",
        "torch allocated bytes start/end": f"{first['torch allocated bytes']}/{last['torch allocated bytes']}",
        "bytes per call": per_call,
        "verdict": verdict,
        "seconds": round(time.perf_counter() - t, 1),
    }
    return rows, summary


# ------------------------------------------------------------------------------------ output


def _header() -> str:
    import flash_numba as fn

    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{fn.device.describe()}; {date}; `python {' '.join(sys.argv)}`"


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "(no rows)\n"
    fields = list(rows[0])
    lines = ["| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
    lines += ["| " + " | ".join(str(r[f]) for f in fields) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write(outdir: str, name: str, title: str, tables: list[tuple[str, str, list[dict]]]) -> list[str]:
    """``OUTDIR/name.md`` with every table, and ``OUTDIR/name_<key>.csv`` per (key, caption, rows)."""
    os.makedirs(outdir, exist_ok=True)
    paths = []
    md = [f"# {title}\n", _header() + "\n"]
    for key, caption, rows in tables:
        md += [f"## {caption}\n", markdown_table(rows)]
        path = os.path.join(outdir, f"{name}_{key}.csv")
        with open(path, "w", newline="") as f:
            if rows:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
        paths.append(path)
    md_path = os.path.join(outdir, f"{name}.md")
    with open(md_path, "w") as f:
        f.write("\n".join(md))
    return [md_path] + paths


def _torch_cuda() -> str | None:
    """None if torch CUDA tensors can be used, else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not importable"
    return None if torch.cuda.is_available() else "torch has no CUDA"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("determinism", help="bitwise identical results over repeated calls")
    p.add_argument("outdir")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--N", type=int, default=1000)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--kernels", nargs="+")
    p = sub.add_parser("leaks", help="free device memory over many calls")
    p.add_argument("outdir")
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--every", type=int, default=100)
    p.add_argument("--N", type=int, default=256)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--no-torch", action="store_true", help="skip the torch-tensor run")
    args = parser.parse_args(argv)

    import flash_numba as fn

    if fn.device.SIMULATOR:
        print(f"no CUDA GPU here (flash_numba runs in the simulator): `{args.what}` needs a GPU; nothing run.")
        return 0
    print(fn.device.describe(), flush=True)
    if args.what == "determinism":
        rows = determinism_rows(args.kernels, args.N, args.d, args.repeats)
        paths = write(
            args.outdir, "determinism", "Determinism: repeated calls, bit for bit", [("results", "results", rows)]
        )
        print(markdown_table(rows))
        ok = all(r["identical"] for r in rows)
    else:
        runs = ["numpy"]
        why = "--no-torch" if args.no_torch else _torch_cuda()
        if why is None:
            runs.append("torch")
        else:
            print(f"torch run skipped: {why}")
        tables, summaries = [], []
        for inputs in runs:
            rows, summary = leak_rows(inputs, args.calls, args.every, args.N, args.d)
            tables.append((inputs, f"free device memory, {inputs} inputs", rows))
            summaries.append(summary)
            print(markdown_table(rows))
        tables.insert(0, ("summary", "summary", summaries))
        paths = write(args.outdir, "leaks", "Leaks: device memory over repeated calls", tables)
        print(markdown_table(summaries))
        ok = all(s["verdict"] == "flat" for s in summaries)
    print("written: " + ", ".join(paths))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
