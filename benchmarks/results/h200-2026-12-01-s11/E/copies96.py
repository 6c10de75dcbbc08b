"""d = 96 (and 80) deterministic split backward at forced dQ copies, alternating twice: N = 4096, B*H = 32, fp32."""
import torch, flash_numba as fn
from flash_numba.kernels.flash2_fast import layout as L
from flash_numba.tools.timing import torch_median_ms
for d, copies in ((96, (12, 16)), (80, (16, 12))):
    q, k, v, do = (torch.randn(1, 32, 4096, d, device="cuda") for _ in range(4))
    f = fn.attention_forward(q, k, v, kernel="flash2_fast")
    for rep in range(2):
        for S in copies:
            L.FORCE_DQ_COPIES = S
            ms = torch_median_ms(lambda: fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_fast"), 10)
            print(f"d = {d}, {S} copies, run {rep + 1}: backward {ms:.3f} ms", flush=True)
    L.FORCE_DQ_COPIES = None
