"""cuBLAS float32 (TF32 off) on the products of attention, one at a time: the yardstick of a fused kernel.

    python benchmarks/gemm_ceiling.py [--n 4096] [--bh 32] [--d 64 128] [--repeats 10] [--csv out.csv]

PyTorch's math SDPA path is cuBLAS's float32 GEMMs plus element-wise kernels, so the rate cuBLAS reaches on
attention's own shapes (batched over B*H) bounds what a fused CUDA-core kernel must reach to beat it. A forward runs
two products (S = Q K^T, O = P V), a backward five (S again, dP, dV, dK, dQ); they come in two shapes, timed here:
N x N with inner dimension d (S = Q K^T; dP = dO V^T likewise) and N x d with inner dimension N (dV = P^T dO,
dQ = dS K; O = P V and dK = dS^T Q likewise). Each product is 2 B*H M N K FLOPs.

Recorded: 2026-12-01, commit 667bc71, `benchmarks/results/h200-2026-12-01-s13/A/gemm.txt` (H200: S 33.9 / 41.5
TFLOP/s at d = 64 / 128, the N x d products 40-44 / 51); docs/PERFORMANCE.md, "The d = 128 fwd+bwd".
Needs PyTorch with CUDA; ``products`` also runs on the CPU (the tests check its shapes, values and FLOPs).
"""

from __future__ import annotations

import argparse
import csv


def products(bh: int, n: int, d: int, device: str = "cuda", seed: int = 0) -> dict:
    """``{name: (call, flops)}``: each product of attention at (B*H, N, d) on float32 operands on ``device``."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    q, k, do = (torch.randn(bh, n, d, device=device, generator=g) for _ in range(3))
    p = torch.randn(bh, n, n, device=device, generator=g)  # stands for P, and for dS
    return {
        "S = Q K^T (N x N, inner d)": (lambda: q @ k.transpose(1, 2), 2 * bh * n * n * d),
        "dV = P^T dO (N x d, inner N)": (lambda: p.transpose(1, 2) @ do, 2 * bh * n * d * n),
        "dQ = dS K (N x d, inner N)": (lambda: p @ k, 2 * bh * n * d * n),
    }


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--bh", type=int, default=32)
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--csv", help="write the rows to this CSV file")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gemm_ceiling: needs PyTorch with CUDA and a GPU (torch.cuda.is_available() is False)")
    from flash_numba.tools.timing import torch_median_ms

    torch.backends.cuda.matmul.allow_tf32 = False
    print(torch.cuda.get_device_name(), "cuBLAS float32, allow_tf32 =", torch.backends.cuda.matmul.allow_tf32)
    rows = []
    for d in args.d:
        prods = products(args.bh, args.n, d)
        for name, (call, flops) in prods.items():
            ms = torch_median_ms(call, args.repeats)
            rows.append({"gpu": torch.cuda.get_device_name(), "BH": args.bh, "N": args.n, "d": d, "product": name,
                         "ms": ms, "tflops": flops / ms / 1e9})
            print(f"d = {d:3d} {name:<30} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s")
        del prods
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return rows


if __name__ == "__main__":
    main()
