"""flash2_fast forward at d = 64: four tiles, P^T aliased over K^T, aliased and capped at 128 registers."""
import statistics
import torch
import flash_numba as fn
from flash_numba.kernels.flash2_fast import layout

def ms(f, n=20):
    for _ in range(3): f()
    torch.cuda.synchronize()
    out = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); torch.cuda.synchronize(); out.append(a.elapsed_time(b))
    return statistics.median(out)

print(torch.cuda.get_device_name(), "fp32 forward, B*H = 32 as (4, 8)")
for N, d in ((4096, 64), (4096, 32), (4096, 128), (1024, 64)):
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 8, N, d, device="cuda") for _ in range(3))
    for causal in (False, True):
        ref = None
        for rep in (1, 2):
            for name, alias, cap in (("four tiles", False, None), ("alias", True, None), ("alias cap128", True, 128)):
                layout.ALIAS_P, layout.ALIAS_MAX_REGISTERS = alias, cap
                r = fn.attention_forward(q, k, v, kernel="flash2_fast", causal=causal)
                if ref is None:
                    ref = r.o.clone()
                same = torch.equal(r.o, ref)
                t = ms(lambda: fn.attention_forward(q, k, v, kernel="flash2_fast", causal=causal))
                print(f"N={N} d={d} causal={causal} rep={rep} {name:13s} {t:.3f} ms  same bits as four tiles: {same}",
                      flush=True)
layout.ALIAS_P, layout.ALIAS_MAX_REGISTERS = True, None
