"""block_sweep with flash2_fast's backward limits lifted to 64 x 64 (session 13 experiment: d = 128 at 16 x 64)."""
import sys
import flash_numba.kernels.flash2_fast as F
import flash_numba.kernels as K
spec = F.SPEC
object.__setattr__(spec, "block_limits", lambda d, dt, p="forward": (64, 64))
sys.path.insert(0, "benchmarks")
import block_sweep
block_sweep.main()
