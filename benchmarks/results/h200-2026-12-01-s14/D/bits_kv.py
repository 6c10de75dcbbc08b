"""dK, dV with dV/dK split across warps against not (S^T/dP^T split by the rule): the atomic backward at d = 32, 64
(32 x 64) and the forced split at 32 x 32, causal or not, dropout at d = 64: bit for bit."""
import numpy as np, torch, flash_numba as fn
from flash_numba.kernels.flash2_fast import layout as L
res, bad = {}, []
for kv in (True, False):
    L.SPLIT_DV_DK = kv
    L._drop_tile_builds()
    for d, causal, p, force in [(64, False, 0.0, None), (64, True, 0.0, None), (64, True, 0.1, None), (32, False, 0.0, None),
                                (64, False, 0.0, True), (64, True, 0.1, True)]:
        L.FORCE_SPLIT_S_DP = force
        L._drop_tile_builds()
        g = torch.Generator(device="cuda").manual_seed(d)
        q, k, v, do = (torch.randn(2, 3, 333, d, device="cuda", generator=g) for _ in range(4))
        f = fn.attention_forward(q, k, v, causal=causal, kernel="flash2_fast", dropout_p=p, dropout_seed=7 if p else None)
        for det in (False, True):
            b = fn.attention_backward(q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2_fast", dropout_p=p,
                                      dropout_seed=7 if p else None, deterministic=det)
            names = ("dq", "dk", "dv") if det else ("dk", "dv")
            res[kv, d, causal, p, force, det] = [getattr(b, n).cpu().numpy() for n in names]
    L.FORCE_SPLIT_S_DP = None
for key in res:
    if key[0] and not all(np.array_equal(a, b, equal_nan=True) for a, b in zip(res[key], res[(False,) + key[1:]])):
        bad.append(key[1:])
print(f"{sum(1 for k in res if k[0])} cases, {len(bad)} differ: {bad}")
