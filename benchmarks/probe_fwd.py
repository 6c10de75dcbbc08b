"""Probe (lead's scratch, issue 4): flash2_fast's forward against the fwd_v1 candidate, and the API's overhead."""
# ruff: noqa: E501, E731, E402  (a scratch probe: its output lines are kept verbatim in results/)

import cProfile
import pstats
import sys
import time

import numpy as np
import torch
from numba import cuda

sys.path.insert(0, "benchmarks")
import fwd_v1

import flash_numba
from flash_numba.kernels import flash2_fast as F

BH, d = 32, 64
cnt = cuda.to_device(np.zeros(2, np.int64))


def tm(f, reps=7):
    f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        f()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return float(np.median(ts))


for N in (4096, 1024):
    fl = 4 * BH * N * N * d
    torch.manual_seed(0)
    q, k, v = (torch.randn(BH, N, d, device="cuda") for _ in range(3))
    nb = [cuda.as_cuda_array(t) for t in (q, k, v)]
    sl2 = np.float32(F.LOG2E / 8)
    for causal in (False, True):
        div = 2 if causal else 1
        if N == 4096:
            ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
        for name, fac in (("old", F.forward_kernel), ("v1", fwd_v1.forward_kernel)):
            for TM, TN in ((8, 2), (8, 1), (4, 2)):
                if name == "old" and (TM, TN) != (8, 2):
                    continue
                kern, g = fac(d, TM, TN, "float32", causal, False)
                o = torch.full((BH, N, d), float("nan"), device="cuda")
                lse = torch.empty(BH, N, device="cuda")
                no, nl = cuda.as_cuda_array(o), cuda.as_cuda_array(lse)
                ms = tm(lambda: kern[(N // g["Br"], BH), F.NT](*nb, no, nl, N, N, sl2, cnt))
                regs = list(kern.get_regs_per_thread().values())[0]
                err = ""
                if N == 4096:
                    err = f"max rel err {((o.double() - ref).abs().max() / ref.abs().max()).item():.2e}"
                print(f"N={N} causal={causal} {name} {TM}x{TN}: {ms:.3f} ms {fl / div / ms / 1e9:.1f} TFLOP/s regs {regs} smem {g['smem']} {err}", flush=True)

# API overhead: a tiny problem, so the time is the host's
for N in (64, 1024):
    q, k, v = (torch.randn(1, 1, N, d, device="cuda") for _ in range(3))
    qn, kn, vn = (cuda.as_cuda_array(t) for t in (q, k, v))
    for kind, args in (("torch", (q, k, v)), ("numba", (qn, kn, vn))):
        for kernel in ("flash2_fast", "flash2"):
            f = lambda: flash_numba.flash_attention_forward(*args, kernel=kernel)
            for _ in range(20):
                f()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(200):
                f()
            torch.cuda.synchronize()
            host = (time.perf_counter() - t0) / 200 * 1e3
            print(f"API N={N} {kind} {kernel}: {host:.3f} ms per call (host loop), events {tm(f):.3f} ms", flush=True)
q, k, v = (torch.randn(1, 1, 64, d, device="cuda") for _ in range(3))
pr = cProfile.Profile()
pr.enable()
for _ in range(300):
    flash_numba.flash_attention_forward(q, k, v, kernel="flash2_fast")
torch.cuda.synchronize()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(22)
