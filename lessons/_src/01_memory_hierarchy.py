"""Source of lessons/01_memory_hierarchy.ipynb (build it with `python lessons/_build.py`)."""
# ruff: noqa: E402
# requires: flash_numba.tools.microbench

# %% [markdown]
# # Lesson 1: The memory hierarchy
#
# A kernel does two things: it moves bytes and it computes on them. Which of the two limits its speed
# decides what is worth optimising. In this lesson you measure your GPU's three ceilings (how many bytes
# per second HBM delivers, how many shared memory delivers, how many float32 operations per second the
# SMs do) and use them to sort kernels into *memory-bound* and *compute-bound* with the roofline model.
# FlashAttention exists because attention, computed the standard way, is memory-bound.

# %%
import sys

if "google.colab" in sys.modules:  # Colab: install flash_numba (see lesson 0)
    # !pip install -q "numba-cuda[cu12]==0.30.4"
    # !pip install -q --no-deps "git+@REPO_URL@"
    pass  # source-only

# %%
import numpy as np

import flash_numba as fn
from flash_numba import device, iomodel
from flash_numba.course import lessonkit, pictures, recorded
from flash_numba.tools import l2, microbench
from flash_numba.course import exercises as ex

SIM = device.SIMULATOR
print(device.describe())
if SIM:
    print("Simulator: the benchmarks run on tiny sizes to check their kernels, and nothing is timed.")

# %% [markdown]
# ## HBM bandwidth
#
# `microbench.hbm_bandwidth()` copies a 1 GiB float32 buffer into another with a simple grid-stride
# kernel, several loads in flight per thread, and divides the bytes read plus written by the median
# time of 20 launches. The buffers are far larger than the L2 cache, so the bytes really come from and
# go to HBM. (Read `flash_numba/tools/microbench.py`: each benchmark is one short kernel.)

# %%
hbm = microbench.hbm_bandwidth()
print(hbm)
print("  method:", hbm.method)

# %% [markdown]
# ## Shared-memory bandwidth and the float32 peak
#
# `shared_bandwidth()` has every thread of a full wave of blocks stream reads from an 8 KB tile in shared
# memory, laid out so that the 32 threads of a warp hit 32 different banks (lesson 4 explains banks).
# `fp32_peak()` runs eight independent chains of fused multiply-adds per thread, so that a warp can
# issue one every cycle; one FMA counts as 2 FLOPs.

# %%
smem = microbench.shared_bandwidth()
fp32 = microbench.fp32_peak()
for m in (smem, fp32):
    print(m)
    print("  method:", m.method)
if hbm.value is not None:
    print(f"\nshared memory delivers {smem.value / hbm.value:.1f} times the bytes per second of HBM")

# %% [markdown]
# ## Compute-bound or memory-bound: the roofline
#
# A kernel that performs $F$ floating-point operations and moves $B$ bytes to and from HBM has
# *arithmetic intensity* $I = F / B$ (FLOP per byte). On a GPU with peak $\pi$ (FLOP/s) and bandwidth
# $\beta$ (bytes/s) it needs at least $\max(F/\pi,\ B/\beta)$ seconds, so it can reach at most
# $\min(\pi,\ \beta I)$ FLOP/s: the *roofline* (Williams, Waterman and Patterson, 2009). The two
# ceilings meet at the *ridge point* $I^* = \pi / \beta$. Below it a kernel is **memory-bound**: faster
# arithmetic would not help, only moving fewer bytes would. Above it the kernel is **compute-bound**.
#
# In the simulator nothing is measured, so the roofline below uses a Tesla T4's datasheet numbers
# (320 GB/s, 8.1 TFLOP/s float32; NVIDIA T4 datasheet), labelled as such.

# %%
if hbm.value is None:
    BW, PEAK = 320e9, 8.1e12
    SOURCE = "NVIDIA T4 datasheet, not measured"
else:
    BW, PEAK = hbm.per_second, fp32.per_second
    SOURCE = f"measured on {device.info().name}"
roof = microbench.roofline(peak_flops=PEAK, bandwidth=BW)
print(f"roofline ({SOURCE}): bandwidth {BW / 1e9:,.0f} GB/s, float32 peak {PEAK / 1e12:.1f} TFLOP/s")
print(f"ridge point: {roof.ridge:.1f} FLOP/byte; a kernel below that intensity is memory-bound here")

# %% [markdown]
# ## Your turn: the intensity of a matrix product
#
# $C = AB$ with $A$ of shape $M \times K$ and $B$ of shape $K \times N$ does one multiply and one add per
# triple $(i, j, k)$. At the very least it reads $A$ and $B$ once and writes $C$ once, each element
# `itemsize` bytes. Write its intensity, FLOPs over that minimum number of bytes.

# %%
def matmul_intensity(M, N, K, itemsize):
    """FLOP per byte of C (M x N) = A (M x K) @ B (K x N), reading A and B once and writing C once."""
    # Your turn
    raise NotImplementedError("return flops / bytes")


# %%
mine = ex.check("matmul_intensity", matmul_intensity)
assert ex.check_solution("matmul_intensity")
intensity = matmul_intensity if mine else ex.solution_fn("matmul_intensity")  # yours once it passes
print(f"C = A B with M = N = K = 1024 in float32: {intensity(1024, 1024, 1024, 4):.0f} FLOP/byte")

# %% [markdown]
# A large square product is far above the ridge point: compute-bound. Now attention's
# pieces at a real size (one head: $N = 4096$, $d = 64$, float32; this is arithmetic, nothing runs).
# Standard attention is three kernels: $S = QK^\top/\sqrt{d}$ is a product with a small inner dimension
# $K = d$ and a large $N \times N$ output; the softmax does 3 operations per element of $S$ (subtract the
# row's maximum, exponential, multiply by $1/\ell$: lesson 2's kernel, whose row maximum and sum come from
# the first kernel), reading $S$ and writing
# $P$; $O = PV$ is a product with a large inner dimension. Their minimum traffic, and the traffic our
# kernels actually request (counted by the IO model of lesson 2's kernels, which re-read tiles):

# %%
N, d, e = 4096, 64, 4
std_bytes = iomodel.forward("standard", 1, N, N, d, np.float32).per_kernel
rows = [  # (kernel, FLOPs, minimum bytes, bytes our kernel requests)
    ("S = scale*Q@K^T", 2 * N * N * d, (2 * N * d + N * N) * e, std_bytes["S = scale*Q@K^T"].total),
    ("P = softmax(S)", 3 * N * N, 2 * N * N * e, std_bytes["P = softmax(S)"].total),
    ("O = P@V", 2 * N * N * d, (N * N + 2 * N * d) * e, std_bytes["O = P@V"].total),
]
print(f"one head, N = {N}, d = {d}, float32; ridge point {roof.ridge:.1f} FLOP/byte ({SOURCE})")
print(f"{'kernel':<16} {'GFLOP':>7} {'MB min':>7} {'I min':>6} {'MB ours':>8} {'I ours':>7}  bound (ours)")
points = []
for name, flops, b_min, b_ours in rows:
    i_min, i_ours = flops / b_min, flops / b_ours
    bound = "memory" if i_ours < roof.ridge else "compute"
    mb_min, mb_ours = b_min / 1e6, b_ours / 1e6
    print(f"{name:<16} {flops / 1e9:>7.2f} {mb_min:>7.1f} {i_min:>6.1f} {mb_ours:>8.1f} {i_ours:>7.2f}  {bound}")
    points.append((name, i_ours))
assert abs(rows[0][1] / rows[0][2] - intensity(N, N, d, e)) < 1e-9  # the S row is your exercise

# %% [markdown]
# The softmax has an intensity below 1 FLOP/byte whatever the GPU: it is memory-bound everywhere, and its
# time is the time to read $S$ and write $P$. The two products would be far above the ridge if they moved
# only their minimum bytes; ours (lesson 2) also re-read $K$ and $V$ once per block of 64 query rows,
# which brings them down to about 16 FLOP/byte: under a T4's ridge, about at an H200's. (The L2 cache
# serves most of those re-reads, see below, so the DRAM sees fewer bytes than this count.)
# FlashAttention attacks the $N \times N$ traffic itself: it never
# writes $S$ or $P$. Its forward pass does $4 N^2 d$ FLOPs (the two products) and moves a number of
# bytes that lesson 6 derives; the IO model gives it here for flash2 with the block sizes this device
# would use:

# %%
blk = fn.resolve_block("flash2", d, np.float32)
flash_bytes = iomodel.forward("flash2", 1, N, N, d, np.float32, False, blk).total
flash_I = 4 * N * N * d / flash_bytes
print(f"flash2 forward, blocks (Br, Bc) = {blk}: {flash_bytes / 1e6:.1f} MB, intensity {flash_I:.1f} FLOP/byte")
print(f"standard attention's three kernels together: {sum(r[3] for r in rows) / 1e6:.1f} MB")
points.append(("flash2 forward", flash_I))

# %% [markdown]
# The roofline of this device with those kernels on it (the attainable FLOP/s at each intensity):

# %%
import matplotlib.pyplot as plt

I = np.logspace(-1, 3, 200)
fig, ax = plt.subplots(figsize=(7, 4))
ax.loglog(I, roof.attainable(I) / 1e12, color="k", label=f"roofline ({SOURCE})")
ax.axvline(roof.ridge, color="k", ls=":", lw=1)
for name, x in points:
    ax.plot([x], [roof.attainable(x) / 1e12], "o", label=f"{name}: {x:.2f} FLOP/B")
ax.set_xlabel("arithmetic intensity (FLOP/byte)")
ax.set_ylabel("attainable TFLOP/s (float32)")
ax.set_title(f"Roofline: {device.info().name}")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## What the counters count, and what the DRAM sees
#
# The byte counts in this course (the counters and the IO models) are the bytes a kernel's code
# *requests* from global memory: the paper's HBM accesses, in a model with two levels, SRAM and HBM.
# A GPU has a third level between them: the **L2 cache**, shared by all SMs (4 MB on a T4, 40 MB on an
# A100, 50 MB on an H200; NVIDIA's datasheets). A read whose data is still in L2 never reaches DRAM:
# the re-reads of $K_j$ and $V_j$ by the thread blocks of different query blocks mostly hit in L2,
# while $S$ of a whole batch (2 GB at $B \cdot H = 32$, $N = 4096$, float32) cannot stay there: it is
# written to DRAM and read back. At small sizes everything fits and the DRAM sees far fewer bytes than
# the counts. NVIDIA's profiler, Nsight Compute, measures both (lesson 6 says how); the project ran it
# on an H200 for lesson 2's kernels and flash2_fast's forward:

# %%
if recorded.available():
    print(recorded.ncu_table())
t4_l2 = l2.L2_BYTES["T4"]
n_t4 = l2.crossing_N(1, t4_l2)
print(f"\nT4: {t4_l2 / 2**20:.0f} MB of L2; S of one head in float32 fills it at N = {n_t4:,.0f} "
      f"({n_t4**2 * 4 / 2**20:.0f} MB), S of {16} heads at N = {l2.crossing_N(16, t4_l2):,.0f}")

# %% [markdown]
# Read the last column: standard's softmax at $B \cdot H = 32$, $N = 4096$ sends nearly every byte it
# counts to DRAM ($S$ in, $P$ out), while the products send about 0.6 of theirs and flash2_fast, whose
# only large traffic is those re-reads, under 0.2. (Nsight Compute empties the caches before each
# kernel it profiles, so even the small size, where $S$ would fit in the 50 MB L2, reads $S$ from DRAM
# in the softmax.) On a T4 the L2 holds $S$ of one head only up to $N = 1024$: past that, standard's
# $S$ and $P$ go through DRAM, and the re-reads of $K$ and $V$ still mostly hit.

# %% [markdown]
# ## What to take away
#
# * Shared memory is much faster than HBM but tiny; HBM is large and, for most of attention, the limit.
# * Intensity decides: under the ridge point a kernel's time is its bytes divided by the bandwidth.
# * The softmax and the writing of $S$ and $P$ make standard attention memory-bound. Lesson 2 measures
#   that on the kernels themselves.
# * The counters count bytes requested; the L2 cache serves re-reads, so DRAM sees fewer, but never
#   fewer than $S$ and $P$ once they outgrow it.

# %% [markdown]
# ## The levels in one picture
#
# **Predict, then run.** How many times the bytes per second of HBM does shared memory deliver? (On a GPU
# the cells above measured both; in the simulator the next cell uses the committed H200 measurement,
# recorded, not measured now.)

# %%
my_prediction = None  # shared-memory bandwidth / HBM bandwidth

# %%
if not SIM:
    info = device.info()
    levels = {"shared memory, all SMs": (info.sm_count * info.shared_mem_per_sm, smem.value * 1e9),
              "HBM": (info.total_memory or 1, hbm.value * 1e9)}  # (1 byte where the driver does not say)
    title = f"measured now: {info.name}"
elif recorded.available():
    levels, title = recorded.hierarchy_levels(), f"{recorded.LABEL}: {recorded.hierarchy()['gpu']}"
    print(recorded.cite(recorded.LESSON1_LOG))
else:
    levels, title = None, "no GPU and no recorded results (clone the repository)"
print(title)
if levels:
    ratio_smem = levels["shared memory, all SMs"][1] / levels["HBM"][1]
    lessonkit.compare_prediction("shared / HBM bandwidth", my_prediction, round(ratio_smem, 1))
    lessonkit.show(pictures.memory_hierarchy(levels, title))

# %% [markdown]
# ## Check

# %%
assert (hbm.value is None) == SIM and (smem.value is None) == SIM and (fp32.value is None) == SIM
if not SIM:
    assert hbm.value > 0 and smem.value > hbm.value and fp32.value > 0, (hbm, smem, fp32)
assert roof.ridge > 1
softmax_I = points[1][1]
assert softmax_I < 1 < roof.ridge, "the softmax is memory-bound"
assert np.isclose(roof.attainable(softmax_I), BW * softmax_I)
assert flash_bytes < sum(r[3] for r in rows)
assert l2.crossing_N(1, l2.L2_BYTES["T4"]) == 1024, "S of one head, float32, N = 1024: 4 MB"
print("lesson 1: all checks passed")
