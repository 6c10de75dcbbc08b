"""Wave quantization probe: flash2_fast at N = 4096, d = 64, B = 1, H heads: time per head against H.

For each launch of a replayed plan, the driver's occupancy (blocks per SM) and the grid: waves = grid / (SMs * occupancy).
"""
import sys, statistics
import torch
import flash_numba as fn
from flash_numba import _launch_plan
from flash_numba.tools.timing import torch_median_ms
from cuda.bindings import driver

N, d = 4096, 64
Hs = [int(x) for x in sys.argv[1:]] or [24, 28, 30, 31, 32, 33, 34, 36, 37, 38]
sms = torch.cuda.get_device_properties(0).multi_processor_count
print(f"{torch.cuda.get_device_name()} SMs={sms} N={N} d={d} B=1")

def occupancy(plan):
    out = []
    for l in plan.launches:
        h, gx, gy, gz, bx, by, bz, smem = l.args[:8]
        err, occ = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(h, bx * by * bz, smem)
        out.append((gx * gy * gz, bx * by * bz, smem, occ))
    return out

print(f"{'H':>3} {'pass':<10} {'ms':>8} {'ms/head':>8}  launches (grid, threads, dyn smem, blocks/SM, waves)")
for H in Hs:
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(1, H, N, d, device="cuda") for _ in range(4))
    f = fn.attention_forward(q, k, v, kernel="flash2_fast")
    calls = {
        "fwd": lambda: fn.attention_forward(q, k, v, kernel="flash2_fast"),
        "bwd-atom": lambda: fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_fast", deterministic=False),
        "bwd-det": lambda: fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_fast"),
    }
    for name, call in calls.items():
        before = set(_launch_plan._PLANS)
        ms = torch_median_ms(call, repeats=10)
        new = [p for kk, p in _launch_plan._PLANS.items() if kk not in before and p]
        info = ""
        for p in new:
            info = "  ".join(f"({g},{t},{s},{o},{g / (sms * o):.2f})" if o else f"({g},{t},{s},?)" for g, t, s, o in occupancy(p))
        print(f"{H:>3} {name:<10} {ms:8.3f} {ms / H:8.4f}  {info}", flush=True)
    del q, k, v, do, f
    torch.cuda.empty_cache()
