"""Source of lessons/07_backward_recomputation.ipynb (build it with `python lessons/_build.py`)."""
# ruff: noqa: E402

# %% [markdown]
# # Lesson 7: The backward pass, with recomputation
#
# Training needs the gradients of a loss with respect to $Q$, $K$ and $V$, given the gradient $dO$ of the
# loss with respect to the output. For one head, with $S = \text{scale} \cdot QK^\top$, $P = \mathrm{softmax}(S)$
# and $O = PV$, the chain rule gives
#
# $$dV = P^\top dO, \qquad dP = dO\, V^\top, \qquad dS_{ij} = P_{ij}\,(dP_{ij} - D_i), \qquad
#   dQ = \text{scale} \cdot dS\, K, \qquad dK = \text{scale} \cdot dS^\top Q,$$
#
# where $D_i = \sum_j P_{ij}\, dP_{ij}$ comes from the softmax's Jacobian. Every one of these uses $P$, an
# $N \times N$ matrix. Standard attention stores $P$ during the forward pass and reads it back; the
# FlashAttention forward pass never had $P$ to store. The backward pass *recomputes* it, tile by tile,
# from $Q$, $K$ and one number per row saved by the forward pass: $L_i = m_i + \log \ell_i$.

# %%
import sys

if "google.colab" in sys.modules:  # Colab: install flash_numba (see lesson 0)
    # !pip install -q "numba-cuda[cu12]==0.30.4"
    # !pip install -q --no-deps "git+@REPO_URL@"
    pass  # source-only

# %%
import math

import numpy as np
from numba import cuda, float32  # noqa: F401  (float32: for your kernels)

import flash_numba as fn
from flash_numba import device, iomodel, reference
from flash_numba.course import bugzoo, lessonkit, pictures
from flash_numba.course import exercises as ex
from flash_numba.course import flash_checks as kx

SIM = device.SIMULATOR
print(device.describe())
BH, N, d = (1, 32, 16) if SIM else (4, 1024, 64)  # flash1 takes seconds per call beyond this
BLOCK = (8, 8) if SIM else None
print(f"sizes: B*H = {BH}, N = {N}, d = {d}; blocks {BLOCK or 'chosen by the package'}")


def median_ms(run):
    """Median time of run() in milliseconds over CUDA events, or None in the simulator."""
    times = device.time_ms(run)
    return None if times is None else float(np.median(times))


# %% [markdown]
# ## The two statistics: L and D
#
# **$L_i$ gives back $P$.** The forward pass ends with $m_i = \max_j S_{ij}$ and
# $\ell_i = \sum_j e^{S_{ij} - m_i}$, so $P_{ij} = e^{S_{ij} - m_i} / \ell_i = e^{S_{ij} - L_i}$. Given a tile
# $S_{ij}$, recomputed as $\text{scale} \cdot Q_i K_j^\top$, one exponential per entry restores the tile
# $P_{ij}$: no running maximum, no second pass. (A row that saw no key has $L_i = -\infty$ and $P = 0$:
# guard $e^{-\infty - (-\infty)}$ once more.)
#
# **$D_i$ needs no $P$.** Since $dP_{ij} = dO_i \cdot V_j$,
#
# $$D_i = \sum_j P_{ij}\, dP_{ij} = \sum_j P_{ij}\, (dO_i \cdot V_j) = dO_i \cdot \sum_j P_{ij} V_j
#   = dO_i \cdot O_i.$$
#
# So $D = \mathrm{rowsum}(dO \circ O)$, from two $N \times d$ matrices the backward pass has anyway.

# %% [markdown]
# ## Your turn: D, and P from L

# %%
def compute_D(o, do):
    """D_i = rowsum(dO_i * O_i) for o, do of shape (..., N, d); returns (..., N)."""
    # Your turn
    raise NotImplementedError("one line")


def recompute_P(S, L):
    """P_ij = exp(S_ij - L_i) for a tile S (Br, Bc) and L (Br,); rows with L_i = -inf give P = 0."""
    # Your turn
    raise NotImplementedError("exp(S - L), guarded")


# %%
mine_D = ex.check("compute_D", compute_D)
mine_P = ex.check("recompute_P", recompute_P)
assert ex.check_solution("compute_D") and ex.check_solution("recompute_P")
D_of = compute_D if mine_D else ex.solution_fn("compute_D")
P_of = recompute_P if mine_P else ex.solution_fn("recompute_P")

# %% [markdown]
# Both identities on a random head, in float64:

# %%
rng = np.random.default_rng(7)
q1, k1, v1, do1 = (rng.standard_normal((12, 8)) for _ in range(4))
o1, L1 = reference.attention_forward(q1, k1, v1)
S1 = q1 @ k1.T / math.sqrt(8)
P1 = np.exp(S1 - S1.max(axis=1, keepdims=True))
P1 /= P1.sum(axis=1, keepdims=True)  # the softmax, computed directly
dP1 = do1 @ v1.T
err_P = np.abs(P_of(S1, L1) - P1).max()
err_D = np.abs(D_of(o1, do1) - (P1 * dP1).sum(axis=1)).max()
print(f"max |exp(S - L) - softmax(S)|     = {err_P:.1e}")
print(f"max |rowsum(dO * O) - rowsum(P * dP)| = {err_D:.1e}")

# %% [markdown]
# ## flash1's backward
#
# The backward pass of flash1 follows the paper's Algorithm 4 with FlashAttention-2's statistic $L$:
# the outer loop over key blocks $j$ loads $K_j$, $V_j$ and keeps $dK_j$, $dV_j$ in shared memory; the
# inner loop over query blocks $i$ loads $Q_i$, $O_i$, $dO_i$, $L_i$ and $dQ_i$, recomputes
# $S_{ij}$ and $P_{ij} = e^{S_{ij} - L_i}$, computes $D_i$, then $dV_j \mathrel{+}= P_{ij}^\top dO_i$,
# $dP_{ij} = dO_i V_j^\top$, $dS_{ij} = P_{ij} \circ (dP_{ij} - D_i)$,
# $dK_j \mathrel{+}= \text{scale} \cdot dS_{ij}^\top Q_i$, and adds $\text{scale} \cdot dS_{ij} K_j$ to $dQ_i$
# in HBM (read, add, write back: once per outer step, as $O$ in the forward pass). After the inner loop
# it writes $dK_j$, $dV_j$ once.

# %%
q, k, v, do = (rng.standard_normal((BH, N, d)).astype(np.float32) for _ in range(4))
fwd = fn.flash_attention_forward(q, k, v, kernel="flash1", block=BLOCK)
bwd = fn.flash_attention_backward(q, k, v, fwd.o, fwd.lse, do, kernel="flash1", block=BLOCK, count_hbm=True)
o_ref, lse_ref = reference.attention_forward(q, k, v)
grads_ref = reference.attention_backward(q, k, v, o_ref, lse_ref, do)
errs = {}
for name, got, want in zip(("dQ", "dK", "dV"), (bwd.dq, bwd.dk, bwd.dv), grads_ref):
    errs[name] = np.abs(got - want).max() / np.abs(want).max()
    print(f"{name}: max relative error {errs[name]:.1e}")
print(bwd.hbm.table(f"flash1 backward, (Br, Bc) = {bwd.block} (bytes)"))
print("counted == IO model:", bwd.hbm == iomodel.backward("flash1", BH, N, N, d, np.float32, False, bwd.block))

# %% [markdown]
# ## Your turn: the dK, dV body, in a kernel
#
# FlashAttention-2 computes $dK_j$ and $dV_j$ with one thread block per *key* tile: the block keeps its
# $dK_j$, $dV_j$ on chip and walks over the query tiles, so each is written to HBM once, and nothing is
# ever added to HBM twice. The frame (printed below) gives each thread one key row ($k_c$, $v_c$, and its
# accumulators `dk_c`, `dv_c`, in registers) and loads $Q_i$, $dO_i$, $L_i$, $D_i$ into shared memory.
# Write what the thread adds for one query tile: for each query row $r$ that sees the key,
# $P = e^{\text{scale}\, q_r \cdot k_c - L_r}$ (recomputed from $L$, never stored),
# $dP = dO_r \cdot v_c$, $dS = P\,(dP - D_r)$, then $dv_c \mathrel{+}= P\, dO_r$ and
# $dk_c \mathrel{+}= \text{scale}\; dS\, q_r$. Query $r_0 + r$ sees key `col` iff
# `col <= r0 + r + diag` (lesson 8; the frame passes `diag` = $N_k$ when nothing is masked). The checker
# compares $dK$, $dV$ with the float64 reference, causal cases included.

# %%
print(kx.frame_source("dkdv_block"))


# %%
@cuda.jit(device=True)
def dkdv_step(col, r0, rows, diag, Q_i, dO_i, L_i, D_i, k_c, v_c, dk_c, dv_c, scale):
    """Add query tile i's share to dK, dV of key `col` (this thread's rows k_c, v_c, dk_c, dv_c; length d).
    Q_i, dO_i (Br, d), L_i, D_i (Br,) are in shared memory; row r is query r0 + r."""
    for r in range(rows):  # (d = Q_i.shape[1])
        # Your turn: skip the masked pairs; s = q_r . k_c, dP = dO_r . v_c; P = exp(scale s - L_r);
        # dS = P (dP - D_r); then dv_c[x] += P dO_r[x] and dk_c[x] += scale dS q_r[x] for every x.
        raise NotImplementedError("P from L, then dS = P * (dP - D)")


# %%
mine_dkdv = ex.check("dkdv_block", dkdv_step)
assert ex.check_solution("dkdv_block")
# kx.hints("dkdv_block", upto=1)  # uncomment for a hint; upto=2 for two, and so on

# %% [markdown]
# ## Your turn: a whole dQ kernel
#
# $dK_j$ and $dV_j$ sum over query rows; $dQ_i$ sums over keys: $dQ_r = \text{scale} \sum_c dS_{rc}\, k_c$.
# So $dQ$ wants the opposite loop: one thread block per *query* tile, one thread per query row, walking
# over the key tiles. Now you write the whole kernel, not only its body.
#
# * A *factory* `make_dq(Br, Bc, d, causal)` returns the `@cuda.jit` kernel. The tile sizes are closure
#   constants, so `cuda.shared.array((Bc, d), float32)` has a compile-time shape.
# * The launch is ours: `kernel[ceil(Nq / Br), Br](q, k, v, do, L, D, dq, scale, counter)`.
# * Each thread keeps its row of $q$ and $dO$, and $L_r$, $D_r$, on chip.
# * For each key tile: a barrier, all threads load $K_j$, $V_j$ into shared memory, a barrier again.
#   Then each thread adds $\text{scale}\; dS_{rc}\, k_c$ for every key $c$ its row sees.
# * After the loop the thread writes its row of $dQ$, once.
# * Count your bytes (`nr`, `nw`, $E = 4$ a float32) and add them to `counter[0]`, `counter[1]` at the end.
#
# Under the causal mask, key $c$ is visible to query $r$ iff $c \le r + N_k - N_q$. A block can stop
# after the last key tile its last row sees (lesson 8). The checker compares $dQ$ with the float64
# reference (causal and $N_q \ne N_k$ cases included), your bytes with flash2's IO model, every global
# access with your counter, and watches shared memory for races.

# %%
E = 4  # bytes of a float32


def make_dq(Br, Bc, d, causal):
    """dQ, one block per query tile: launched as kernel[ceil(Nq / Br), Br](q, k, v, do, L, D, dq, scale, counter)."""

    @cuda.jit
    def dq_pass(q, k, v, do, L, D, dq, scale, counter):
        tid = cuda.threadIdx.x
        row = cuda.blockIdx.x * Br + tid  # noqa: F841  (this thread's query row; none if row >= Nq)
        K_j = cuda.shared.array((Bc, d), float32)  # noqa: F841  (yours to fill)
        V_j = cuda.shared.array((Bc, d), float32)  # noqa: F841
        nr, nw = 0, 0  # noqa: F841  (the bytes you read and write)
        # Your turn: the row's q, dO, L, D on chip; the loop over key tiles (barrier, load, barrier, add);
        # dq[row, :] written once; then cuda.atomic.add(counter, 0, nr) and (counter, 1, nw).
        raise NotImplementedError("the dQ kernel")

    return dq_pass


# %%
mine_dq = ex.check("dq_kernel", make_dq)
assert ex.check_solution("dq_kernel")
# kx.hints("dq_kernel", upto=1)  # uncomment for a hint; upto=2 for two, and so on

# %% [markdown]
# Which thread touched what, in the GPU-Puzzles manner: block 0 of your kernel (or the packaged one
# until yours passes) at $N_q = N_k = 8$, $B_r = B_c = 4$, $d = 4$. Each square is an element, labelled
# with the thread that first read it (or wrote it, for $dQ$).

# %%
dq_make = make_dq if mine_dq else kx.dq_kernel
if SIM:
    run_dq = kx.measure_kernel("dq_kernel", dq_make, 8, 8)
    shapes = {"q": ((8, 4), "r"), "k": ((8, 4), "r"), "v": ((8, 4), "r"), "dQ": ((8, 4), "w")}
    lessonkit.show(pictures.kernel_accesses(run_dq["log"], shapes, title="dq_kernel, block 0 (queries 0-3)"))
else:
    print("the access trace exists only in the simulator")

# %% [markdown]
# ## dQ from the key side: why atomics
#
# A fused backward (FlashAttention-2's) computes $dK_j$, $dV_j$ *and* $dQ$ in the one pass over key
# blocks, so $dS$ is computed once. But then thread $c$ of key block $j$ owns key $c$, not a query row.
# For every query $r$ it sees, it adds $\text{scale}\; dS_{rc}\, k_c$ into row $r$ of $dQ$ in HBM. Every
# thread of every key block adds into the same rows.
#
# `x[i] += v` is three steps: read $x_i$, add, write it back. Two threads doing it at once can both
# read the old value, and one addition is lost. `cuda.atomic.add(x, i, v)` does the three steps as one.
# The simulator runs one thread at a time, so a plain `+=` gives the right values here. The checker
# therefore records who wrote each element of $dQ$, and how: two threads writing one element, one of
# them with a plain store, is a race.
#
# Run the packaged atomic kernel, and the same kernel with a plain `+=`, at $N_q = 4$, $N_k = 8$, $d = 4$
# (two key blocks of 4). The picture counts the writes each element of $dQ$ received: one per key.

# %%
if SIM:
    with_plain_add = bugzoo.edited_factory("dq_atomic_kernel", bugzoo.PLAIN_ADD)  # the packaged kernel, add made +=
    atomic_run = kx.measure_kernel("dq_atomic", kx.dq_atomic_kernel, 4, 8)
    plain_run = kx.measure_kernel("dq_atomic", with_plain_add, 4, 8)
    print("same values:", np.allclose(atomic_run["dQ"], plain_run["dQ"], atol=1e-6))
    print("atomic adds:", len(atomic_run["atomics"]), "| race in the atomic kernel:", kx.write_races(atomic_run))
    print("the plain +=:", kx.write_races(plain_run).yours)
    plain_race = kx.write_races(plain_run) is not None
    lessonkit.show(pictures.read_counts({"dq_atomic, 8 keys in 2 blocks": atomic_run["log"]}, "dQ", (4, 4), "w"))
else:
    plain_race = True  # on a GPU nothing records the writes
    print("the write record exists only in the simulator")

# %% [markdown]
# ## Your turn: dQ with atomics
#
# Write the key-side kernel: one thread block per key tile, one thread per key, launched as
# `kernel[ceil(Nk / Bc), Bc](q, k, v, do, L, D, dq, scale, counter)` with `dq` zeroed.
#
# * The thread keeps its key's $k_c$, $v_c$ on chip.
# * For each query tile: a barrier, load $Q_i$, $dO_i$ ($B_r \times d$) and $L_i$, $D_i$ into shared
#   memory, a barrier again.
# * For each query row the key is visible to, add $\text{scale}\; dS\, k_c$ into $dQ$ with
#   `cuda.atomic.add(dq, (row, x), value)`. Count each add as a read and a write of $E$ bytes.
#
# A block can skip a query tile none of whose rows sees its first key; the test must give the same
# answer for every thread of the block, or the barriers stop matching.

# %%
def make_dq_atomic(Br, Bc, d, causal):
    """dQ from the key side: launched as kernel[ceil(Nk / Bc), Bc](q, k, v, do, L, D, dq, scale, counter), dq = 0."""

    @cuda.jit
    def dq_atomic(q, k, v, do, L, D, dq, scale, counter):
        tid = cuda.threadIdx.x
        col = cuda.blockIdx.x * Bc + tid  # noqa: F841  (this thread's key; none if col >= Nk)
        Q_i = cuda.shared.array((Br, d), float32)  # noqa: F841  (yours to fill)
        dO_i = cuda.shared.array((Br, d), float32)  # noqa: F841
        L_i = cuda.shared.array(Br, float32)  # noqa: F841
        D_i = cuda.shared.array(Br, float32)  # noqa: F841
        nr, nw = 0, 0  # noqa: F841  (the bytes you read and write)
        # Your turn: k_c, v_c on chip; the loop over query tiles (barrier, load, barrier); for each visible
        # row an atomic add of scale * dS * k_c[x] into dq[row, x]; then add nr, nw to the counter.
        raise NotImplementedError("the atomic dQ kernel")

    return dq_atomic


# %%
mine_dq_atomic = ex.check("dq_atomic", make_dq_atomic)
assert ex.check_solution("dq_atomic")
# kx.hints("dq_atomic", upto=1)  # uncomment for a hint; upto=2 for two, and so on

# %% [markdown]
# The price of the atomics, from the IO model you were checked against: every addition reads and
# writes 4 bytes, once per visible (query, key) pair and column. The query-side kernel writes $dQ$ once.

# %%
for label, atomic in (("dq_kernel (query side)", False), ("dq_atomic (key side)", True)):
    (r_b, w_b), _ = kx._dq_model(64, 64, 16, 16, 16, False, atomic)
    print(f"{label:24} N = 64, d = 16, 16 x 16 tiles: read {r_b:>9,} B, written {w_b:>9,} B")

# %% [markdown]
# ## A gradient check
#
# Agreement with the reference's formulas is one test; agreement with the definition of a derivative is
# another, independent of any formula. Take the loss $\mathcal{L} = \sum O \circ dO$, whose gradient with
# respect to $O$ is $dO$, and a random direction $u = (u_Q, u_K, u_V)$. Central differences of the
# kernel's own forward pass, in float64, must give
#
# $$\frac{\mathcal{L}(x + hu) - \mathcal{L}(x - hu)}{2h} \approx
#   \langle dQ, u_Q\rangle + \langle dK, u_K\rangle + \langle dV, u_V\rangle.$$

# %%
x64 = [a[:1].astype(np.float64) for a in (q, k, v, do)]  # one head, float64
u = [rng.standard_normal(a.shape) for a in x64[:3]]


def loss(h):
    qh, kh, vh = (a + h * ua for a, ua in zip(x64[:3], u))
    return float((fn.flash_attention_forward(qh, kh, vh, kernel="flash1", block=BLOCK).o * x64[3]).sum())


h = 1e-5
numeric = (loss(h) - loss(-h)) / (2 * h)
f64 = fn.flash_attention_forward(*x64[:3], kernel="flash1", block=BLOCK)
g64 = fn.flash_attention_backward(*x64[:3], f64.o, f64.lse, x64[3], kernel="flash1", block=BLOCK)
analytic = sum(float((g * ua).sum()) for g, ua in zip((g64.dq, g64.dk, g64.dv), u))
grad_check = abs(numeric - analytic) / abs(analytic)
print(f"finite differences {numeric:.10f}, backward pass {analytic:.10f}: relative difference {grad_check:.1e}")

# %% [markdown]
# ## What storing P would cost
#
# Standard attention's backward reads $P$ (and writes and reads $dP$ and $dS$, all $N \times N$). Our
# standard backward recomputes $P = e^{S - L}$ from $Q$, $K$ and $L$ too, since the API keeps nothing
# between calls, but then writes $P$ and $dS$ to HBM (keeping $dP$ in registers) and reads them back
# for $dV$, $dK$ and $dQ$; PyTorch's
# autograd would instead keep $P$ from the forward pass: $N^2$ elements per head held in memory from the
# forward to the backward pass, against $N$ for $L$. The bytes, from the IO models at a real size:

# %%
Hb, Nb, db = 16, 4096, 64
P_bytes, L_bytes = Hb * Nb * Nb * 4, Hb * Nb * 4
print(f"B*H = {Hb}, N = {Nb}, d = {db}, float32: P takes {P_bytes / 2**30:.2f} GB, L takes {L_bytes / 2**20:.2f} MB")
std_b = iomodel.backward("standard", Hb, Nb, Nb, db, np.float32)
print(std_b.table("standard backward (bytes)"))
for name in ("flash1", "flash2"):
    blk = fn.resolve_block(name, db, np.float32, pass_="backward")
    mb = iomodel.backward(name, Hb, Nb, Nb, db, np.float32, False, blk).total
    ratio = std_b.total / mb
    compare = f"{ratio:.1f}x fewer than standard" if ratio >= 1 else f"{1 / ratio:.1f}x more than standard"
    print(f"{name} backward, blocks {blk}: {mb:,} bytes ({compare})")
recompute_flops, backward_flops = 2 * Nb * Nb * db, 8 * Nb * Nb * db
print(f"the price: recomputing S adds {recompute_flops / backward_flops:.0%} to the backward's "
      f"{backward_flops / 1e9:.1f} GFLOP of products per head")

# %% [markdown]
# Some more arithmetic for a large cut in bytes and no $N \times N$ memory: on a memory-bound problem
# that trade wins, and it is why the FlashAttention paper's backward pass beats the standard one although
# it computes more. In float32 on CUDA cores the products are compute-bound and the trade saves memory
# rather than time: on the H200 our standard's forward + backward ran faster than flash2_fast's
# deterministic one (lesson 2's recorded table). On a GPU, time them (flash1 is the slow, readable
# version; lesson 9's flash2 is the one to compare):

# %%
t = {}
if SIM:
    print(f"not timed: {device.CudaTimer.note}")
else:
    dev = [cuda.to_device(a) for a in (q, k, v, do)]
    f = fn.flash_attention_forward(*dev[:3], kernel="flash2")
    s = fn.standard_attention_forward(*dev[:3])
    t["standard"] = median_ms(lambda: fn.standard_attention_backward(*dev[:3], s.o, s.lse, dev[3]))
    for name in ("flash1", "flash2"):
        t[name] = median_ms(lambda: fn.flash_attention_backward(*dev[:3], f.o, f.lse, dev[3], kernel=name))
    print("backward pass: " + ", ".join(f"{name} {ms:.2f} ms" for name, ms in t.items()))

# %% [markdown]
# ## Forward against backward bytes
#
# **Predict, then run.** flash1's backward pass reads $Q$, $O$, $dO$, $L$ and reads and writes $dQ$ on
# every outer step. How many times the forward's bytes does it move here?

# %%
my_prediction = None  # backward bytes / forward bytes, flash1, these sizes

# %%
fwd_counted = fn.attention_forward(q, k, v, kernel="flash1", block=BLOCK, count_hbm=True).hbm.total
lessonkit.compare_prediction("backward / forward bytes", my_prediction, round(bwd.hbm.total / fwd_counted, 2))
lessonkit.show(pictures.hbm_bytes_by_term(kernels=("standard", "flash1", "flash2"), pass_="backward"))

# %% [markdown]
# ## What to take away
#
# * The backward needs $P$, but recomputes it from $Q$, $K$ and the saved $L = m + \log \ell$: $O(N)$ extra memory
#   instead of $O(N^2)$.
# * $D_i = \mathrm{rowsum}(dO_i \circ O_i)$ replaces $\mathrm{rowsum}(P \circ dP)$, so the softmax's gradient needs no
#   $N \times N$ matrix either: $dS = P \circ (dP - D)$.
# * Recomputation costs FLOPs and saves bytes: the right trade for a memory-bound layer.
# * A finite-difference gradient check tests the whole pass independently of any formula.
# * When many threads add into one output (dQ from the key side), each add must be atomic; one owner per
#   output element (dQ from the query side) needs none, and writes once.

# %% [markdown]
# ## Check

# %%
assert err_P < 1e-12 and err_D < 1e-12
assert max(errs.values()) < 1e-4, errs
assert bwd.hbm == iomodel.backward("flash1", BH, N, N, d, np.float32, False, bwd.block)
assert grad_check < 1e-6, grad_check
assert plain_race  # a plain += into dQ from many threads is a race (in the simulator: seen by the write record)
assert SIM or t["flash2"] > 0
print("lesson 7: all checks passed")
