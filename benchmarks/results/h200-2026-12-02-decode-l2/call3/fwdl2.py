"""flash2_tc forward with forward.L2_PREFETCH set (argv[1]), then the harness with the rest of argv."""
import sys
from flash_numba.kernels.flash2_tc import forward
forward.L2_PREFETCH = int(sys.argv[1])
print("flash2_tc forward L2_PREFETCH", forward.L2_PREFETCH, flush=True)
from flash_numba.tools import bench
sys.exit(bench.main(sys.argv[2:]))
