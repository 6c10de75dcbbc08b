"""compute-sanitizer racecheck on the builds with dV_j and dK_j in separate warps (layout.split_dv_dk): on the H200 the
atomic backward at d = 64 (32 x 64, dynamic shared memory, capped at 168 registers); causal or not, dropout or not."""
import numpy as np, flash_numba as fn
from flash_numba.kernels.flash2_fast import layout
rng = np.random.default_rng(0)
q, k, v, do = (rng.standard_normal((2, 97, 64)).astype(np.float32) for _ in range(4))
for causal in (False, True):
    for p in (0.0, 0.2):
        f = fn.attention_forward(q, k, v, causal=causal, kernel="flash2_fast", dropout_p=p)
        fn.attention_backward(q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2_fast", dropout_p=p,
                              dropout_seed=f.dropout_seed, deterministic=False)
print("split_dv_dk at d = 64 atomic:", layout.split_dv_dk(True, False, 4), "ok")
