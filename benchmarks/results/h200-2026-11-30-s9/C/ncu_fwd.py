import torch, flash_numba as fn
from flash_numba.kernels.flash2_fast import layout
q, k, v = (torch.randn(4, 8, 4096, 64, device="cuda") for _ in range(3))
for force in (False, True):
    layout.FORCE_MMA = force
    for _ in range(2):
        fn.attention_forward(q, k, v, kernel="flash2_fast", block=(64, 32))
torch.cuda.synchronize()
