"""cuBLAS float32 (no TF32) on the backward's five products at N = 4096, B*H = 32, d = 64 and 128: the rate a
SIMT GEMM reaches on these shapes (session 13)."""
import torch
from flash_numba.tools.timing import torch_median_ms
torch.backends.cuda.matmul.allow_tf32 = False
BH, N = 32, 4096
print(torch.cuda.get_device_name(), "cuBLAS float32, allow_tf32 =", torch.backends.cuda.matmul.allow_tf32)
for d in (64, 128):
    q, k, v, do = (torch.randn(BH, N, d, device="cuda") for _ in range(4))
    s = torch.randn(BH, N, N, device="cuda")
    prods = {"S = Q K^T (N x N x d)": lambda: q @ k.transpose(1, 2),
             "dV = P^T dO (N x d x N)": lambda: s.transpose(1, 2) @ do,
             "dQ = dS K (N x d x N)": lambda: s @ k}
    for name, f in prods.items():
        t = torch_median_ms(f, 10)
        print(f"d = {d:3d} {name:<26} {t:8.3f} ms {2 * BH * N * N * d / t / 1e9:7.1f} TFLOP/s")
    del s
