"""Source of lessons/00_setup_and_tour.ipynb (build it with `python lessons/_build.py`)."""
# ruff: noqa: E402

# %% [markdown]
# # Lesson 0: Setup, and a tour of the machine
#
# This course builds FlashAttention from scratch: first the memory hierarchy of a GPU, then standard
# attention and why it is slow, then the online softmax and tiling, and finally the FlashAttention
# forward and backward passes and the FlashAttention-2 loop order, each as a Numba CUDA kernel you can
# read, run and measure. Every claim is checked in a cell: the byte counts come from counters inside the
# kernels, the errors from a float64 NumPy reference, the times from CUDA events on your GPU.
#
# **Where it runs.** On a machine with an NVIDIA GPU (Colab's free T4 is enough) the kernels run for
# real, at real sizes, and are timed. On a laptop without a GPU, `flash_numba` switches to Numba's
# *CUDA simulator*, which runs every CUDA thread as Python code on the CPU: the same kernel code, the
# same results and the same byte counts, but only at tiny sizes (a few dozen tokens), with no timings
# (the simulator has no clock for kernels), no detection of races, and no check that the code would
# compile for a GPU. Every lesson picks its sizes from the mode it finds and says which one it ran in.
#
# **On Colab**: *Runtime > Change runtime type > T4 GPU*, then run the next cell. It installs
# `numba-cuda` with the CUDA 12 toolkit wheels and this package. `--no-deps` keeps the numpy that
# Colab ships (2.5): numba-cuda 0.30.4 trips over a name numpy 2.5 removed, and `flash_numba` puts that
# name back when it is imported (`flash_numba/_compat.py`), so nothing needs downgrading. Anywhere
# else the cell does nothing; install with `pip install -e ".[dev]"` from a clone instead.

# %%
import sys

if "google.colab" in sys.modules:
    # !pip install -q "numba-cuda[cu12]==0.30.4"
    # !pip install -q --no-deps "git+@REPO_URL@"
    pass  # source-only

# %% [markdown]
# Import `flash_numba` **before** anything imports numba: that is when it decides between the GPU and the
# simulator (it turns the simulator on when no NVIDIA driver can be loaded).

# %%
import numpy as np

import flash_numba as fn
from flash_numba import device, iomodel, reference
from flash_numba.course import lessonkit, pictures, recorded
from flash_numba.course import exercises as ex

SIM = device.SIMULATOR
print(device.describe())
if SIM:
    print("Simulator: sizes are tiny and nothing is timed; byte counts and errors are exact all the same.")

# %% [markdown]
# ## The machine in numbers
#
# A GPU has a few dozen to over a hundred *streaming multiprocessors* (SMs). Each SM has a small, fast
# on-chip memory that a kernel manages itself, *shared memory* (the FlashAttention paper calls it SRAM),
# next to its registers and an L1 cache. All SMs share the large off-chip *high-bandwidth memory* (HBM),
# where every tensor lives. The paper's example, an A100, has 40-80 GB of HBM at 1.5-2.0 TB/s and
# 192 KB of SRAM on each of its 108 SMs, with an estimated 19 TB/s of SRAM bandwidth (Dao et al. 2022,
# Section 2.1). Shared memory is an order of magnitude faster, and all of it together (about 20 MB on
# the A100) is some two thousand times smaller than HBM: that asymmetry is what this course is about.
# Here is your device (in the simulator the numbers are stand-ins, a T4-sized shared-memory budget, and
# are marked so):

# %%
info = device.info()
print(f"device                      {info.name}{'  (stand-in numbers)' if info.simulated else ''}")
print(f"compute capability          {info.compute_capability[0]}.{info.compute_capability[1]}")
print(f"streaming multiprocessors   {info.sm_count}")
print(f"warp size                   {info.warp_size} threads")
print(f"shared memory per SM        {info.shared_mem_per_sm // 1024} KB")
print(f"shared memory per block     {info.shared_mem_per_block // 1024} KB (static limit; the kernels stay within it)")
sram_total = info.sm_count * info.shared_mem_per_sm
print(f"shared memory, all SMs      {sram_total / 2**20:.2f} MB")
if info.total_memory:
    print(f"device memory (HBM / GDDR)  {info.total_memory / 2**30:.1f} GB")
    print(f"HBM / all shared memory     {info.total_memory / sram_total:,.0f} times larger")
else:
    print("device memory               unknown (the simulator has none of its own)")

# %% [markdown]
# ## The whole course in one cell
#
# Attention computes $O = \mathrm{softmax}(S)\,V$ with scores $S = Q K^\top / \sqrt{d}$, for queries $Q$,
# keys $K$ and values $V$ of shape $N \times d$ (sequence length $N$, head dimension $d$), once per batch
# element and head ($B \cdot H$ times). *Standard attention* writes the $N \times N$ matrices $S$ and
# $P = \mathrm{softmax}(S)$ to HBM and reads them back; *FlashAttention* computes the same $O$ block by
# block in shared memory and never stores them. `count_hbm=True` makes the kernels count every byte
# they read from and write to HBM. Run both on random inputs and compare them with the float64 NumPy
# reference:

# %%
BH, N, d = (1, 32, 16) if SIM else (16, 2048, 64)  # (batch * heads, sequence length, head dim)
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((BH, N, d)).astype(np.float32) for _ in range(3))
o_ref, lse_ref = reference.attention_forward(q, k, v)  # float64, the ground truth

std = fn.standard_attention_forward(q, k, v, count_hbm=True)
flash = fn.flash_attention_forward(q, k, v, kernel="flash2", count_hbm=True)
errors = {}
for name, res in (("standard", std), ("flash2", flash)):
    errors[name] = np.abs(res.o - o_ref).max() / np.abs(o_ref).max()
    print(f"{name:>8}: max |O - O_ref| / max |O_ref| = {errors[name]:.1e}")
print()
print(std.hbm.table(f"standard attention, B*H = {BH}, N = {N}, d = {d}, float32 (bytes)"))
print()
print(flash.hbm.table(f"flash2 (blocks Br, Bc = {flash.block})"))
print(f"\nstandard attention moves {std.hbm.total / flash.hbm.total:.1f} times the bytes of flash2 here")

# %% [markdown]
# Both are exact to float32 rounding, and FlashAttention moves a fraction of the bytes. Standard
# attention's traffic grows like $Nd + N^2$, FlashAttention's like $N^2 d^2 / M$ for $M$ elements of
# shared memory (lesson 6), and FlashAttention never needs memory for an $N \times N$ matrix. On a GPU
# the next cell also times both, with the inputs already on the device so that no copy between host and
# device is timed.

# %%
from numba import cuda


def median_ms(run):
    """Median time of run() in milliseconds over CUDA events, or None in the simulator."""
    times = device.time_ms(run)
    return None if times is None else float(np.median(times))


q_d, k_d, v_d = (cuda.to_device(x) for x in (q, k, v))
t_std = median_ms(lambda: fn.standard_attention_forward(q_d, k_d, v_d))
t_flash = median_ms(lambda: fn.flash_attention_forward(q_d, k_d, v_d, kernel="flash2"))
if t_std is None:
    print(f"not timed: {device.CudaTimer.note}")
else:
    print(f"standard {t_std:.3f} ms, flash2 {t_flash:.3f} ms: flash2 takes {t_flash / t_std:.2f} of the time")

# %% [markdown]
# ## The course
#
# | notebook | what you build or measure |
# |---|---|
# | 1 | your GPU's HBM and shared-memory bandwidth, arithmetic intensity, a roofline |
# | 2 | standard attention: NumPy, then three Numba kernels; bytes, time per step, O(N^2) memory |
# | 3 | the online softmax: a running max and sum, exact on any split of a row |
# | 4 | tiling and shared memory: a tiled matrix product, barriers, bank conflicts |
# | 5 | the FlashAttention forward pass (Algorithm 1), in NumPy blocks and in Numba |
# | 6 | IO complexity: the counters against Theorem 2, the block-size sweep |
# | 7 | the backward pass with recomputation: L and D; a dK/dV body, then a whole dQ kernel |
# | 8 | causal masking: skipping whole blocks, rows with no visible key |
# | 9 | FlashAttention-2: the swapped loops, delayed normalisation; you write the whole forward kernel |
# | 10 | in practice: PyTorch SDPA, checking which backend runs, the KV cache |
# | 11 | the bug zoo: read a checker's verdict, name the bug, repair two broken kernels |
# | 12 | swap our attention into a model: the autograd Function, causal conventions, a GPT trained on it |
# | 13 | tensor cores: the mma.sync fragment map, a 16 x 16 tile product you write, P kept in registers |
# | 14 | decoding and the KV cache: a step's bytes, GQA, split-KV and the merge you write, a paged cache |
# | A1 | optional appendix: how flash2_fast got fast (swizzles, lane groups, register caps, splits) |
#
# Each lesson has *Your turn* exercises. You write a function or a kernel in the exercise cell
# (which ships with `raise NotImplementedError` in place of your code) and run the check cell below it:
# `ex.check(name, answer)` runs your answer next to the reference on awkward cases and prints the first
# case where they differ as `Yours:` / `Spec :`. The same cell then runs the packaged solution through the
# same checker, so the cell checks something real even before you start. `ex.solution(name)` prints the
# solution when you are stuck.

# %% [markdown]
# ## Your turn: a first kernel
#
# A CUDA kernel is a function that every thread of a *grid* runs. The grid is made of *blocks* of
# threads; `kernel[blocks, threads_per_block](args)` launches it. Each thread finds its element from its
# coordinates: `cuda.grid(1)` is `blockIdx.x * blockDim.x + threadIdx.x`, the thread's global index. The
# grid is rounded up to whole blocks, so the last block usually has threads past the end of the data:
# they must do nothing. (In the simulator an out-of-bounds access raises `IndexError`; on a GPU it may
# silently corrupt other memory, which is why the checker looks for writes past the end.)
#
# Write `axpy`: `out[i] = alpha * x[i] + y[i]`, one thread per element. Replace the `raise` line.

# %%
@cuda.jit
def axpy(alpha, x, y, out):
    """out[i] = alpha * x[i] + y[i], one thread per element i."""
    # Your turn: i = this thread's global index; if i is inside the arrays, write out[i].
    raise NotImplementedError("write the body of axpy")


# %%
mine = ex.check("axpy", axpy)  # launched with 32 threads per block on arrays of 1, 31, 32 and 101 elements
assert ex.check_solution("axpy")  # the packaged solution passes the same checker
# ex.solution("axpy")  # uncomment to print the solution

# %% [markdown]
# ## Measured on a real GPU
#
# In the simulator nothing is timed. The project ran the same kernels on an NVIDIA H200. The table
# below comes from one run of the benchmark, shipped with the package, and is printed with the GPU, the
# date and the command: recorded, not measured now (on a GPU the cells above measure this one).

# %%
if recorded.available():
    print(recorded.bench_table(["standard", "flash2_fast", "torch-math"], "fwd", 4096, recorded.STANDARD_BENCH_CSV))
    title = f"{recorded.LABEL}: {recorded.hierarchy()['gpu']}"
    print(recorded.cite(recorded.LESSON1_LOG))
    lessonkit.show(pictures.memory_hierarchy(recorded.hierarchy_levels(), title))
else:
    print("the recorded results are not installed (flash_numba/course/data/)")

# %% [markdown]
# **Predict, then run.** At another $N$ (half this one in the simulator, where standard attention's
# $N^2$ threads are slow; twice this one on a GPU), is standard attention's share of the bytes larger,
# smaller or the same? Write the ratio of standard attention's bytes to flash2's that you expect.

# %%
my_prediction = None  # standard / flash2 bytes at the other N

# %%
N2 = N // 2 if SIM else 2 * N
q2, k2, v2 = (rng.standard_normal((BH, N2, d)).astype(np.float32) for _ in range(3))
std2 = fn.attention_forward(q2, k2, v2, kernel="standard", count_hbm=True).hbm.total  # one entry point, any kernel
ratio2 = std2 / fn.attention_forward(q2, k2, v2, kernel="flash2", count_hbm=True).hbm.total
lessonkit.compare_prediction(f"standard / flash2 bytes at N = {N2}", my_prediction, round(ratio2, 2))

# %% [markdown]
# ## What to take away
#
# * The same kernels run on a GPU and in the simulator, with the same results and the same byte counts; only a GPU can
#   time them.
# * Standard attention and FlashAttention give the same $O$; FlashAttention moves a fraction of the bytes and never
#   stores an $N \times N$ matrix.
# * On a GPU, bytes become time: the recorded H200 table shows what that is worth, and that a tuned library kernel
#   goes further still.

# %% [markdown]
# ## Check
#
# The last cell of every lesson asserts what the lesson showed, so a run that goes wrong fails loudly.

# %%
tol = 1e-5  # float32 against float64
assert errors["standard"] < tol and errors["flash2"] < tol, errors
assert np.abs(flash.lse - lse_ref).max() < tol * max(1.0, np.abs(lse_ref).max())
assert std.hbm == iomodel.forward("standard", BH, N, N, d, np.float32), "the counters disagree with the IO model"
assert flash.hbm.total < std.hbm.total
assert (t_std is None) == SIM
print("lesson 0: all checks passed")
