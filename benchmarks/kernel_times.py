"""Each kernel launch timed alone (CUDA events between launches, no host time), for a before/after comparison.

    python benchmarks/kernel_times.py [--n 4096] [--bh 32 ...] [--d 64] [--dtype float32] [--kernels flash2 flash2_fast]
                                      [--repeats 5]

Several ``--bh`` values time the same launches at several grid sizes: a launch whose time steps with its waves
(blocks / (blocks an SM x SMs), rounded up) rather than with its blocks loses the rest of its last wave.
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
    p.add_argument("--bh", type=int, nargs="+", default=[32])
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    p.add_argument("--kernels", nargs="+", default=["flash2", "flash2_fast"])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'kernel':<12} {'B*H':>4} {'pass':<8} {'launch':<36} {'ms':>8}   (N = {args.n}, d = {args.d}, "
          f"{args.dtype})")
    for bh in args.bh:
        q, k, v, do = (cuda.to_device(rng.standard_normal((bh, args.n, args.d), dtype=np.float32)
                                      .astype(args.dtype)) for _ in range(4))
        for kernel in args.kernels:
            f = flash_numba.attention_forward(q, k, v, kernel=kernel)
            arrays = {"q": q, "k": k, "v": v, "do": do, "o": f.o, "lse": f.lse}
            for pass_ in ("forward", "backward"):
                timed = [launch_times(kernel, pass_, arrays) for _ in range(args.repeats)]
                for name in timed[0][0]:
                    ms = "-" if timed[0][1] is None else f"{statistics.median(r[1][name] for r in timed):.3f}"
                    print(f"{kernel:<12} {bh:>4} {pass_:<8} {name:<36} {ms:>8}", flush=True)


if __name__ == "__main__":
    main()
