"""Every timing step of the final device call in one process (the kernels compile once), each step's output in
its own file; a step that raises is logged and the next runs."""
import contextlib, io, os, runpy, sys, time, traceback

O = sys.argv[1]
steps = sys.argv[2].split(",")
K = ["--kernels", "flash2_tc", "flash2_tc-atomic", "standard", "torch-flash", "torch-efficient", "torch-math"]
COMMON = ["--causal", "both", "--pass", "both", "--repeats", "10"]


def bench(args):
    from flash_numba.tools import bench as b
    return b.main(args)


def run(name, fn):
    t = time.time()
    with open(f"{O}/{name}.txt", "w") as fh, contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
        try:
            rc = fn()
        except BaseException as exc:  # SystemExit included
            traceback.print_exc()
            rc = f"raised {type(exc).__name__}"
    print(f"{name}: rc={rc} {time.time() - t:.0f} s", flush=True)


def tcb():
    sys.argv = ["tc_backward.py", f"{O}/tcb"]
    runpy.run_path("benchmarks/tc_backward.py", run_name="__main__")
    return 0


def gpt(args):
    from flash_numba.examples import gpt as g
    return g.main(args)


def dropin():
    sys.argv = ["dropin_overhead.py", "--csv", f"{O}/dropin.csv"]
    runpy.run_path("benchmarks/dropin_overhead.py", run_name="__main__")
    return 0


ALL = {
    "tcb": tcb,
    "bench_f16_d64": lambda: bench(["--n", "1024", "4096", "16384", "--d", "64", "--dtype", "float16", *COMMON, *K,
                                    "--csv", f"{O}/bench_float16_d64.csv"]),
    "bench_f16_d128": lambda: bench(["--n", "4096", "--d", "128", "--dtype", "float16", *COMMON, *K,
                                     "--csv", f"{O}/bench_float16_d128.csv"]),
    "bench_bf16": lambda: bench(["--n", "4096", "--d", "64", "128", "--dtype", "bfloat16", *COMMON, *K,
                                 "--csv", f"{O}/bench_bfloat16.csv"]),
    "shares": lambda: __import__("flash_numba.tools.launch_shares", fromlist=["main"]).main(
        ["--N", "4096", "--d", "64", "--out", O]),
    "dropin": dropin,
    "gpt_sdpa": lambda: gpt(["train", "--attn", "sdpa", "--autocast", "bfloat16", "--steps", "150",
                             "--csv", f"{O}/gpt_bf16_sdpa.csv"]),
    "gpt_ours": lambda: gpt(["train", "--attn", "flash_numba", "--autocast", "bfloat16", "--steps", "150",
                             "--csv", f"{O}/gpt_bf16_flash_numba.csv"]),
    "generate": lambda: gpt(["generate", "--attn", "flash_numba", "--check", "--csv", f"{O}/generate.csv"]),
}
for s in steps:
    run(s, ALL[s])
