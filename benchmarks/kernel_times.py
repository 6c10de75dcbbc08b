"""Each kernel launch timed alone (CUDA events between launches, no host time), for a before/after comparison.

    python benchmarks/kernel_times.py [--n 4096] [--bh 32] [--d 64] [--kernels flash2 flash2_fast] [--repeats 5]

Non-causal (the tools' ``run_pass`` runs every kernel without a mask).  Prints one row per (kernel, pass,
launch): the median over ``--repeats`` runs of
:func:`launch_times` (itself a median of 3 passes).  It imports ``launch_times`` from where this
checkout keeps it (``flash_numba.tools.timing`` now, ``flash_numba.figures`` before the tooling moved), so
the same script times an older checkout: ``cd OLD && PYTHONPATH=$PWD python /path/to/kernel_times.py``.
"""

import argparse
import statistics

import numpy as np
from numba import cuda

import flash_numba  # noqa: F401  (GPU or simulator first)

try:
    from flash_numba.tools.timing import launch_times
except ImportError:  # a checkout from before flash_numba.tools
    from flash_numba.figures import launch_times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--bh", type=int, default=32)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--kernels", nargs="+", default=["flash2", "flash2_fast"])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    q, k, v, do = (cuda.to_device(rng.standard_normal((args.bh, args.n, args.d), dtype=np.float32))
                   for _ in range(4))
    print(f"{'kernel':<12} {'pass':<8} {'launch':<36} {'ms':>8}   (B*H = {args.bh}, N = {args.n}, "
          f"d = {args.d}, float32)")
    for kernel in args.kernels:
        f = flash_numba.flash_attention_forward(q, k, v, kernel=kernel)
        arrays = {"q": q, "k": k, "v": v, "do": do, "o": f.o, "lse": f.lse}
        for pass_ in ("forward", "backward"):
            runs = [launch_times(kernel, pass_, arrays)[1] for _ in range(args.repeats)]
            for name in runs[0]:
                ms = statistics.median(r[name] for r in runs)
                print(f"{kernel:<12} {pass_:<8} {name:<36} {ms:8.3f}", flush=True)


if __name__ == "__main__":
    main()
