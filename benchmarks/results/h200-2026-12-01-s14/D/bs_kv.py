"""benchmarks/block_sweep.py with the dK/dV kernel's dV/dK split across warps on (KV=1) or off (KV=0), and S^T/dP^T
split forced (SPLIT=1/0) or by the rule (SPLIT unset)."""
import os, runpy, sys
from flash_numba.kernels.flash2_fast import layout as L
L.SPLIT_DV_DK = os.environ.get("KV", "1") == "1"
if os.environ.get("SPLIT"):
    L.FORCE_SPLIT_S_DP = os.environ["SPLIT"] == "1"
sys.argv = ["block_sweep.py"] + sys.argv[1:]
runpy.run_path("benchmarks/block_sweep.py", run_name="__main__")
