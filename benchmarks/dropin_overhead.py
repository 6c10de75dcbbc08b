"""The drop-in's cost inside a training step, against PyTorch's SDPA: GPT-shaped attention forward + backward.

    python benchmarks/dropin_overhead.py [--csv FILE] [--profile FILE]

q, k, v are the example GPT's views of one packed projection (B = 64, H = 4, N = 256, d = 64, causal,
bfloat16 as under autocast).  Per implementation: ``host_us``, the CPU time of one forward + backward
that is not waited for (the launches are asynchronous); ``gpu_us``, the same between CUDA events, waited for.
In a step that is host-bound (a small model), host_us is what the attention adds to the step; ``--profile``
writes cProfile's 45 costliest functions (own time) over 200 of our steady-state calls.
Implementations: ``sdpa`` (PyTorch's), ``flash_numba`` (ours as a model calls it: eager, our autograd.Function),
``flash_numba-ops`` (ours through the two custom ops, as torch.compile and dispatch modes see it).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time

import torch
import torch.nn.functional as F

import flash_numba.torch as fnt
from flash_numba.torch import scaled_dot_product_attention as ours

B, H, N, D = 64, 4, 256, 64


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv")
    p.add_argument("--profile")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    args = p.parse_args()
    dt = getattr(torch, args.dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    packed = torch.randn(B, N, 3 * H * D, device="cuda", generator=g, dtype=dt, requires_grad=True)
    grad = torch.randn(B, H, N, D, device="cuda", generator=g, dtype=dt)

    def step(f):
        q, k, v = packed.view(B, N, 3, H, D).permute(2, 0, 3, 1, 4)
        y = f(q, k, v, is_causal=True)
        y.backward(grad)

    def through_ops(*args, **kw):  # the custom ops even in eager mode
        eager, fnt._eager = fnt._eager, lambda *_: False
        try:
            return ours(*args, **kw)
        finally:
            fnt._eager = eager

    rows = []
    for name, f in (("sdpa", F.scaled_dot_product_attention), ("flash_numba", ours), ("flash_numba-ops", through_ops)):
        for _ in range(20):
            step(f)
        torch.cuda.synchronize()
        host = []
        for _ in range(200):
            t0 = time.perf_counter()
            step(f)
            host.append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
        gpu = []
        for _ in range(50):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step(f)
            b.record()
            b.synchronize()
            gpu.append(a.elapsed_time(b) * 1e3)
        rows.append(dict(impl=name, dtype=args.dtype, B=B, H=H, N=N, d=D, host_us=round(statistics.median(host), 1),
                         gpu_us=round(statistics.median(gpu), 1), gpu=torch.cuda.get_device_name()))
        print(rows[-1], flush=True)
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            step(ours)
        prof.disable()
        torch.cuda.synchronize()
        with open(args.profile, "w") as fh:
            pstats.Stats(prof, stream=fh).sort_stats("tottime").print_stats(45)
            pstats.Stats(prof, stream=fh).sort_stats("cumtime").print_stats(45)
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
