"""Host overhead of one public-API call on a GPU: the CPU time a call costs before it returns.

Issue #15's measure: at N = 128 the kernels take microseconds, so the time of a call is the host's
work (argument checks, output allocation, Numba's dispatch of each launch).  For each input kind
(PyTorch CUDA tensors, Numba device arrays) and pass, this prints

* ``host us``: the median CPU time of one call that is not waited for (``perf_counter`` around the
  call; the launches are asynchronous), over 200 calls after warm-up;
* ``gpu us``: the median time of the same call between CUDA events on the stream (kernel time plus
  any gaps the host leaves);

and writes them as CSV.  Run on a GPU: ``python benchmarks/host_overhead.py --csv OUT.csv``.  Calls on PyTorch
tensors replay a launch plan after the first (``flash_numba._launch_plan``); the column ``plans`` says
whether plans were on: ``FLASH_NUMBA_LAUNCH_PLANS=0 python benchmarks/host_overhead.py`` times the normal path.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time

import numpy as np

import flash_numba as fn
from flash_numba import _launch_plan, device


def _host_us(call, repeats=200):
    for _ in range(20):
        call()
    device.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e6)
        device.synchronize()
    return statistics.median(times)


def _gpu_us(call, repeats=50):
    times = []
    for _ in range(repeats):
        with device.CudaTimer() as t:
            call()
        times.append(t.ms * 1e3)
    return statistics.median(times)


def _profile(kinds, kernel, path):
    """Where a call's host time goes: cProfile over 500 forward and 500 backward calls."""
    import cProfile
    import io
    import pstats

    kind, (q, k, v, do) = list(kinds.items())[-1]
    f = fn.attention_forward(q, k, v, kernel=kernel)
    out = io.StringIO()
    for pass_, call in (("fwd", lambda: fn.attention_forward(q, k, v, kernel=kernel)),
                        ("bwd", lambda: fn.attention_backward(q, k, v, f.o, f.lse, do, kernel=kernel))):
        call()
        device.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(500):
            call()
        prof.disable()
        device.synchronize()
        out.write(f"== {kind} {kernel} {pass_}: 500 calls\n")
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(40)
    with open(path, "w") as fh:
        fh.write(out.getvalue())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=128)
    p.add_argument("--bh", type=int, default=32)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--kernels", nargs="+", default=["flash2_fast", "flash2", "standard"])
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                   help="bfloat16: PyTorch tensors only")
    p.add_argument("--csv")
    p.add_argument("--profile", metavar="FILE",
                   help="also profile 500 forward and 500 backward calls of the first kernel with cProfile "
                        "(the last input kind) and write the 40 costliest functions, by own time, to FILE")
    args = p.parse_args(argv)
    if device.SIMULATOR:
        print("host_overhead: needs a GPU (the simulator has no clock)", file=sys.stderr)
        return 2
    from numba import cuda

    rng = np.random.default_rng(0)
    shape = (1, args.bh, args.n, args.d)
    host = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    kinds = {} if args.dtype == "bfloat16" else {"numba": [cuda.to_device(x.astype(args.dtype)) for x in host]}
    try:
        import torch

        kinds["torch"] = [torch.from_numpy(x).cuda().to(getattr(torch, args.dtype)) for x in host]
    except ImportError:
        pass
    rows = []
    print(f"{'inputs':<7} {'kernel':<12} {'pass':<8} {'host us':>8} {'gpu us':>8} {'plans':>6}   (B*H = {args.bh}, "
          f"N = {args.n}, d = {args.d}, {args.dtype}, {device.info().name})")
    for kind, (q, k, v, do) in kinds.items():
        for kernel in args.kernels:
            f = fn.attention_forward(q, k, v, kernel=kernel)
            calls = {
                "fwd": lambda: fn.attention_forward(q, k, v, kernel=kernel),
                "bwd": lambda: fn.attention_backward(q, k, v, f.o, f.lse, do, kernel=kernel),
            }
            for pass_, call in calls.items():
                row = {"inputs": kind, "kernel": kernel, "pass": pass_, "N": args.n, "BH": args.bh, "d": args.d,
                       "dtype": args.dtype,
                       "host_us": round(_host_us(call), 1), "gpu_us": round(_gpu_us(call), 1),
                       "plans": _launch_plan.ENABLED and kind == "torch"}
                rows.append(row)
                print(f"{kind:<7} {kernel:<12} {pass_:<8} {row['host_us']:>8} {row['gpu_us']:>8} {row['plans']!s:>6}",
                      flush=True)
    if args.profile:
        _profile(kinds, args.kernels[0], args.profile)
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
