"""The split backward at d = 128, N = 4096, B*H = 32 with forced copies of dQ (session 13: three blocks an SM)."""
import sys, torch, flash_numba as fn
from flash_numba.kernels import flash2_fast
from flash_numba.tools.timing import torch_median_ms
torch.manual_seed(0)
q, k, v, do = (torch.randn(4, 8, 4096, 128, device="cuda") for _ in range(4))
for causal in (False, True):
    f = fn.attention_forward(q, k, v, kernel="flash2_fast", causal=causal)
    for copies in [int(x) for x in sys.argv[1:]]:
        flash2_fast.layout.FORCE_DQ_COPIES = copies
        t = torch_median_ms(lambda: fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_fast", causal=causal), 10)
        print(f"d = 128 causal = {causal} copies = {copies:3d} backward {t:8.3f} ms", flush=True)
