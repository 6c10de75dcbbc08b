"""The tensor-core kernels on a real GPU: tests, timings and sanitizers in one run.

    python benchmarks/tc_check.py --out DIR            # everything below, CSV and logs into DIR
    python benchmarks/tc_check.py --only time --out DIR
    python benchmarks/tc_check.py --case small         # the small case the sanitizers run (used by the above)

1. ``pytest -m gpu`` (run after the timings) on tests/test_mma.py (mma, ldmatrix, packing against the host
   model, bit for bit) and
   tests/test_flash2_tc.py (the forward at N = 1 .. 4099, d = 64 and 128, float16 and bfloat16, causal and
   not, the sm_75 path forced, determinism over 20 calls).
2. Timings: the forward at B*H = 32 (B = 4, H = 8), N = 4096, d = 64 and 128, float16 and bfloat16, causal and
   not; flash2_tc (its sm80 path, and the sm75 path forced with FLASH_NUMBA_TC_PATH), PyTorch's flash and
   memory-efficient SDPA backends in the same process.  CUDA events around each call, median of the repeats;
   TFLOP/s = 4 d (visible query-key pairs) B*H / time.  Written to ``tc_forward.csv``.
3. compute-sanitizer memcheck and racecheck on ``--case small`` (flash2_tc, float16 and bfloat16, causal and
   not, N = 77, d = 64, and the sm75 path): 0 errors expected.  Logs ``sanitize_<tool>.log``.

Prints a short table at the end.  Needs a CUDA GPU, PyTorch with CUDA, compute-sanitizer on the PATH.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_tests(out: str, timeout: float) -> str:
    """The gpu tests of tests/test_mma.py and tests/test_flash2_tc.py, and the strided/unaligned inputs test (the
    16-byte and element copies on the device)."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
           "-m", "gpu", "tests/test_mma.py", "tests/test_flash2_tc.py"]
    extra = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
             "tests/test_flash2_tc.py::test_strided_and_unaligned_device_inputs",
             "tests/test_flash2_tc.py::test_dropout_matches_the_reference_mask",
             "tests/test_flash2_tc.py::test_non_finite_inputs",
             "tests/test_flash2_tc.py::test_the_two_paths_agree_closely"]
    t0 = time.time()
    lines = []
    for c in (cmd, extra):
        try:
            proc = subprocess.run(c, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=max(10.0, timeout - (time.time() - t0)))
            text, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            text, rc = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or ""), "timeout"
        with open(os.path.join(out, "tests.log"), "a") as f:
            f.write(" ".join(c) + "\n" + text + "\n")
        last = (text.strip().splitlines() or ["(no output)"])[-1]
        lines.append(f"pytest {'-m gpu' if c is cmd else 'strided/dropout'}: {last} (exit {rc})")
    return "\n".join(lines) + f" ({time.time() - t0:.0f} s)"


def visible_pairs(N: int, causal: bool) -> int:
    return N * (N + 1) // 2 if causal else N * N


def run_timings(out: str, N: int = 4096, B: int = 4, H: int = 8, reps: int = 20,
                dtypes=("float16", "bfloat16")) -> list[dict]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import flash_numba as fn
    from flash_numba import _switches
    from flash_numba.tools.timing import torch_median_ms

    rows = []
    path = os.path.join(out, "tc_forward.csv")
    gpu = torch.cuda.get_device_name()
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, ["implementation", "path", "dtype", "B", "H", "N", "d", "causal", "ms",
                               "tflops", "gpu"])
        w.writeheader()
        for dtype_name in dtypes:
            tdt = getattr(torch, dtype_name)
            for d in (64, 128):
                q, k, v = (torch.randn(B, H, N, d, dtype=tdt, device="cuda") for _ in range(3))
                for causal in (False, True):
                    flops = 4 * d * visible_pairs(N, causal) * B * H
                    impls = [("flash2_tc", "sm80"), ("flash2_tc", "sm75"), ("torch-flash", ""),
                             ("torch-efficient", "")]
                    for impl, p in impls:
                        if p == "sm75" and dtype_name == "bfloat16":
                            continue
                        if impl == "flash2_tc":
                            _switches.TC_PATH = p

                            def call():
                                return fn.attention_forward(q, k, v, kernel="flash2_tc", causal=causal)
                        else:
                            backend = SDPBackend.FLASH_ATTENTION if impl == "torch-flash" else \
                                SDPBackend.EFFICIENT_ATTENTION

                            def call(backend=backend):
                                with sdpa_kernel(backend):
                                    return torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                                            is_causal=causal)
                        try:
                            ms = torch_median_ms(call, repeats=reps, warmup=3)
                        except Exception as exc:  # a backend that refuses: recorded, not fatal
                            print(f"{impl} {dtype_name} d={d}: {type(exc).__name__}: {exc}", file=sys.stderr)
                            continue
                        finally:
                            _switches.TC_PATH = None
                        row = dict(implementation=impl, path=p, dtype=dtype_name, B=B, H=H, N=N, d=d,
                                   causal=causal, ms=round(ms, 4), tflops=round(flops / ms / 1e9, 1), gpu=gpu)
                        w.writerow(row)
                        f.flush()
                        rows.append(row)
    return rows


def small_case() -> None:
    """What the sanitizers run: few launches, every code path of the forward (edges, causal, bf16, sm75)."""
    import numpy as np

    import flash_numba as fn
    from flash_numba import _switches

    rng = np.random.default_rng(0)
    for path, dtype_name, causals in (("sm80", "float16", (False, True)), ("sm80", "bfloat16", (True,)),
                                      ("sm75", "float16", (True,))):
        _switches.TC_PATH = path
        for causal in causals:
            x = [rng.standard_normal((2, 77, 64)).astype(np.float32) for _ in range(3)]
            x = [a.astype(np.float16) if dtype_name == "float16" else fn.as_bfloat16(a) for a in x]
            r = fn.attention_forward(*x, kernel="flash2_tc", causal=causal)
            assert np.isfinite(np.asarray(r.lse)).all()
    _switches.TC_PATH = None
    print("small case done")


def run_sanitizers(out: str, timeout: float) -> list[str]:
    lines = []
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", PYTHONPATH=ROOT)
    for tool in ("memcheck", "racecheck"):
        cmd = ["compute-sanitizer", "--tool", tool, "--error-exitcode", "9", sys.executable,
               os.path.join(ROOT, "benchmarks", "tc_check.py"), "--case", "small"]
        t0 = time.time()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
            log, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            log, rc = str(exc.stdout or ""), "timeout"
        with open(os.path.join(out, f"sanitize_{tool}.log"), "w") as f:
            f.write(log)
        summary = [ln for ln in log.splitlines() if "ERROR SUMMARY" in ln or "RACECHECK SUMMARY" in ln]
        lines.append(f"{tool}: exit {rc}, {' | '.join(summary) or 'no summary'} "
                     f"({time.time() - t0:.0f} s)")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="tc_check_out")
    p.add_argument("--only", choices=("tests", "time", "sanitize"))
    p.add_argument("--case", choices=("small",))
    p.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"], help="the timings' dtypes")
    p.add_argument("--test-timeout", type=float, default=170, help="seconds for the pytest runs")
    p.add_argument("--sanitize-timeout", type=float, default=90, help="seconds per sanitizer tool")
    args = p.parse_args()
    if args.case:
        small_case()
        return 0
    os.makedirs(args.out, exist_ok=True)
    summary = []
    rows = []
    if args.only in (None, "time"):  # first: the numbers a short run must bring back
        rows = run_timings(args.out, dtypes=tuple(args.dtypes))
    if args.only in (None, "tests"):
        summary.append(run_tests(args.out, args.test_timeout))
        print(summary[-1], flush=True)
    if args.only in (None, "sanitize"):
        summary += run_sanitizers(args.out, args.sanitize_timeout)
    print("\n".join(summary))
    if rows:
        print(f"{'implementation':<16} {'path':<5} {'dtype':<9} {'d':>4} {'causal':<6} {'ms':>8} {'TFLOP/s':>8}")
        for r in rows:
            print(f"{r['implementation']:<16} {r['path']:<5} {r['dtype']:<9} {r['d']:>4} {str(r['causal']):<6} "
                  f"{r['ms']:>8.3f} {r['tflops']:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
