"""flash2_fast forward at d = 96 (and 80): shipped cap 128 against uncapped (argv[1] = 'cap' or 'nocap')."""
import statistics, sys
import torch
import flash_numba as fn
from flash_numba.kernels.flash2_fast import layout
if sys.argv[1] == "nocap":
    layout.MAX_REGISTERS[layout.FORWARD_NAME] = None
def ms(f, n=20):
    for _ in range(3): f()
    torch.cuda.synchronize()
    out = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); torch.cuda.synchronize(); out.append(a.elapsed_time(b))
    return statistics.median(out)
for d in (96, 80):
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 8, 4096, d, device="cuda") for _ in range(3))
    for causal in (False, True):
        t = ms(lambda: fn.attention_forward(q, k, v, kernel="flash2_fast", causal=causal))
        print(f"{sys.argv[1]} d={d} causal={causal} {t:.3f} ms", flush=True)
