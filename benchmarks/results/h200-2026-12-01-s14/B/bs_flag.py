"""benchmarks/block_sweep.py with flash2_fast's dK/dV kernel built with S^T and dP^T split across warps (SPLIT=1),
not (SPLIT=0), or by the rule (SPLIT unset)."""
import os, runpy, sys
from flash_numba.kernels.flash2_fast import layout as L
if os.environ.get("SPLIT"):
    L.FORCE_SPLIT_S_DP = os.environ["SPLIT"] == "1"
sys.argv = ["block_sweep.py"] + sys.argv[1:]
runpy.run_path("benchmarks/block_sweep.py", run_name="__main__")
