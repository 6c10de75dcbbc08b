import sys, torch, flash_numba as fn
from flash_numba.tools.timing import torch_median_ms
tag = sys.argv[1]
for d, block in ((64, None), (64, (64, 32)), (128, None)):
    q, k, v = (torch.randn(4, 8, 4096, d, device="cuda") for _ in range(3))
    for causal in (False, True):
        call = lambda: fn.attention_forward(q, k, v, kernel="flash2_fast", causal=causal, block=block)
        f = call()
        print(f"{tag},{d},{f.block[0]}x{f.block[1]},{causal},{torch_median_ms(call, repeats=20):.3f}", flush=True)
