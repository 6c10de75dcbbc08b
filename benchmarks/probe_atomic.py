"""Probe (lead's scratch, issue 4): flash2_fast's backward with dQ by atomics against the two-kernel one."""
# ruff: noqa: E501, E731, E402  (a scratch probe: its output lines are kept verbatim in results/)

import time

import numpy as np
import torch
from numba import cuda

import flash_numba
from flash_numba.kernels import flash2_fast as F
from flash_numba.kernels import flash2 as F2

BH, N, d = 32, 4096, 64
fl = 4 * BH * N * N * d  # forward FLOPs; one product = fl / 2
torch.manual_seed(0)
q, k, v, do = (torch.randn(BH, N, d, device="cuda") for _ in range(4))
cnt = cuda.to_device(np.zeros(2, np.int64))


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
    f = flash_numba.flash_attention_forward(q, k, v, causal=causal, kernel="flash2_fast")
    o, lse = f.o, f.lse
    D = torch.empty(BH, N, device="cuda")
    dq, dk, dv = (torch.empty_like(q) for _ in range(3))
    nb = {n: cuda.as_cuda_array(t) for n, t in dict(q=q, k=k, v=v, do=do, o=o, lse=lse, D=D, dq=dq, dk=dk, dv=dv).items()}
    rs = F2._rowsum_kernel(d, np.dtype("float32"), False)
    rs[(N // F2.TY, BH), F2.NT](nb["o"], nb["do"], nb["D"], cnt, N)
    Br, Bc = 32, 32
    unused = F._unused_dq(np.dtype("float32"))
    kv, _ = F.dkdv_kernel(d, Bc // 8, Br // 16, "float32", causal, False)
    ms_kv = tm(lambda: kv[(N // Bc) * BH, F.NT](nb["q"], nb["k"], nb["v"], nb["do"], nb["lse"], nb["D"], nb["dk"], nb["dv"], unused, N, N, sc, sl2, cnt))
    qk, _ = F.dq_kernel(d, Br // 8, Bc // 16, "float32", causal, False)
    ms_q = tm(lambda: qk[(N // Br) * BH, F.NT](nb["q"], nb["k"], nb["v"], nb["do"], nb["lse"], nb["D"], nb["dq"], N, N, sc, sl2, cnt))
    print(f"causal={causal} deterministic: dK/dV {ms_kv:.3f} ms + dQ {ms_q:.3f} ms = {ms_kv + ms_q:.3f} ms", flush=True)
    zero = F.zero_kernel("float32", False)
    n = BH * N * d
    flat = nb["dq"].reshape(n)
    ms_z = tm(lambda: zero[-(-n // 256), 256](flat, n, cnt))
    for maxreg in (None, 128, 168):
        F.dkdv_kernel.cache_clear()
        kva, _ = F.dkdv_kernel(d, Bc // 8, Br // 16, "float32", causal, False, maxreg, atomic_dq=True)
        run = lambda: (zero[-(-n // 256), 256](flat, n, cnt), kva[(N // Bc) * BH, F.NT](nb["q"], nb["k"], nb["v"], nb["do"], nb["lse"], nb["D"], nb["dk"], nb["dv"], nb["dq"], N, N, sc, sl2, cnt))
        ms = tm(run)
        regs = list(kva.get_regs_per_thread().values())[0]
        lm = list(kva.get_local_mem_per_thread().values())[0]
        print(f"causal={causal} atomic maxreg={maxreg}: zero {ms_z:.3f} + dK/dV/dQ = {ms:.3f} ms ({5 * fl / 2 / div / ms / 1e9:.1f} TFLOP/s over 5 products) regs {regs} local {lm}", flush=True)
    # through the API, and the error against float64
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    o64 = torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=causal)
    g64 = torch.autograd.grad(o64, ref, do.double())
    for det in (True, False):
        b = flash_numba.flash_attention_backward(q, k, v, o, lse, do, causal=causal, kernel="flash2_fast", deterministic=det)
        errs = [((x.double() - r).abs().max() / r.abs().max()).item() for x, r in zip((b.dq, b.dk, b.dv), g64)]
        api = tm(lambda: flash_numba.flash_attention_backward(q, k, v, o, lse, do, causal=causal, kernel="flash2_fast", deterministic=det))
        b2 = flash_numba.flash_attention_backward(q, k, v, o, lse, do, causal=causal, kernel="flash2_fast", deterministic=det)
        same = torch.equal(b.dq, b2.dq)
        print(f"causal={causal} API deterministic={det}: {api:.3f} ms; rel err dq {errs[0]:.1e} dk {errs[1]:.1e} dv {errs[2]:.1e}; dq bitwise equal on a second call: {same}", flush=True)

# API host overhead (after the _inputs changes)
for kind in ("torch", "numba"):
    qs = [torch.randn(1, 1, 64, d, device="cuda") for _ in range(3)]
    args = qs if kind == "torch" else [cuda.as_cuda_array(t) for t in qs]
    f = lambda: flash_numba.flash_attention_forward(*args, kernel="flash2_fast")
    for _ in range(20):
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        f()
    torch.cuda.synchronize()
    print(f"API N=64 {kind} flash2_fast forward: {(time.perf_counter() - t0) / 200 * 1e3:.3f} ms per call (host loop)", flush=True)
