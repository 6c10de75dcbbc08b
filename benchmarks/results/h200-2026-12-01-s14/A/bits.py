"""dQ, dK, dV of the deterministic backward (default and forced two-pass) at d = 32, 64, 80, 96, 128, causal or not,
with dropout at d = 64: saved to an .npz so two trees can be compared bit for bit (argv: output path)."""
import sys, numpy as np, torch, flash_numba as fn
from flash_numba.kernels import flash2_fast
out = {}
for d in (32, 64, 80, 96, 128):
    g = torch.Generator(device="cuda").manual_seed(d)
    q, k, v, do = (torch.randn(2, 3, 333, d, device="cuda", generator=g) for _ in range(4))
    for causal in (False, True):
        for p in ((0.0, 0.1) if d == 64 else (0.0,)):
            f = fn.attention_forward(q, k, v, causal=causal, kernel="flash2_fast", dropout_p=p, dropout_seed=7 if p else None)
            for copies in (None, 0):
                flash2_fast.layout.FORCE_DQ_COPIES = copies
                b = fn.attention_backward(q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2_fast", dropout_p=p,
                                          dropout_seed=7 if p else None)
                for name in ("dq", "dk", "dv"):
                    out[f"{d}_{causal}_{p}_{copies}_{name}"] = getattr(b, name).cpu().numpy()
flash2_fast.layout.FORCE_DQ_COPIES = None
np.savez(sys.argv[1], **out)
print(len(out), "arrays")
