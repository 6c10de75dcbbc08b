"""Backward paths of flash2_fast on the GPU: two-pass, split (device's copies), atomic; time and bits."""
import statistics, sys
import torch
import flash_numba as fn
from flash_numba.kernels.flash2_fast import layout

def ms(f, n=10):
    for _ in range(2): f()
    torch.cuda.synchronize()
    out = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); torch.cuda.synchronize(); out.append(a.elapsed_time(b))
    return statistics.median(out)

print(f"device {torch.cuda.get_device_name()} fp32, backward only (forward done once)")
print("N,d,BH,causal,path,copies,ms,peak_MB")
for N, d, BH in [(4096, 64, 32), (4096, 128, 32), (1024, 64, 32), (1024, 64, 128), (4096, 96, 32)]:
    B, H = BH // 8, 8
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(B, H, N, d, device="cuda") for _ in range(4))
    for causal in (False, True):
        f = fn.attention_forward(q, k, v, kernel="flash2_fast", causal=causal)
        blk = fn.resolve_block("flash2_fast", d, "float32", pass_="backward")
        natural = layout.split_dq_copies(BH, 1, N, N, d, "float32", blk)
        res = {}
        for path, force, det in (("two-pass", 0, True), ("split", None, True), ("atomic", None, False)):
            layout.FORCE_DQ_COPIES = force
            call = lambda: fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_fast", causal=causal,
                                                 deterministic=det)
            torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            r = call(); torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20
            t = ms(call)
            again = call()
            same = all(torch.equal(x, y) for x, y in zip((r.dq, r.dk, r.dv), (again.dq, again.dk, again.dv)))
            res[path] = r
            print(f"{N},{d},{BH},{causal},{path},{natural if path == 'split' else ''},{t:.3f},{peak:.0f},bitwise_repeat={same}", flush=True)
        layout.FORCE_DQ_COPIES = None
        e = lambda x, y: float((x - y).abs().max() / y.abs().max())
        print(f"#  split vs two-pass dq rel diff {e(res['split'].dq, res['two-pass'].dq):.2e}; "
              f"dk equal atomic {torch.equal(res['split'].dk, res['atomic'].dk)}", flush=True)
