"""Probe (lead's scratch): time flash2_fast's kernels one by one at N = 4096 on this GPU."""
# ruff: noqa: E501, E731, E402  (a scratch probe: its output lines are kept verbatim in results/)

import numpy as np
import torch
from numba import cuda

from flash_numba.kernels import flash2_fast as F, flash2 as F2

BH, N, d = 32, 4096, 64
fl = 4 * BH * N * N * d
torch.manual_seed(0)
q, k, v, do = (torch.randn(BH, N, d, device="cuda") for _ in range(4))
o = torch.empty_like(q)
lse = torch.empty(BH, N, device="cuda")
D = torch.empty(BH, N, device="cuda")
dq, dk, dv = (torch.empty_like(q) for _ in range(3))
cnt = cuda.to_device(np.zeros(2, np.int64))
nb = {n: cuda.as_cuda_array(t) for n, t in dict(q=q, k=k, v=v, do=do, o=o, lse=lse, D=D, dq=dq, dk=dk, dv=dv).items()}


def tm(f, reps=5):
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


sc, sl2 = np.float32(1 / 8), np.float32(F.LOG2E / 8)
for causal in (False, True):
    div = 2 if causal else 1
    for TM, TN in ((8, 2),):
        kern, g = F.forward_kernel(d, TM, TN, "float32", causal, False)
        ms = tm(lambda: kern[(N // g["Br"]) * BH, F.NT](nb["q"], nb["k"], nb["v"], nb["o"], nb["lse"], N, N, sl2, cnt))
        print(f"fwd causal={causal} {TM}x{TN}: {ms:.3f} ms {fl / div / ms / 1e9:.1f} TFLOP/s", flush=True)
    rs = F2._rowsum_kernel(d, np.dtype("float32"), False)
    ms = tm(lambda: rs[(N // F2.TY, BH), F2.NT](nb["o"], nb["do"], nb["D"], cnt, N))
    print(f"rowsum: {ms:.3f} ms", flush=True)
    for Br, Bc in ((32, 32), (32, 16), (16, 32), (64, 32), (32, 64)):
        for maxreg in (None, 128):
            try:
                kv, g = F.dkdv_kernel(d, Bc // 8, Br // 16, "float32", causal, False, maxreg)
                if g["smem"] > 48 * 1024:
                    continue
                ms = tm(
                    lambda: kv[(N // Bc) * BH, F.NT](
                        nb["q"], nb["k"], nb["v"], nb["do"], nb["lse"], nb["D"], nb["dk"], nb["dv"], N, N, sc, sl2, cnt
                    )
                )
                regs = list(kv.get_regs_per_thread().values())[0]
                print(
                    f"dkdv causal={causal} Br={Br} Bc={Bc} maxreg={maxreg}: {ms:.3f} ms {2 * fl / div / ms / 1e9:.1f} TFLOP/s (4 matmuls) regs {regs}",
                    flush=True,
                )
            except Exception as e:
                print("dkdv fail", Br, Bc, maxreg, repr(e)[:200])
        try:
            qk, g = F.dq_kernel(d, Br // 8, Bc // 16, "float32", causal, False)
            if g["smem"] > 48 * 1024:
                continue
            ms = tm(
                lambda: qk[(N // Br) * BH, F.NT](
                    nb["q"], nb["k"], nb["v"], nb["do"], nb["lse"], nb["D"], nb["dq"], N, N, sc, sl2, cnt
                )
            )
            regs = list(qk.get_regs_per_thread().values())[0]
            print(
                f"dq   causal={causal} Br={Br} Bc={Bc}: {ms:.3f} ms {1.5 * fl / div / ms / 1e9:.1f} TFLOP/s (3 matmuls) regs {regs}",
                flush=True,
            )
        except Exception as e:
            print("dq fail", Br, Bc, repr(e)[:200])
