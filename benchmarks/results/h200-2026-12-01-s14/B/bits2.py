"""dQ, dK, dV with S^T and dP^T split across warps against not, bit for bit (same tree, same process), and the
registers and local memory (spills) the device's compiler gave each dK/dV kernel."""
import numpy as np, torch, flash_numba as fn
from flash_numba.kernels import flash2_fast
from flash_numba.kernels.flash2_fast import layout as L
import importlib; BW = importlib.import_module("flash_numba.kernels.flash2_fast.backward")
cases = [(64, c, p) for c in (False, True) for p in (0.0, 0.1)] + [(d, c, 0.0) for d in (80, 96, 128) for c in (False, True)]
res = {}
for split in (True, False):
    with L.s_dp_split(split):
        for d, causal, p in cases:
            g = torch.Generator(device="cuda").manual_seed(d)
            q, k, v, do = (torch.randn(2, 3, 333, d, device="cuda", generator=g) for _ in range(4))
            f = fn.attention_forward(q, k, v, causal=causal, kernel="flash2_fast", dropout_p=p, dropout_seed=7 if p else None)
            for mode in ("split", "twopass", "atomic"):
                L.FORCE_DQ_COPIES = 0 if mode == "twopass" else None
                b = fn.attention_backward(q, k, v, f.o, f.lse, do, causal=causal, kernel="flash2_fast", dropout_p=p,
                                          dropout_seed=7 if p else None, deterministic=mode != "atomic")
                if mode != "atomic":
                    res[(split, d, causal, p, mode)] = [getattr(b, n).cpu().numpy() for n in ("dq", "dk", "dv")]
            L.FORCE_DQ_COPIES = None
        for d, causal, p in cases:
            for atomic in (False, True):
                blk = fn.resolve_block("flash2_fast", d, "float32", pass_="backward", deterministic=not atomic)
                gk = L.geometry_kv(d, blk[1] // 8, blk[0] // 16, np.float32)
                kern, _ = BW.dkdv_kernel(d, blk[1] // 8, blk[0] // 16, "float32", causal, False, atomic_dq=True,
                                         dropout=p > 0, dynamic=gk["smem"] > 48 * 1024)
                try:
                    print(f"split={split} d={d} causal={causal} p={p} atomic-block={atomic} {blk}: registers "
                          f"{kern.get_regs_per_thread()}, local bytes {kern.get_local_mem_per_thread()}", flush=True)
                except Exception as e:
                    print(f"split={split} d={d} causal={causal} p={p} atomic-block={atomic}: {type(e).__name__} {e}")
same = [k[1:] for k in res if k[0] and all(np.array_equal(a, b, equal_nan=True) for a, b in zip(res[k], res[(False,) + k[1:]]))]
diff = [k[1:] for k in res if k[0] and k[1:] not in same]
print(f"{len(same)} cases bit for bit the same, {len(diff)} differ: {diff}")
