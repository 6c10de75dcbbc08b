"""Source of lessons/02_standard_attention.ipynb (build it with `python lessons/_build.py`)."""
# ruff: noqa: E402
# requires: flash_numba.tools.microbench

# %% [markdown]
# # Lesson 2: Standard attention, and where its time and memory go
#
# For one head, with queries $Q \in \mathbb{R}^{N_q \times d}$, keys and values
# $K, V \in \mathbb{R}^{N_k \times d}$ and the scale $1/\sqrt{d}$:
#
# $$S = \tfrac{1}{\sqrt d}\, Q K^\top \in \mathbb{R}^{N_q \times N_k}, \qquad
#   P = \mathrm{softmax}(S) \text{ (row by row)}, \qquad O = P V \in \mathbb{R}^{N_q \times d}.$$
#
# The paper calls the straightforward implementation *standard attention* (its Algorithm 0): three
# steps, each reading its inputs from HBM and writing its result to HBM, so the $N \times N$ matrices
# $S$ and $P$ are stored. This lesson writes it in NumPy, runs the package's three Numba kernels, counts
# their bytes, times each step, and works out where the $O(N^2)$ memory runs out.

# %%
import sys

if "google.colab" in sys.modules:  # Colab: install flash_numba (see lesson 0)
    # !pip install -q "numba-cuda[cu12]==0.30.4"
    # !pip install -q --no-deps "git+@REPO_URL@"
    pass  # source-only

# %%
import math

import numpy as np
from numba import cuda

import flash_numba as fn
from flash_numba import device, iomodel, lessonkit, pictures, recorded, reference
from flash_numba.tools import microbench
from flash_numba import exercises as ex
from flash_numba.kernels import standard

SIM = device.SIMULATOR
print(device.describe())
BH, N, d = (1, 32, 16) if SIM else (16, 4096, 64)  # (batch * heads, sequence length, head dim)
print(f"sizes: B*H = {BH}, N = {N}, d = {d}, float32" + ("  (tiny: simulator; nothing is timed)" if SIM else ""))


def median_ms(run):
    """Median time of run() in milliseconds over CUDA events, or None in the simulator."""
    times = device.time_ms(run)
    return None if times is None else float(np.median(times))


# %% [markdown]
# ## The reference
#
# `flash_numba.reference` computes attention in float64 NumPy; every kernel in this course is tested
# against it. Besides $O$ it returns $L_i = m_i + \log \ell_i$ for each query row, with
# $m_i = \max_j S_{ij}$ and $\ell_i = \sum_j e^{S_{ij} - m_i}$: the log of the softmax's denominator.
# The backward pass (lesson 7) needs it.

# %%
rng = np.random.default_rng(0)
q6, k6, v6 = (rng.standard_normal((6, 4)) for _ in range(3))
o6, lse6 = reference.attention_forward(q6, k6, v6)
S6 = q6 @ k6.T / math.sqrt(4)
P6 = np.exp(S6 - lse6[:, None])  # softmax(S) = exp(S - L): L normalises every row
print("rows of P sum to", P6.sum(axis=1))
print("O = P V equals the reference:", np.allclose(P6 @ v6, o6))

# %% [markdown]
# ## Your turn: standard attention in NumPy
#
# Write it for 2-D arrays `q` $(N_q, d)$, `k` and `v` $(N_k, d)$. Make the softmax *stable*: $e^{x}$
# overflows float64 above $x \approx 709$ (float32: 88), so subtract each row's maximum before
# exponentiating. $\mathrm{softmax}(x) = \mathrm{softmax}(x - c)$ for any constant $c$, and with
# $c = \max x$ every exponent is $\le 0$. The checker includes scores near $\pm 1000$.

# %%
def standard_attention(q, k, v):
    """softmax(q k^T / sqrt(d)) v for q (Nq, d), k and v (Nk, d)."""
    # Your turn: S, then a stable row-wise softmax P, then O = P v.
    raise NotImplementedError("three steps: S, P, O")


# %%
mine = ex.check("standard_attention", standard_attention)
assert ex.check_solution("standard_attention")

# %% [markdown]
# ## The three kernels
#
# `flash_numba/kernels/standard.py` runs those three steps as three kernels, with the $N \times N$
# matrices in HBM between them:
#
# 1. `matmul_kernel`: $S = \text{scale} \cdot QK^\top$, a tiled matrix product (lesson 4), one thread per
#    element of $S$, written to HBM.
# 2. `softmax_kernel`: one block of 32 threads per row of $S$. Three passes over the row in HBM: its
#    maximum $m_i$, then $\ell_i = \sum_j e^{S_{ij} - m_i}$, then $P_{ij} = e^{S_{ij} - m_i} / \ell_i$ written to
#    HBM (and $L_i$).
# 3. `matmul_kernel` again: $O = PV$.
#
# Here is the softmax kernel; the three `for j in range(t, Nk, NT)` loops are the three passes:

# %%
import inspect

print(inspect.getsource(standard.softmax_kernel))

# %% [markdown]
# Run them through the public function with `count_hbm=True`: each kernel counts the bytes its threads
# read from and write to HBM. The IO model (`flash_numba.iomodel.standard`) predicts the same numbers in
# closed form; they agree exactly.

# %%
q, k, v = (rng.standard_normal((BH, N, d)).astype(np.float32) for _ in range(3))
o_ref, lse_ref = reference.attention_forward(q, k, v)
res = fn.standard_attention_forward(q, k, v, count_hbm=True)
err = np.abs(res.o - o_ref).max() / np.abs(o_ref).max()
print(f"max |O - O_ref| / max |O_ref| = {err:.1e}")
print(res.hbm.table(f"standard attention forward, B*H = {BH}, N = {N}, d = {d}, float32 (bytes)"))
model = iomodel.forward("standard", BH, N, N, d, np.float32)
print("counted == IO model:", res.hbm == model)
nn_bytes = 2 * BH * N * N * 4
print(f"S and P alone take {nn_bytes:,} bytes; Q, K, V and O take {4 * BH * N * d * 4:,}")
print()
print(lessonkit.counted_beside_model(res.hbm, "standard", BH, N, d, np.float32))

# %% [markdown]
# Every byte of $S$ is written once and read three times by the softmax; every byte of $P$ is written
# once and read by the last product. The products also re-read their inputs, once per row or column of
# output tiles (lesson 4 explains why). With $N \gg d$ the $N^2$ terms dominate: standard attention moves
# $\Theta(Nd + N^2)$ bytes.
#
# ## Time per step
#
# To time the steps one at a time, launch the three kernels directly on device arrays (the launch
# configurations are in their docstrings). Running them once also checks that they give the same $O$.

# %%
f32 = np.dtype(np.float32)
T = standard.TILE
q_d, k_d, v_d = (cuda.to_device(x) for x in (q, k, v))
S_d = cuda.device_array((BH, N, N), f32)
P_d = cuda.device_array((BH, N, N), f32)
L_d = cuda.device_array((BH, N), f32)
O_d = cuda.device_array((BH, N, d), f32)
no_count = cuda.to_device(np.zeros(2, np.int64))  # the counter argument; the plain kernels never touch it
qk = standard.matmul_kernel(f32, False, True)  # C = alpha * A @ B^T
pv = standard.matmul_kernel(f32)  # C = alpha * A @ B
softmax = standard.softmax_kernel(f32)
scale = np.float32(1 / math.sqrt(d))
steps = {
    "S = scale*Q@K^T": lambda: qk[(math.ceil(N / T), math.ceil(N / T), BH), (T, T)](q_d, k_d, S_d, scale, no_count),
    "P = softmax(S)": lambda: softmax[(N, BH), standard.ROW_THREADS](S_d, P_d, L_d, no_count),
    "O = P@V": lambda: pv[(math.ceil(d / T), math.ceil(N / T), BH), (T, T)](P_d, v_d, O_d, np.float32(1), no_count),
}
for run in steps.values():
    run()
assert np.allclose(O_d.copy_to_host(), res.o, rtol=1e-5, atol=1e-6)
times = {name: median_ms(run) for name, run in steps.items()}

# %%
flops = {"S = scale*Q@K^T": 2 * BH * N * N * d, "P = softmax(S)": 5 * BH * N * N, "O = P@V": 2 * BH * N * N * d}
print(f"{'step':<16} {'MB counted':>10} {'ms':>8} {'share':>6} {'GB/s':>7} {'TFLOP/s':>8}")
total_ms = None if SIM else sum(times.values())
for name in steps:
    mb = res.hbm.per_kernel[name].total / 1e6
    if SIM:
        print(f"{name:<16} {mb:>10.3f} {'n/a':>8}")
    else:
        t = times[name]
        print(f"{name:<16} {mb:>10.1f} {t:>8.3f} {t / total_ms:>6.0%} {mb / t:>7.0f} {flops[name] / t / 1e9:>8.2f}")
if SIM:
    print(f"not timed: {device.CudaTimer.note}")

# %% [markdown]
# On a GPU, compare the GB/s column with the HBM bandwidth of lesson 1 and the TFLOP/s column with the
# float32 peak. The softmax can only stream bytes, so its rate is a fraction of the bandwidth. Our
# products are deliberately plain (one output element per thread, no register tiling) and stay far
# below the peak, so on a GPU they may well take longer than the softmax. Libraries run the products
# close to the peak, on tensor cores in half precision; what is left then is the time the roofline
# allows. The lower bound of each step,
# $\max(F/\pi,\ B_{\min}/\beta)$ with its minimum bytes $B_{\min}$ (each input read once, the output
# written once), at $B \cdot H = 16$, $N = 4096$, $d = 64$, on this GPU in float32 and on the paper's
# A100 in float16 with tensor cores (312 TFLOP/s and 1.555 TB/s, NVIDIA A100 40 GB datasheet):

# %%
hbm, fp32 = microbench.hbm_bandwidth(), microbench.fp32_peak()
if hbm.value is None:
    here = ("a T4 in float32 (datasheet: 320 GB/s, 8.1 TFLOP/s)", 320e9, 8.1e12, 4)
else:
    here = (f"{device.info().name} in float32 (measured)", hbm.per_second, fp32.per_second, 4)
a100 = ("an A100 in float16 on tensor cores (datasheet)", 1.555e12, 312e12, 2)


Hb, Nb, db = 16, 4096, 64  # the sizes of the bounds (arithmetic only: the same in the simulator)
flops_b = {"S = scale*Q@K^T": 2 * Hb * Nb * Nb * db, "P = softmax(S)": 5 * Hb * Nb * Nb,
           "O = P@V": 2 * Hb * Nb * Nb * db}
elems_b = {"S = scale*Q@K^T": 2 * Hb * Nb * db + Hb * Nb * Nb, "P = softmax(S)": 2 * Hb * Nb * Nb,
           "O = P@V": Hb * Nb * Nb + 2 * Hb * Nb * db}  # minimum elements moved
bound_share = {}
for label, bw, peak, e in (here, a100):
    bounds = {name: max(flops_b[name] / peak, elems_b[name] * e / bw) for name in steps}
    total = sum(bounds.values())
    bound_share[label] = bounds["P = softmax(S)"] / total
    print(f"lower bounds on {label}:")
    for name, t in bounds.items():
        kind = "memory" if elems_b[name] * e / bw > flops_b[name] / peak else "compute"
        print(f"  {name:<16} {t * 1e3:8.4f} ms  {t / total:>4.0%}  ({kind}-bound)")

# %% [markdown]
# In half precision the products finish so quickly that writing and reading the $N \times N$ matrices
# is most of the bound, and the softmax, which only moves bytes, takes the largest share. Masking and
# dropout add more such elementwise passes over $N \times N$ matrices: the FlashAttention paper measured
# these steps taking most of the time of GPT-2's attention in PyTorch (Dao et al. 2022, Figure 1,
# right). With PyTorch installed on a GPU, the next cell times the same three steps with its library
# kernels.

# %%
try:
    import torch

    HAVE_TORCH_GPU = torch.cuda.is_available() and not SIM
except ImportError:
    HAVE_TORCH_GPU = False

if HAVE_TORCH_GPU:
    for dt in (torch.float32, torch.float16):
        tq, tk, tv = (torch.as_tensor(x, device="cuda").to(dt) for x in (q, k, v))
        ts = {}
        tS = torch.matmul(tq, tk.transpose(1, 2)) * scale.item()
        tP = torch.softmax(tS, dim=-1)
        ts["S = scale*Q@K^T"] = median_ms(lambda: torch.matmul(tq, tk.transpose(1, 2)).mul_(scale.item()))
        ts["P = softmax(S)"] = median_ms(lambda: torch.softmax(tS, dim=-1))
        ts["O = P@V"] = median_ms(lambda: torch.matmul(tP, tv))
        tot = sum(ts.values())
        print(f"PyTorch, {dt}: " + ", ".join(f"{n} {t:.3f} ms ({t / tot:.0%})" for n, t in ts.items()))
else:
    print("skipped: needs PyTorch and a GPU")

# %% [markdown]
# ## O(N^2) memory
#
# $S$ and $P$ take $2 \cdot BH \cdot N^2$ elements. At $B \cdot H = 16$ heads in float32, here is what
# that costs as $N$ grows, against this device's memory (in the simulator: a T4's 16 GB, datasheet):

# %%
mem = device.info().total_memory or 16 * 2**30
heads, e = 16, 4
n_max = int(math.sqrt(mem / (2 * heads * e)))
for n in (1024, 4096, 16384, 65536):
    need = 2 * heads * n * n * e
    print(f"N = {n:>6}: S and P take {need / 2**30:8.2f} GB {'(does not fit)' if need > mem else ''}")
print(f"largest N whose S and P fit in {mem / 2**30:.0f} GB (nothing else counted): {n_max:,}")

# %% [markdown]
# On a GPU, try it: standard attention a little beyond that length fails to allocate, while the
# FlashAttention kernel, which never stores $S$ or $P$, runs (its memory is $O(Nd)$: the inputs and the
# output). In the simulator this cell only prints what it would do.

# %%
n_big = int(n_max * 1.1) // 64 * 64
if SIM:
    print(f"(on a GPU: standard and flash2 attention at N = {n_big:,}, B*H = {heads}, d = 64)")
else:
    big = [cuda.to_device(rng.standard_normal((heads, n_big, 64), dtype=np.float32)) for _ in range(3)]
    try:
        fn.standard_attention_forward(*big)
        print(f"standard attention at N = {n_big:,}: ran (more memory than estimated was free)")
    except Exception as exc:  # CudaAPIError: CUDA_ERROR_OUT_OF_MEMORY
        print(f"standard attention at N = {n_big:,}: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
    t0 = device.time_ms(lambda: fn.flash_attention_forward(*big, kernel="flash2"), warmup=1, repeats=1)[0]
    print(f"flash2 at N = {n_big:,}: runs, {t0:.0f} ms")
    del big

# %% [markdown]
# ## What to take away
#
# * Standard attention stores two $N \times N$ matrices and moves $\Theta(Nd + N^2)$ bytes.
# * The softmax only moves bytes; with fast products, the $N^2$ traffic is the cost.
# * The memory runs out at a sequence length the cells above computed for this device.
#
# Lessons 3 and 4 collect the two tools that remove the $N \times N$ matrices: a softmax computed in one
# pass over blocks, and tiles kept in shared memory.

# %% [markdown]
# ## Measured on a real GPU
#
# In the simulator nothing is timed. The project ran the same kernels on an NVIDIA H200; the table
# below is loaded from the committed benchmark file and printed with the GPU, the date and the command
# it came from: recorded, not measured now (on a GPU the cells above measure this one).
# The paper's point, seen at $N = 4096$ ($B \cdot H = 32$, $d = 64$): standard attention against the
# flash kernels, forward and backward, and the memory each needed (`peak_mem_bytes` in the same file).

# %%
if recorded.available():
    print(recorded.bench_table(["standard", "flash2", "flash2_fast"], "fwd", 4096))
    print(recorded.bench_table(["standard", "flash2", "flash2_fast"], "fwd+bwd", 4096).split("\n", 3)[3])
    peak = {r["implementation"]: int(r["peak_mem_bytes"]) for r in recorded.bench_rows(None, "fwd", 4096)}
    print(f"peak memory of the call: standard {peak['standard'] / 2**20:.0f} MiB, "
          f"flash2 {peak['flash2'] / 2**20:.0f} MiB ({peak['standard'] / peak['flash2']:.0f}x less)")

# %% [markdown]
# Where the bytes go as $N$ grows, from the IO models (one head, $d = 64$, float32): standard
# attention's three kernels against the flash kernels'. $S$ and $P$ make the $N^2$ terms; they dominate
# from the first $N$ on the axis.
#
# **Predict, then run.** At $N = 16384$, how many MB does standard attention's softmax kernel move (it
# reads $S$ and writes $P$, both $N \times N$ float32, and reads $S$ more than once: look at its row in
# the counted table above)?

# %%
my_prediction = None  # MB moved by "P = softmax(S)" at N = 16384, one head

# %%
sm16k = iomodel.forward("standard", 1, 16384, 16384, 64, np.float32).per_kernel["P = softmax(S)"].total
lessonkit.compare_prediction("softmax MB at N = 16384", my_prediction, round(sm16k / 1e6))
lessonkit.show(pictures.hbm_bytes_by_term())

# %% [markdown]
# ## Check

# %%
assert err < 1e-5, err
assert res.hbm == model
assert res.hbm.per_kernel["P = softmax(S)"].bytes_read == 3 * BH * N * N * 4, "three passes over S"
assert (times["P = softmax(S)"] is None) == SIM
assert bound_share[a100[0]] > 0.4, "in float16 on tensor cores the softmax is the largest share of the bound"
assert 2 * heads * n_max**2 * e <= mem < 2 * heads * (n_max + 1) ** 2 * e
print("lesson 2: all checks passed")
