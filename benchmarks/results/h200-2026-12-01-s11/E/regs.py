"""Registers per thread of the dK/dV/dQ (atomic) kernel as the device builds it (Numba's own ptxas/driver), at the
deterministic backward's block for d = 80, 96, 128, float32, N = 4096, B*H = 32 (one backward each, split path)."""
import numpy as np, torch, flash_numba as fn
from flash_numba.kernels import flash2_fast as F
from flash_numba.kernels.flash2_fast import layout as L
from flash_numba import device
info = device.info()
for d in (64, 80, 96, 128):
    q, k, v, do = (torch.randn(1, 32, 4096, d, device="cuda") for _ in range(4))
    f = fn.attention_forward(q, k, v, kernel="flash2_fast")
    b = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_fast")
    blk = fn.resolve_block("flash2_fast", d, "float32", pass_="backward")
    g = L.geometry_kv(d, blk[1] // 8, blk[0] // 16, np.float32)
    kern, _ = F.dkdv_kernel(d, blk[1] // 8, blk[0] // 16, "float32", False, False, atomic_dq=True,
                            dynamic=g["smem"] > 48 * 1024)
    regs = kern.get_regs_per_thread()
    print(f"d = {d}, block {blk}, copies {L.split_dq_copies(32, 1, 4096, 4096, d, np.float32, blk)}, "
          f"blocks/SM assumed {L.kvq_blocks_per_sm(*blk, d, np.float32, info.compute_capability, info.shared_mem_per_sm)}, "
          f"registers on this device {regs}", flush=True)
