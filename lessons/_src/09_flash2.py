"""Source of lessons/09_flash2.ipynb (build it with `python lessons/_build.py`)."""
# ruff: noqa: E402

# %% [markdown]
# # Lesson 9: FlashAttention-2, and a look at FlashAttention-3
#
# Algorithm 1 reads and writes $O$, $\ell$ and $m$ in HBM on every outer step, normalises $O_i$ on every
# step, and, written as one thread block per head (flash1), leaves most of a GPU idle when there are fewer
# heads than SMs. FlashAttention-2 (Dao 2023) changes the schedule, not the mathematics:
#
# 1. **Swap the loops.** The outer loop runs over *query* blocks $Q_i$, the inner over key/value blocks.
#    $O_i$, $\ell_i$ and $m_i$ then stay on chip (registers) for the whole inner loop and are written to
#    HBM once, at the end.
# 2. **Delay the normalisation.** Keep $O_i$ *unnormalised*, $\tilde O_i = \sum_j e^{S_{ij} - m_i} V_j$,
#    rescaled by $e^{m_{\text{old}} - m_{\text{new}}}$ when the maximum moves; divide by $\ell_i$ once after
#    the loop. Save only $L_i = m_i + \log \ell_i$ for the backward pass. Fewer non-matrix-multiply
#    FLOPs, which matter on GPUs whose tensor cores make matrix products far cheaper than anything else.
# 3. **Parallelise over the sequence.** Each query block is independent, so each gets its own thread
#    block: a grid of $T_r \times B \cdot H$ blocks instead of $B \cdot H$, enough to fill the GPU even at
#    batch size 1.
#
# The forward pass for one query block (FlashAttention-2's Algorithm 1, in our words):
#
# ```
# load Q_i;  O~_i = 0 (Br x d), l_i = 0, m_i = -inf                  on chip
# for j = 1 .. Tc:
#     load K_j, V_j
#     S_ij = scale * Q_i K_j^T                                        (Br x Bc)
#     m_new = max(m_i, rowmax(S_ij));  P~_ij = exp(S_ij - m_new)
#     l_i = e^(m_i - m_new) l_i + rowsum(P~_ij)
#     O~_i = diag(e^(m_i - m_new)) O~_i + P~_ij V_j                   no division
#     m_i = m_new
# O_i = diag(l_i)^-1 O~_i;  L_i = m_i + log(l_i);  write O_i, L_i     once
# ```

# %%
import sys

if "google.colab" in sys.modules:  # Colab: install flash_numba (see lesson 0)
    # !pip install -q "numba-cuda[cu12]==0.30.4"
    # !pip install -q --no-deps "git+@REPO_URL@"
    pass  # source-only

# %%
import math

import numpy as np
from numba import cuda, float32

import flash_numba as fn
from flash_numba import device, iomodel, kernels, reference
from flash_numba.course import lessonkit, pictures, recorded
from flash_numba.course import exercises as ex
from flash_numba.course import flash_checks as kx
from flash_numba.kernels import flash2

SIM = device.SIMULATOR
print(device.describe())
BH, N, d = (1, 32, 16) if SIM else (8, 1024, 64)  # flash1 takes seconds per call beyond this
BLOCK = (8, 8) if SIM else None
print(f"sizes: B*H = {BH}, N = {N}, d = {d}, float32; blocks {BLOCK or 'chosen by the package'}")


def median_ms(run):
    """Median time of run() in milliseconds over CUDA events, or None in the simulator."""
    times = device.time_ms(run)
    return None if times is None else float(np.median(times))


# %% [markdown]
# ## Your turn: the inner step, normalisation delayed
#
# Given the running $(\tilde O_i, \ell_i, m_i)$ of a query block and the next tile $S_{ij}$ (scaled,
# $-\infty$ where masked) with $V_j$, return the new $(\tilde O_i, \ell_i, m_i)$ as in the listing above.
# No division. Rows that have seen only $-\infty$ so far keep $\tilde O_i = 0$, $\ell_i = 0$, $m_i = -\infty$,
# without NaN. The last line of the listing is given: `ex.flash2_finish(O_acc, l, m)` returns $(O, L)$.

# %%
def flash2_update(O_acc, l, m, S_ij, V_j):
    """One inner step of FlashAttention-2: O_acc (Br, d) unnormalised, l and m (Br,), S_ij (Br, Bc), V_j (Bc, d)."""
    # Your turn
    raise NotImplementedError("rescale by exp(m - m_new), add P~ V_j; no division")


# %%
mine = ex.check("flash2_update", flash2_update)
assert ex.check_solution("flash2_update")
update = flash2_update if mine else ex.solution_fn("flash2_update")
print("the cells below use", "your update" if mine else "the packaged solution (yours is not done yet)")

# %% [markdown]
# The whole forward pass for one head, in NumPy, with the loops in FlashAttention-2's order:

# %%
def flash2_forward_numpy(q, k, v, Br, Bc):
    """FlashAttention-2's forward pass for one head: q (Nq, d), k and v (Nk, d) -> O, L."""
    Nq, dq = q.shape
    Nk = k.shape[0]
    O, L = np.zeros((Nq, dq)), np.zeros(Nq)
    for i in range(math.ceil(Nq / Br)):  # in parallel on a GPU: one thread block per query block
        r = slice(i * Br, (i + 1) * Br)
        rows = q[r].shape[0]
        state = (np.zeros((rows, dq)), np.zeros(rows), np.full(rows, -np.inf))  # on chip
        for j in range(math.ceil(Nk / Bc)):
            c = slice(j * Bc, (j + 1) * Bc)
            S_ij = q[r] @ k[c].T / math.sqrt(dq)
            state = update(*state, S_ij, v[c])
        O[r], L[r] = ex.flash2_finish(*state)  # normalise once, write once
    return O, L


# %%
rng = np.random.default_rng(9)
qh, kh, vh = (rng.standard_normal((n_, 16)) for n_ in (33, 27, 27))
o2, L2 = flash2_forward_numpy(qh, kh, vh, Br=8, Bc=6)
oh_ref, Lh_ref = reference.attention_forward(qh, kh, vh)
err_np = max(np.abs(o2 - oh_ref).max(), np.abs(L2 - Lh_ref).max())
print(f"max difference from the reference (O and L): {err_np:.1e}")

# %% [markdown]
# ## flash2 in Numba
#
# flash2 (the package `flash_numba/kernels/flash2/`, its kernels in `forward.py` and `backward.py`) launches a
# grid of $(T_r, B \cdot H)$ thread blocks of 128 threads.
# Unlike flash1, where one thread owns a whole row, several threads share each row here: every thread
# holds a small register tile of $S_{ij}$ and of $\tilde O_i$, and the 16 threads of a row combine their
# partial row maxima and sums. Here is its forward kernel; the margin gives the line of FlashAttention-2's
# Algorithm 1 (in the FA2 paper) that each part carries out, as its comments cite them:

# %%
print(lessonkit.annotated_source(flash2._forward_kernel, "def flash2_forward", "return flash2_forward"))

# %% [markdown]
# ## Work partitioning between warps
#
# Inside a thread block the work is split between warps (32 threads that execute together). FlashAttention
# 1 split $K$ and $V$ between the warps of a block and kept $Q$ shared by all ("split-K"): each warp then
# holds a partial $Q_i K_j^\top$ and a partial $\tilde O_i$, which the warps must write to shared memory,
# synchronise and add up. FlashAttention-2 splits $Q$ instead: each warp owns some rows of $Q_i$, sees all
# of $K_j$, $V_j$, and finishes its rows' softmax and $P V$ without exchanging anything with the other
# warps. Our flash2 does the same: a row belongs to one group of 16 threads (half a warp), which combine
# their row maxima and sums among themselves. Fewer shared-memory round trips and barriers, plus the
# parallelism over the sequence below and fewer non-matmul FLOPs (the delayed division), are how the FA2
# paper goes from 25-40% of an A100's peak to about 73% (up to ~230 TFLOP/s forward). Our kernels' share
# of the peak: the timing cell below measures it on a GPU, and the recorded H200 table near the end of
# the lesson shows it in the simulator.

# %% [markdown]
# ## Your turn: FlashAttention-2's loop, one row per thread
#
# Write the loop for one query row in a kernel: one thread block per query tile $Q_i$ (the frame,
# printed below, loads this thread's row of $Q$ into registers once), one thread per row. The loads of
# $K_j$, $V_j$ and both barriers are written; you write the online-softmax step (no division) and, after
# the loop, the one normalisation and the writes of $O$ and $L$, counting the bytes you write. `diag` is
# lesson 8's offset: key $c$ is visible to the row iff $c \le \text{row} + \text{diag}$ (the frame
# passes $N_k$ when nothing is masked). The checker compares $O$, $L$ and the bytes with flash2's IO model.

# %%
print(kx.frame_source("flash2_loop"))

# %%
NEG_INF = float32(-math.inf)
E = 4  # bytes per float32


@cuda.jit(device=True)
def flash2_rows(tid, row, n_tiles, diag, q_r, s_r, o_acc, K_j, V_j, k, v, o, L, scale):
    """Query `row` (thread tid; no row if row >= Nq) against n_tiles tiles K_j, V_j; O, L written once."""
    Bc, D = K_j.shape
    T, Nq, Nk = cuda.blockDim.x, o.shape[0], k.shape[0]
    nr, nw = 0, 0
    m_i, l_i = NEG_INF, float32(0)  # noqa: F841  (the running max and sum: yours to update)
    for x in range(D):
        o_acc[x] = 0
    for j in range(n_tiles):
        c0 = j * Bc
        cols = min(Bc, Nk - c0)
        cuda.syncthreads()  # every thread is done with the previous K_j, V_j
        for idx in range(tid, cols * D, T):
            K_j[idx // D, idx % D] = k[c0 + idx // D, idx % D]
            V_j[idx // D, idx % D] = v[c0 + idx // D, idx % D]
            nr += 2 * E
        cuda.syncthreads()  # K_j, V_j are complete
        if row < Nq:  # Your turn: s_r[c] (masked), m_new, rescale l_i and o_acc, add P~ V_j; m_i = m_new
            raise NotImplementedError("the online-softmax step, normalisation delayed")
    # Your turn (if row < Nq): o[row, x] = o_acc[x] / l_i, L[row] = m_i + log(l_i), nw += the bytes
    return nr, nw


# %%
mine_loop = ex.check("flash2_loop", flash2_rows)
assert ex.check_solution("flash2_loop")
# kx.hints("flash2_loop", upto=1)  # uncomment for a hint; upto=2 for two, and so on
# ex.solution("flash2_loop")  # uncomment to print the solution

# %% [markdown]
# ## Your turn: the whole forward kernel
#
# The loop above sat in a frame we wrote. Now write the frame too: the whole FlashAttention-2 forward as
# one `@cuda.jit` kernel. You declare the shared tiles, load them, place the barriers, walk over the key
# tiles, apply the causal mask and write $O$ and $L$ once.
#
# * A factory `make_flash2(Br, Bc, d, causal)` returns the kernel; the tile sizes are closure constants.
# * The launch is ours: `kernel[ceil(Nq / Br), Br](q, k, v, o, L, scale, counter)`. Thread `tid` of block
#   `i` owns query row `i * Br + tid`.
# * `causal`: key $c$ is visible to query $r$ iff $c \le r + N_k - N_q$. The block stops after the key
#   tile holding the last key its last row sees.
# * Count your bytes into `counter` as before.
#
# The checker runs nine cases, six without the mask and three with it ($N_q = N_k$, $N_q < N_k$, and
# $N_q > N_k$ with rows that see no key). It compares $O$ and $L$ with float64, your bytes with flash2's
# IO model and every global access with your counter, and watches shared memory for races.
# `kx.hints("flash2_kernel")` helps, one hint at a time.

# %%
def make_flash2(Br, Bc, d, causal):
    """FlashAttention-2's forward: launched as kernel[ceil(Nq / Br), Br](q, k, v, o, L, scale, counter)."""

    @cuda.jit
    def flash2_forward(q, k, v, o, L, scale, counter):
        tid = cuda.threadIdx.x
        i = cuda.blockIdx.x
        row = i * Br + tid  # noqa: F841  (this thread's query row; none if row >= Nq)
        nr, nw = 0, 0  # noqa: F841  (the bytes you read and write)
        # Your turn: the shared tiles K_j, V_j (Bc, d) and the row's local arrays; q's row loaded once;
        # the loop over key tiles (barrier, load, barrier, the online softmax with the mask); O and L
        # written once; then cuda.atomic.add(counter, 0, nr) and cuda.atomic.add(counter, 1, nw).
        raise NotImplementedError("the whole forward kernel")

    return flash2_forward


# %%
mine_kernel = ex.check("flash2_kernel", make_flash2)
assert ex.check_solution("flash2_kernel")
# kx.hints("flash2_kernel", upto=1)  # uncomment for a hint; upto=2 for two, and so on

# %%
q, k, v = (rng.standard_normal((BH, N, d)).astype(np.float32) for _ in range(3))
o_ref, lse_ref = reference.attention_forward(q, k, v)
results = {}
for name in ("flash1", "flash2"):
    results[name] = fn.flash_attention_forward(q, k, v, kernel=name, block=BLOCK, count_hbm=True)
    r = results[name]
    e_o = np.abs(r.o - o_ref).max() / np.abs(o_ref).max()
    print(f"{name}: blocks {r.block}, relative error of O {e_o:.1e}, HBM {r.hbm.total:,} bytes")
for name, r in results.items():
    assert r.hbm == iomodel.forward(name, BH, N, N, d, np.float32, False, r.block)
print("both counts equal their IO models")

# %% [markdown]
# flash2 reads $Q$ once and writes $O$ and $L$ once, but reads $K$ and $V$ once per *query* block:
# $\Theta(Nd + N^2 d / B_r)$ bytes, against flash1's $\Theta(N^2 d^2 / M)$ with its $Q$, $O$, $\ell$, $m$
# traffic on every outer step. At real sizes (IO models, one head, $d = 64$):

# %%
for n_ in (1024, 4096, 16384):
    row = []
    for name in ("standard", "flash1", "flash2"):
        blk = fn.resolve_block(name, 64, np.float32)
        row.append(f"{name} {iomodel.forward(name, 1, n_, n_, 64, np.float32, False, blk).total / 1e6:9.1f} MB")
    print(f"N = {n_:>5}:  " + "   ".join(row))

# %% [markdown]
# ## Parallelism
#
# How many thread blocks each kernel launches for $N = 4096$, against the number of SMs (each SM runs
# at least one block at a time; a GPU needs several per SM to hide latency):

# %%
sms = device.info().sm_count
n_par = 4096
blk_f2 = fn.resolve_block("flash2", 64, np.float32)
print(f"{sms} SMs here{' (simulator stand-in)' if SIM else ''}; flash2 blocks {blk_f2}")
for heads in (1, 4, 16, 64):
    print(f"B*H = {heads:>2}: flash1 launches {heads:>4} thread blocks, "
          f"flash2 {heads * math.ceil(n_par / blk_f2[0]):>6}")

# %% [markdown]
# On a GPU, time every FlashAttention kernel in the package (`flash2_fast` is flash2 rearranged for
# speed: larger register tiles, vectorised loads from shared memory; its docstring tells the story) at
# $B \cdot H = 16$ and at a single head:

# %%
timings = {}
FLASH32 = [n for n in kernels.NAMES if "float32" in kernels.get(n).dtypes]  # the kernels that run float32
if SIM:
    print(f"not timed: {device.CudaTimer.note}")
else:
    for heads in (16, 1):  # N = 2048: flash1 needs ~0.4 s a call at B*H = 16 (3.5 s at N = 4096)
        dev = [cuda.to_device(rng.standard_normal((heads, 2048, 64)).astype(np.float32)) for _ in range(3)]
        for name in FLASH32:
            if name != "standard":
                timings[name, heads] = median_ms(lambda: fn.flash_attention_forward(*dev, kernel=name))
        flops = 4 * heads * 2048 * 2048 * 64
        print(f"B*H = {heads}, N = 2048, d = 64: " + ", ".join(
            f"{name} {timings[name, heads]:.2f} ms ({flops / timings[name, heads] / 1e9:.1f} TFLOP/s)"
            for name in FLASH32 if name != "standard"))

# %% [markdown]
# ## The backward pass, deterministic
#
# flash2's backward pass runs three kernels: $D = \mathrm{rowsum}(dO \circ O)$; then one thread block per
# *key* block, which keeps $dK_j$, $dV_j$ on chip while it walks over the query blocks; then one thread
# block per *query* block, which keeps $dQ_i$ on chip while it walks over the key blocks. Every output
# element is summed by one thread in a fixed order, so two runs give bitwise identical gradients.
# FlashAttention-2 itself saves the third kernel by adding each block's contribution to $dQ$ in HBM with
# atomic float additions, whose order, and so whose rounding, changes from run to run.
# `flash_attention_backward(..., kernel="flash2_fast", deterministic=False)` does that too: one pass
# over the key blocks instead of two (the recorded times are below), and a `dq` whose last bits differ between
# two identical calls.

# %%
do = rng.standard_normal((BH, N, d)).astype(np.float32)
f2 = results["flash2"]
g_a = fn.flash_attention_backward(q, k, v, f2.o, f2.lse, do, kernel="flash2", block=BLOCK)
g_b = fn.flash_attention_backward(q, k, v, f2.o, f2.lse, do, kernel="flash2", block=BLOCK)
grads_ref = reference.attention_backward(q, k, v, o_ref, lse_ref, do)
bitwise = all(np.array_equal(x, y) for x, y in zip((g_a.dq, g_a.dk, g_a.dv), (g_b.dq, g_b.dk, g_b.dv)))
g_err = max(np.abs(g - r).max() / np.abs(r).max() for g, r in zip((g_a.dq, g_a.dk, g_a.dv), grads_ref))
print(f"two runs bitwise identical: {bitwise}; max relative error of dQ, dK, dV: {g_err:.1e}")

# %% [markdown]
# The atomic path, the deterministic one with a copy of $dQ$ per block, and what each costs on an H200
# are in the optional appendix, "How flash2_fast got fast". In lesson 7 you wrote both ways of computing
# $dQ$: one owner per row, and atomic adds from the key side.

# %% [markdown]
# ## Measured on a real GPU
#
# In the simulator nothing is timed. The project ran the same kernels on an NVIDIA H200; the table
# below is loaded from the committed benchmark file and printed with the GPU, the date and the command
# it came from: recorded, not measured now (on a GPU the cells above measure this one).
# Beside it, the paper's claim: FlashAttention-2 reaches about 73% of an A100's peak in the forward pass
# (up to ~230 TFLOP/s, float16 on tensor cores), where FlashAttention reached 25-40%. Our kernels do
# float32 on the CUDA cores, so the column "of peak" is against the H200's float32 peak.

# %%
if recorded.available():
    print(recorded.bench_table(["flash2", "flash2_fast", "torch-efficient"], "fwd", 4096))
    rows = recorded.bench_rows(["flash2", "flash2_fast", "torch-efficient"], None, 4096)  # standard: lesson 2
    lessonkit.show(pictures.recorded_times(rows, f"{recorded.LABEL}: N = 4096, B*H = 32, d = 64, float32"))

# %% [markdown]
# ## Your kernel, thread by thread
#
# **Predict, then run.** In your kernel (or the packaged one until yours passes) at $N_q = N_k = 8$,
# $B_r = B_c = 4$, $d = 4$, causal, how many element reads of $K$ does the whole launch make? (Query tile
# 0 sees keys 0-3 only; query tile 1 sees all 8.)

# %%
my_prediction = None  # element reads of K

# %%
whole = make_flash2 if mine_kernel else kx.flash2_forward_kernel
if SIM:
    run8 = kx.measure_kernel("flash2_kernel", whole, 8, 8, causal=True)
    k_reads = run8["log"].elements("k", "r")
    shapes = {"q": ((8, 4), "r"), "k": ((8, 4), "r"), "v": ((8, 4), "r"), "O": ((8, 4), "w")}
    lessonkit.show(pictures.kernel_accesses(run8["log"], shapes, title="block 0 (queries 0-3), causal"))
else:
    k_reads = sum(iomodel.flash2.kv_rows_read(8, 8, True, (4, 4))) * 4
lessonkit.compare_prediction("element reads of K", my_prediction, k_reads)

# %% [markdown]
# ## Where FlashAttention-3 goes (on paper)
#
# FlashAttention-2 reaches 50-73% of the A100's theoretical peak (Dao 2023) but only about 35% of an
# H100's (Shah et al. 2024). FlashAttention-3 (Shah, Bikshandi, Zhang, Thakkar, Ramani and
# Dao, 2024) uses three features of Hopper GPUs (sm_90: the H100 and the H200 this course's kernels are
# also tested on):
#
# * **Asynchrony.** The Tensor Memory Accelerator (TMA) copies tiles between HBM and shared memory
#   without occupying threads, and `wgmma` instructions run matrix products on a whole warpgroup
#   (4 warps) asynchronously. FlashAttention-3 specialises warps: *producer* warps only issue TMA loads of
#   $K_j$, $V_j$ into a circular buffer of shared memory, *consumer* warpgroups only compute.
# * **Overlapping the softmax with the products.** The exponentials run on a unit with far lower
#   throughput than the tensor cores. Two warpgroups take turns ("ping-pong"), so one computes its softmax
#   while the other runs its products; within a warpgroup, the softmax of one block overlaps the products
#   of the next.
# * **FP8.** Hopper's tensor cores run float8 at twice the float16 rate. To keep the error small,
#   FlashAttention-3 quantises per block and multiplies $Q$ and $K$ by a random orthogonal matrix first
#   ("incoherent processing"), which spreads outlier values across a row before they are rounded.
#
# The paper reports up to 740 TFLOP/s in float16 (75% of an H100's peak) and close to 1.2 PFLOP/s in
# FP8, with 2.6 times lower error than a baseline FP8 attention (Shah et al. 2024). The kernels of this
# course use none of these features: they do float32 arithmetic on the CUDA cores, with ordinary loads
# and stores. The algorithm, the online softmax over tiles kept on chip, is the same.

# %% [markdown]
# ## What to take away
#
# * FlashAttention-2 swaps the loops: one thread block per query tile, $O_i$, $\ell_i$, $m_i$ on chip, and a single
#   division at the end.
# * Splitting $Q$ (not $K$) between warps means no partial results to exchange through shared memory.
# * Parallelism over the sequence keeps every SM busy even at one head.
# * A backward pass with one owner per output element is deterministic, at the price of a third kernel.
# * You can write the whole kernel: shared tiles, loads between two barriers, the loop, the mask, one write.

# %% [markdown]
# ## Check

# %%
assert err_np < 1e-12, err_np
for r in results.values():
    assert np.abs(r.o - o_ref).max() / np.abs(o_ref).max() < 1e-5
assert results["flash2"].hbm.total < results["flash1"].hbm.total
assert bitwise and g_err < 1e-4, (bitwise, g_err)
assert (not timings) == SIM
assert k_reads == sum(iomodel.flash2.kv_rows_read(8, 8, True, (4, 4))) * 4  # causal: tile 0 skips key tile 1
print("lesson 9: all checks passed")
