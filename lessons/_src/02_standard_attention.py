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
from flash_numba import device, iomodel, reference
from flash_numba.course import lessonkit, pictures, recorded
from flash_numba.tools import microbench
from flash_numba.course import exercises as ex
from flash_numba.course import tensor_cores as tcx
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
# `flash_numba/kernels/standard/` runs those three steps as three kernels, with the $N \times N$
# matrices in HBM between them. It is the paper's baseline done well: the same blocks $(B_r, B_c)$ and
# the same register tiles as the fastest flash kernel (`flash2_fast`, lesson 9), so that the only
# difference between the two is where $S$ and $P$ live.
#
# 1. `scores_kernel` ("S = scale*Q@K^T"): the thread block of query block $i$ keeps $Q_i$ on chip while
#    the key blocks $K_j$ stream past, and writes each tile $S_{ij}$ to HBM. On the way it keeps the row
#    statistics $m_i$, $\ell_i$ online (lesson 3) and writes them and $L_i = m_i + \log \ell_i$ once.
# 2. `softmax_kernel` ("P = softmax(S)"): one warp per row reads the row of $S$ once and writes
#    $P_{ij} = e^{S_{ij} - m_i} / \ell_i$. One pass, because the first kernel already has $m_i$ and
#    $\ell_i$; a softmax that starts from $S$ alone needs the maximum and the sum first (two more passes
#    over the row, or one with lesson 3's online softmax).
# 3. `rowprod_kernel` ("O = P@V"): the thread block of query block $i$ streams the tiles $P_{ij}$ and
#    $V_j$ past an $O_i$ held in registers and writes $O_i$ once.
#
# Here is the softmax kernel; the `while` loops are its one pass over the row:

# %%
import inspect

print(inspect.getsource(standard.softmax_kernel))

# %% [markdown]
# Run them through the public function with `count_hbm=True`: each kernel counts the bytes its threads
# read from and write to HBM. The IO model (`flash_numba.iomodel.standard`) predicts the same numbers in
# closed form; they agree exactly. `iomodel.terms` splits the bytes into three terms: *compulsory*
# (each input read once, each output written once), *re-reads* ($K$ and $V$ once per query block) and
# *S/P* ($S$ and $P$ written and read back, with $m$ and $\ell$).

# %%
q, k, v = (rng.standard_normal((BH, N, d)).astype(np.float32) for _ in range(3))
o_ref, lse_ref = reference.attention_forward(q, k, v)
res = fn.standard_attention_forward(q, k, v, count_hbm=True)
err = np.abs(res.o - o_ref).max() / np.abs(o_ref).max()
print(f"max |O - O_ref| / max |O_ref| = {err:.1e}, blocks (Br, Bc) = {res.block}")
print(res.hbm.table(f"standard attention forward, B*H = {BH}, N = {N}, d = {d}, float32 (bytes)"))
model = iomodel.forward("standard", BH, N, N, d, np.float32, False, res.block)
print("counted == IO model:", res.hbm == model)
split = iomodel.terms.split("standard", "forward", BH, N, N, d, np.float32, False, res.block)
flash2_total = iomodel.forward("flash2", BH, N, N, d, np.float32, False, res.block).total
print("by term:", ", ".join(f"{t} {b:,}" for t, b in split.items()))
print(f"standard - flash2 at the same blocks = {res.hbm.total - flash2_total:,} bytes = the S/P term")
print()
print(lessonkit.counted_beside_model(res.hbm, "standard", BH, N, d, np.float32, block=res.block))

# %% [markdown]
# Every byte of $S$ is written once and read once, by the softmax; every byte of $P$ is written once and
# read once, by the last product. Everything else is what flash2 reads and writes with the same blocks:
# $Q$ once, $K$ and $V$ once per query block, $O$ and $L$ once. So *standard minus flash2* is exactly the
# S/P term, $4 N^2$ elements per head (plus $4N$ for $m$ and $\ell$): the $\Theta(N^2)$ that the paper's
# Theorem 2 says FlashAttention removes. Standard attention moves $\Theta(Nd + N^2 d / B_r + N^2)$ bytes.

# %% [markdown]
# ## Time per step
#
# `standard.forward_launches` returns the same three launches, one callable each, on device arrays it
# allocates once, so each step can be timed alone. Running them once also checks that they give the same
# $O$.

# %%
launches, arrays = standard.forward_launches(q, k, v)
for name, run in launches:
    run()
assert np.allclose(arrays["O"].copy_to_host(), res.o, rtol=1e-5, atol=1e-6)
times = {name: median_ms(run) for name, run in launches}

# %%
def step_flops(BH, N, d):
    """FLOPs of each step: 2 N^2 d per product, 3 per element of the softmax (subtract, exp, multiply)."""
    return {"S = scale*Q@K^T": 2 * BH * N * N * d, "P = softmax(S)": 3 * BH * N * N, "O = P@V": 2 * BH * N * N * d}


flops = step_flops(BH, N, d)
print(f"{'step':<16} {'MB counted':>10} {'ms':>8} {'share':>6} {'GB/s':>7} {'TFLOP/s':>8}")
total_ms = None if SIM else sum(times.values())
for name in times:
    mb = res.hbm.per_kernel[name].total / 1e6
    if SIM:
        print(f"{name:<16} {mb:>10.3f} {'n/a':>8}")
    else:
        t = times[name]
        print(f"{name:<16} {mb:>10.1f} {t:>8.3f} {t / total_ms:>6.0%} {mb / t:>7.0f} {flops[name] / t / 1e9:>8.2f}")
if SIM:
    print(f"not timed: {device.CudaTimer.note}")

# %% [markdown]
# In the simulator, here are the same steps on an H200 at $B \cdot H = 32$, $N = 4096$, $d = 64$
# (recorded, not measured now; bytes from the IO model, equal to the counters):

# %%
if recorded.available():
    rec_ms = recorded.standard_kernel_times()
    rec_bytes = iomodel.forward("standard", 32, 4096, 4096, 64, np.float32).per_kernel
    rec_flops = step_flops(32, 4096, 64)
    print(recorded.cite(recorded.STANDARD_KERNELS_CSV))
    print("  each kernel alone, median of 20 calls")
    for name in rec_flops:
        ms, gb = rec_ms[name], rec_bytes[name].total / 1e9
        print(f"  {name:<16} {ms:6.3f} ms {ms / sum(rec_ms[x] for x in rec_flops):>5.0%} {gb:6.2f} GB "
              f"{gb / ms:5.2f} TB/s {rec_flops[name] / ms / 1e9:5.1f} TFLOP/s")

# %% [markdown]
# On a GPU, compare the GB/s column with the HBM bandwidth of lesson 1 and the TFLOP/s column with the
# float32 peak. The softmax can only stream bytes: on the H200 it runs at about the HBM bandwidth. The
# products are register-tiled and run at about half the float32 peak; in float32 on the CUDA cores they
# take most of the time, and the $N^2$ traffic inside them (writing $S$, reading $P$) hides behind their
# arithmetic. Libraries run the products close to the peak, on tensor cores in half precision; what is
# left then is the time the roofline allows. The lower bound of each step,
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
flops_b = step_flops(Hb, Nb, db)
elems_b = {"S = scale*Q@K^T": 2 * Hb * Nb * db + Hb * Nb * Nb, "P = softmax(S)": 2 * Hb * Nb * Nb,
           "O = P@V": Hb * Nb * Nb + 2 * Hb * Nb * db}  # minimum elements moved
bound_share = {}
for label, bw, peak, e in (here, a100):
    bounds = {name: max(flops_b[name] / peak, elems_b[name] * e / bw) for name in times}
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
    scale = 1 / math.sqrt(d)
    for dt in (torch.float32, torch.float16):
        tq, tk, tv = (torch.as_tensor(x, device="cuda").to(dt) for x in (q, k, v))
        ts = {}
        tS = torch.matmul(tq, tk.transpose(1, 2)) * scale
        tP = torch.softmax(tS, dim=-1)
        ts["S = scale*Q@K^T"] = median_ms(lambda: torch.matmul(tq, tk.transpose(1, 2)).mul_(scale))
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
# ## In float16 on tensor cores: where the time goes, measured
#
# The bounds above say that with fast products the softmax's bytes should be a large share of the time.
# Measure it instead of assuming it. In float16 standard's two products run on tensor cores (`mma.sync`,
# lesson 13), and each of its three launches moves about the same bytes: $S$ is written once and read once,
# $P$ likewise. If every launch ran at the copy rate, each would take about a third of the time.
#
# **Predict.** What share of standard's float16 forward ($B \cdot H = 32$, $N = 4096$, $d = 64$, on an H200)
# does the softmax launch take?

# %%
my_softmax_share = None  # a fraction between 0 and 1

# %%
shares = tcx.standard_launch_shares(4096, 64)
print(f"recorded: {tcx.SHARES_SOURCE}")
print(f"{'launch':<16} {'ms':>7} {'share':>6} {'GB':>6} {'ms / its byte bound':>20}")
for r in shares:
    print(f"{r['launch']:<16} {float(r['ms']):>7.3f} {float(r['share']):>6.0%} {int(r['model_bytes']) / 1e9:>6.2f} "
          f"{float(r['ms_over_bound']):>20.2f}")
softmax_share = next(float(r["share"]) for r in shares if r["launch"] == "P = softmax(S)")
lessonkit.compare_prediction("softmax share of the float16 forward", my_softmax_share, round(softmax_share, 2))
if not SIM and device.info().compute_capability >= (7, 5):  # on your GPU: the same measurement, smaller
    from flash_numba.tools import launch_shares

    for r in launch_shares.measure(8, 2048, 64, "float16", copy_GBps=hbm.value, count=False):  # hbm: measured above
        print(f"here, B*H = 8, N = 2048: {r['launch']:<16} {r['ms']:.3f} ms, {r['share']:.0%}, "
              f"{r['ms_over_bound']:.2f}x its byte bound")

# %% [markdown]
# The softmax runs at the copy rate (its time is about its bytes over the bandwidth), but each product takes
# 1.6 to 2.1 times its byte bound: a block loads a tile, waits, then multiplies, with no loads in flight while it
# computes. So in our standard kernels the products, not the softmax, are most of the time (79-87% over the
# recorded sizes): the article's picture holds only for products that run near their own bound. The $S$ and
# $P$ bytes still cost time, through the products that write and read them: flash2_tc, which never stores
# them, runs the same forward in 0.657 ms against standard's 2.965 (lesson 13).
#
# Those products waited on one load at a time: each thread copied its tile chunk by chunk, a load and then
# its store. Issuing all of a thread's loads before its stores (commit 6992544) brought the same forward to
# 2.070 ms, 1.07x its byte bound: $S = QK^T$ 0.959 ms, the softmax 0.579 (28%), $O = PV$ 0.532
# (`benchmarks/results/h200-2026-12-01-harness/launch_shares.csv`, H200, c6f8000). Now every launch runs near
# the copy rate, and the time is the bytes of $S$ and $P$: the article's picture, once the products are done well.

# %% [markdown]
# ## What to take away
#
# * Standard attention stores two $N \times N$ matrices and moves $\Theta(Nd + N^2)$ bytes; done well, it
#   moves exactly flash2's bytes plus the S/P term.
# * The softmax only moves bytes. With fast products (tensor cores, half precision) the $N^2$ traffic is
#   the cost; in float32 on CUDA cores the products are, and removing $S$ and $P$ saves memory and DRAM
#   traffic far more than time.
# * Measured in float16 on tensor cores, the softmax launch is 20% of standard's forward and the products,
#   which write and read $S$ and $P$, the rest; a kernel that never stores them is 4.5x faster (lesson 13).
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
# At $N = 4096$ ($B \cdot H = 32$, $d = 64$, float32): these kernels against `flash2_fast` (the same
# blocks and register tiles, no $S$ or $P$) and PyTorch's math path (`torch-math`: $S$ and $P$
# materialised, cuBLAS products), forward and forward + backward, the bytes each counts and the memory
# each needed (`peak_mem_bytes` in the same file).

# %%
if recorded.available():
    impls, path = ["standard", "flash2_fast", "torch-math"], recorded.STANDARD_BENCH_CSV
    print(recorded.bench_table(impls, "fwd", 4096, path))
    print(recorded.bench_table(impls, "fwd+bwd", 4096, path).split("\n", 3)[3])
    fwd = {r["implementation"]: r for r in recorded.bench_rows(None, "fwd", 4096, path)}
    std_r, fl_r = fwd["standard"], fwd["flash2_fast"]
    print(f"forward: standard counts {int(std_r['hbm_bytes']) / int(fl_r['hbm_bytes']):.1f}x flash2_fast's bytes, "
          f"takes {float(std_r['ms']) / float(fl_r['ms']):.2f}x its time and "
          f"{int(std_r['peak_mem_bytes']) / int(fl_r['peak_mem_bytes']):.0f}x its memory")

# %% [markdown]
# About three times the bytes, little more time: in float32 on CUDA cores these products are compute-bound
# (about 40% of the float32 peak), so the S/P traffic costs little time but gigabytes of memory. The
# paper's large speedups come with float16 products on tensor cores, where the same traffic is most of
# the time (the bounds above). Lesson 6 shows what the DRAM sees of these bytes.

# %% [markdown]
# Where the bytes go as $N$ grows, from the IO models (one head, $d = 64$, float32): standard
# attention's three kernels against the flash kernels'. The S/P term is most of standard's bytes at
# every $N$ on the axis; its re-reads of $K$ and $V$, $\Theta(N^2 d / B_r)$, are flash2's.
#
# **Predict, then run.** At $N = 16384$, how many MB does standard attention's softmax kernel move (it
# reads $S$ once and writes $P$, both $N \times N$ float32, and reads $m_i$, $\ell_i$ for each row)?

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
assert res.hbm.per_kernel["P = softmax(S)"].bytes_read == BH * (N * N + 2 * N) * 4, "one pass over S"
assert res.hbm.total - flash2_total == split["S/P"] > 0, "standard - flash2 is the S/P term"
assert (times["P = softmax(S)"] is None) == SIM
assert abs(sum(float(r["share"]) for r in shares) - 1) < 1e-6 and 0 < softmax_share < 1
assert bound_share[a100[0]] > 0.4, "in float16 on tensor cores the softmax is the largest share of the bound"
assert 2 * heads * n_max**2 * e <= mem < 2 * heads * (n_max + 1) ** 2 * e
print("lesson 2: all checks passed")
