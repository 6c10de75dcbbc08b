"""Probe (lead's scratch, issue 4): one launch each of flash2_fast's forward and atomic dK/dV/dQ kernels at
N = 4096, for Nsight Compute (run under ``ncu -k regex:'forward_kernel|dkdv_kernel'``)."""
# ruff: noqa: E402

import numpy as np
import torch
from numba import cuda

from flash_numba.kernels import flash2 as F2
from flash_numba.kernels import flash2_fast as F

BH, N, d = 32, 4096, 64
torch.manual_seed(0)
q, k, v, do = (torch.randn(BH, N, d, device="cuda") for _ in range(4))
o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
lse, D = torch.empty(BH, N, device="cuda"), torch.empty(BH, N, device="cuda")
nb = {n: cuda.as_cuda_array(t) for n, t in dict(q=q, k=k, v=v, do=do, o=o, lse=lse, D=D, dq=dq, dk=dk, dv=dv).items()}
cnt = cuda.to_device(np.zeros(2, np.int64))
sc, sl2 = np.float32(1 / 8), np.float32(F.LOG2E / 8)
fwd, g = F.forward_kernel(d, 8, 2, "float32", False, False)
fwd[(N // g["Br"]) * BH, F.NT](nb["q"], nb["k"], nb["v"], nb["o"], nb["lse"], N, N, sl2, cnt)
F2._rowsum_kernel(d, np.dtype("float32"), False)[(N // F2.TY, BH), F2.NT](nb["o"], nb["do"], nb["D"], cnt, N)
kv, _ = F.dkdv_kernel(d, 4, 2, "float32", False, False, atomic_dq=True)
kv[(N // 32) * BH, F.NT](nb["q"], nb["k"], nb["v"], nb["do"], nb["lse"], nb["D"], nb["dk"], nb["dv"], nb["dq"],
                        N, N, sc, sl2, cnt)
cuda.synchronize()
print("done")
