"""Source of lessons/A1_how_flash2_fast_got_fast.ipynb (build it with `python lessons/_build.py`)."""
# ruff: noqa: E402

# %% [markdown]
# # Appendix 1 (optional): How flash2_fast got fast
#
# Lessons 5 to 9 build FlashAttention the readable way: `flash1`, then `flash2`, and your own kernels.
# `flash2_fast` is the same algorithm as flash2, rearranged for speed. This appendix tells how, one change
# at a time, with the number that justified each change.
#
# Read it after lesson 10, if you want to tune a kernel yourself. Nothing later depends on it.
#
# Each section is one idea:
#
# 1. A bank conflict in the forward, and two ways to remove it (lesson 4's banks, in a real kernel).
# 2. More than 48 KB of shared memory a block, and what the extra reuse buys.
# 3. How many blocks an SM holds, and what one tile less, or fewer loads, buys.
# 4. The backward's three ways to compute $dQ$: atomics, a copy per block, two passes.
# 5. The host's share of a call at small $N$.
#
# How the numbers were measured. Each change was timed on one NVIDIA H200 against the build before it,
# the two builds alternating, twice each, and the best of two kept. Every recorded number below is printed
# with its GPU, its date or commit, and its file (`flash_numba/course/data/README.md` lists the commands).
# In the simulator nothing is timed; on a GPU some cells time this one.

# %%
import sys

if "google.colab" in sys.modules:  # Colab: install flash_numba (see lesson 0)
    # !pip install -q "numba-cuda[cu12]==0.30.4"
    # !pip install -q --no-deps "git+@REPO_URL@"
    pass  # source-only

# %%
import numpy as np
from numba import cuda

import flash_numba as fn
from flash_numba import _switches, device, reference
from flash_numba.course import lessonkit, pictures, recorded
from flash_numba.course import exercises as ex
from flash_numba.kernels import flash2_fast

SIM = device.SIMULATOR
print(device.describe())
rng = np.random.default_rng(0)
BH, N, d = (2, 32, 16) if SIM else (8, 1024, 64)
q, k, v, do = (rng.standard_normal((BH, N, d)).astype(np.float32) for _ in range(4))
o_ref, lse_ref = reference.attention_forward(q, k, v)
grads_ref = reference.attention_backward(q, k, v, o_ref, lse_ref, do)
print(f"sizes: B*H = {BH}, N = {N}, d = {d}")


def median_ms(run):
    """Median time of run() in milliseconds over CUDA events, or None in the simulator."""
    times = device.time_ms(run)
    return None if times is None else float(np.median(times))


# %% [markdown]
# First, where flash2_fast stands: the harness's latest run on the H200, its forward against PyTorch's
# memory-efficient kernel and math path at $N = 4096$, each head dimension.

# %%
if recorded.available():
    latest = recorded.LATEST_BENCH_CSV
    rows = [r for r in recorded.bench_rows(["flash2_fast", "torch-efficient"], "fwd", 4096, latest)]
    print(recorded.bench_table(["flash2_fast", "torch-efficient"], "fwd", 4096, latest))
    lessonkit.show(pictures.recorded_times(rows, f"{recorded.LABEL}: forward, N = 4096, B*H = 32, float32"))

# %% [markdown]
# Lesson 4 showed that a warp reading down one column of a shared tile waits for 32 passes, and that
# padding each row by one word removes the conflict.

# %% [markdown]
# ## 1. A bank conflict, and two fixes
#
# Padding fixes a warp that walks down one column. Real kernels store in less tidy patterns. An earlier
# version of `flash2_fast`'s forward wrote each block of probabilities $P_{ij}$ into shared
# memory *transposed*, so that its product $P_{ij} V_j$ can read each thread's rows as 16-byte vectors.
#
# - Its 128 threads form an $8 \times 16$ grid.
# - Thread $(t_y, t_x)$ owned $T_M$ rows and $T_N$ *adjacent* keys.
# - It stored the probability of row $t_y T_M + a$ and key $t_x T_N + b$ at word
#   $(t_x T_N + b)\,P_S + t_y T_M + a$, where the row stride $P_S = B_r + 4$.
# - A warp is two rows of the grid: $t_y \in \{0, 1\}$ and $t_x = 0, \dots, 15$.
#
# **Predict, then run.** Take the $64 \times 32$ block: $T_M = 8$, $T_N = 2$, $P_S = 68$. How many passes
# does one such store take (say $a = b = 0$)?

# %%
my_prediction = None  # passes of one store of P^T


# %%
def store_passes(TM, TN, PS):
    """Passes one warp (ty = 0, 1; tx = 0..15) needs to store element (a, b) = (0, 0) of its micro-tiles into P^T."""
    ty, tx = np.divmod(np.arange(32), 16)
    banks = ((tx * TN) * PS + ty * TM) % 32  # 32 different words: the passes are the fullest bank's count
    return int(np.bincount(banks, minlength=32).max())


p_store_passes = store_passes(8, 2, 68)
lessonkit.compare_prediction("passes of one store of P^T", my_prediction, p_store_passes)

# %% [markdown]
# Nsight Compute measured that kernel's shared stores on the H200, over all its stores. Its transposed
# $K_j^\top$ tile was stored with a 4-way conflict, and $V_j$ without one. The average below mixes those
# with $P_{ij}^\top$'s stores.

# %%
if recorded.available():
    shipped = recorded.shared_store_conflicts()[0]
    print(recorded.cite(recorded.FORWARD_NCU_TXT))
    print(f"{recorded.LABEL}: flash2_fast forward (before the fix below), d = 64, 64 x 32 blocks, N = 4096, "
          f"compute capability {shipped['cc']} ({recorded.folder_provenance(recorded.FORWARD_NCU_TXT)['file']})")
    print(f"  shared stores: a {shipped['ways']:.1f}-way conflict on average; "
          f"{shipped['conflicts'] / shipped['store_wavefronts']:.0%} of their {shipped['store_wavefronts']:,} passes "
          f"are conflicts")

# %% [markdown]
# Is it worth fixing? The project tried first with the classic tool. No padding that keeps 16-byte rows
# spreads these stores. An *XOR swizzle* does: store 4 rows at a time and move 16-byte chunk $c$ of key $k$
# to chunk $c \oplus (\lfloor k / T_N \rfloor \bmod 8)$. The product reads with the same rule. The table below
# is that forward timed against the one before, twice each, alternating.

# %%
if recorded.available():
    prov = recorded.folder_provenance(recorded.SWIZZLE_CSV)
    times = {}
    for r in recorded.swizzle_rows():
        if r["d"] == "64":
            times.setdefault((r["block"], r["causal"]), {}).setdefault(r["tree"], []).append(float(r["ms"]))
    print(recorded.cite(recorded.SWIZZLE_CSV))
    print(f"{recorded.LABEL}: {prov['device']}, commit {prov['commit']} ({prov['file']}); N = 4096, d = 64, B*H = 32")
    print(f"{'block':>7} {'causal':>7} {'before ms':>10} {'swizzled ms':>12}")
    for (block, causal), t in times.items():
        print(f"{block:>7} {causal:>7} {min(t['before']):>10.3f} {min(t['swizzled']):>12.3f}")

# %% [markdown]
# In the $64 \times 32$ block the product still read 16-byte vectors, and the conflict-free stores made the
# kernel a little faster. In the $64 \times 64$ block the compiler split each swizzled 16-byte read into four
# single loads, and the kernel got slower. A fix pays only if it costs less than it saves.

# %% [markdown]
# ### The fix that shipped: change which keys a thread owns
#
# The swizzle moves the *data*. The fix that shipped moves the *threads*. Thread $(t_y, t_x)$ now owns the
# keys $t_x, t_x + 16, t_x + 32, \dots$: 16 apart, not adjacent. It still computes $T_M \times T_N$ scores,
# and nothing else in the algorithm changes. What changes is where its stores land:
#
# - It stores each key's $T_M = 8$ probabilities with two 16-byte stores at word $(t_x + 16 b)\,P_S + t_y T_M$.
# - For 16-byte accesses the hardware serves 8 threads at a time (8 x 16 bytes = 128 bytes, one pass if their
#   8 chunks fall on 8 different groups of 4 banks). A warp's 512 bytes need at least 4 passes.
#
# **Predict, then run.** With the $64 \times 64$ block ($T_M = 8$, $P_S = 68$, so a row is 17 chunks of
# 16 bytes), how many passes does one warp's 16-byte store of $P_{ij}^\top$ take with keys 16 apart? The
# function below counts them; the old layout (adjacent keys, $T_N = 4$) is printed beside it.

# %%
my_prediction = None  # passes of one 16-byte store of P^T, keys 16 apart


# %%
def vector_store_passes(words):
    """Passes one warp needs when thread t stores 16 bytes at words[t] .. words[t] + 3: the hardware takes the
    threads 8 at a time, and a group's passes are the most of its threads whose chunk lands on the same 4 banks."""
    chunks = (np.asarray(words) // 4) % 8  # 8 chunks of 16 bytes span the 32 banks
    return sum(int(np.bincount(group, minlength=8).max()) for group in chunks.reshape(4, 8))


ty, tx = np.divmod(np.arange(32), 16)
p_strided = vector_store_passes(tx * 68 + ty * 8)  # key tx + 16 b (b = 0), rows ty*8 ..: keys 16 apart
p_adjacent = vector_store_passes(tx * 4 * 68 + ty * 8)  # key tx*4 + b (b = 0): adjacent keys, T_N = 4
lessonkit.compare_prediction("passes of one 16-byte store, keys 16 apart", my_prediction, p_strided)
print(f"adjacent keys would take {p_adjacent} passes for the same 512 bytes")

# %% [markdown]
# With keys 16 apart, neighbouring threads write rows 17 chunks apart: an odd number, so 8 neighbours hit
# 8 different chunks. Adjacent keys put them $4 \times 17$ chunks apart, and 8 neighbours share 2 chunks.
# The same trick lets the kernel keep $K_j$ row-major (row stride 68, again 17 chunks) and read each key's
# row 16 bytes at a time, where $K_j^\top$ had 4-way conflicted stores. The order in which each score sums
# its $d$ products is unchanged, so the backward, which recomputes the scores, still gets the same bits.
#
# Here is the forward on the H200, change by change, each timed twice, alternating (best of the two), beside
# PyTorch's memory-efficient kernel in the same runs. Two more changes came with it: $K_j$ and $V_j$ are read
# from global memory 16 bytes a thread, and written into shared memory 16 bytes at a time
# (`flash_numba/kernels/_vec.py`).

# %%
STEPS = {"main": "adjacent keys (before)", "keys16": "keys 16 apart, P^T in 16-byte stores, fmax row max",
         "keys16v": "+ 16-byte global loads of K_j, V_j", "keys16s": "+ 16-byte shared stores of K_j, V_j"}
if recorded.available():
    rows = [r for r in recorded.forward_step_rows() if r["d"] == "64" and r["tree"] in STEPS]
    best = {}
    for r in rows:
        key = (r["tree"] if r["implementation"] == "flash2_fast" else "torch", r["causal"])
        best[key] = min(best.get(key, np.inf), float(r["ms"]))
    commits = {r["tree"]: r["commit"] for r in rows}
    print(recorded.cite(recorded.FORWARD_STEP_FOLDERS[0] / "commit.txt"))
    print(f"{recorded.LABEL}: NVIDIA H200, N = 4096, d = 64, B*H = 32, float32 "
          f"({recorded.source_file(recorded.FORWARD_STEP_FOLDERS[0].parent)}/A, B)")
    print(f"{'forward':<48} {'commit':>8} {'ms':>7} {'causal ms':>10}")
    for tree, label in STEPS.items():
        print(f"{label:<48} {commits[tree]:>8} {best[tree, 'False']:>7.3f} {best[tree, 'True']:>10.3f}")
    print(f"{'PyTorch memory-efficient (same runs)':<48} {'':>8} {best['torch', 'False']:>7.3f} "
          f"{best['torch', 'True']:>10.3f}")

# %% [markdown]
# Nsight Compute on the new forward. Careful with its "ways": it divides the store passes by the store
# instructions, and a 16-byte store needs 4 passes even with no conflict, so 4.0 is the floor here, not 1.0.
# Read the share of passes that are conflicts instead. (The profile before was of the $64 \times 32$ block, this
# one of the $64 \times 64$ block the kernel now chooses: compare the shares, not the counts.)

# %%
if recorded.available():
    after = recorded.shared_store_conflicts(recorded.FORWARD_NCU_AFTER_TXT)[0]
    print(recorded.cite(recorded.FORWARD_NCU_AFTER_TXT))
    print(f"{recorded.LABEL}: flash2_fast forward (keys 16 apart), d = 64, 64 x 64 blocks, N = 4096 "
          f"({recorded.folder_provenance(recorded.FORWARD_NCU_AFTER_TXT)['file']})")
    print(f"  {after['store_wavefronts']:,} store passes for {after['store_requests']:,} store instructions "
          f"({after['ways']:.1f} a store); {after['conflicts'] / after['store_wavefronts']:.0%} of the passes are "
          f"conflicts (before: {shipped['conflicts'] / shipped['store_wavefronts']:.0%})")

# %% [markdown]
# A conflict costs time only where shared memory is what the kernel waits for, and this kernel waited for it.
# Two fixes removed the same conflict; the one that also kept every read 16 bytes wide won. Measure the
# conflict, then measure the fix. (`docs/PERFORMANCE.md` has the whole story.)

# %% [markdown]
# ## 2. Beyond 48 KB: dynamic shared memory
#
# The lessons' block sizes came from 48 KB of shared memory (lesson 5): the most a kernel may declare
# *statically*, with a fixed size in its code, on every GPU. A GPU may give one block more, if the kernel asks:
# it declares an array of unknown size (`cuda.shared.array(0, dtype)` in Numba), the launch says how many bytes
# it gets (`kernel[grid, block, stream, nbytes]`), and above 48 KB the kernel must first opt in through the
# driver (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`). A T4 allows 64 KB that way, an A100 163 KB, an
# H100 or H200 227 KB. `flash2_fast` uses it on H100/H200-class GPUs (where it was measured to pay):
# `flash_numba/kernels/_smem.py` holds a block's tiles in one array, static up to 48 KB, dynamic above.
#
# Why it pays: `flash2_fast` gives each thread an $8 \times 2$ tile of $S_{ij}$ (16 multiply-adds for every
# 10 numbers it reads from shared memory), but at $d = 128$ the tiles of an $8 \times 2$ block do not fit 48 KB,
# so it had to fall back to $4 \times 1$ tiles, with half the reuse.

# %% [markdown]
# ### Your turn: the shared memory of one block
#
# `flash2_fast`'s forward runs 128 threads as an $8 \times 16$ grid; with $T_M \times T_N$ tiles per thread a
# block holds $B_r = 8 T_M$ query rows and $B_c = 16 T_N$ keys. It keeps four tiles in shared memory:
# $Q_i^T$ (transposed: $D_P$ rows of $B_r + p$ numbers), $K_j$ ($B_c$ rows of $D_P + p$), $V_j$ ($B_c$ rows of
# $D_P$) and $P_{ij}^T$ ($B_c$ rows of $B_r + p$), where $D_P = 16 \lceil d / 16 \rceil$ pads $d$ to a multiple of
# 16 and $p$ pads a row by one 16-byte vector (4 float32 numbers), so that threads reading or writing 16 bytes at
# the same place of different rows hit different banks (lesson 4). Write the bytes.

# %%
def tile_bytes(d, TM, TN, itemsize):
    """Shared memory of one flash2_fast forward block with TM x TN tiles per thread, at head dim d."""
    # Your turn
    raise NotImplementedError("Q_i^T, K_j, V_j and P_ij^T, rows (but V_j's) padded by one 16-byte vector")


# %%
mine_tiles = ex.check("tile_bytes", tile_bytes)
assert ex.check_solution("tile_bytes")
tiles = tile_bytes if mine_tiles else ex.solution_fn("tile_bytes")
for d_ in (64, 128):
    for TM, TN in ((8, 2), (4, 1)):
        b = tiles(d_, TM, TN, 4)
        print(f"d = {d_:>3}, {TM} x {TN} tiles (Br = {8 * TM}, Bc = {16 * TN}): {b / 1024:5.1f} KB"
              f"{'  > 48 KB' if b > 48 * 1024 else ''}")

# %% [markdown]
# The block each GPU gets: `flash2_fast`'s rule tries the tile shapes measured fastest for that head dim and
# takes the first that fits (with 48 KB, and with an H200's 227 KB):

# %%

H200_OPTIN = device.SHARED_OPTIN_BY_CC[(9, 0)]
for d_ in (32, 64, 96, 128):
    static, dynamic = (flash2_fast.choose_block(d_, np.float32, b) for b in (48 * 1024, H200_OPTIN))
    kb = flash2_fast.geometry(d_, dynamic[0] // 8, dynamic[1] // 16, np.float32)["smem"] / 1024
    print(f"d = {d_:>3}: {static} within 48 KB, {dynamic} on an H200 ({kb:.0f} KB)")
print(f"here: {fn.resolve_block('flash2_fast', 128, np.float32)} at d = 128")

# %% [markdown]
# The same kernel code runs either way; only where its tiles live changes. Run both paths here
# (`_switches.DYNAMIC_ABOVE = 0` sends every block to dynamic shared memory, even a small one) and compare
# the bits:

# %%
q_s, k_s, v_s = (rng.standard_normal((2, 37, 16)).astype(np.float32) for _ in range(3))
o_static = fn.attention_forward(q_s, k_s, v_s, kernel="flash2_fast", causal=True).o
_switches.DYNAMIC_ABOVE = 0
try:
    o_dynamic = fn.attention_forward(q_s, k_s, v_s, kernel="flash2_fast", causal=True).o
finally:
    _switches.DYNAMIC_ABOVE = 48 * 1024
same_bits = np.array_equal(o_static, o_dynamic)
print(f"static and dynamic shared memory give the same bits: {same_bits}")

# %% [markdown]
# **Measure.** On a GPU whose blocks may use more than 48 KB, the next cell times $d = 128$ with the block that
# fits 48 KB and with the one the device allows. Elsewhere it prints what the project recorded on an H200.

# %%
dyn_ms = {}
if not SIM and fn.resolve_block("flash2_fast", 128, np.float32) != (32, 16):
    x = [cuda.to_device(rng.standard_normal((32, 4096, 128)).astype(np.float32)) for _ in range(3)]
    for blk in ((32, 16), fn.resolve_block("flash2_fast", 128, np.float32)):
        dyn_ms[blk] = median_ms(lambda: fn.attention_forward(*x, kernel="flash2_fast", block=blk))
        print(f"d = 128, N = 4096, B*H = 32, block {blk}: {dyn_ms[blk]:.2f} ms")
elif recorded.available():
    print(recorded.cite(recorded.BLOCK_SWEEP_CSV))
    print(f"{recorded.LABEL}: {recorded.provenance(recorded.BLOCK_SWEEP_CSV)['device']}, "
          f"{recorded.provenance(recorded.BLOCK_SWEEP_CSV)['file']}")
    for r in recorded.block_sweep_rows(128):
        if r["causal"] == "False":
            kb = flash2_fast.geometry(128, int(r["Br"]) // 8, int(r["Bc"]) // 16, np.float32)["smem"] / 1024
            print(f"d = 128, N = 4096, B*H = 32, block ({r['Br']}, {r['Bc']}), {kb:.0f} KB: {float(r['ms']):.2f} ms")

# %% [markdown]
# ## 3. How many blocks an SM holds

# %% [markdown]
# ### Your turn: blocks per SM
#
# More shared memory per block buys reuse, but it has a price: an SM runs the blocks whose tiles fit its shared
# memory *at once*, and those blocks' warps are all it has to switch between. A warp waiting for a shared-memory
# load leaves the scheduler idle unless another warp is ready. Registers limit the same count: an SM has 65,536,
# handed out 8 per thread at a time. And the driver keeps 1 KB of shared memory per block for itself.
#
# Write the number of blocks of one kernel an SM holds at once: the fewer of the two limits.

# %%
def blocks_per_sm(tile_bytes, registers, threads, smem_per_sm):
    """Blocks an SM holds at once: tiles of tile_bytes, registers per thread, threads per block."""
    # Your turn
    raise NotImplementedError("min(by registers: 65,536 / (registers rounded up to 8 x threads), "
                              "by shared memory: smem_per_sm / (tile_bytes + 1 KB))")


# %%
mine_blocks = ex.check("blocks_per_sm", blocks_per_sm)
assert ex.check_solution("blocks_per_sm")
per_sm = blocks_per_sm if mine_blocks else ex.solution_fn("blocks_per_sm")

# %% [markdown]
# `flash2_fast`'s backward kernel for $dK_j, dV_j$ at $d = 128$ runs blocks of 32 keys $\times$ 32 queries with 128
# threads and 168 registers each. It keeps six tiles in shared memory: $K_j^T$, $V_j^T$, $Q_i$, $dO_i$, $P_{ij}$ and
# $dS_{ij}$. Nsight Compute found it waiting on shared-memory loads with no warp ready in 42% of its cycles.
# $P_{ij}$ and $dS_{ij}$ feed two products, $dV_j \mathrel{+}= P^T dO_i$ and $dK_j \mathrel{+}= dS^T Q_i$. Run
# those one after the other, and $dS$ can be written over $P$ in between, so that one tile serves both.
#
# **Predict, then run.** Does that one tile less (4,608 bytes) change how many blocks an H200 SM (228 KB) holds?
# If it does, by how much should the backward get faster: not at all, a little, or in proportion to the warps?

# %%
my_prediction = None  # blocks of the kernel an H200 SM holds with P and dS in one tile (two before)

# %%
H200_SM = 228 * 1024
g128 = flash2_fast.layout.geometry_kv(128, 4, 2, np.float32)  # the dK/dV kernel's tiles at d = 128, 32 x 32
one_tile = g128["smem"]
two_tiles = one_tile + g128["Br"] * g128["PS"] * 4  # dS in a tile of its own, as in the build before
held = {name: per_sm(b, 168, 128, H200_SM) for name, b in (("two", two_tiles), ("one", one_tile))}
for name, b in (("two", two_tiles), ("one", one_tile)):
    print(f"P and dS in {name} tile{'s' * (name == 'two')}: {b:,} bytes a block -> {held[name]} blocks "
          f"({4 * held[name]} warps) an SM")
print(f"the library's own count (flash2_fast.layout.kvq_blocks_per_sm): "
      f"{flash2_fast.layout.kvq_blocks_per_sm(32, 32, 128, np.float32, (9, 0), H200_SM)}")
lessonkit.compare_prediction("blocks an SM, P and dS in one tile", my_prediction, held["one"])

# %% [markdown]
# **Measure.** On a GPU the next cell builds the kernel both ways (`flash2_fast.layout.p_ds_tiles`) and times the
# atomic backward at $d = 128$, $N = 4096$, $B \cdot H = 32$, with the blocks an SM of this GPU holds each way.
# Predict first with `blocks_per_sm` and your GPU's numbers: on a T4 (64 KB an SM, blocks within 48 KB) does the
# saving buy a block? The cell after it runs anywhere, the simulator included: it prints what the project recorded
# on an H200, the two builds alternating.

# %%
if not SIM:
    gpu = device.info()
    xs = [cuda.to_device(rng.standard_normal((32, 4096, 128)).astype(np.float32)) for _ in range(4)]
    f128 = fn.attention_forward(*xs[:3], kernel="flash2_fast")
    blk = fn.resolve_block("flash2_fast", 128, np.float32, pass_="backward", deterministic=False)
    for share in (False, True):
        with flash2_fast.layout.p_ds_tiles(share):
            n_blocks = flash2_fast.layout.kvq_blocks_per_sm(*blk, 128, np.float32, gpu.compute_capability,
                                                            gpu.shared_mem_per_sm)
            t = median_ms(lambda: fn.attention_backward(*xs[:3], f128.o, f128.lse, xs[3], kernel="flash2_fast",
                                                        deterministic=False))
        print(f"{gpu.name}, block {blk}, P and dS in {'one tile' if share else 'two tiles'}: {n_blocks} blocks an SM, "
              f"backward {t:.2f} ms")

# %%
if recorded.available():
    tile_rows = recorded.shared_tile_rows()
    print(recorded.cite(recorded.SHARED_TILE_CSVS["one", 1]))
    print(f"{recorded.LABEL}: {tile_rows[0]['device']}, d = 128, N = 4096, B*H = 32, backward only "
          f"({', '.join(sorted({r['file'] for r in tile_rows}))})")
    print(f"{'P, dS in':<10} {'backward':<14} {'causal':<7} {'ms':>7}   commit")
    for r in sorted(tile_rows, key=lambda r: (r["mode"], r["causal"], r["tiles"] == "one", r["run"])):
        tiles_ = f"{r['tiles']} tile{'s' * (r['tiles'] == 'two')}"
        print(f"{tiles_:<10} {r['mode']:<14} {r['causal']:<7} {r['ms']:7.2f}   {r['commit']}")
    gain = {mode: min(r["ms"] for r in tile_rows if r["mode"] == mode and r["causal"] == "False" and
                      r["tiles"] == "two") /
            min(r["ms"] for r in tile_rows if r["mode"] == mode and r["causal"] == "False" and r["tiles"] == "one")
            for mode in ("deterministic", "atomic")}
    print("speed-up, no mask: " + ", ".join(f"{m} {g:.2f}x" for m, g in gain.items()))

# %% [markdown]
# Half again as many warps, and 11-14% less time: the new warps hide part of the waiting, not all of it. The same
# rule explains why the atomic backward at $d = 64$ stopped at 3 blocks of 32 x 64 (its 167 registers) and
# why a 64 x 64 block, at 200 registers and 2 blocks an SM, measured slower despite its larger tiles
# (`docs/PERFORMANCE.md`).

# %% [markdown]
# ### Your turn: shared loads per multiply-add
#
# More warps hide the wait for shared memory; fewer loads shorten it. In the same kernel's largest loop every
# thread computes a $T_M \times T_N$ micro-tile of $S^T = K_j Q_i^T$ *and* one of $dP^T = V_j\, dO_i^T$. For each
# step $k$ of the inner dimension it loads $T_M$ values of $K_j^T$, $T_M$ of $V_j^T$, $T_N$ of $Q_i$ and $T_N$ of
# $dO_i$, and does $2 T_M T_N$ multiply-adds. The shipped kernel gives $S^T$ to warps 0-1 and $dP^T$ to warps 2-3: each
# thread a $T_M \times 2T_N$ tile of one product, as many multiply-adds and accumulators. (The price: $dS = P \circ
# (dP - D)$ needs $P$ from the other warps, handed over through the $P$ tile in shared memory, which was written
# anyway.)
#
# Write the loads per multiply-add, split or not.

# %%
def loads_per_madd(TM, TN, split):
    """Shared-memory loads per multiply-add of the S^T, dP^T loop, one product a thread (split) or both."""
    # Your turn
    raise NotImplementedError("(loads of one step k) / (2 TM TN): 2 TM + 2 TN loads, or TM + 2 TN split")


# %%
mine_loads = ex.check("loads_per_madd", loads_per_madd)
assert ex.check_solution("loads_per_madd")
per_madd = loads_per_madd if mine_loads else ex.solution_fn("loads_per_madd")

# %% [markdown]
# **Predict, then run.** At $d = 128$ the block is 32 x 32 ($T_M = 4$, $T_N = 2$). Split, the loop loads a third
# fewer values for the same arithmetic, with the same registers (168) and blocks an SM (3). How much faster is
# the whole backward: a third, about a tenth of that loop's share of the time, or not at all (the loop waits on
# load *latency*, not on their number)?

# %%
my_prediction = None  # backward time split / not split, d = 128 atomic, e.g. 0.95

# %%
for TM, TN, what in ((4, 2, "d = 128, 32 x 32"), (8, 2, "d = 64 atomic, 32 x 64")):
    print(f"{what}: {per_madd(TM, TN, False):.3f} loads per multiply-add both in a thread, "
          f"{per_madd(TM, TN, True):.3f} split")
split_ratio = None
if not SIM:  # both builds of the kernel, timed here (flash2_fast.layout.s_dp_split)
    blk = fn.resolve_block("flash2_fast", 128, np.float32, pass_="backward", deterministic=False)
    xs = [cuda.to_device(rng.standard_normal((32, 4096, 128)).astype(np.float32)) for _ in range(4)]
    f128 = fn.attention_forward(*xs[:3], kernel="flash2_fast")
    split_ms = {}
    for split in (False, True):
        with flash2_fast.layout.s_dp_split(split):
            split_ms[split] = median_ms(lambda: fn.attention_backward(*xs[:3], f128.o, f128.lse, xs[3],
                                                                      kernel="flash2_fast", deterministic=False))
        print(f"{device.info().name}, block {blk}, S^T and dP^T {'split' if split else 'in every thread'}: "
              f"backward {split_ms[split]:.2f} ms")
    split_ratio = split_ms[True] / split_ms[False]
if recorded.available():
    split_rows = recorded.split_s_dp_rows()
    print(recorded.cite(recorded.SPLIT_S_DP_CSVS["split"]))
    print(f"{recorded.LABEL}: {split_rows[0]['device']}, d = 128, N = 4096, B*H = 32, backward only")
    for r in sorted(split_rows, key=lambda r: (r["mode"], r["causal"], r["threads"])):
        print(f"  {r['mode']:<14} causal={r['causal']:<6} {r['threads']:<6} {r['ms']:7.2f} ms   {r['commit']}")
    rec = {(r["threads"], r["mode"]): r["ms"] for r in split_rows if r["causal"] == "False"}
    split_ratio = split_ratio or rec["split", "atomic"] / rec["both", "atomic"]
if split_ratio is not None:
    lessonkit.compare_prediction("backward time, split / not", my_prediction, round(split_ratio, 3))

# %% [markdown]
# A third fewer loads in the largest loop, 6-7% less time for the whole backward: the loop waits less, but it is
# one part of five products, the softmax, the barriers and the atomics. Where the split made a build need more
# registers, it lost a block an SM and ran slower ($d = 96$: `docs/PERFORMANCE.md`), so the library
# splits only where the registers allow (`flash2_fast.layout.split_s_dp`). Fewer loads and more warps are two
# answers to one question: what does a warp do while it waits?

# %% [markdown]
# ### The same count, one loop further: dQ
#
# The atomic kernel has a fifth product, $dQ_i \mathrel{+}= dS_{ij} K_j$, added into $dQ$ with atomics (or into the
# split backward's copies). A warp owns $R_W = 8$ query rows of it, and in the first build each of its 32 lanes took
# the columns lane, lane + 32, ..: at $d = 64$, 8 rows $\times$ 2 columns. For every 4 keys a lane loads one 16-byte
# vector of $K_j^T$ (4 keys) per column it holds and one of $dS_{ij}$ per row: 10 vectors for 16 multiply-adds of 4,
# where the loops above now load 4-6. Split the lanes into two groups of 16: group $h$ takes rows $4h, \dots, 4h + 3$
# and lane $l$ of it the columns $l, l + 16, \dots$: 4 $\times$ 4 a lane. The rows' width $D_P$ is $d$ rounded up to
# 16; where 32 (or 16) does not divide $D_P$, the lanes past it idle in the last block of columns, and only the
# multiply-adds of columns that exist count.
#
# Write the vectors per useful multiply-add of 4, for $R_W$ rows, $D_P$ columns and the lanes in 1 or 2 groups.

# %%
def dq_loads_per_madd(RW, DP, groups):
    """16-byte loads per useful multiply-add of 4 in the dQ loop, the warp's lanes in ``groups`` groups."""
    # Your turn
    raise NotImplementedError("(ceil(groups DP / 32) + RW / groups) / ((RW / groups) (groups DP / 32))")


# %%
mine_dq = ex.check("dq_loads_per_madd", dq_loads_per_madd)
assert ex.check_solution("dq_loads_per_madd")
dq_per_madd = dq_loads_per_madd if mine_dq else ex.solution_fn("dq_loads_per_madd")

# %% [markdown]
# **Predict, then read.** At $d = 64$ two groups load a fifth fewer vectors in a loop that is a fifth of the
# backward's arithmetic. How much faster is the atomic backward: about 1%, or more?

# %%
my_prediction = None  # atomic backward time, two groups / one, d = 64, e.g. 0.99

# %%
print(f"{'d':>4} {'RW':>3} {'one group':>10} {'two groups':>11}   fewer   library's rule")
agree = True
for d, RW in ((32, 8), (64, 8), (80, 8), (96, 4), (128, 8)):
    DP = -(-d // 16) * 16
    one, two = dq_per_madd(RW, DP, 1), dq_per_madd(RW, DP, 2)
    fewer = 2 if two < one else 1
    rule = flash2_fast.layout.dq_lane_groups(RW, DP)
    agree &= fewer == rule
    print(f"{d:4d} {RW:3d} {one:10.3f} {two:11.3f}   {fewer:5d}   {rule}")
lane_ratio = None
if recorded.available():
    lane_rows = recorded.dq_lane_rows()
    print(recorded.cite(recorded.DQ_LANE_CSVS[2, "a"]))
    print(f"{recorded.LABEL}: {lane_rows[0]['device']}, d = 64, N = 4096, B*H = 32, backward only, "
          f"commit {lane_rows[0]['commit']} ({lane_rows[0]['file'].rsplit('/', 1)[0]})")
    print(f"{'block':<7} {'backward':<14} {'causal':<7} {'one group, ms':>16} {'two groups, ms':>16}")
    for bc, mode, causal in sorted({(r["Bc"], r["mode"], r["causal"]) for r in lane_rows}):
        ms = {g: [r["ms"] for r in lane_rows if (r["groups"], r["Bc"], r["mode"], r["causal"]) == (g, bc, mode, causal)]
              for g in (1, 2)}
        print(f"32x{bc:<4} {mode:<14} {causal:<7} {' / '.join(f'{x:.2f}' for x in ms[1]):>16} "
              f"{' / '.join(f'{x:.2f}' for x in ms[2]):>16}")
    shipped = [r for r in lane_rows if (r["Bc"], r["mode"], r["causal"]) == ("64", "atomic", "False")]
    lane_ratio = (sum(r["ms"] for r in shipped if r["groups"] == 2) / sum(r["ms"] for r in shipped if r["groups"] == 1))
    lessonkit.compare_prediction("atomic backward, two groups / one", my_prediction, round(lane_ratio, 3))

# %% [markdown]
# (At $d = 64$ the atomic backward runs 32 x 64 blocks, the default one 32 x 32: the rows the library ships.)
# About 3% where a fifth of a fifth predicted 1%: in a loop that waits on its loads, each load fewer takes its
# latency out too, not only its issue slot. At $d = 80$ one group left half its lanes idle over columns 64-95;
# two groups of 16 cover 80 columns exactly, and the harness's atomic forward + backward went from 25.8 to 23.0 ms
# (`docs/PERFORMANCE.md`). On a GPU, `flash2_fast.layout.dq_lanes(1)` builds the kernel with one group,
# to time both yourself.

# %% [markdown]
# ## 4. The backward: three ways to compute dQ
#
# Lesson 9's flash2 runs three backward kernels: $D$, then $dK$, $dV$ per key block, then $dQ$ per query
# block. In lesson 7 you wrote the two ways to compute $dQ$: one owner per row, and atomic adds from the
# key side. flash2_fast offers both, and a third.

# %% [markdown]
# ### How many atomic additions? More keys a block, fewer
#
# A thread block of the atomic backward owns $B_c$ keys. For every query row it visits it adds its part of
# $dQ$, $dS_{ij} K_j$, into all $d$ columns of that row in HBM: one atomic addition per element, which reads
# and writes 4 bytes (float32). With no mask every block visits every query row, so a call makes
# $T_c \cdot N_q \cdot d$ additions, $T_c = \lceil N_k / B_c \rceil$: twice the keys a block, half the additions.
# The counters count each addition as 4 bytes read and 4 written.
#
# **Predict.** One head, $N_q = N_k = 64$, $d = 16$, float32. How many bytes does the dK/dV/dQ launch write with
# key blocks of $B_c = 16$, and of $B_c = 32$? (Besides the additions it writes $dK$ and $dV$ once each.)

# %%
my_written_16 = None  # bytes written by the dK, dV, dQ (atomic) launch, Bc = 16
my_written_32 = None  # the same, Bc = 32

# %%
n_a, d_a = 64, 16
qa, ka, va, doa = (rng.standard_normal((1, n_a, d_a)).astype(np.float32) for _ in range(4))
fa = fn.flash_attention_forward(qa, ka, va, kernel="flash2_fast")
atomic_written = {}
for Bc in (16, 32):  # block = (Br, Bc): 16 query rows a step, Bc keys a block
    ga = fn.flash_attention_backward(qa, ka, va, fa.o, fa.lse, doa, kernel="flash2_fast", deterministic=False,
                                     block=(16, Bc), count_hbm=True)
    atomic_written[Bc] = ga.hbm.per_kernel["flash2_fast dK, dV, dQ (atomic)"].bytes_written
lessonkit.compare_prediction("bytes written, Bc = 16", my_written_16, atomic_written[16])
lessonkit.compare_prediction("bytes written, Bc = 32", my_written_32, atomic_written[32])
print(f"dK and dV: {2 * n_a * d_a * 4} B; the additions: {atomic_written[16] - 2 * n_a * d_a * 4} B at Bc = 16, "
      f"{atomic_written[32] - 2 * n_a * d_a * 4} B at Bc = 32")

# %% [markdown]
# On the H200 the same halving paid (recorded below: the backward alone, N = 4096, B*H = 32, float32). A block
# of 64 keys also keeps a larger $dK_j$, $dV_j$ in registers, so each number loaded from shared memory feeds
# more multiply-adds. flash2_fast's atomic backward therefore takes 64 keys a block at $d \le 64$ on GPUs that give
# a block more than 48 KB of shared memory, like the H200 where it was measured
# (`fn.resolve_block("flash2_fast", 64, np.float32, pass_="backward", deterministic=False)`); the deterministic
# backward keeps 32: it measured slower with 64.

# %%
from flash_numba import blocks
from flash_numba.kernels import flash2_fast as fast_kernels

if recorded.available():
    print(recorded.cite(recorded.ATOMIC_BLOCK_CSVS[0]))
    for r in recorded.atomic_block_rows():
        print(f"{recorded.LABEL}: {r['device']}, d = {r['d']:>2}, {r['Bc']} keys a block, causal {r['causal']:5}: "
              f"{float(r['ms']):6.2f} ms  ({r['file']})")
tiles_64_keys = fast_kernels.backward_smem(32, 64, 64, np.float32)  # shared bytes of 32 queries x 64 keys, d = 64
print(f"this device's choice at d = 64, {blocks.dynamic_budget() // 1024} KB of shared memory a block:",
      fn.resolve_block("flash2_fast", 64, np.float32, pass_="backward", deterministic=False),
      f"(64 keys need {tiles_64_keys // 1024} KB there)")

# %% [markdown]
# ### A third way: a copy of $dQ$ for each block that runs at once
#
# The atomic additions are non-deterministic only because several blocks add into the *same* $dQ_i$ at
# the same time. flash2_fast's default backward keeps the one pass and removes the race instead:
#
# * $S$ thread blocks per head, each with its **own copy** of $dQ$ in HBM (zeroed first);
# * the key tiles are dealt out in rounds of $S$, one launch per round: block $s$ adds $dS_{ij} K_j$ for its
#   tile of this round into copy $s$, and no other block touches copy $s$; launches run one after the other;
# * at the end, $dQ$ = copy 0 + copy 1 + ... + copy $S-1$, always in that order.
#
# Every addition now happens in a fixed order, so the result is bitwise reproducible, and each key tile
# still costs 5 block products (the two-pass way costs 7: its $dQ$ kernel recomputes $S$ and $dP$). The price
# is memory: $S$ copies of $dQ$. $S$ is the number of blocks per head that fills the GPU once
# (`flash_numba.kernels.flash2_fast.layout.dq_copies`); where that would not fit in 1 GiB, or cannot keep
# the GPU busy (few, short heads), the two-pass backward runs.
#
# **Predict.** An H200 has 132 SMs and holds 4 blocks of this kernel on each at $d = 64$ (528 at once). At
# $B \cdot H = 32$, $N = 4096$, $d = 64$ with key tiles of 32 rows, how many copies does it take, and how
# many MiB do they use in float32?

# %%
my_copies = None  # number of copies of dQ
my_copies_mib = None  # their size in MiB

# %%
from flash_numba.kernels.flash2_fast import layout as fast_layout

heads, n_long, d_long = 32, 4096, 64
dq_bytes = heads * n_long * d_long * 4
copies = fast_layout.dq_copies(heads, n_long // 32, dq_bytes, 132 * 4)
lessonkit.compare_prediction("copies of dQ", my_copies, copies)
lessonkit.compare_prediction("MiB of copies", my_copies_mib, copies * dq_bytes // 2**20)
print(f"{copies} blocks per head x {heads} heads = {copies * heads} blocks for 528 places, "
      f"{n_long // 32 // copies} key tiles each")

# %% [markdown]
# Now run it. Here the number of copies is forced to 2 (`FORCE_DQ_COPIES`, a switch for tests and
# benchmarks), so that even these small sizes take the split path; the counters show its four launches.

# %%
f_fast = fn.flash_attention_forward(q, k, v, kernel="flash2_fast")
_switches.FORCE_DQ_COPIES = 2
try:
    split_a, split_b = (fn.flash_attention_backward(q, k, v, f_fast.o, f_fast.lse, do, kernel="flash2_fast",
                                                    count_hbm=True) for _ in range(2))
finally:
    _switches.FORCE_DQ_COPIES = None
split_bitwise = all(np.array_equal(x, y) for x, y in zip((split_a.dq, split_a.dk, split_a.dv),
                                                         (split_b.dq, split_b.dk, split_b.dv)))
split_err = max(np.abs(g - r).max() / np.abs(r).max() for g, r in zip((split_a.dq, split_a.dk, split_a.dv),
                                                                      grads_ref))
for launch, nbytes in split_a.hbm.per_kernel.items():
    print(f"{launch:34s} read {nbytes.bytes_read:>10,} B  written {nbytes.bytes_written:>10,} B")
print(f"two runs bitwise identical: {split_bitwise}; max relative error of dQ, dK, dV: {split_err:.1e}")

# %% [markdown]
# Measured on the H200 (recorded): the backward alone, three ways, and the memory each call allocated.

# %%
if recorded.available():
    print(recorded.cite(recorded.BACKWARD_PATHS_CSV))
    print(f"{recorded.LABEL}: NVIDIA H200, {recorded.source_file(recorded.BACKWARD_PATHS_CSV)}")
    for r in recorded.backward_path_rows(d=64):
        how = f"split, {r['copies']} copies" if r["copies"] else r["path"]
        print(f"N = {r['N']:>4}, B*H = {r['BH']:>3}, causal {r['causal']:5}: {how:16} {float(r['ms']):7.3f} ms, "
              f"{r['peak_MB']:>4} MB allocated, same bits twice: {r['bitwise_repeat']}")

# %% [markdown]
# ## 5. What a call costs besides its kernels
#
# Lesson 10 counted the launches of each backward. **See them in microseconds.** The project timed one
# call on the H200 (PyTorch tensors, $N = 128$, $B \cdot H = 32$,
# $d = 64$, launch plans replayed; `benchmarks/host_overhead.py`), the library before and after flash2_fast's $dQ$
# kernel took over $D$, alternating, two runs each. Recorded, not measured now:

# %%
if recorded.available():
    print(recorded.cite(recorded.HOST_CSVS["after", 1]))
    host = recorded.host_rows()
    print(f"{'kernel':<12} {'pass':<5} {'before (us)':>12} {'after (us)':>11}   ({host[0]['device']}, "
          f"{host[0]['file'].rsplit('/', 1)[0]})")
    for kernel, pass_ in (("flash2_fast", "fwd"), ("flash2_fast", "bwd"), ("flash2", "bwd")):
        us = {t: [r["host_us"] for r in host if (r["tree"], r["kernel"], r["pass"]) == (t, kernel, pass_)]
              for t in ("before", "after")}
        before, after = (" / ".join(map(str, us[t])) for t in ("before", "after"))
        print(f"{kernel:<12} {pass_:<5} {before:>12} {after:>11}")

# %% [markdown]
# flash2_fast's backward, one launch fewer (and one allocation: a plan now keeps the small $D$ buffer instead of
# allocating it every call), lost about 6 microseconds a call. flash2's backward, whose launches did not change,
# is the control: it moved by a few microseconds between runs, which is the noise of the host, and so did the
# forward. Kernel time hides none of this at small $N$: the GPU waits for the host.

# %% [markdown]
# ## What to take away
#
# * Measure each change against the build before it, alternating, and keep only what pays: the swizzle
#   that removed a conflict but split 16-byte reads made the kernel slower.
# * More shared memory a block buys reuse, but an SM runs only the blocks its shared memory and registers
#   hold; one tile less can add a block, and more warps hide more waiting.
# * Fewer loads per multiply-add shorten the wait of a loop that waits on loads; count them before you time.
# * Atomic adds, a copy per block, or a second pass: three prices (bits, memory, arithmetic) for one $dQ$.
# * At small $N$ a call's time is the host's: count the launches.

# %% [markdown]
# ## Check

# %%
assert p_store_passes == 8 and store_passes(8, 2, 65) == 2  # an odd stride would spread them (no 16-byte rows)
assert not recorded.available() or recorded.shared_store_conflicts()[0]["ways"] > 1
assert tiles(128, 8, 2, 4) > 48 * 1024 >= tiles(64, 8, 2, 4) and same_bits
assert (held["two"], held["one"]) == (2, 3) and two_tiles - one_tile == 32 * 36 * 4
assert (per_madd(4, 2, False), per_madd(4, 2, True)) == (0.75, 0.5)
assert (dq_per_madd(8, 64, 1), dq_per_madd(8, 64, 2)) == (10 / 16, 8 / 16) and agree
for Bc in (16, 32):  # dK, dV once, and one addition per element of dQ per key block
    assert atomic_written[Bc] == 2 * n_a * d_a * 4 + 4 * d_a * n_a * (n_a // Bc), (Bc, atomic_written[Bc])
assert split_bitwise and split_err < 1e-4, (split_bitwise, split_err)
assert list(split_a.hbm.per_kernel)[1:] == [fast_layout.ZERO_DQ_COPIES_NAME, fast_layout.BACKWARD_KVQ_SPLIT_NAME,
                                            fast_layout.SUM_DQ_NAME]
print("appendix 1: all checks passed")
