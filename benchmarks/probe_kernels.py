"""Probe (issue 4): each flash2_fast kernel timed alone at N = 4096 (B*H = 32, d = 64, fp32), causal and not.

Kernel-only times (CUDA events around one launch, median of 10 after 3 warm-ups), next to the
API's times in ``benchmarks/bench.py`` (which include the host side of a call).  Prints one line per
kernel with TFLOP/s over the products it runs; ``--ptxas`` adds registers and local memory.

    python benchmarks/probe_kernels.py
"""

import numpy as np
import torch
from numba import cuda

import flash_numba
from flash_numba.device import time_ms
from flash_numba.kernels import flash2 as F2
from flash_numba.kernels import flash2_fast as F

BH, N, d = 32, 4096, 64
product = 2 * BH * N * N * d  # FLOPs of one N x N x d matrix product over all heads
torch.manual_seed(0)
q, k, v, do = (torch.randn(BH, N, d, device="cuda") for _ in range(4))
cnt = cuda.to_device(np.zeros(2, np.int64))
sc, sl2 = np.float32(1 / 8), np.float32(F.LOG2E / 8)


def line(name, causal, ms, products, kern):
    div = 2 if causal else 1
    regs = list(kern.get_regs_per_thread().values())[0]
    local = list(kern.get_local_mem_per_thread().values())[0]
    tf = products * product / div / (ms * 1e-3) / 1e12
    print(f"{name:34s} causal={causal!s:5s} {ms:8.3f} ms  {tf:5.1f} TFLOP/s  regs {regs:3d} local {local}", flush=True)


for causal in (False, True):
    f = flash_numba.flash_attention_forward(q, k, v, causal=causal, kernel="flash2_fast")
    o, lse = f.o, f.lse
    D = torch.empty(BH, N, device="cuda")
    dq, dk, dv = (torch.empty_like(q) for _ in range(3))
    nb = {n: cuda.as_cuda_array(t) for n, t in dict(q=q, k=k, v=v, do=do, o=o, lse=lse, D=D, dq=dq, dk=dk,
                                                     dv=dv).items()}
    fwd, g = F.forward_kernel(d, 8, 2, "float32", causal, False)
    ms = np.median(time_ms(lambda: fwd[(N // g["Br"]) * BH, F.NT](nb["q"], nb["k"], nb["v"], nb["o"], nb["lse"],
                                                                   N, N, sl2, cnt)))
    line("forward", causal, ms, 2, fwd)
    F2._rowsum_kernel(d, np.dtype("float32"), False)[(N // F2.TY, BH), F2.NT](nb["o"], nb["do"], nb["D"], cnt, N)
    kv, _ = F.dkdv_kernel(d, 4, 2, "float32", causal, False)
    unused = F._unused_dq(np.dtype("float32"))
    ms = np.median(time_ms(lambda: kv[(N // 32) * BH, F.NT](nb["q"], nb["k"], nb["v"], nb["do"], nb["lse"], nb["D"],
                                                            nb["dk"], nb["dv"], unused, N, N, sc, sl2, cnt)))
    line("dK, dV (deterministic)", causal, ms, 4, kv)
    qk, _ = F.dq_kernel(d, 4, 2, "float32", causal, False)
    ms = np.median(time_ms(lambda: qk[(N // 32) * BH, F.NT](nb["q"], nb["k"], nb["v"], nb["do"], nb["lse"], nb["D"],
                                                            nb["dq"], N, N, sc, sl2, cnt)))
    line("dQ (deterministic)", causal, ms, 3, qk)
    kva, _ = F.dkdv_kernel(d, 4, 2, "float32", causal, False, atomic_dq=True)
    ms = np.median(time_ms(lambda: kva[(N // 32) * BH, F.NT](nb["q"], nb["k"], nb["v"], nb["do"], nb["lse"], nb["D"],
                                                             nb["dk"], nb["dv"], nb["dq"], N, N, sc, sl2, cnt)))
    line("dK, dV, dQ (atomic)", causal, ms, 5, kva)

# --sweep: other micro-tiles of the forward and other blocks / register caps of the atomic backward
import sys  # noqa: E402

if "--sweep" in sys.argv:
    for causal in (False,):
        f = flash_numba.flash_attention_forward(q, k, v, causal=causal, kernel="flash2_fast")
        nb = {n: cuda.as_cuda_array(t) for n, t in dict(q=q, k=k, v=v, do=do, o=f.o, lse=f.lse).items()}
        D = cuda.as_cuda_array(torch.zeros(BH, N, device="cuda"))
        dq, dk, dv = (cuda.as_cuda_array(torch.empty_like(q)) for _ in range(3))
        for TM, TN in ((8, 2), (8, 1), (4, 2), (4, 3)):
            o2 = cuda.as_cuda_array(torch.empty_like(q))
            l2 = cuda.as_cuda_array(torch.empty(BH, N, device="cuda"))
            fk, g = F.forward_kernel(d, TM, TN, "float32", causal, False)
            ms = np.median(time_ms(lambda: fk[-(-N // g["Br"]) * BH, F.NT](nb["q"], nb["k"], nb["v"], o2, l2, N, N, sl2,
                                                                            cnt)))
            err = float(np.abs(o2.copy_to_host() - f.o.cpu().numpy()).max())
            line(f"forward TM={TM} TN={TN} (max |diff| {err:.1e})", causal, ms, 2, fk)
        for Br, Bc in ((32, 32), (32, 16), (16, 32)):
            for maxreg in (None, 128, 96):
                ka, _ = F.dkdv_kernel(d, Bc // 8, Br // 16, "float32", causal, False, maxreg, atomic_dq=True)
                run = lambda: ka[-(-N // Bc) * BH, F.NT](nb["q"], nb["k"], nb["v"], nb["do"], nb["lse"], D, dk, dv, dq,  # noqa: E731
                                                           N, N, sc, sl2, cnt)
                ms = np.median(time_ms(run))
                line(f"atomic Br={Br} Bc={Bc} maxreg={maxreg}", causal, ms, 5, ka)
