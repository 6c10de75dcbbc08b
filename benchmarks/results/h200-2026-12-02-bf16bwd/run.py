"""One device call (2026-12-02): flash2_tc's forward+backward at d = 128 after the bfloat16 rounding fix, and an
A/B of the atomic dK/dV/dQ kernel capped at 128 registers (4 blocks an SM instead of 3).

    python benchmarks/results/h200-2026-12-02-bf16bwd/run.py OUTDIR

Runs `flash-numba bench` in this process (each kernel compiles once): bfloat16 and float16, B*H = 32, N = 4096,
d = 128, not causal, pass both, flash2_tc, flash2_tc-atomic, torch-efficient (every implementation validated against
float64 first), 10 timed calls a row; then the same bfloat16 row of flash2_tc-atomic with its dK/dV/dQ kernel
rebuilt with max_registers=128 (the A/B; this variant is not shipped); then the registers, local memory (spills)
and shared memory that the driver's JIT gave each backward kernel."""

import functools
import importlib
import os
import sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
from flash_numba.device import jit  # noqa: E402
from flash_numba.tools import bench  # noqa: E402

B = importlib.import_module("flash_numba.kernels.flash2_tc.backward")
seen = {}


def recording(factory, name):
    @functools.wraps(factory)
    def wrapper(*a, **k):
        disp = factory(*a, **k)
        seen[(name, a, tuple(sorted(k.items())))] = disp
        return disp
    return wrapper


B.dq_kernel = recording(B.dq_kernel, "dq")
orig_kv = B.dkdv_kernel
B.dkdv_kernel = recording(orig_kv, "dkdv")
common = ["--n", os.environ.get("PROBE_N", "4096"), "--d", os.environ.get("PROBE_D", "128"), "--causal", "false", "--pass", "both", "--repeats", "10"]
for dtype in ("bfloat16", "float16"):
    bench.main([*common, "--dtype", dtype, "--kernels", "flash2_tc", "flash2_tc-atomic", "torch-efficient",
                "--csv", f"{out}/bench_{dtype}_d128.csv"])


@functools.lru_cache(maxsize=None)
def capped(*a, **k):
    disp = orig_kv(*a, **k)
    atomic = a[5] if len(a) > 5 else k.get("atomic_dq", False)
    return jit(fastmath=B.FASTMATH, max_registers=128)(disp.py_func) if atomic else disp


B.dkdv_kernel = recording(capped, "dkdv cap128")
bench.main([*common, "--dtype", "bfloat16", "--kernels", "flash2_tc-atomic", "--csv", f"{out}/bench_bfloat16_d128_atomic_cap128.csv"])

with open(f"{out}/registers.txt", "w") as f:
    for (name, a, k), disp in seen.items():
        for kern in getattr(disp, "overloads", {}).values():  # (the simulator has none)
            line = (f"{name} {a} {k}: {kern.regs_per_thread} registers, {kern.local_mem_per_thread} bytes local, "
                    f"{kern.shared_mem_per_block} bytes static shared")
            print(line)
            f.write(line + "\n")
