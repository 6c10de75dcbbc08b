"""Probe (lead's scratch, issue 4): flash2_fast's kernels after the fixed-column loads and Q pre-scaling,
against the forward before (benchmarks/fwd_base.py); errors against float64."""
# ruff: noqa: E501, E731, E402

import sys

import numpy as np
import torch
from numba import cuda

sys.path.insert(0, "benchmarks")
import fwd_base

import flash_numba
from flash_numba.kernels import flash2_fast as F

BH, N, d = 32, 4096, 64
fl = 4 * BH * N * N * d
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


torch.manual_seed(0)
q, k, v, do = (torch.randn(BH, N, d, device="cuda") for _ in range(4))
nb = [cuda.as_cuda_array(t) for t in (q, k, v)]
sl2, sc = np.float32(F.LOG2E / 8), np.float32(1 / 8)
for causal in (False, True):
    div = 2 if causal else 1
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    for rep in range(2):  # alternate, twice, against clock drift
        for name, fac in (("before", fwd_base.forward_kernel), ("after", F.forward_kernel)):
            kern, g = fac(d, 8, 2, "float32", causal, False)
            o = torch.full((BH, N, d), float("nan"), device="cuda")
            lse = torch.empty(BH, N, device="cuda")
            no, nl = cuda.as_cuda_array(o), cuda.as_cuda_array(lse)
            ms = tm(lambda: kern[(N // g["Br"], BH), F.NT](*nb, no, nl, N, N, sl2, cnt))
            regs = list(kern.get_regs_per_thread().values())[0]
            err = ((o.double() - ref).abs().max() / ref.abs().max()).item()
            print(f"fwd causal={causal} {name}: {ms:.3f} ms {fl / div / ms / 1e9:.1f} TFLOP/s regs {regs} max rel err {err:.2e}", flush=True)
    f = flash_numba.flash_attention_forward(q, k, v, causal=causal, kernel="flash2_fast")
    D = torch.empty(BH, N, device="cuda")
    dq, dk, dv = (torch.empty_like(q) for _ in range(3))
    m = {n: cuda.as_cuda_array(t) for n, t in dict(q=q, k=k, v=v, do=do, o=f.o, lse=f.lse, D=D, dq=dq, dk=dk, dv=dv).items()}
    flash_numba.kernels.flash2._rowsum_kernel(d, np.dtype("float32"), False)[(N // 8, BH), 128](m["o"], m["do"], m["D"], cnt, N)
    kva, _ = F.dkdv_kernel(d, 4, 2, "float32", causal, False, atomic_dq=True)
    ms = tm(lambda: kva[(N // 32, BH), F.NT](m["q"], m["k"], m["v"], m["do"], m["lse"], m["D"], m["dk"], m["dv"], m["dq"], N, N, sc, sl2, cnt))
    print(f"dK/dV/dQ atomic causal={causal}: {ms:.3f} ms (was 16.494 / 9.054)", flush=True)
    kv, _ = F.dkdv_kernel(d, 4, 2, "float32", causal, False)
    ms1 = tm(lambda: kv[(N // 32, BH), F.NT](m["q"], m["k"], m["v"], m["do"], m["lse"], m["D"], m["dk"], m["dv"], F._unused_dq(np.dtype("float32")), N, N, sc, sl2, cnt))
    qk, _ = F.dq_kernel(d, 4, 2, "float32", causal, False)
    ms2 = tm(lambda: qk[(N // 32, BH), F.NT](m["q"], m["k"], m["v"], m["do"], m["lse"], m["D"], m["dq"], N, N, sc, sl2, cnt))
    print(f"dK/dV {ms1:.3f} + dQ {ms2:.3f} ms causal={causal} (was 12.685 + 9.996 / 7.098 + 5.719)", flush=True)
    ref64 = [t.double().requires_grad_() for t in (q, k, v)]
    g64 = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(*ref64, is_causal=causal), ref64, do.double())
    for det in (True, False):
        b = flash_numba.flash_attention_backward(q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2_fast", deterministic=det)
        errs = [((x.double() - r).abs().max() / r.abs().max()).item() for x, r in zip((b.dq, b.dk, b.dv), g64)]
        print(f"API backward causal={causal} deterministic={det}: rel err dq {errs[0]:.1e} dk {errs[1]:.1e} dv {errs[2]:.1e}", flush=True)
