"""flash2_fast at explicit block sizes: time (CUDA events) and error against float64, PyTorch CUDA tensors.

    python benchmarks/block_sweep.py --d 64 128 --fwd 64x32 64x64 --bwd 32x32 32x64 [--n 4096] [--csv out.csv]

How the block rule (``flash_numba.kernels.flash2_fast.layout``) was chosen: each forward block is
timed causal and not, each backward block deterministic and atomic, at B = 4, H = 8, float32;
the error is the largest of max|x - ref| / max|ref| over the outputs at N = 1000 (one batch, four heads),
against a float64 PyTorch reference, with PyTorch's float32 math path's error printed beside it.
A block that does not fit the device or the kernel's limits prints why and is skipped.
Blocks whose tiles exceed 48 KB run in dynamic shared memory (``kernels/_smem.py``).
"""

import argparse
import csv

import torch

import flash_numba as fn
from flash_numba.tools.timing import torch_median_ms
from flash_numba.kernels import flash2_fast


def reference(q, k, v, do, causal):
    """O, dQ, dK, dV in float64 (PyTorch autograd)."""
    q, k, v = (x.double().requires_grad_() for x in (q, k, v))
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.softmax(s, -1) @ v
    o.backward(do.double())
    return o.detach(), q.grad, k.grad, v.grad


def rel_err(xs, refs):
    return max(float((x.double() - r).abs().max() / r.abs().max()) for x, r in zip(xs, refs))


def pair(text):
    Br, Bc = text.lower().split("x")
    return int(Br), int(Bc)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--d", type=int, nargs="+", default=[64, 128])
    p.add_argument("--fwd", type=pair, nargs="*", default=[], help="forward blocks, BrxBc")
    p.add_argument("--bwd", type=pair, nargs="*", default=[], help="backward blocks, BrxBc")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--csv", help="also write the rows as CSV")
    args = p.parse_args()
    B, H, N = 4, 8, args.n
    rows = []
    print(f"{torch.cuda.get_device_name()}, flash2_fast, B = {B}, H = {H}, N = {N}, float32")
    print(f"{'d':>4} {'pass':<8} {'block':<9} {'mode':<13} {'dynamic':>8} {'causal':<6} {'ms':>8} {'TFLOP/s':>8} "
          f"{'err':>9}")
    for d in args.d:
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(B, H, N, d, device="cuda") for _ in range(4))
        small = tuple(x[:1, :4, :1000].contiguous() for x in (q, k, v, do))
        refs = {c: reference(*small, c) for c in (False, True)}
        f_full = {c: fn.attention_forward(q, k, v, kernel="flash2_fast", causal=c) for c in (False, True)}
        f_small = {c: fn.attention_forward(*small[:3], kernel="flash2_fast", causal=c) for c in (False, True)}
        runs = [("forward", blk, None) for blk in args.fwd] + [("backward", blk, det) for blk in args.bwd
                                                                 for det in (True, False)]
        for pass_, blk, det in runs:
            try:
                fn.resolve_block("flash2_fast", d, "float32", block=blk, pass_=pass_)
            except ValueError as e:
                print(f"{d:>4} {pass_:<8} {blk}: skipped ({e})")
                continue
            if pass_ == "forward":
                g = flash2_fast.geometry(d, blk[0] // 8, blk[1] // 16, "float32")
            else:
                g = {"smem": flash2_fast.backward_smem(*blk, d, "float32")}
            dyn = g["smem"] if g["smem"] > 48 * 1024 else 0
            for causal in (False, True):
                if pass_ == "forward":
                    e = rel_err([fn.attention_forward(*small[:3], kernel="flash2_fast", block=blk, causal=causal).o],
                                refs[causal][:1])
                    t = torch_median_ms(lambda: fn.attention_forward(q, k, v, kernel="flash2_fast", block=blk,
                                                                     causal=causal), args.repeats)
                    flops, mode = 4 * B * H * N * N * d, "forward"
                else:
                    fs = f_small[causal]
                    g_ = fn.attention_backward(*small[:3], fs.o, fs.lse, small[3], kernel="flash2_fast", block=blk,
                                               deterministic=det, causal=causal)
                    e = rel_err([g_.dq, g_.dk, g_.dv], refs[causal][1:])
                    ff = f_full[causal]
                    t = torch_median_ms(lambda: fn.attention_backward(q, k, v, ff.o, ff.lse, do, kernel="flash2_fast",
                                                                      block=blk, deterministic=det, causal=causal),
                                        args.repeats)
                    flops, mode = 10 * B * H * N * N * d, "deterministic" if det else "atomic"
                tflops = flops / (2 if causal else 1) / (t * 1e-3) / 1e12
                row = dict(d=d, pass_=pass_, Br=blk[0], Bc=blk[1], mode=mode, dynamic_bytes=dyn, causal=causal,
                           ms=round(t, 4), tflops=round(tflops, 2), err=f"{e:.2e}")
                rows.append(row)
                print(f"{d:>4} {pass_:<8} {blk[0]}x{blk[1]:<6} {mode:<13} {dyn:>8} {str(causal):<6} {t:8.3f} "
                      f"{tflops:8.1f} {e:9.2e}", flush=True)
        qq, kk, vv = (x.clone().requires_grad_() for x in small[:3])
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            o = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv)
        o.backward(small[3])
        print(f"{d:>4} PyTorch math float32 error: forward {rel_err([o.detach()], refs[False][:1]):.2e}, "
              f"backward {rel_err([qq.grad, kk.grad, vv.grad], refs[False][1:]):.2e}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
