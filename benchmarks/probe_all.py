"""Probe (lead's scratch, superseded by `flash-numba bench`): every kernel at N = 4096 on this GPU.

python benchmarks/probe_all.py
"""
# ruff: noqa: E501, E731, E402  (a scratch probe: its output lines are kept verbatim in results/)

import sys

import numpy as np
import torch

import flash_numba as fn

print(fn.device.describe(), flush=True)
BH, N, d = 32, int(sys.argv[1]) if len(sys.argv) > 1 else 4096, 64
flops_f = 4 * BH * N * N * d
torch.manual_seed(0)
q, k, v, do = (torch.randn(4, 8, N, d, device="cuda", dtype=torch.float32) for _ in range(4))


def tm(fn_, reps=5):
    fn_()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn_()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return float(np.median(ts))


for causal in (False, True):
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    div = 2 if causal else 1
    for kernel, blocks in (
        ("flash2_fast", [None, (32, 16), (16, 32), (16, 16)]),
        ("flash2", [None]),
        ("standard", [None]),
        ("flash1", [None]),
    ):
        if kernel == "flash1" and N > 2048:
            continue
        for blk in blocks:
            try:
                if kernel == "standard":
                    f = lambda: fn.standard_attention_forward(q, k, v, causal=causal)
                    b_ = lambda r: fn.standard_attention_backward(q, k, v, r.o, r.lse, do, causal=causal)
                else:
                    f = lambda: fn.flash_attention_forward(q, k, v, causal=causal, kernel=kernel)
                    b_ = lambda r: fn.flash_attention_backward(
                        q, k, v, r.o, r.lse, do, causal=causal, kernel=kernel, block=blk
                    )
                r = f()
                err = (torch.as_tensor(r.o, device="cuda").double() - ref).norm().item() / ref.norm().item()
                ms_f = tm(f)
                rb = b_(r)
                ms_fb = tm(lambda: b_(f()))
                print(
                    f"{kernel:12s} causal={causal} bwd-block={rb.block}: fwd {ms_f:8.3f} ms {flops_f / div / ms_f / 1e9:5.1f} TFLOP/s | fwd+bwd {ms_fb:8.3f} ms {3.5 * flops_f / div / ms_fb / 1e9:5.1f} TFLOP/s | err {err:.1e}",
                    flush=True,
                )
            except Exception as e:
                print(kernel, blk, causal, "FAILED", repr(e)[:400], flush=True)
qd, kd, vd, dod = (x.detach().double().requires_grad_(True) for x in (q, k, v, do))
for causal in (False, True):
    o = torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=causal)
    o.backward(dod)
    r = fn.flash_attention_forward(q, k, v, causal=causal, kernel="flash2_fast")
    b = fn.flash_attention_backward(q, k, v, r.o, r.lse, do, causal=causal, kernel="flash2_fast")
    for name, ours, ref in (("dq", b.dq, qd.grad), ("dk", b.dk, kd.grad), ("dv", b.dv, vd.grad)):
        print(name, causal, (torch.as_tensor(ours, device="cuda").double() - ref).norm().item() / ref.norm().item())
    qd.grad = kd.grad = vd.grad = None
from torch.nn.attention import sdpa_kernel, SDPBackend

for name, be in (("torch math", SDPBackend.MATH), ("torch efficient", SDPBackend.EFFICIENT_ATTENTION)):
    for causal in (False, True):
        qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
        with sdpa_kernel(be):
            ms = tm(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal))
            ms_fb = tm(
                lambda: torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(do)
            )
        div = 2 if causal else 1
        print(
            f"{name:16s} causal={causal}: fwd {ms:8.3f} ms {flops_f / div / ms / 1e9:5.1f} | fwd+bwd {ms_fb:8.3f} ms {3.5 * flops_f / div / ms_fb / 1e9:5.1f}",
            flush=True,
        )
