"""Source of lessons/06_io_complexity.ipynb (build it with `python lessons/_build.py`)."""
# ruff: noqa: E402

# %% [markdown]
# # Lesson 6: IO complexity
#
# The FlashAttention paper measures an algorithm by its *HBM accesses*: how many elements it reads from
# and writes to HBM. Its Theorem 2: with sequence length $N$, head dimension $d$ and $M$ elements of SRAM,
# $d \le M \le Nd$, standard attention makes $\Theta(Nd + N^2)$ HBM accesses and FlashAttention makes
# $\Theta(N^2 d^2 M^{-1})$ (Dao et al. 2022, Theorem 2). Its Proposition 3 adds that no exact attention
# algorithm can do asymptotically better for all $M$ in that range. In this lesson you derive the count,
# check it against the kernels' counters, sweep the block size as the paper's Figure 2 (middle) does, and
# see what a hardware profiler adds.

# %%
import sys

if "google.colab" in sys.modules:  # Colab: install flash_numba (see lesson 0)
    # !pip install -q "numba-cuda[cu12]==0.30.4"
    # !pip install -q --no-deps "git+@REPO_URL@"
    pass  # source-only

# %%
import importlib.util
import math
import shutil

import matplotlib.pyplot as plt
import numpy as np
from numba import cuda

import flash_numba as fn
from flash_numba import device, iomodel, kernels
from flash_numba.course import lessonkit, recorded
from flash_numba.course import tensor_cores as tcx
from flash_numba.course import exercises as ex

SIM = device.SIMULATOR
print(device.describe())


def median_ms(run):
    """Median time of run() in milliseconds over CUDA events, or None in the simulator."""
    times = device.time_ms(run)
    return None if times is None else float(np.median(times))


# %% [markdown]
# ## Counting Algorithm 1
#
# Follow the loops of Algorithm 1 (lesson 5) for one head with $N_q = N_k = N$ and count elements:
#
# * line 6 loads every block $K_j$, $V_j$ once: $2Nd$ reads in all;
# * line 8 runs $T_c = \lceil N / B_c \rceil$ times for every query block, so each outer step reads all of
#   $Q$ and $O$ ($2Nd$) and all of $\ell$ and $m$ ($2N$);
# * lines 12-13 write all of $O$, $\ell$ and $m$ back on every outer step: $Nd + 2N$.
#
# $B_r$ does not appear: the $T_r$ query blocks of one outer step add up to $N$ rows whatever their
# size. With $B_c = \Theta(M/d)$, $T_c = \Theta(Nd/M)$ and the count is $\Theta(Nd \cdot Nd/M)$: Theorem 2.

# %% [markdown]
# ## Your turn: Theorem 2's count
#
# Write the exact number of elements Algorithm 1 reads and writes for one head, from the three items
# above.

# %%
def theorem2(N, d, Bc):
    """Elements Algorithm 1 reads from and writes to HBM for one head (Nq = Nk = N), no mask."""
    # Your turn: K and V once; per outer step, Q, O, l, m read and O, l, m written.
    raise NotImplementedError("2 N d + Tc * (...)")


# %%
mine = ex.check("theorem2", theorem2)
assert ex.check_solution("theorem2")
count = theorem2 if mine else ex.solution_fn("theorem2")

# %% [markdown]
# ## Against the counters
#
# flash1 counts, in every thread, the bytes it loads and stores. Its count is Theorem 2's plus two things
# the theorem's big-O drops: line 2 (writing $O = 0$, $\ell = 0$, $m = -\infty$: $Nd + 2N$ elements) and the
# final $L = m + \log \ell$ (reading $\ell$ and $m$, writing $L$: $3N$). In float32 every element is 4
# bytes. Run flash1 with a few block sizes and compare:

# %%
N, d = (32, 16) if SIM else (1024, 64)
rng = np.random.default_rng(6)
q, k, v = (rng.standard_normal((1, N, d)).astype(np.float32) for _ in range(3))
checks = []
for blk in ((8, 8), (8, 12), (16, 5)) if SIM else ((64, 16), (32, 32), (16, 64)):
    counted = fn.flash_attention_forward(q, k, v, kernel="flash1", block=blk, count_hbm=True).hbm.total
    predicted = 4 * (count(N, d, blk[1]) + (N * d + 2 * N) + 3 * N)
    checks.append(counted == predicted)
    print(f"(Br, Bc) = {blk}: counted {counted:,} bytes; 4 x (Theorem 2 + init + L) = {predicted:,}")

# %% [markdown]
# ## Block size against HBM accesses
#
# The paper's Figure 2 (middle) runs the forward pass with growing block sizes ($N = 1024$, $d = 64$,
# on an A100): HBM accesses fall as the blocks grow, and so does the runtime, until around block size
# 256 other costs (arithmetic) take over; larger blocks do not fit in SRAM anyway. Here is the same sweep
# for flash1: bytes from the IO model (equal to the counters, as checked above), and on a GPU the
# runtime at $B \cdot H = 16$. Our kernels hold tiles in float32 and must fit 48 KB, so for $d = 64$ the
# sweep stops where `blocks.validate` says the tiles no longer fit:

# %%
Ns, ds, Br = 1024, 64, 16
sweep = []
for Bc in (8, 16, 24, 32, 48, 64, 72, 96):
    try:
        fn.resolve_block("flash1", ds, np.float32, block=(Br, Bc))
    except ValueError as exc:
        print(f"Bc = {Bc}: does not fit ({str(exc).split(', more')[0]})")
        continue
    nbytes = iomodel.forward("flash1", 1, Ns, Ns, ds, np.float32, False, (Br, Bc)).total
    sweep.append((Bc, nbytes))
sweep_ms = {}
if not SIM:
    qs, ks, vs = (cuda.to_device(rng.standard_normal((16, Ns, ds)).astype(np.float32)) for _ in range(3))
    for Bc, _ in sweep:
        sweep_ms[Bc] = median_ms(lambda: fn.flash_attention_forward(qs, ks, vs, kernel="flash1", block=(Br, Bc)))
print(f"{'Bc':>4} {'MB (one head)':>14} {'ms (B*H = 16)':>14}")
for Bc, nbytes in sweep:
    t = f"{sweep_ms[Bc]:.2f}" if Bc in sweep_ms else "n/a"
    print(f"{Bc:>4} {nbytes / 1e6:>14.2f} {t:>14}")

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot([b for b, _ in sweep], [n / 1e6 for _, n in sweep], "o-", label="HBM bytes (IO model = counters)")
ax.set_xlabel("block size Bc (Br = 16)")
ax.set_ylabel("MB moved, one head")
if sweep_ms:
    ax2 = ax.twinx()
    ax2.plot(list(sweep_ms), list(sweep_ms.values()), "s--", color="C1", label="runtime")
    ax2.set_ylabel("ms, B*H = 16")
ax.set_title(f"flash1 forward, N = {Ns}, d = {ds}: {device.info().name}")
ax.legend(loc="upper right", fontsize=8)
plt.show()

# %% [markdown]
# ## Bytes against N, and against d
#
# For every kernel in the package that runs float32 (`flash_numba.kernels.NAMES`; the tensor-core kernel runs
# half precision only), the IO model at growing $N$ (one head, $d = 64$, float32, the blocks this device would
# choose). On a log-log plot a $\Theta(N^2)$ count is a
# line of slope 2. All of them have slope 2: at fixed $d$ and $M$, FlashAttention's saving is a constant
# factor in bytes, of order $M / d^2$. What grows with $N$ is standard attention's *memory* (lesson 2).

# %%
Ngrid = [256, 512, 1024, 2048, 4096, 8192, 16384]
series = {}
for name in (n for n in kernels.NAMES if "float32" in kernels.get(n).dtypes):
    blk = fn.resolve_block(name, 64, np.float32)
    series[name] = [iomodel.forward(name, 1, n_, n_, 64, np.float32, False, blk).total for n_ in Ngrid]
slopes = {name: np.polyfit(np.log(Ngrid[-3:]), np.log(b[-3:]), 1)[0] for name, b in series.items()}
fig, ax = plt.subplots(figsize=(6, 3.5))
for name, b in series.items():
    ax.loglog(Ngrid, b, "o-", label=f"{name} (slope {slopes[name]:.2f})")
ax.set_xlabel("N")
ax.set_ylabel("bytes, one head, d = 64")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The head dimension is where the two bounds differ. The minimum of standard attention,
# $\Theta(Nd + N^2)$, hardly depends on $d$ when $N \gg d$ (our kernels add flash2's re-reads of $K$ and
# $V$, once per query block, which grow with $d$, as the table shows), while $\Theta(N^2 d^2 / M)$ grows
# like $d^2$: larger rows mean smaller blocks (fewer rows fit in $M$) and so more passes. At $N = 4096$:

# %%
print(f"{'d':>4} {'flash1 (Br, Bc)':>16} {'Tc':>4} {'standard MB':>12} {'flash1 MB':>10} {'ratio':>6}")
d_ratio = []
for dd in (16, 32, 64, 128):
    blk = fn.resolve_block("flash1", dd, np.float32)
    s_ = iomodel.forward("standard", 1, 4096, 4096, dd, np.float32).total
    f_ = iomodel.forward("flash1", 1, 4096, 4096, dd, np.float32, False, blk).total
    d_ratio.append(s_ / f_)
    print(f"{dd:>4} {str(blk):>16} {math.ceil(4096 / blk[1]):>4} {s_ / 1e6:>12.1f} {f_ / 1e6:>10.1f} {s_ / f_:>6.1f}")

# %% [markdown]
# ## Counters against the hardware
#
# The counters count the bytes the code *requests* from global memory, the quantity of Theorem 2. The
# DRAM traffic the GPU actually performs differs:
#
# * the L2 cache (4 MB on a T4, 40 MB on an A100, 50 MB on an H200) serves repeated reads, such as the
#   $T_r$ re-reads of $K_j$ and $V_j$ by different thread blocks of flash2, without touching HBM; a
#   matrix larger than L2, such as standard's $S$ of a whole batch, goes to DRAM and back;
# * memory moves in 32-byte sectors, so a scattered 4-byte access costs a whole sector;
# * writes are collected in L2 and written back later, sometimes merged.
#
# NVIDIA's Nsight Compute profiler (`ncu`) measures the real traffic (`dram__bytes_read.sum`,
# `dram__bytes_write.sum`). `flash-numba profile` (`flash_numba/tools/profile.py`) runs every kernel
# under it and tabulates its numbers next to the counters and the IO model (on a machine where `ncu` is
# installed and allowed to read the performance counters; many cloud machines are not, and the script
# says so).

# %%
has_profile = importlib.util.find_spec("flash_numba.tools.profile") is not None
if SIM:
    print("the simulator has no hardware to profile; on a GPU:")
elif shutil.which("ncu") is None:
    print("ncu (Nsight Compute) is not on PATH here; where it is:")
else:
    print("ncu is installed; from a terminal:")
print("    flash-numba profile" if has_profile else "    (flash_numba.tools.profile is not installed)")
if recorded.available():  # what it gave for lesson 2's kernels and flash2_fast (DRAM = read + write)
    print(recorded.ncu_table())
    for r in recorded.ncu_per_call():
        print(f"B*H = {r['BH']:>2}, N = {r['N']}: {r['kernel']:<11} forward counted {r['counted'] / 1e9:6.3f} GB, "
              f"DRAM {r['dram'] / 1e9:6.3f} GB ({r['dram'] / r['counted']:.2f} of it)")

# %% [markdown]
# The counters and Theorem 2 count every request; the DRAM sees what the L2 cache lets through. At
# $B \cdot H = 32$, $N = 4096$, flash2_fast's DRAM bytes are a fraction of its count (its re-reads of
# $K$ and $V$ hit in L2), while standard's are well over half of its count: its $S$ and $P$, 2 GB each,
# go to DRAM and back. The gap in DRAM bytes between the two is much larger than the gap in counted
# bytes. At the small size everything would fit in the H200's 50 MB L2; Nsight Compute empties the caches
# before each kernel it profiles, so there each launch starts cold. On a T4 (4 MB of L2), $S$ of a single
# head outgrows the cache at $N = 1024$ in float32.

# %% [markdown]
# **Predict, then run.** Double $B_c$ from 64 to 128 at $N = 4096$, $d = 64$: by what factor do flash1's
# HBM bytes fall? (Theorem 2: the $T_c$ passes over $Q$, $O$, $\ell$, $m$ dominate.)

# %%
my_prediction = None  # bytes at Bc = 64 / bytes at Bc = 128

# %%
b64 = iomodel.forward("flash1", 1, 4096, 4096, 64, np.float32, False, (64, 64)).total
b128 = iomodel.forward("flash1", 1, 4096, 4096, 64, np.float32, False, (64, 128)).total
lessonkit.compare_prediction("bytes(Bc = 64) / bytes(Bc = 128)", my_prediction, round(b64 / b128, 2))

# %% [markdown]
# ## Bytes and time in float16, on tensor cores
#
# In half precision both standard attention and `flash2_tc` run their products on tensor cores, so what
# separates them is $S$ and $P$ going through HBM. First the bytes, from the IO models: $B \cdot H = 32$,
# $N = 4096$, $d = 64$, float16, each with the blocks it takes. **Predict** the ratio of standard's bytes to
# flash2_tc's.

# %%
my_byte_ratio = None  # standard's bytes / flash2_tc's, float16, N = 4096, d = 64

# %%
f16 = np.dtype(np.float16)
std16 = iomodel.forward("standard", 32, 4096, 4096, 64, f16, False, fn.resolve_block("standard", 64, f16))
tc16 = iomodel.forward("flash2_tc", 32, 4096, 4096, 64, f16, False, fn.resolve_block("flash2_tc", 64, f16))
byte_ratio = std16.total / tc16.total
lessonkit.compare_prediction("standard bytes / flash2_tc bytes", my_byte_ratio, round(byte_ratio, 1))
times16 = tcx.forward_times(d=64, dtype="float16", causal=False)
std_ms = sum(float(r["ms"]) for r in tcx.standard_launch_shares(4096, 64))
tc_ms = times16["flash2_tc (sm80 path)"][0]
print(f"bytes: standard {std16.total / 1e9:.2f} GB, flash2_tc {tc16.total / 1e9:.2f} GB ({byte_ratio:.1f}x)")
print(f"time (recorded, H200): standard {std_ms:.3f} ms, flash2_tc {tc_ms:.3f} ms ({std_ms / tc_ms:.1f}x)")
print(f"  sources: {tcx.SHARES_SOURCE}; {tcx.TC_SOURCE}")

# %% [markdown]
# The time falls by more than the bytes (4.5x against 3.0x): with the products on tensor cores, standard
# attention pays for the traffic of $S$ and $P$, as the paper says, and its product kernels also wait on
# their tile loads (lesson 2 measures each launch). In float32 on CUDA cores (the tables above) the products
# themselves take most of the time, and the same byte ratio buys much less.

# %% [markdown]
# ## What to take away
#
# * Theorem 2 counts flash1's HBM accesses exactly: $2Nd + T_c(3Nd + 4N)$ elements, $T_c = \lceil N/B_c \rceil$.
# * Larger $B_c$ means fewer passes and fewer bytes, until the tiles no longer fit in shared memory.
# * Bytes grow like $N^2$ for every kernel here, but with very different constants; the IO model carries the
#   simulator's exact counts to any $N$.
# * Counted bytes are what the code requests; the hardware (L2, sectors) adds its own, which a profiler sees.

# %% [markdown]
# ## Check

# %%
assert all(checks), checks
assert all(b1 > b2 for (_, b1), (_, b2) in zip(sweep, sweep[1:])), "bytes fall as Bc grows"
assert all(abs(s - 2) < 0.1 for s in slopes.values()), slopes
assert all(r2 < r1 for r1, r2 in zip(d_ratio, d_ratio[1:])), "flash1's advantage shrinks as d grows"
assert (not sweep_ms) == SIM
assert byte_ratio > 1 and std_ms > tc_ms, "float16 on tensor cores: S and P cost standard bytes and time"
if recorded.available():
    big = {r["kernel"]: r for r in recorded.ncu_per_call() if r["N"] == 4096}
    gap = {x: big["standard"][x] / big["flash2_fast"][x] for x in ("counted", "dram")}
    assert gap["dram"] > 2 * gap["counted"], "DRAM widens the gap: S and P do not fit in L2, K and V re-reads do"
print("lesson 6: all checks passed")
