"""flash2_fast's forward with P V on the CUDA cores and on the tensor cores (3xTF32 ``mma``): time, error, bits.

    python benchmarks/forward_mma.py [--shapes 4096x64x32 4096x128x32] [--blocks chosen 64x32] [--csv out.csv]

Each shape is N x d x B*H (B*H as (B*H / 8, 8) heads, float32), causal and not.  Per path
(``layout.FORCE_MMA`` False / True): the median of 10 CUDA-event timings after 2 warm-up calls,
TFLOP/s (4 N^2 d B*H FLOPs, halved when causal), the largest error of o against a float64
PyTorch reference of the same inputs (relative to max |o|), and whether the two paths' lse are
bitwise equal (S_ij and the softmax are the same code on both: only O differs).
"""

import argparse
import csv
import sys

import torch

import flash_numba as fn
from flash_numba.tools.timing import torch_median_ms
from flash_numba.kernels.flash2_fast import layout

PATHS = (("cuda-cores", False), ("tensor-cores", True))
COLUMNS = ("N", "d", "BH", "causal", "block", "path", "ms", "TFLOPs", "o_rel_err", "lse_bitwise_equal")


def reference_o(q, k, v, causal):
    """softmax(q k^T / sqrt(d)) v in float64 (bottom-right causal mask; Nq = Nk here)."""
    q, k, v = (x.double() for x in (q, k, v))
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def shape_rows(N, d, BH, causal, block=None):
    torch.manual_seed(0)
    q, k, v = (torch.randn(BH // 8, 8, N, d, device="cuda") for _ in range(3))
    ref = reference_o(q, k, v, causal) if N * N * BH <= 2**29 else None
    flops = 4 * N * N * d * BH / (2 if causal else 1)
    rows, lse = [], {}
    for name, force in PATHS:
        layout.FORCE_MMA = force
        try:
            call = lambda: fn.attention_forward(q, k, v, kernel="flash2_fast", causal=causal, block=block)  # noqa: E731
            f = call()
            ms = torch_median_ms(call)
        finally:
            layout.FORCE_MMA = None
        lse[name] = f.lse
        err = float((f.o.double() - ref).abs().max() / ref.abs().max()) if ref is not None else float("nan")
        rows.append(dict(N=N, d=d, BH=BH, causal=causal, block=f"{f.block[0]}x{f.block[1]}", path=name, ms=f"{ms:.3f}", TFLOPs=f"{flops / ms / 1e9:.1f}",
                         o_rel_err=f"{err:.2e}", lse_bitwise_equal=""))
    rows[-1]["lse_bitwise_equal"] = bool(torch.equal(lse["cuda-cores"], lse["tensor-cores"]))
    for r in rows:
        print(",".join(str(r[c]) for c in COLUMNS), flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["4096x64x32", "4096x128x32", "4096x32x32", "4096x96x32",
                                                     "1024x64x32"], help="N x d x B*H (B*H a multiple of 8)")
    p.add_argument("--blocks", nargs="+", default=["chosen"], help="Br x Bc forward blocks (default: the chosen one)")
    p.add_argument("--csv", help="also write the rows as CSV")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    if any(len(s) != 3 or s[2] % 8 for s in shapes):
        p.error("--shapes: N x d x B*H, with B*H a multiple of 8")
    print(f"# device: {torch.cuda.get_device_name()}\n" + ",".join(COLUMNS))
    blocks = [None if b == "chosen" else tuple(int(x) for x in b.split("x")) for b in args.blocks]
    rows = [r for N, d, BH in shapes for block in blocks for causal in (False, True)
            for r in shape_rows(N, d, BH, causal, block)]
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
