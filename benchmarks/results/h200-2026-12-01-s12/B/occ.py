"""Registers and blocks per SM of each launch of flash2_fast's passes on this GPU, read from the driver through the
launch plans (N = 4096, B*H = 32): the default (split) deterministic backward and the atomic one, d = 64, 80, 96, 128;
and what layout.kvq_blocks_per_sm's table assumed."""
import torch
import flash_numba as fn
from flash_numba import _launch_plan, device
from flash_numba.kernels.flash2_fast import layout
from cuda.bindings import driver

N, BH = 4096, 32
info = device.info()
print(f"{torch.cuda.get_device_name()} SMs={info.sm_count} cc={info.compute_capability} N={N} B*H={BH}")
REGS = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS
LOCAL = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES

def describe(plan):
    out = []
    for l in plan.launches:
        h, gx, gy, gz, bx, by, bz, smem = l.args[:8]
        h = driver.CUfunction(h) if isinstance(h, int) else h
        _, regs = driver.cuFuncGetAttribute(REGS, h)
        _, local = driver.cuFuncGetAttribute(LOCAL, h)
        _, occ = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(h, bx * by * bz, smem)
        out.append(f"grid={gx * gy * gz} thr={bx * by * bz} dyn={smem} regs={regs} local={local} blocks/SM={occ}")
    seen, uniq = set(), []
    for o in out:
        if o not in seen:
            seen.add(o); uniq.append(o)
    return uniq

for d in (64, 80, 96, 128):
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(1, BH, N, d, device="cuda") for _ in range(4))
    f = fn.attention_forward(q, k, v, kernel="flash2_fast")
    for det in (True, False):
        before = set(_launch_plan._PLANS)
        fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_fast", deterministic=det)
        fn.attention_backward(q, k, v, f.o, f.lse, do, kernel="flash2_fast", deterministic=det)
        plans = [p for kk, p in _launch_plan._PLANS.items() if kk not in before and p]
        blk = fn.resolve_block("flash2_fast", d, "float32", pass_="backward", deterministic=det)
        copies = layout.split_dq_copies(BH, 1, N, N, d, "float32", blk) if det else "-"
        table = layout.kvq_blocks_per_sm(*blk, d, "float32", info.compute_capability, info.shared_mem_per_sm)
        print(f"d={d} deterministic={det} block={blk} copies={copies} table blocks/SM={table}")
        for p in plans:
            for line in describe(p):
                print("   ", line)
    torch.cuda.synchronize()
    del q, k, v, do, f
