"""Small d = 128 backwards (P and dS in one tile) for compute-sanitizer racecheck: two-pass, split, atomic."""
import numpy as np, flash_numba as fn
from flash_numba.kernels import flash2_fast
rng = np.random.default_rng(0)
q, k, v, do = (rng.standard_normal((2, 97, 128)).astype(np.float32) for _ in range(4))
for causal in (False, True):
    f = fn.flash_attention_forward(q, k, v, causal=causal, kernel="flash2_fast")
    for copies in (0, 2):
        flash2_fast.layout.FORCE_DQ_COPIES = copies
        fn.flash_attention_backward(q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2_fast")
    fn.flash_attention_backward(q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2_fast", deterministic=False)
print("ok")
