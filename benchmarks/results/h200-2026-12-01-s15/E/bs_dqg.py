"""benchmarks/block_sweep.py with flash2_fast's dQ product in the dK/dV kernel run by one group of 32 lanes (DQG=1),
two of 16 (DQG=2), or by the rule (DQG unset): layout.FORCE_DQ_LANE_GROUPS."""
import os, runpy, sys
from flash_numba.kernels.flash2_fast import layout as L
if os.environ.get("DQG"):
    L.FORCE_DQ_LANE_GROUPS = int(os.environ["DQG"])
sys.argv = ["block_sweep.py"] + sys.argv[1:]
runpy.run_path("benchmarks/block_sweep.py", run_name="__main__")
