"""Probe: time the register-tiled forward prototype against PyTorch on this GPU.

    python benchmarks/probe_regtile.py
"""
import math
import sys
import time

import numpy as np
import torch

import flash_numba
from flash_numba.device import describe
from numba import cuda
from flash_numba.kernels._regtile_fwd import forward_kernel, LOG2E, NT

print(describe(), "numpy", np.__version__, "shim patched:", flash_numba._compat.PATCHED, flush=True)
BH, N, d = 32, 4096, 64
flops = 4 * BH * N * N * d
torch.manual_seed(0)
q, k, v = (torch.randn(BH, N, d, device="cuda", dtype=torch.float32) for _ in range(3))


def tm(fn, reps=10):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b))
    return float(np.median(ts))

ref = torch.nn.functional.scaled_dot_product_attention(q.double()[None], k.double()[None], v.double()[None])[0]
for causal in (False, True):
    for (TM, TN) in [(8, 2), (4, 2), (8, 1), (4, 3), (8, 3)]:
        try:
            t0 = time.time()
            kern, g = forward_kernel(d, TM, TN, "float32", causal, False)
            if g["smem"] > 48 * 1024:
                print("skip", TM, TN, g["smem"]); continue
            o = torch.empty_like(q); L = torch.empty(BH, N, device="cuda")
            cnt = cuda.to_device(np.zeros(2, np.int64))
            args = [cuda.as_cuda_array(x) for x in (q, k, v, o, L)]
            Tr = -(-N // g["Br"])
            run = lambda: kern[(Tr, BH), NT](*args, N, N, np.float32(LOG2E / math.sqrt(d)), cnt)
            run(); cuda.synchronize()
            comp = time.time() - t0
            refc = ref if not causal else torch.nn.functional.scaled_dot_product_attention(q.double()[None], k.double()[None], v.double()[None], is_causal=True)[0]
            err = ((o.double() - refc).norm() / refc.norm()).item()
            ms = tm(run)
            f = flops / (2 if causal else 1)
            regs = list(kern.get_regs_per_thread().values())[0]
            print(f"regtile TM={TM} TN={TN} Br={g['Br']} Bc={g['Bc']} causal={causal}: {ms:.3f} ms {f/ms/1e9:.1f} TFLOP/s err {err:.2e} regs {regs} smem {g['smem']} compile {comp:.1f}s", flush=True)
        except Exception as e:
            print("fail", TM, TN, causal, repr(e)[:300], flush=True)

from torch.nn.attention import sdpa_kernel, SDPBackend
for name, be in ():
    for causal in (False, True):
        with sdpa_kernel(be):
            ms = tm(lambda: torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=causal))
        f = flops / (2 if causal else 1)
        print(f"torch {name} causal={causal}: {ms:.3f} ms {f/ms/1e9:.1f} TFLOP/s")
