"""flash2_fast's three backward paths on a GPU: two-pass, split (copies of dQ) and atomic; time, memory, bits.

    python benchmarks/backward_paths.py [--shapes 4096x64x32 1024x64x128] [--csv out.csv]

Each shape is N x d x B*H (B*H as (B*H / 8, 8) heads, float32), causal and not; the forward runs once,
then each path's backward is timed (median of 10 CUDA-event timings after 2 warm-up calls).  Per path:
the dQ copies the split path runs with on this device (``layout.split_dq_copies``; the two-pass path is
forced with ``_switches.FORCE_DQ_COPIES = 0``), the peak memory the call allocates beyond its inputs, and
whether a second call gives the same bits.  The last line per shape compares the split path's dQ with
the two-pass one's and checks that dK, dV equal the atomic path's bit for bit (the same kernel code).
"""

import argparse
import csv
import sys
import time

import torch

import flash_numba as fn
from flash_numba.tools.timing import torch_median_ms
from flash_numba import _switches
from flash_numba.kernels.flash2_fast import layout

PATHS = (("two-pass", 0, True), ("split", None, True), ("atomic", None, False))  # (name, forced copies, det)
COLUMNS = ("N", "d", "BH", "causal", "path", "copies", "ms", "peak_MB", "bitwise_repeat")


def run_path(call):
    """(result, ms, peak MB beyond what was allocated before, bitwise equal on a second call)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    first = call()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    ms = torch_median_ms(call)
    again = call()
    same = all(torch.equal(x, y) for x, y in zip((first.dq, first.dk, first.dv), (again.dq, again.dk, again.dv)))
    return first, ms, peak, same


def shape_rows(N, d, BH, causal):
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(BH // 8, 8, N, d, device="cuda") for _ in range(4))
    f = fn.attention_forward(q, k, v, kernel="flash2_fast", causal=causal)
    block = fn.resolve_block("flash2_fast", d, "float32", pass_="backward")
    copies = layout.split_dq_copies(BH, 1, N, N, d, "float32", block)
    rows, results = [], {}
    for name, force, det in PATHS:
        _switches.FORCE_DQ_COPIES = force
        try:
            res, ms, peak, same = run_path(lambda: fn.attention_backward(
                q, k, v, f.o, f.lse, do, kernel="flash2_fast", causal=causal, deterministic=det))
        finally:
            _switches.FORCE_DQ_COPIES = None
        results[name] = res
        rows.append(dict(N=N, d=d, BH=BH, causal=causal, path=name, copies=copies if name == "split" else "",
                         ms=f"{ms:.3f}", peak_MB=f"{peak:.0f}", bitwise_repeat=same))
        print(",".join(str(rows[-1][c]) for c in COLUMNS), flush=True)
    s, t, a = results["split"], results["two-pass"], results["atomic"]
    diff = float((s.dq - t.dq).abs().max() / t.dq.abs().max())
    print(f"#  split vs two-pass: max |dq difference| / max |dq| = {diff:.2e}; dK, dV equal the atomic path's: "
          f"{torch.equal(s.dk, a.dk) and torch.equal(s.dv, a.dv)}", flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["4096x64x32", "4096x128x32", "1024x64x32", "1024x64x128"],
                   help="N x d x B*H (B*H a multiple of 8)")
    p.add_argument("--csv", help="also write the rows as CSV")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    if any(len(s) != 3 or s[2] % 8 for s in shapes):
        p.error("--shapes: N x d x B*H, with B*H a multiple of 8")
    print(f"# device: {torch.cuda.get_device_name()}\n" + ",".join(COLUMNS))
    rows = [r for N, d, BH in shapes for causal in (False, True) for r in shape_rows(N, d, BH, causal)]
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            fh.write(f"# device: {torch.cuda.get_device_name()}\n# date: {date}\n"
                     f"# command: python benchmarks/backward_paths.py {' '.join(argv)}\n")
            w = csv.DictWriter(fh, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
