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
from flash_numba import device, reference
from flash_numba.course import lessonkit, pictures, recorded
from flash_numba.tools import microbench
from flash_numba.course import exercises as ex

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

# %% [markdown]
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

# %% [markdown]
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

# %% [markdown]
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
# The launches of flash2_fast's backward, and what each one costs in microseconds on an H200's host, are
# in the optional appendix, "How flash2_fast got fast".

# %% [markdown]
# ## Where to go next
#
# * Read `flash_numba/kernels/flash2_fast/`: the same algorithm as flash2, rearranged for speed, with
#   each step measured.
# * Regenerate the article's figures on your GPU: `python figures/make_all.py`.
# * Compare every implementation on your GPU, PyTorch's included: `flash-numba bench`.
# * Hold the counters against the hardware with Nsight Compute: `flash-numba profile`.

# %% [markdown]
# ## What to take away
#
# * In practice FlashAttention reaches you through a framework (PyTorch SDPA); check which backend really runs, since
#   a silent fallback costs the speed-up.
# * Our float32 kernels, exact and readable, are within a small factor of a tuned library kernel; the tuned one's
#   forward beats PyTorch's memory-efficient fp32 kernel at $d = 64$ on the H200 (how it got there: the appendix).
# * At small $N$ a call's time is the host's, mostly one driver call per kernel launch: count the launches.
# * The KV cache is a different memory problem: it grows with every token kept, $2 \cdot$ layers $\cdot$ heads $\cdot
#   d \cdot$ tokens $\cdot$ batch elements.

# %% [markdown]
# ## Check

# %%
assert per_seq == 2 * 32 * 32 * 128 * 4096 * 2 and per_seq == 2 * 2**30
assert 0.9 < intensity < 1.1
assert [len(launches[x]) for x in ("flash2", "flash2_fast", "flash2_fast atomic")] == [3, 2, 3], launches
if TORCH_GPU:
    ran = [r for r in sdpa_rows if r[2] != "refused"]
    assert len(ran) >= 2 and all(float(r[3]) < 1e-2 for r in ran), sdpa_rows
elif TORCH:
    assert cpu_diff < 1e-5, cpu_diff
print("lesson 10: all checks passed")
