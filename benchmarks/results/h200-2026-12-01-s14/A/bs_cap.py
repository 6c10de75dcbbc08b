"""benchmarks/block_sweep.py with the atomic dK/dV/dQ kernel capped at 168 registers where its tiles are dynamic
shared memory (3 blocks of 128 threads an SM at d = 64, 32 x 64)."""
import runpy, sys
from flash_numba.kernels.flash2_fast import layout as L
_orig = L.register_cap
def capped(launch, cc, d, dtype, dynamic=False, count=False):
    if launch == L.BACKWARD_KVQ_NAME and dynamic and not count and tuple(cc) >= (9, 0):
        return 168
    return _orig(launch, cc, d, dtype, dynamic, count)
L.register_cap = capped
sys.argv = ["block_sweep.py"] + sys.argv[1:]
runpy.run_path("benchmarks/block_sweep.py", run_name="__main__")
