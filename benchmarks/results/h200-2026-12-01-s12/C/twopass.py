"""The two-pass deterministic backward (FORCE_DQ_COPIES = 0), B*H = 32: backward ms (CUDA events, median of 10)."""
import torch
import flash_numba as fn
from flash_numba.kernels.flash2_fast import layout
from flash_numba.tools.timing import torch_median_ms

layout.FORCE_DQ_COPIES = 0
print(torch.cuda.get_device_name(), fn.__file__)
for N, d, causal in ((4096, 64, False), (4096, 64, True), (4096, 128, False), (1024, 64, False), (128, 64, False)):
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(1, 32, N, d, device="cuda") for _ in range(4))
    f = fn.attention_forward(q, k, v, kernel="flash2_fast", causal=causal)
    ms = torch_median_ms(lambda: fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_fast", causal=causal))
    print(f"N={N} d={d} causal={causal} two-pass backward {ms:.3f} ms", flush=True)
