"""Source of lessons/04_tiling_shared_memory.ipynb (build it with `python lessons/_build.py`)."""
# ruff: noqa: E402

# %% [markdown]
# # Lesson 4: Tiling and shared memory
#
# The second tool FlashAttention needs: load a tile of data from HBM into shared memory once, and let
# many threads use it many times. This lesson builds a tiled matrix product, the idea under standard
# attention's kernels (lesson 2) and the flash kernels, shows why it needs barriers, measures what it
# saves in HBM bytes, and explains bank conflicts, the one way shared memory can be slow.

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

from flash_numba import device
from flash_numba.sim import trace as simtrace

from flash_numba.course import lessonkit, pictures
from flash_numba.course import exercises as ex
from flash_numba.iomodel import matmul16 as io_matmul16
from flash_numba.kernels import matmul16

SIM = device.SIMULATOR
print(device.describe())


def median_ms(run):
    """Median time of run() in milliseconds over CUDA events, or None in the simulator."""
    times = device.time_ms(run)
    return None if times is None else float(np.median(times))


# %% [markdown]
# ## Without tiles, and with them
#
# The simplest kernel for $C = AB$ ($A$: $M \times K$, $B$: $K \times N$) gives each thread one element
# $C_{ij}$ and has it read row $i$ of $A$ and column $j$ of $B$ from HBM: $2K$ loads for $2K$ FLOPs, and
# $2MNK$ loads in all. Neighbouring threads read the same rows and columns again and again.
#
# A *tiled* kernel groups the threads into blocks of $T \times T$, one per $T \times T$ tile of $C$. The
# block walks along the inner dimension in steps of $T$: at each step every thread loads **one** element
# of $A$ and **one** of $B$ into two $T \times T$ tiles in shared memory, and then every thread reads a row
# of one tile and a column of the other, $T$ multiply-adds each, from shared memory. Each element of $A$
# is now loaded from HBM once per column of tiles ($N/T$ times) instead of once per column of $C$
# ($N$ times): the traffic drops by a factor $T$.

# %%
def naive_bytes(M, N, K, e):
    return e * (2 * M * N * K + M * N)  # each thread: a row of A, a column of B, one store


def tiled_bytes(M, N, K, T, e):
    # A is read once per column of tiles, B once per row of tiles; C is written once.
    return e * (math.ceil(N / T) * M * K + math.ceil(M / T) * K * N + M * N)


M = N = K = 1024
print(f"C = A B, {M} x {K} times {K} x {N}, float32:")
print(f"  untiled      {naive_bytes(M, N, K, 4) / 1e9:6.2f} GB")
for T in (8, 16, 32):
    print(f"  tiles T = {T:<2} {tiled_bytes(M, N, K, T, 4) / 1e9:6.2f} GB")

# %% [markdown]
# The package's `flash_numba.kernels.matmul16.matmul` is this tiled product with $T = 16$. With
# `count_hbm=True` it counts the bytes its threads load and store, which match the formula:

# %%
rng = np.random.default_rng(4)
Mt, Kt, Nt = (20, 24, 18) if SIM else (1000, 64, 1200)
a = rng.standard_normal((Mt, Kt)).astype(np.float32)
b = rng.standard_normal((Kt, Nt)).astype(np.float32)
c, hbm = matmul16.matmul(a, b, count_hbm=True)
mm_err = np.abs(c - a.astype(np.float64) @ b).max()
print(f"A {Mt}x{Kt} @ B {Kt}x{Nt}: max |C - C_ref| = {mm_err:.1e}")
print(hbm.table())
print("formula:", f"{tiled_bytes(Mt, Nt, Kt, matmul16.TILE, 4):,} bytes")

# %% [markdown]
# ## Barriers
#
# The threads of a block share the tiles, so they must agree on when a tile is ready and when it may be
# overwritten. `cuda.syncthreads()` is a barrier: no thread of the block passes it until all have reached
# it. The tiled loop needs two per step:
#
# 1. after loading the tiles, before anyone reads them: otherwise a fast thread multiplies with elements
#    a slow thread has not stored yet (read after write);
# 2. after the multiply-adds, before the next step loads new tiles: otherwise a fast thread overwrites an
#    element a slow thread is still reading (write after read).
#
# A missing barrier is a *race*: on a GPU the result is wrong only sometimes, depending on timing. In the
# simulator the threads of a block take turns, each running to its next barrier, so whether one reads a
# tile element before another has stored it depends on that fixed order, not on the GPU's (where a warp
# of 32 runs in lockstep and warps interleave by timing): the values alone catch a missing barrier only
# for some orders. The checker below therefore runs your kernel with the package's race detector
# (`flash_numba.sim.races`): each shared element remembers which thread wrote it and which threads read it
# since the last barrier, so without barrier 1 it sees a thread read an element another thread stored
# (read after write), and without barrier 2 a thread store an element another thread read (write after
# read), on every run. It watches only the sizes it runs, and a GPU schedules threads differently:
# reason about your barriers, do not rely on a run (lesson 11 shows more races and what tools find them
# on a GPU).
#
# One trap of the simulator: it keeps one shared array per *source line*, so
# `a, b = cuda.shared.array(4, float32), cuda.shared.array(4, float32)` gives `a` and `b` the same memory
# there (on a GPU they are two arrays). Declare each shared array on its own line.

# %% [markdown]
# ## Your turn: the tiled matrix product
#
# Finish the kernel below: for each step `k0`, stage the tiles (0 for elements past the edge of $A$ or
# $B$, so partial tiles add nothing) and put in the two barriers; the multiply-adds are written. Count
# in `nr` the bytes this thread loads from $A$ and $B$ (4 per element actually loaded; not the zeros);
# the kernel adds them to `counter[0]` and the bytes it writes to `counter[1]`, as the package's
# kernels do. The checker launches it on shapes that are not multiples of `TILE` and compares both $C$
# and the byte counts.

# %%
TILE = 8 if SIM else 16  # threads per block: TILE x TILE (the simulator runs each one as Python code)
E = 4  # bytes per float32


@cuda.jit
def matmul_tiled(a, b, c, counter):
    """C = A @ B for float32 a (M, K), b (K, N), c (M, N); blocks of (TILE, TILE) threads."""
    M, K = a.shape
    N = b.shape[1]
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    row = cuda.blockIdx.y * TILE + ty  # this thread computes C[row, col]
    col = cuda.blockIdx.x * TILE + tx
    a_tile = cuda.shared.array((TILE, TILE), float32)
    b_tile = cuda.shared.array((TILE, TILE), float32)
    acc = float32(0)
    nr = 0  # bytes this thread loads from A and B
    for k0 in range(0, K, TILE):
        # Your turn: a_tile[ty, tx] = A[row, k0 + tx] and b_tile[ty, tx] = B[k0 + ty, col], 0 outside A or B,
        # nr += E for each element loaded; then the barrier that makes the tiles safe to read.
        raise NotImplementedError("stage the two tiles, then synchronise")

        for kk in range(TILE):  # row ty of the A tile times column tx of the B tile
            acc += a_tile[ty, kk] * b_tile[kk, tx]
        # Your turn: the barrier that makes the tiles safe to overwrite.
    if row < M and col < N:
        c[row, col] = acc
        cuda.atomic.add(counter, 1, E)  # bytes written
    cuda.atomic.add(counter, 0, nr)  # bytes read


# %%
mine = ex.check("tiled_matmul", matmul_tiled, tile=TILE)
assert ex.check_solution("tiled_matmul", tile=TILE)
# ex.solution("tiled_matmul")  # uncomment to print the solution

# %% [markdown]
# On a GPU, time your kernel (or the packaged solution, until yours passes) against an untiled one on a
# square product:

# %%
@cuda.jit
def matmul_untiled(a, b, c):
    """C = A @ B, each thread reading its row of A and column of B straight from HBM."""
    row, col = cuda.blockIdx.y * TILE + cuda.threadIdx.y, cuda.blockIdx.x * TILE + cuda.threadIdx.x
    if row < c.shape[0] and col < c.shape[1]:
        acc = float32(0)
        for k in range(a.shape[1]):
            acc += a[row, k] * b[k, col]
        c[row, col] = acc


# %%
tiled = matmul_tiled if mine else ex.solution_fn("tiled_matmul", tile=TILE)
n = 24 if SIM else 2048
A, B = (cuda.to_device(rng.standard_normal((n, n)).astype(np.float32)) for _ in range(2))
C1, C2 = cuda.device_array((n, n), np.float32), cuda.device_array((n, n), np.float32)
count = cuda.to_device(np.zeros(2, np.int64))
grid = (math.ceil(n / TILE), math.ceil(n / TILE))
t_tiled = median_ms(lambda: tiled[grid, (TILE, TILE)](A, B, C1, count))
t_untiled = median_ms(lambda: matmul_untiled[grid, (TILE, TILE)](A, B, C2))
if SIM:
    tiled[grid, (TILE, TILE)](A, B, C1, count)
    matmul_untiled[grid, (TILE, TILE)](A, B, C2)
    print(f"not timed: {device.CudaTimer.note}")
else:
    for name, t in (("tiled", t_tiled), ("untiled", t_untiled)):
        print(f"n = {n}, {name:>7}: {t:7.2f} ms, {2 * n**3 / t / 1e9:.2f} TFLOP/s")
same = np.allclose(C1.copy_to_host(), C2.copy_to_host(), rtol=1e-4, atol=1e-4)
print("tiled and untiled agree:", same)

# %% [markdown]
# On a modern GPU the untiled kernel is often not $T$ times slower: the L1 and L2 caches catch many of its
# repeated loads. The byte counts in this course are the bytes the code *requests*; what the caches
# absorb is a hardware matter that lesson 6 shows how to measure.

# %% [markdown]
# ## Bank conflicts
#
# Shared memory is divided into 32 *banks*, each 4 bytes wide: 4-byte word $w$ lives in bank
# $w \bmod 32$. The 32 threads of a warp are served in one pass when they read 32 different banks (or
# the same word, which is broadcast); $k$ threads hitting different words of one bank take $k$ passes.
# Reading along a row of a float32 tile hits 32 consecutive banks: fine. Reading down a *column* of a
# tile whose rows are 32 floats long hits the same bank 32 times: a 32-way conflict. The fix is one
# float of padding per row: with rows of 33 floats, element $(r, c)$ is in bank
# $(33r + c) \bmod 32 = (r + c) \bmod 32$, all different down a column.

# %%
def conflict_degree(row_stride, column=0):
    """Passes a warp needs when lane r reads element (r, column) of a tile with this row stride (floats)."""
    banks = (np.arange(32) * row_stride + column) % 32
    return np.bincount(banks, minlength=32).max()


for stride in (16, 17, 32, 33, 64, 65):
    print(f"rows of {stride:>2} floats: a warp reading down a column needs {conflict_degree(stride):>2} pass(es)")

# %% [markdown]
# That is why the package's matrix product declares its tiles as `(TILE, TILE + 1)`: for a transposed
# operand each thread stores its element into the tile transposed, down a column. The kernels below
# read a column of a 32 x 32 tile, padded or not; on a GPU they are timed.

# %%
def make_column_reader(width):
    """A kernel in which lane tx of each warp reads row tx of a (32, width) shared tile, down one column."""

    @cuda.jit
    def kernel(out, iters):
        tile = cuda.shared.array((32, width), float32)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y  # blocks of (32, 8) threads: 8 warps
        for r in range(ty, 32, 8):
            for cc in range(tx, width, 32):
                tile[r, cc] = r
        cuda.syncthreads()
        acc = float32(0)
        for it in range(iters):
            acc += tile[tx, (it + ty) % 32]  # the 32 lanes of a warp: one column, 32 rows
        out[cuda.blockIdx.x, ty, tx] = acc

    return kernel


# %%
iters, n_blocks = (4, 1) if SIM else (1 << 14, 8 * device.info().sm_count)
out = cuda.device_array((n_blocks, 8, 32), np.float32)
bank_ms = {}
for width in (32, 33):
    reader = make_column_reader(width)
    reader[n_blocks, (32, 8)](out, iters)
    assert np.array_equal(out.copy_to_host()[0, 0], iters * np.arange(32, dtype=np.float32))
    bank_ms[width] = median_ms(lambda: reader[n_blocks, (32, 8)](out, iters))
if SIM:
    print(f"not timed: {device.CudaTimer.note}")
else:
    print(f"column reads, rows of 32 floats: {bank_ms[32]:.3f} ms; rows of 33: {bank_ms[33]:.3f} ms "
          f"({bank_ms[32] / bank_ms[33]:.1f}x)")

# %% [markdown]
# Real kernels store in less tidy patterns than one column. The optional appendix, "How flash2_fast got
# fast", finds a conflict in this course's fastest kernel and measures two ways to remove it.

# %% [markdown]
# ## The bytes tiling saves in attention
#
# In standard attention, $S = QK^\top$ is an $N \times N$ product with inner dimension $d$; $O = PV$ is an
# $N \times d$ product with inner dimension $N$. At $N = 4096$, $d = 64$, one head, float32:

# %%
Na, da = 4096, 64
for name, (m_, n_, k_) in {"S = Q K^T": (Na, Na, da), "O = P V": (Na, da, Na)}.items():
    untiled = naive_bytes(m_, n_, k_, 4)
    tiled16 = io_matmul16.matmul(1, m_, n_, k_, np.float32).total
    print(f"{name}: untiled {untiled / 1e9:.2f} GB, 16 x 16 tiles {tiled16 / 1e9:.2f} GB "
          f"({untiled / tiled16:.1f}x less)")

# %% [markdown]
# ## Who reads what: an access map
#
# In the simulator the package can watch every global access of a kernel (`flash_numba.sim.trace`): here,
# for $A$, $B$ ($16 \times 16$) and one thread block of your tiled product (or the solution), which
# thread loaded each element, GPU-Puzzles style (thread number $t_x + t_y \cdot$ `TILE`).
#
# **Predict, then run.** With $M = N = K = 16$ and this lesson's `TILE` (8 in the simulator), how many
# times is each element of $A$ read from global memory, over the whole launch?

# %%
my_prediction = None  # reads of each element of A

# %%
if SIM:
    A16, B16 = (rng.standard_normal((16, 16)).astype(np.float32) for _ in range(2))
    arrays = [("A", A16), ("B", B16), ("C", np.zeros((16, 16), np.float32))]
    out16, log16 = simtrace.run(tiled, (2, 2), (TILE, TILE), arrays, cuda.to_device(np.zeros(2, np.int64)))
    reads_A = int(log16.count_map("A", "r", (16, 16)).max())
    lessonkit.compare_prediction("reads of each element of A", my_prediction, reads_A)
    lessonkit.show(pictures.access_map(log16, "A", "r", (16, 16), "A: the thread of block (0, 0) that "
                                       "loaded each element", block=(0, 0, 0)))
else:
    reads_A = 16 // TILE
    print("the access trace exists only in the simulator; the model says", reads_A, "reads of each element")

# %% [markdown]
# The package's standard-attention kernels (lesson 2) tile further: a thread block keeps a block of
# query rows (64 at $d = 64$, float32) on chip while the key blocks stream past, and each thread computes
# several outputs from registers, so they read $K$ and $V$ once per block of query rows. Tiling divides
# the traffic of the *reads*, but standard attention still writes and re-reads the $N \times N$
# matrices. FlashAttention (lesson 5) combines tiling with the online softmax of lesson 3 so that $S$
# and $P$ exist only as tiles in shared memory.

# %% [markdown]
# ## What to take away
#
# * A tile loaded once into shared memory serves every thread of the block: global reads fall by the tile width.
# * Two barriers per step: after loading (read after write) and before the next load (write after read).
# * Shared memory has 32 banks; pad a tile's rows when threads read down a column.
# * Tiling alone does not save attention: $S$ and $P$ still go to HBM and back.

# %% [markdown]
# ## Check

# %%
assert mm_err < 1e-4 and hbm.total == tiled_bytes(Mt, Nt, Kt, matmul16.TILE, 4)
assert hbm.total == io_matmul16.matmul(1, Mt, Nt, Kt, np.float32).total
assert same
assert conflict_degree(32) == 32 and conflict_degree(33) == 1 and conflict_degree(17) == 1
assert (t_tiled is None) == SIM and (bank_ms[32] is None) == SIM
assert naive_bytes(M, N, K, 4) > 15 * tiled_bytes(M, N, K, 16, 4)
print("lesson 4: all checks passed")
