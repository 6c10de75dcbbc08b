"""Small backwards for compute-sanitizer racecheck (S^T/dP^T split, dV/dK split): d = 32, 64 and 128, two-pass,
split and atomic, causal or not, with and without dropout."""
import numpy as np, flash_numba as fn
from flash_numba.kernels import flash2_fast
rng = np.random.default_rng(0)
for d in (32, 64, 128):
    q, k, v, do = (rng.standard_normal((2, 97, d)).astype(np.float32) for _ in range(4))
    for causal in (False, True):
        for p in (0.0, 0.2):
            f = fn.attention_forward(q, k, v, causal=causal, kernel="flash2_fast", dropout_p=p)
            kw = dict(causal=causal, kernel="flash2_fast", dropout_p=p, dropout_seed=f.dropout_seed)
            for copies in (0, 2):
                flash2_fast.layout.FORCE_DQ_COPIES = copies
                fn.attention_backward(q, k, v, f.o, f.lse, do, **kw)
            flash2_fast.layout.FORCE_DQ_COPIES = None
            fn.attention_backward(q, k, v, f.o, f.lse, do, deterministic=False, **kw)
print("ok")
