"""Source of lessons/05_flash_forward.ipynb (build it with `python lessons/_build.py`)."""
# ruff: noqa: E402

# %% [markdown]
# # Lesson 5: The FlashAttention forward pass
#
# Put lessons 3 and 4 together. Split $Q$ into blocks of $B_r$ rows and $K$, $V$ into blocks of $B_c$
# rows; load a block of each into shared memory; compute the score tile $S_{ij}$ there; and fold it into
# the output with the online softmax, rescaling what was accumulated before whenever a row's maximum
# grows. $S$ and $P$ never exist as $N \times N$ matrices, only as $B_r \times B_c$ tiles on chip. This is
# Algorithm 1 of FlashAttention (Dao et al. 2022). Written out for one head, with the paper's names
# ($N_q = N_k = N$ there; the scale $1/\sqrt d$ and, in lesson 8, the mask apply to $S_{ij}$ at line 9):
#
# ```
#  1  Bc = ceil(M / 4d), Br = min(Bc, d)                    M: elements of on-chip memory
#  2  O = 0 (N x d), l = 0 (N), m = -inf (N), in HBM
#  3  split Q into Tr = ceil(N / Br) blocks Q_i of Br rows; K, V into Tc = ceil(N / Bc) blocks K_j, V_j
#  4  split O, l, m into Tr blocks O_i, l_i, m_i alike
#  5  for j = 1 .. Tc:
#  6      load K_j, V_j from HBM to on-chip memory
#  7      for i = 1 .. Tr:
#  8          load Q_i, O_i, l_i, m_i from HBM to on-chip memory
#  9          S_ij = Q_i K_j^T                                   (Br x Bc)
# 10          m~_ij = rowmax(S_ij), P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij)
# 11          m_new = max(m_i, m~_ij),  l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
# 12          O_i = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j), to HBM
# 13          l_i = l_new, m_i = m_new, to HBM
# 16  return O
# ```
#
# Two things to notice. The *outer* loop runs over key/value blocks, so each $K_j, V_j$ is read from HBM
# exactly once, but $Q$, $O$, $\ell$ and $m$ are read and written once per outer step: $T_c$ times
# (lesson 6 counts this). And $O_i$ is kept *normalised* after every step (the $\mathrm{diag}(\ell_{new})^{-1}$
# of line 12), which costs a division per step; FlashAttention-2 delays it (lesson 9).

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
from flash_numba import blocks, device, iomodel, reference
from flash_numba.course import lessonkit, pictures, recorded
from flash_numba.course import exercises as ex
from flash_numba.course import flash_checks as kx
from flash_numba.kernels import flash1

SIM = device.SIMULATOR
print(device.describe())
BH, N, d = (1, 32, 16) if SIM else (16, 4096, 64)
BLOCK = (8, 8) if SIM else None  # the simulator: small blocks so both loops run several times
print(f"sizes: B*H = {BH}, N = {N}, d = {d}, float32; blocks {BLOCK or 'chosen by the package'}")


def median_ms(run):
    """Median time of run() in milliseconds over CUDA events, or None in the simulator."""
    times = device.time_ms(run)
    return None if times is None else float(np.median(times))


# %% [markdown]
# ## Block sizes
#
# Line 1 sizes the blocks so that the four tiles of a step ($Q_i$, $K_j$, $V_j$, $O_i$, each about
# $B_c \times d$) fill the on-chip memory. Our kernels keep their tiles in float32, so $M$ is the shared
# memory one block may use (48 KB on every GPU the course targets) divided by 4 bytes. The kernel also
# holds the score tile $S_{ij}$, so `flash_numba.resolve_block` shrinks the paper's sizes until the
# kernel's actual footprint fits:

# %%
M = blocks.shared_budget() // 4
print(f"M = {M} float32 elements of shared memory per block")
print(f"{'d':>4} {'paper (Br, Bc)':>16} {'flash1 uses':>12} {'shared bytes':>13}")
for dd in (16, 32, 64, 128):
    Br, Bc = fn.resolve_block("flash1", dd, np.float32)
    print(f"{dd:>4} {str(blocks.paper_block_sizes(M, dd)):>16} {str((Br, Bc)):>12} "
          f"{flash1.shared_bytes(Br, Bc, dd, np.float32):>13,}")

# %% [markdown]
# ## Your turn: lines 10-13
#
# Write one step of the inner loop: given the running state of a query block ($O_i$: $B_r \times d$,
# normalised; $\ell_i$, $m_i$: length $B_r$) and the next score tile $S_{ij}$ ($B_r \times B_c$, already
# scaled, $-\infty$ where masked) with its values $V_j$ ($B_c \times d$), return the new
# $(O_i, \ell_i, m_i)$. Before the first step $O_i = 0$, $\ell_i = 0$, $m_i = -\infty$. Mind the rows that
# have seen only $-\infty$ scores so far: they must stay $O_i = 0$, $\ell_i = 0$, $m_i = -\infty$, with
# no NaN (lesson 3's guard, for a whole row of the block at once).

# %%
def flash_rescale(O_i, l_i, m_i, S_ij, V_j):
    """Algorithm 1, lines 10-13: fold the tile S_ij (Br, Bc) and V_j (Bc, d) into O_i (Br, d), l_i, m_i (Br,)."""
    # Your turn: m~, P~, l~ (line 10); m_new, l_new (line 11); the new O_i (line 12); return O_i, l_i, m_i.
    raise NotImplementedError("lines 10-13 of Algorithm 1")


# %%
mine = ex.check("flash_rescale", flash_rescale)
assert ex.check_solution("flash_rescale")
step = flash_rescale if mine else ex.solution_fn("flash_rescale")
print("the cells below use", "your step" if mine else "the packaged solution (yours is not done yet)")

# %% [markdown]
# ## Algorithm 1 in NumPy blocks
#
# With the step in hand, the rest of Algorithm 1 is two loops. For one head:

# %%
def flash_forward_numpy(q, k, v, Br, Bc):
    """Algorithm 1 for one head: q (Nq, d), k and v (Nk, d) -> O (Nq, d), L = m + log(l) (Nq,)."""
    Nq, dq = q.shape
    Nk = k.shape[0]
    O, l, m = np.zeros((Nq, dq)), np.zeros(Nq), np.full(Nq, -np.inf)  # line 2
    Tr, Tc = math.ceil(Nq / Br), math.ceil(Nk / Bc)  # line 3
    for j in range(Tc):  # line 5
        K_j, V_j = k[j * Bc : (j + 1) * Bc], v[j * Bc : (j + 1) * Bc]  # line 6
        for i in range(Tr):  # line 7
            r = slice(i * Br, (i + 1) * Br)  # line 8: Q_i, O_i, l_i, m_i
            S_ij = (q[r] @ K_j.T) / math.sqrt(dq)  # line 9, (Br, Bc)
            O[r], l[r], m[r] = step(O[r], l[r], m[r], S_ij, V_j)  # lines 10-13
    return O, m + np.log(l)


# %%
rng = np.random.default_rng(5)
qh, kh, vh = (rng.standard_normal((n_, 16)) for n_ in (37, 29, 29))  # one head, Nq != Nk, awkward sizes
o_np, lse_np = flash_forward_numpy(qh, kh, vh, Br=8, Bc=5)
oh_ref, lseh_ref = reference.attention_forward(qh, kh, vh)
oh_tiled, _ = reference.flash_forward_tiled(qh, kh, vh, Br=8, Bc=5)  # the package's NumPy mirror
err_np = max(np.abs(o_np - oh_ref).max(), np.abs(lse_np - lseh_ref).max())
print("max |O - O_ref|      =", np.abs(o_np - oh_ref).max())
print("max |L - L_ref|      =", np.abs(lse_np - lseh_ref).max())
print("max |O - mirror's O| =", np.abs(o_np - oh_tiled).max())

# %% [markdown]
# Exact to float64 rounding for any block sizes, including blocks that do not divide $N$: the online
# softmax makes the block order irrelevant.

# %% [markdown]
# ## flash1: Algorithm 1 in Numba
#
# `flash_numba/kernels/flash1.py` runs the same loops on the GPU, one thread block per (batch, head), as
# the original FlashAttention did. $K_j$, $V_j$, $Q_i$ and $S_{ij}$ live in shared memory; thread $r < B_r$
# owns query row $r$ of the block (its scores, $\tilde m_{ij}$, $\tilde\ell_{ij}$ and its row of $O_i$) and
# all threads cooperate on loading tiles. $O$, $\ell$ and $m$ are read and written in HBM on every outer
# step, as the paper writes it. Here is the kernel itself, with the line of Algorithm 1 (above) that each
# part carries out in the margin. `COUNT` is the byte counter of lesson 2, compiled away when off; the
# causal lines are lesson 8's.

# %%
print(lessonkit.annotated_source(flash1._forward_kernels, "def algorithm1", "# The pair (Tr-1, j)"))

# %%
q, k, v = (rng.standard_normal((BH, N, d)).astype(np.float32) for _ in range(3))
o_ref, lse_ref = reference.attention_forward(q, k, v)
res = fn.flash_attention_forward(q, k, v, kernel="flash1", block=BLOCK, count_hbm=True)
err_o = np.abs(res.o - o_ref).max() / np.abs(o_ref).max()
err_l = np.abs(res.lse - lse_ref).max() / np.abs(lse_ref).max()
print(f"flash1 with (Br, Bc) = {res.block}: relative error O {err_o:.1e}, L {err_l:.1e}")
print(res.hbm.table(f"flash1 forward, B*H = {BH}, N = {N}, d = {d}, float32 (bytes)"))
flash_model = iomodel.forward("flash1", BH, N, N, d, np.float32, False, res.block)
std_model = iomodel.forward("standard", BH, N, N, d, np.float32)  # equal to its counters (lesson 2)
print("counted == IO model:", res.hbm == flash_model)
print(lessonkit.counted_beside_model(res.hbm, "flash1", BH, N, d, np.float32, block=res.block))
print(f"standard attention at this size: {std_model.total:,} bytes, {std_model.total / res.hbm.total:.2f}x flash1"
      + (" (tiny N and blocks: flash1's re-reads outweigh S and P here; real sizes below)" if SIM else ""))

# %% [markdown]
# ## Your turn: lines 9-13 in a kernel
#
# Now write the heart of that kernel yourself, for one query row. The package's frame (printed below)
# does lines 5-8: it loads $K_j$, $V_j$ and $Q_i$ into shared memory, with the barriers, and calls your
# device function once per row of $Q_i$ (thread `r` owns row `row = r0 + r`). Your function reads
# $m_i$, $\ell_i$ and the row of $O_i$ from HBM, computes lines 9-11 in the shared tile `S_i`, writes the
# new row of $O_i$ (line 12) and $\ell_i$, $m_i$ (line 13) back, and returns the bytes it read and wrote
# in HBM (4 per float32 element, the counter pattern of the package's kernels). The checker runs the
# kernel at tiny sizes, compares $O$ and $L$ with the float64 reference, and compares your bytes with
# flash1's IO model; in the simulator it also watches every global access, so a row of $O$ read twice,
# or a load your count forgot, is named.

# %%
print(kx.frame_source("flash1_block"))

# %%
NEG_INF = float32(-math.inf)
E = 4  # bytes per float32


@cuda.jit(device=True)
def flash1_step(r, row, cols, Q_i, K_j, V_j, S_i, O, l, m, scale):
    """Lines 9-13 for query `row` (row r of Q_i) against the `cols` keys of K_j, V_j (shared memory).
    O (N, d), l, m (N,) are in HBM. Returns (bytes read, bytes written) in HBM."""
    D = Q_i.shape[1]
    # Your turn: read m_i = m[row], l_i = l[row] from HBM; lines 9-10 into S_i[r, c] for c < cols
    # (S = scale Q_i K_j^T, m~ = rowmax, P~, l~); line 11 (m_new, l_new); line 12 (O[row, x] for every x:
    # read, rescale, add P~ V_j, divide); line 13 (write l[row], m[row]).
    raise NotImplementedError("lines 9-13 of Algorithm 1")
    return 2 * E + D * E, D * E + 2 * E  # read m_i, l_i, O_i's row; wrote O_i's row, l_i, m_i


# %%
mine_kernel = ex.check("flash1_block", flash1_step)
assert ex.check_solution("flash1_block")
# kx.hints("flash1_block", upto=1)  # uncomment for a hint; upto=2 for two, and so on
# ex.solution("flash1_block")  # uncomment to print the solution

# %% [markdown]
# **Predict, then run.** At $N = 16$, $d = 4$ and $B_r = B_c = 4$, how many bytes does this kernel read
# from HBM? Count, as Theorem 2 does: $K$ and $V$ once, and $Q$, $O$, $\ell$, $m$ once per outer step
# ($T_c = 4$ of them), plus one more read of $\ell$ and $m$ for $L$. Write your number, then run the
# next cell.

# %%
my_prediction = None  # your number of bytes read, e.g. 2 * 16 * 4 * 4 + ...

# %%
run16 = kx.measure_forward("flash1_block", flash1_step if mine_kernel else kx.flash1_step, 16, 16)
read16 = run16["bytes"][0]  # the kernel's own counter
lessonkit.compare_prediction("flash1 reads at N = 16, d = 4", my_prediction, read16)
print("per array (element reads, writes), as the simulator saw them:", run16["log"].per_array() if SIM else "-")

# %% [markdown]
# ## As N grows
#
# The IO models give the bytes at any size without running anything. Standard attention's bytes grow
# like $N^2$ because of $S$ and $P$. flash1's grow like $N^2$ too, for another reason: each of the
# $T_c \approx N / B_c$ outer steps re-reads $Q$ and $O$. So at a fixed head dimension the ratio settles to a
# constant, set by $d$ and the block sizes (lesson 6 derives it), while the $N \times N$ *memory* is gone
# altogether. One head, $d = 64$, float32, the blocks this device would use:

# %%
blk64 = fn.resolve_block("flash1", 64, np.float32)
print(f"{'N':>6} {'standard MB':>12} {'flash1 MB':>10} {'ratio':>6}   (flash1 blocks {blk64})")
ratios = []
for n_ in (512, 1024, 2048, 4096, 8192, 16384):
    s_ = iomodel.forward("standard", 1, n_, n_, 64, np.float32).total
    f_ = iomodel.forward("flash1", 1, n_, n_, 64, np.float32, False, blk64).total
    ratios.append(s_ / f_)
    print(f"{n_:>6} {s_ / 1e6:>12.1f} {f_ / 1e6:>10.1f} {s_ / f_:>6.1f}")

# %% [markdown]
# On a GPU, time flash1 against standard attention. Expect a surprise: flash1 moves fewer bytes but runs
# one thread block per head, so with $B \cdot H$ = 16 heads it keeps only 16 SMs busy, and each block
# walks all $T_r T_c$ tile pairs one after another. It is written to be read next to the paper, not to
# be fast; lesson 9's flash2 fixes both.

# %%
q_d, k_d, v_d = (cuda.to_device(x) for x in (q, k, v))
t_std = median_ms(lambda: fn.standard_attention_forward(q_d, k_d, v_d))
t_f1 = median_ms(lambda: fn.flash_attention_forward(q_d, k_d, v_d, kernel="flash1", block=BLOCK))
if SIM:
    print(f"not timed: {device.CudaTimer.note}")
else:
    sms = device.info().sm_count
    print(f"standard {t_std:.2f} ms; flash1 {t_f1:.2f} ms ({BH} thread blocks on {sms} SMs)")

# %% [markdown]
# ## Measured on a real GPU
#
# In the simulator nothing is timed. The project ran the same kernels on an NVIDIA H200; the table
# below is loaded from the committed benchmark file and printed with the GPU, the date and the command
# it came from: recorded, not measured now (on a GPU the cells above measure this one).
# Next to it, the paper's headline results (Dao et al. 2022, as the seed article reports them): about
# 10 times less memory than standard attention at $N$ = 2K and 20 times at 4K, exact results, and
# faster training.

# %%
if recorded.available():
    path = recorded.STANDARD_BENCH_CSV  # the run of the rebuilt standard kernels (lesson 2)
    print(recorded.bench_table(["standard", "flash2_fast"], "fwd", 4096, path))
    peak = {r["implementation"]: int(r["peak_mem_bytes"]) for r in recorded.bench_rows(None, "fwd", 4096, path)}
    print(f"memory of one call at N = 4096: standard {peak['standard'] / 2**20:.0f} MiB, flash2_fast "
          f"{peak['flash2_fast'] / 2**20:.0f} MiB: {peak['standard'] / peak['flash2_fast']:.0f}x less")
    print("(the paper: ~20x less at N = 4K, against its own baselines; the ratio grows with N, as S and P do)")

# %% [markdown]
# ## The loop, step by step
#
# Which tiles sit in shared memory at three steps of Algorithm 1, and what goes to HBM: $Q_i$, $K_j$,
# $V_j$ are loaded, $S_{ij}$ lives only on chip, and $O_i$, $\ell_i$, $m_i$ are read and written back at
# every step (flash1's cost, which FlashAttention-2 removes).

# %%
lessonkit.show(pictures.tiling_steps(N=12, Br=4, Bc=6))

# %% [markdown]
# ## What to take away
#
# * Algorithm 1 = tiles in shared memory + the online softmax: $S$ and $P$ exist only as tiles on chip.
# * The result is exact (to rounding) for any block sizes, including blocks that do not divide $N$.
# * flash1 reads $Q$ and reads and writes $O$, $\ell$, $m$ on every outer step: fewer bytes than standard attention,
#   but not yet the fewest.
# * Counted bytes equal the IO model exactly, at the simulator's sizes; the model carries them to real $N$.

# %% [markdown]
# ## Check

# %%
assert err_np < 1e-12, err_np
assert err_o < 1e-5 and err_l < 1e-5, (err_o, err_l)
assert res.hbm == flash_model
assert SIM or res.hbm.total < std_model.total  # real sizes: the ratios below, in the simulator too
assert read16 == list(iomodel.flash1.forward(1, 16, 16, 4, np.float32, False, (4, 4)).per_kernel.values())[1].bytes_read
assert min(ratios) > 1 and abs(ratios[-1] / ratios[-2] - 1) < 0.05, "fewer bytes, by a ratio that settles"
assert (t_f1 is None) == SIM
print("lesson 5: all checks passed")
