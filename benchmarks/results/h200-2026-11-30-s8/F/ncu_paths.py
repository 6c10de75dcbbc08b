"""One split backward (8 rounds) and one atomic backward at N = 4096, d = 64, B*H = 32: for ncu."""
import torch
import flash_numba as fn
torch.manual_seed(0)
q, k, v, do = (torch.randn(4, 8, 4096, 64, device="cuda") for _ in range(4))
f = fn.attention_forward(q, k, v, kernel="flash2_fast")
fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_fast")  # split: 16 copies, 8 launches
fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_fast", deterministic=False)  # atomic
torch.cuda.synchronize()
print("done")
