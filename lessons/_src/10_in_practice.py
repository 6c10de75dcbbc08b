"""Source of lessons/10_in_practice.ipynb (build it with `python lessons/_build.py`)."""
# ruff: noqa: E402
# requires: flash_numba.tools.microbench

# %% [markdown]
# # Lesson 10: FlashAttention in practice
#
# In a real model you do not call our kernels: you call PyTorch's
# `torch.nn.functional.scaled_dot_product_attention` (SDPA), which dispatches to one of several
# implementations ("backends"):
#
# | backend | what it is |
# |---|---|
# | `FLASH_ATTENTION` | the FlashAttention-2 kernels (half precision only) |
# | `EFFICIENT_ATTENTION` | the memory-efficient kernels from xFormers: tiled and online-softmax too |
# | `CUDNN_ATTENTION` | cuDNN's fused attention (recent PyTorch, recent GPUs) |
# | `MATH` | plain PyTorch operations: $S$ and $P$ materialised, like our `standard` |
#
# SDPA picks the first backend whose constraints the call meets (dtype, head dimension, GPU architecture,
# mask, dropout...). If FlashAttention cannot run, it *silently* falls back to another backend, possibly
# the slow, $O(N^2)$-memory math path. This lesson compares our kernels with SDPA where PyTorch is
# installed, shows how to find out which backend actually ran, and ends with the memory problem that
# FlashAttention does not solve: the KV cache.

# %%
import sys

if "google.colab" in sys.modules:  # Colab: install flash_numba (see lesson 0)
    # !pip install -q "numba-cuda[cu12]==0.30.4"
    # !pip install -q --no-deps "git+@REPO_URL@"
    pass  # source-only

# %%

import numpy as np

import flash_numba as fn
from numba import cuda
from flash_numba import device, lessonkit, pictures, recorded, reference
from flash_numba.tools import microbench
from flash_numba import exercises as ex

SIM = device.SIMULATOR
print(device.describe())
try:
    import torch
    import torch.nn.functional as F

    TORCH = torch.__version__
    TORCH_GPU = torch.cuda.is_available() and not SIM
except ImportError:
    TORCH, TORCH_GPU = None, False
print(f"PyTorch: {TORCH or 'not installed'}; on a GPU: {TORCH_GPU}")


def median_ms(run):
    """Median time of run() in milliseconds over CUDA events, or None in the simulator."""
    times = device.time_ms(run)
    return None if times is None else float(np.median(times))


# %% [markdown]
# ## Our kernels against SDPA
#
# Our functions accept PyTorch CUDA tensors directly: they read them through `__cuda_array_interface__`,
# without a copy, and for such inputs they allocate their outputs with PyTorch and return PyTorch
# tensors. With PyTorch on a GPU the next cell runs SDPA with each backend forced in turn
# (`torch.nn.attention.sdpa_kernel`) in float32 and float16, records which ones refuse and why, and
# times them next to our flash2 (float32) against the float64 reference. With PyTorch on the CPU only,
# it compares SDPA's result with ours from the simulator; without PyTorch it says so.

# %%
B, H, N, d = (1, 1, 32, 16) if SIM else (4, 8, 4096, 64)
rng = np.random.default_rng(10)
q, k, v = (rng.standard_normal((B, H, N, d)).astype(np.float32) for _ in range(3))
sdpa_rows = []
if TORCH and not TORCH_GPU:
    ours = fn.flash_attention_forward(q, k, v, kernel="flash2")
    o_torch = F.scaled_dot_product_attention(*(torch.from_numpy(x) for x in (q, k, v))).numpy()
    cpu_diff = np.abs(o_torch - ours.o).max()
    print(f"SDPA on the CPU against our flash2 (simulator): max |difference| = {cpu_diff:.1e}")
elif TORCH_GPU:
    o_ref = reference.attention_forward(q[:1, :1], k[:1, :1], v[:1, :1])[0]  # one head is enough to check
    tq, tk, tv = (torch.as_tensor(x, device="cuda") for x in (q, k, v))
    res = fn.flash_attention_forward(tq, tk, tv, kernel="flash2")  # torch tensors in, torch tensors out
    err = np.abs(torch.as_tensor(res.o)[0, 0].double().cpu().numpy() - o_ref[0, 0]).max()
    t = median_ms(lambda: fn.flash_attention_forward(tq, tk, tv, kernel="flash2"))
    sdpa_rows.append(("flash_numba flash2", "float32", f"{t:.2f} ms", f"{err:.1e}"))
    sdpa_rows += lessonkit.sdpa_backend_rows(tq, tk, tv, o_ref[0, 0], median_ms)  # every backend, fp32 and fp16
    print(f"B = {B}, H = {H}, N = {N}, d = {d}; error: max |O - O_ref| on one head (float64 reference)")
    for row in sdpa_rows:
        print(f"  {row[0]:<20} {row[1]:<8} {row[2]:>9}   {row[3]}")
else:
    print("skipped: PyTorch is not installed (pip install torch to run this part)")

# %% [markdown]
# Read the refusals: each forced backend that cannot run says why (for example FlashAttention's kernels
# take only float16 and bfloat16, and need a recent enough GPU architecture). Those reasons are exactly
# the cases in which the *default* call quietly uses something else.
#
# ## Is FlashAttention actually being used?
#
# Three ways to find out, from the most to the least direct:
#
# 1. **Force it.** Run the call inside `with sdpa_kernel(SDPBackend.FLASH_ATTENTION):`. If FlashAttention
#    cannot run, SDPA raises instead of falling back, with warnings that name the reason. Useful in a
#    test: it turns a silent slowdown into an error.
# 2. **Profile it.** PyTorch's profiler records which operator ran:
#    `aten::_scaled_dot_product_flash_attention`, `..._efficient_attention`, `..._cudnn_attention`, or the
#    math path's `aten::_scaled_dot_product_attention_math`, and the GPU kernels under it.
# 3. **Measure it.** Peak memory (`torch.cuda.max_memory_allocated`) grows like $N^2$ on the math path
#    and like $N$ on the others; a sequence length that runs out of memory is the loudest symptom.
#
# Common reasons for a fallback: float32 inputs; an explicit `attn_mask` tensor where `is_causal=True`
# would do; a head dimension the kernels were not built for; dropout or a GPU architecture the backend
# does not support. The next cell profiles the default call in float32 and float16, causal through
# `is_causal=True` and through an explicit boolean mask (on the CPU when PyTorch has no GPU here: the
# CPU has its own backends, but the method is the same):

# %%
def backend_of(run):
    """The SDPA operators that run() executed, from the PyTorch profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return sorted({e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product")})


# %%
profiled = {}
if TORCH:
    where = "cuda" if TORCH_GPU else "cpu"
    causal_mask = torch.ones(N, N, dtype=torch.bool, device=where).tril()
    for dt in (torch.float32, torch.float16):
        xq, xk, xv = (torch.as_tensor(x, device=where).to(dt) for x in (q, k, v))
        cases = {
            "is_causal=True": lambda: F.scaled_dot_product_attention(xq, xk, xv, is_causal=True),
            "attn_mask=<bool tensor>": lambda: F.scaled_dot_product_attention(xq, xk, xv, attn_mask=causal_mask),
        }
        for label, run in cases.items():
            try:
                profiled[str(dt)[6:], label] = backend_of(run)
            except Exception as exc:  # some machines do not let the profiler run
                profiled[str(dt)[6:], label] = [f"profiler failed: {type(exc).__name__}: {exc}"]
    for (dt, label), ops in profiled.items():
        print(f"{where} {dt:<8} {label:<24} -> {', '.join(ops) or '(no SDPA operator recorded)'}")
else:
    print("skipped: PyTorch is not installed")

# %% [markdown]
# ## The KV cache: a different memory problem
#
# FlashAttention removes the $N \times N$ intermediate matrices. It does not remove the inputs. When a
# model *generates* text, each new token's query attends to the keys and values of every earlier token,
# of every layer; recomputing them at every step would cost a full forward pass over the prefix, so they
# are kept: the *KV cache*. Its size is linear in the context length, but with every layer and head
# counted it is large, and it grows with the batch.
#
# ## Your turn: the size of a KV cache
#
# Write the bytes of a KV cache for a model with `layers` layers of `heads` attention heads of dimension
# `d`, holding `context` tokens for each of `batch` sequences, `itemsize` bytes per number.

# %%
def kv_cache_bytes(layers, heads, d, context, batch, itemsize):
    """Bytes of the keys and values a decoder keeps for `batch` sequences of `context` tokens."""
    # Your turn
    raise NotImplementedError("keys and values, for every layer, head, token and sequence")


# %%
mine = ex.check("kv_cache_bytes", kv_cache_bytes)
assert ex.check_solution("kv_cache_bytes")
kv = kv_cache_bytes if mine else ex.solution_fn("kv_cache_bytes")

# %% [markdown]
# For Llama-2-7B (32 layers, 32 heads of dimension 128, about 7 billion parameters; Touvron et al.
# 2023) in float16 with a 4096-token context:

# %%
llama = dict(layers=32, heads=32, d=128, context=4096, itemsize=2)
per_seq = kv(batch=1, **llama)
weights = 7e9 * 2  # about 7e9 parameters in float16
print(f"KV cache, one sequence: {per_seq / 2**30:.2f} GiB; the weights: {weights / 2**30:.1f} GiB")
mem = device.info().total_memory or 16 * 2**30  # the simulator has none: a T4's 16 GB (datasheet)
fits = max(int((mem - weights) // per_seq), 0)
seqs = f"{fits} sequence{'s' * (fits != 1)}"
print(f"with {mem / 2**30:.0f} GiB of device memory, after the weights: {seqs} of 4096 tokens")

# %% [markdown]
# Decoding is also slow in a way FlashAttention cannot fix. At each step one new query per sequence meets
# all $N$ cached keys and values: $4Nd$ FLOPs per head against $2Nd$ numbers read, about 1 FLOP per byte
# in float16, far below any ridge point (lesson 1). Every step must read the whole cache from HBM, so
# the time per generated token is bounded below by the cache's bytes over the bandwidth:

# %%
hbm = microbench.hbm_bandwidth()
bw, src = (hbm.per_second, "measured") if hbm.value is not None else (320e9, "T4 datasheet, not measured")
intensity = 4 * llama["context"] * llama["d"] / (2 * llama["context"] * llama["d"] * llama["itemsize"])
print(f"decode attention: {intensity:.1f} FLOP/byte")
for batch in (1, 8):
    t = kv(batch=batch, **llama) / bw
    print(f"batch {batch}: reading the cache takes at least {t * 1e3:.1f} ms per token ({bw / 1e9:.0f} GB/s, {src})")

# %% [markdown]
# ## Beyond 48 KB: dynamic shared memory
#
# Every block size so far came from 48 KB of shared memory (lesson 5): the most a kernel may declare
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
#
# ## Your turn: the shared memory of one block
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
from flash_numba import _switches
from flash_numba.kernels import flash2_fast

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
    print(f"{recorded.LABEL}: {recorded.provenance(recorded.BLOCK_SWEEP_CSV)['device']}, "
          f"{recorded.provenance(recorded.BLOCK_SWEEP_CSV)['file']}")
    for r in recorded.block_sweep_rows(128):
        if r["causal"] == "False":
            kb = flash2_fast.geometry(128, int(r["Br"]) // 8, int(r["Bc"]) // 16, np.float32)["smem"] / 1024
            print(f"d = 128, N = 4096, B*H = 32, block ({r['Br']}, {r['Bc']}), {kb:.0f} KB: {float(r['ms']):.2f} ms")

# %% [markdown]
# ## Your turn: how many blocks an SM holds
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
two_tiles = one_tile + g128["Br"] * g128["PS"] * 4  # dS in a tile of its own, as before session 13
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
# (`docs/PERFORMANCE.md`, session 13).

# %% [markdown]
# ## Your turn: shared loads per multiply-add
#
# More warps hide the wait for shared memory; fewer loads shorten it. In the same kernel's largest loop every
# thread computes a $T_M \times T_N$ micro-tile of $S^T = K_j Q_i^T$ *and* one of $dP^T = V_j\, dO_i^T$. For each
# step $k$ of the inner dimension it loads $T_M$ values of $K_j^T$, $T_M$ of $V_j^T$, $T_N$ of $Q_i$ and $T_N$ of
# $dO_i$, and does $2 T_M T_N$ multiply-adds. Session 14 gave $S^T$ to warps 0-1 and $dP^T$ to warps 2-3: each
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
# registers, it lost a block an SM and ran slower ($d = 96$: `docs/PERFORMANCE.md`, session 14), so the library
# splits only where the registers allow (`flash2_fast.layout.split_s_dp`). Fewer loads and more warps are two
# answers to one question: what does a warp do while it waits?

# %% [markdown]
# ### The same count, one loop further: dQ
#
# The atomic kernel has a fifth product, $dQ_i \mathrel{+}= dS_{ij} K_j$, added into $dQ$ with atomics (or into the
# split backward's copies). A warp owns $R_W = 8$ query rows of it, and until session 15 each of its 32 lanes took
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
# (`docs/PERFORMANCE.md`, session 15). On a GPU, `flash2_fast.layout.dq_lanes(1)` builds the kernel with one group,
# to time both yourself.

# %% [markdown]
# ## Measured on a real GPU
#
# In the simulator nothing is timed. The project ran the same kernels on an NVIDIA H200; the table
# below is loaded from the committed benchmark file and printed with the GPU, the date and the command
# it came from: recorded, not measured now (on a GPU the cells above measure this one).
# Here: our fastest forward against PyTorch's SDPA backends, as recorded.
#
# **Predict, then run.** Our `flash2_fast` forward time divided by that of PyTorch's memory-efficient SDPA
# kernel at $N = 4096$, $d = 64$ on the H200: above 1 (theirs faster) or below (ours)? By how much?

# %%
my_prediction = None  # flash2_fast ms / torch-efficient ms

# %%
if recorded.available():
    latest = recorded.LATEST_BENCH_CSV
    print(recorded.bench_table(["flash2_fast", "torch-math", "torch-efficient"], "fwd", 4096, latest, d=64))
    ms = {r["implementation"]: float(r["ms"]) for r in recorded.bench_rows(None, "fwd", 4096, latest, d=64)}
    lessonkit.compare_prediction("flash2_fast / torch-efficient", my_prediction,
                                 round(ms["flash2_fast"] / ms["torch-efficient"], 2))
    lessonkit.show(pictures.recorded_times(recorded.bench_rows(["flash2_fast", "torch-math", "torch-efficient"],
                                                               None, 4096, latest, d=64), recorded.LABEL))

# %% [markdown]
# What is done about it: *multi-query* and *grouped-query* attention share one set of keys and values
# among several query heads, dividing the cache by the group size (Llama-2-70B uses 8 key/value heads for
# 64 query heads); caches are stored in 8-bit or lower precision; vLLM's *PagedAttention* allocates the
# cache in pages to avoid fragmentation; and *Flash-Decoding* splits the keys of one long sequence across
# thread blocks, so that a single query still fills the GPU. Each attacks the bytes of the cache; none of
# them is the $N \times N$ problem FlashAttention solved.
#
# ## What a call costs besides its kernels
#
# At $N = 4096$ the kernels take milliseconds. At $N = 128$ they take microseconds, and the time of a call is
# the host's: Python checking the arguments, PyTorch allocating the outputs, and one driver call
# (`cuLaunchKernel`) per kernel launch. flash_numba records the launches of a call the first time it sees its
# shapes (a *launch plan*, `flash_numba/_launch_plan.py`) and replays them after that, so what is left is
# the allocations and the launches. On the H200's host the driver took about 8 microseconds a launch. So the
# number of launches of a pass is the number to make small.
#
# **Predict.** How many kernels does each backward launch at a small $N$?
#
# * flash2's backward: $D = \mathrm{rowsum}(dO \circ O)$, then $dK, dV$ per key block, then $dQ$ per query block.
# * flash2_fast's default (deterministic) backward. At a small $N$ it takes two passes, and its $dQ$ kernel
#   computes $D_i$ itself from the $dO_i$ it has already loaded (it writes $D$ for the $dK, dV$ kernel).
# * flash2_fast with `deterministic=False`: $D$, then a zeroed $dQ$ accumulator, then $dK, dV, dQ$ with atomics.

# %%
my_launches = {"flash2": None, "flash2_fast": None, "flash2_fast atomic": None}  # your three numbers

# %% [markdown]
# **Run.** With `count_hbm=True` every launch adds its bytes under its own name, so the counters list the
# launches. (A kernel launched in rounds, as flash2_fast's split backward is at large $N$, keeps one name.)

# %%
rng_h = np.random.default_rng(11)
qh, kh, vh, doh = (rng_h.standard_normal((1, 1, 32, 16)).astype(np.float32) for _ in range(4))
launches = {}
for label, kernel, det in (("flash2", "flash2", True), ("flash2_fast", "flash2_fast", True),
                           ("flash2_fast atomic", "flash2_fast", False)):
    fh = fn.attention_forward(qh, kh, vh, kernel=kernel)
    bwd_h = fn.attention_backward(qh, kh, vh, fh.o, fh.lse, doh, kernel=kernel, deterministic=det, count_hbm=True)
    launches[label] = list(bwd_h.hbm.per_kernel)
    print(f"{label:<19} {len(launches[label])} launches: {', '.join(launches[label])}")
    lessonkit.compare_prediction(f"{label} launches", my_launches[label], len(launches[label]))

# %% [markdown]
# **See it in microseconds.** The project timed one call on the H200 (PyTorch tensors, $N = 128$, $B \cdot H = 32$,
# $d = 64$, launch plans replayed; `benchmarks/host_overhead.py`), the library before and after flash2_fast's $dQ$
# kernel took over $D$, alternating, two runs each. Recorded, not measured now:

# %%
if recorded.available():
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
#
# ## Where to go next
#
# * Read `flash_numba/kernels/flash2_fast/`: the same algorithm as flash2, rearranged for speed, with
#   each step measured.
# * Regenerate the article's figures on your GPU: `python figures/make_all.py`.
# * Compare every implementation on your GPU, PyTorch's included: `python -m flash_numba.bench`.
# * Hold the counters against the hardware with Nsight Compute: `python -m flash_numba.profile`.
#
# ## What to take away
#
# * In practice FlashAttention reaches you through a framework (PyTorch SDPA); check which backend really runs, since
#   a silent fallback costs the speed-up.
# * Our float32 kernels, exact and readable, are within a small factor of a tuned library kernel; the tuned one's
#   forward beats PyTorch's memory-efficient fp32 kernel at $d = 64$ on the H200, and so does its forward + backward
#   with the atomic backward (at $d = 32$ and 64).
# * Shared memory per block is not fixed at 48 KB: with dynamic shared memory, opted in, an H200 gives a block up to
#   227 KB, and larger tiles (more reuse per number loaded) made our $d = 128$ forward 1.5x faster. But an SM runs
#   only as many blocks as its shared memory and registers allow: one tile less at $d = 128$ gave 3 blocks instead
#   of 2, and the backward took 11-14% less time; one product a thread instead of two, a third fewer shared loads
#   per multiply-add, took 6-7% more off, and the same count in the dQ loop 3% more.
# * At small $N$ a call's time is the host's, mostly one driver call per kernel launch: count the launches.
# * The KV cache is a different memory problem: it grows with every token kept, $2 \cdot$ layers $\cdot$ heads $\cdot
#   d \cdot$ tokens $\cdot$ batch elements.
#
# ## Check

# %%
assert per_seq == 2 * 32 * 32 * 128 * 4096 * 2 and per_seq == 2 * 2**30
assert tiles(128, 8, 2, 4) > 48 * 1024 >= tiles(64, 8, 2, 4) and same_bits
assert (held["two"], held["one"]) == (2, 3) and two_tiles - one_tile == 32 * 36 * 4
assert (per_madd(4, 2, False), per_madd(4, 2, True)) == (0.75, 0.5)
assert (dq_per_madd(8, 64, 1), dq_per_madd(8, 64, 2)) == (10 / 16, 8 / 16) and agree
assert 0.9 < intensity < 1.1
assert [len(launches[x]) for x in ("flash2", "flash2_fast", "flash2_fast atomic")] == [3, 2, 3], launches
if TORCH_GPU:
    ran = [r for r in sdpa_rows if r[2] != "refused"]
    assert len(ran) >= 2 and all(float(r[3]) < 1e-2 for r in ran), sdpa_rows
elif TORCH:
    assert cpu_diff < 1e-5, cpu_diff
print("lesson 10: all checks passed")
