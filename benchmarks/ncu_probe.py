"""One call of each kernel to profile under Nsight Compute, after a warm-up that compiles it.

    ncu --profile-from-start off --section SpeedOfLight ... python benchmarks/ncu_probe.py WHAT [WHAT ...]

WHAT: ``std64`` (standard attention's forward on tensor cores, float16, B*H = 32, N = 4096, d = 64), ``tc64``,
``tc128`` (flash2_tc forward, deterministic and atomic backward, float16, B*H = 32, N = 4096; ``tc64bf`` and
``tc128bf`` the same in bfloat16)
and ``decode`` (attention_decode, B = 8, Hq = 32, Hkv = 8, d = 128, float16, 32k cache, Nq = 1).  Only the
calls between ``cuda.profile_start()`` and ``cuda.profile_stop()`` are profiled (``--profile-from-start off``).
"""

from __future__ import annotations

import sys

import torch
from numba import cuda

import flash_numba as fn


def tc(d, dtype=torch.float16):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(1, 32, 4096, d, device="cuda", generator=g, dtype=dtype) for _ in range(4))

    def calls():
        f = fn.attention_forward(q, k, v, kernel="flash2_tc")
        for det in (True, False):
            fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_tc", deterministic=det)
    return calls


def std(d):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 32, 4096, d, device="cuda", generator=g, dtype=torch.float16) for _ in range(3))
    return lambda: fn.standard_attention_forward(q, k, v)


def decode():
    g = torch.Generator(device="cuda").manual_seed(0)
    B, Hq, Hkv, N, d = 8, 32, 8, 32768, 128
    q = torch.randn(B, Hq, 1, d, device="cuda", generator=g, dtype=torch.float16)
    kc, vc = (torch.randn(B, Hkv, N, d, device="cuda", generator=g, dtype=torch.float16) for _ in range(2))
    return lambda: fn.attention_decode(q, kc, vc)


def main():
    what = sys.argv[1:] or ["tc64"]
    make = {"std64": lambda: std(64), "tc64": lambda: tc(64), "tc128": lambda: tc(128),
            "tc64bf": lambda: tc(64, torch.bfloat16), "tc128bf": lambda: tc(128, torch.bfloat16), "decode": decode}
    runs = [make[w]() for w in what]
    for r in runs:  # compile and warm up outside the profiled range
        r()
    torch.cuda.synchronize()
    cuda.profile_start()
    for r in runs:
        r()
    torch.cuda.synchronize()
    cuda.profile_stop()


if __name__ == "__main__":
    main()
