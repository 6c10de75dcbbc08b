"""Source of lessons/14_decoding_kv_cache.ipynb (build it with `python lessons/_build.py`)."""
# ruff: noqa: E402

# %% [markdown]
# # Lesson 14: Decoding and the KV cache
#
# A language model generates one token at a time. At each step the new token's query attends to the keys
# and values of every token before it. Those are kept from step to step in the *KV cache*, so they are not
# computed again. But they are read again, all of them, at every step.
#
# This is the other memory story of the same layer. FlashAttention removed the bytes of $S$ and $P$. At
# decoding time there is no big $S$: one query row per head. The bytes are the cache itself. In this lesson
# you will:
#
# 1. count a decoding step's bytes and FLOPs, and see why it is memory-bound;
# 2. see why one thread block per head leaves most of a GPU idle, and how *split-KV* fills it;
# 3. write the merge of the splits' partial results, lesson 3's rescale once more;
# 4. run `flash_numba.attention_decode` on a small paged cache and compare its counted bytes with yours;
# 5. read the H200's recorded rates against PyTorch.

# %%
import sys

if "google.colab" in sys.modules:  # Colab: install flash_numba (see lesson 0)
    # !pip install -q "numba-cuda[cu12]==0.30.4"
    # !pip install -q --no-deps "git+@REPO_URL@"
    pass  # source-only

# %%
import math

import numpy as np

import flash_numba
from flash_numba import device, reference
from flash_numba.course import decoding as dcx
from flash_numba.course import exercises as ex
from flash_numba.course import lessonkit
from flash_numba.kernels import flash_decode

SIM = device.SIMULATOR
print(device.describe())

# %% [markdown]
# ## One step, counted
#
# Take $B$ sequences with $L$ cached tokens each and one new token. There are $H_q$ query heads. With
# grouped-query attention (GQA) they share $H_{kv}$ KV heads: each group of $G = H_q / H_{kv}$ query heads
# reads the same keys and values. The step must:
#
# * read the cache: $K$ and $V$, $2 B H_{kv} L d$ elements;
# * read the new query, $B H_q d$ elements, and write the output, $B H_q d$ elements, and its log-sum-exp,
#   one float32 per (sequence, query head).
#
# The arithmetic: every query head does $q \cdot k$ ($2d$ FLOPs) and $p\,v$ ($2d$) for every cached key.

# %% [markdown]
# ## Your turn: the bytes and FLOPs of a step
#
# Return `(bytes, flops)` for one step. `itemsize` is the bytes of one element of q, the cache and o.
# The checker compares your bytes with the IO model of our decode kernel (`flash_numba.iomodel.flash_decode`:
# its "KV cache", "q" and "o and lse" terms) and your FLOPs with its count of visible keys.

# %%
def decode_bytes(B, Hq, Hkv, L, d, itemsize):
    """(HBM bytes, FLOPs) of one decoding step: one new token a sequence, L cached tokens."""
    # Your turn
    raise NotImplementedError("bytes = the cache + q + o + lse; flops = ...")


# %%
mine_bytes = ex.check("decode_bytes", decode_bytes)
assert ex.check_solution("decode_bytes")
count = decode_bytes if mine_bytes else ex.solution_fn("decode_bytes")
# dcx.hints("decode_bytes", upto=1)  # uncomment for a hint

# %% [markdown]
# Now a real configuration: $B = 8$ sequences, $H_q = 32$, $d = 128$, float16, 32k tokens cached.
#
# **Predict, then run.** How many FLOPs per byte does one step do without grouping ($H_{kv} = 32$)?

# %%
my_prediction = None  # FLOPs per byte at Hkv = 32

# %%
intensity = {}
for Hkv in (32, 8, 1):
    nbytes, nflops = count(8, 32, Hkv, 32768, 128, 2)
    intensity[Hkv] = nflops / nbytes
    print(f"Hkv = {Hkv:>2} (G = {32 // Hkv:>2}): {nbytes / 1e9:6.3f} GB, {nflops / 1e9:5.2f} GFLOP, "
          f"{intensity[Hkv]:5.2f} FLOPs per byte; at 4,166 GB/s {nbytes / 4166e6:.3f} ms")
lessonkit.compare_prediction("FLOPs per byte at Hkv = 32", my_prediction, round(intensity[32], 2))

# %% [markdown]
# About one FLOP per byte. In the time an H200 moves one byte from HBM it can do about a dozen FLOPs on CUDA
# cores and over a hundred on tensor cores (lesson 1's roofline, lesson 13's ceilings). So a decoding step is
# bound by reading the cache, whatever unit does the arithmetic. GQA raises the
# intensity by the group size $G$: the cache is read once for $G$ query heads. It also makes the cache $G$
# times smaller, which is why models use it.

# %% [markdown]
# ## Filling the GPU
#
# A prefill kernel such as flash2 puts one block on each (query block, head). At decoding time there is one
# query row a head, so one block per (sequence, KV head): $B \cdot H_{kv} = 64$ blocks here. An H200 has 132
# SMs, and each SM needs several blocks in flight to keep enough loads waiting on HBM.
#
# *Split-KV* (flash-decoding) cuts each cache into `num_splits` chunks, one block each. Every block computes a
# partial result over its chunk, and the partials are merged. In `flash_decode` the last block of each
# (sequence, KV head) to finish does the merge: every block counts itself in with one atomic add once its
# partial is written, and the one that sees all the others counted merges them (a small second kernel would do
# the same work, one launch later). The picture counts the blocks each SM holds at once (four at most for our
# CUDA-core decode kernel, by its registers):

# %%
sms = 132  # the H200's SMs (the recorded results below)
chosen = flash_decode.choose_splits(8, 8, 1, 32768, None, sms)
print(f"split rule for B = 8, Hkv = 8, 32k tokens on {sms} SMs: {chosen} splits "
      f"({8 * 8 * chosen} blocks; one wave holds {flash_decode.RESIDENT_BLOCKS * sms})")
lessonkit.show(dcx.blocks_figure(8, 8, sms, splits=(1, chosen), resident=flash_decode.RESIDENT_BLOCKS))

# %% [markdown]
# With one split 68 of the 132 SMs have nothing to do, and the others hold one block each. With 8 splits,
# 512 blocks nearly fill one wave of four blocks an SM.
#
# On an sm_80 or later GPU at float16 and bfloat16, `flash_decode` runs a second split kernel instead: it
# multiplies on tensor cores and keeps its loads in flight in shared memory (cp.async), 80 KB a block at
# d = 128, so an SM holds two of its blocks and the same one-wave rule gives it 4 splits
# (`flash_decode.resident_blocks`; docs/PERFORMANCE.md, "Decoding"). The rule is the same; what sets the
# blocks an SM holds differs.

# %% [markdown]
# ## Your turn: merge the splits
#
# Split $s$ of a row returns three things over its chunk of keys, exactly lesson 3's running values:
#
# * $m_s$, the largest score it saw ($-\infty$ if its chunk is empty);
# * $\ell_s = \sum_j e^{x_j - m_s}$ (0 if empty);
# * $O_s = \sum_j e^{x_j - m_s} v_j$, the *unnormalised* output, a row of $d$ numbers.
#
# Merge them into the row's output $o$ and log-sum-exp $L = m + \log \ell$. Each split's numbers are
# relative to its own maximum. Bring them to the common one. A row whose splits are all empty saw no key:
# return $o = 0$ and $L = -\infty$, without NaN.
#
# The checker compares with float64 attention over all the keys, on splits whose maxima differ, an empty
# split, scores near $10^4$ and a row with no key.

# %%
def merge_splits(O_s, m_s, l_s):
    """O_s (S, d), m_s (S,), l_s (S,): the splits' partials of one row. Returns (o (d,), lse)."""
    # Your turn
    raise NotImplementedError("m = max m_s; rescale each split by exp(m_s - m); o = ... / l; lse = m + log(l)")


# %%
mine_merge = ex.check("merge_splits", merge_splits)
assert ex.check_solution("merge_splits")
merge = merge_splits if mine_merge else ex.solution_fn("merge_splits")
# dcx.hints("merge_splits", upto=1)  # uncomment for a hint

# %% [markdown]
# The merge is exact on any split, as lesson 3's update is. Cut one row of 1,000 keys into 1 to 64 chunks:

# %%
rng = np.random.default_rng(14)
x = 3 * rng.standard_normal(1000)  # one row's scores
V = rng.standard_normal((1000, 16))
p = np.exp(x - x.max())
o_true, lse_true = p @ V / p.sum(), x.max() + math.log(p.sum())
worst = 0.0
for S in (1, 2, 7, 64):
    chunks = np.array_split(np.arange(1000), S)  # the keys of each split
    m_s = np.array([x[c].max() for c in chunks])
    l_s = np.array([np.exp(x[c] - x[c].max()).sum() for c in chunks])
    O_s = np.array([np.exp(x[c] - x[c].max()) @ V[c] for c in chunks])  # (S, d)
    o, lse = merge(O_s, m_s, l_s)
    worst = max(worst, float(np.abs(o - o_true).max()), abs(lse - lse_true))
    print(f"{S:>2} splits: max |o - o_true| = {np.abs(o - o_true).max():.1e}, "
          f"|lse - lse_true| = {abs(lse - lse_true):.1e}")

# %% [markdown]
# Our kernel writes each split's $O_s / \ell_s$ and its log-sum-exp instead of $(O_s, m_s, \ell_s)$: one
# number fewer a row, and the same merge in other variables.

# %% [markdown]
# ## A decoding step in the simulator
#
# `flash_numba.attention_decode` runs one step over a *paged* cache, as vLLM and FlashAttention 2.5 do. The
# cache is a pool of fixed-size pages. A `block_table` lists each sequence's pages in order, so a sequence
# grows one page at a time without moving the others. Here are two sequences of 37 and 5 tokens, in pages of
# 8 rows, the pages shuffled in the pool:

# %%
B, Hq, Hkv, d, page = 2, 4, 2, 16, 8
lengths = np.array([37, 5], dtype=np.int32)
pages_needed = [-(-int(n) // page) for n in lengths]
pool = rng.permutation(sum(pages_needed)).astype(np.int32)  # which pool page holds each sequence's pages
table = np.zeros((B, max(pages_needed)), dtype=np.int32)
table[0, :pages_needed[0]] = pool[:pages_needed[0]]
table[1, :pages_needed[1]] = pool[pages_needed[0]:]
k_cache = rng.standard_normal((len(pool), Hkv, page, d)).astype(np.float32)
v_cache = rng.standard_normal((len(pool), Hkv, page, d)).astype(np.float32)
q = rng.standard_normal((B, Hq, 1, d)).astype(np.float32)
res = flash_numba.attention_decode(q, k_cache, v_cache, cache_seqlens=lengths, block_table=table, num_splits=3,
                                   count_hbm=True)
print("block table:\n", table)
print(f"kernel {res.kernel}, {res.num_splits} splits; counted HBM bytes by term:")
for term, nbytes in res.hbm.terms.items():
    print(f"  {term:<12} {nbytes:>7,}")

# %% [markdown]
# Check the output against float64 attention, sequence by sequence, with the pages put back in order:

# %%
dec_err = 0.0
for b in range(B):
    n = int(lengths[b])
    keys = np.concatenate([k_cache[pg] for pg in table[b, :pages_needed[b]]], axis=1)[:, :n]  # (Hkv, n, d)
    vals = np.concatenate([v_cache[pg] for pg in table[b, :pages_needed[b]]], axis=1)[:, :n]
    for h in range(Hq):
        kv_head = h // (Hq // Hkv)  # GQA: the KV head of query head h
        o_ref, _ = reference.attention_forward(q[b, h].astype(np.float64), keys[kv_head], vals[kv_head])
        dec_err = max(dec_err, float(np.abs(res.o[b, h] - o_ref).max()))
print(f"max |o - o_float64| = {dec_err:.1e}")

# %% [markdown]
# Your count has the cache, $q$, $o$ and the lse. The kernel also reads each block's length and the page
# table entries its chunk touches, and with splits it writes and reads the partials (and the combine reads each
# row's length, to know which splits saw its keys):

# %%
mine_total = sum(count(1, Hq, Hkv, int(n), d, 4)[0] for n in lengths)
t = res.hbm.terms
print(f"your terms: {mine_total:,} bytes; counted KV cache + q + o and lse: "
      f"{t['KV cache'] + t['q'] + t['o and lse']:,}")
print(f"q is read by each of the {res.num_splits} splits: {t['q']:,} bytes counted, {B * Hq * d * 4:,} once")
print(f"metadata {t['lengths'] + t['page table']:,} bytes, partials {t['partials']:,} bytes; "
      f"total counted {res.hbm.total:,}")

# %% [markdown]
# Each split reads its rows of $q$, so $q$ counts once per split. The partials are the price of splitting: a
# row of $d + 1$ floats per split, written and read once. The "split counters" are the merge's bookkeeping:
# each block adds 1 to its group's counter (4 bytes read, 4 written) and the last one sets it back to 0. At 32k
# tokens all of it is tiny next to the cache.

# %% [markdown]
# ## Recorded on an H200
#
# The decode benchmark: $B = 8$, $H_q = 32$, $H_{kv} = 8$, $d = 128$, float16, one new token, caches of 4k
# to 128k tokens. The rate is the KV cache's bytes over the GPU's time of one step. Every row is timed the same
# way: ten steps queued back to back behind a sleep kernel, so that the host has queued them all before the GPU
# starts and no Python time counts (`flash_numba.tools.bench_decode`).

# %%
print("\n".join(dcx.recorded_header()[:3]))
print(dcx.DECODE_SOURCE)
rates = dcx.recorded_rates()
Ns = sorted(rates["torch-flash"])
print(f"{'GB/s':<18}" + "".join(f"{n // 1024:>7}k" for n in Ns))
for name, by_n in rates.items():
    print(f"{name:<18}" + "".join(f"{by_n[n]:>8,.0f}" for n in Ns))
lessonkit.show(dcx.rates_figure(rates, copy_gbps=4166))
if not SIM:  # the same step on this GPU, 32k tokens
    from numba import cuda

    shape = (8, 8, 32768, 128)
    kc, vc = (cuda.to_device(rng.standard_normal(shape, dtype=np.float32).astype(np.float16)) for _ in range(2))
    qg = cuda.to_device(rng.standard_normal((8, 32, 1, 128), dtype=np.float32).astype(np.float16))
    ms = float(np.median(device.time_ms(lambda: flash_numba.attention_decode(qg, kc, vc))))
    print(f"this GPU: flash_decode {ms:.3f} ms, {2 * kc.nbytes / ms / 1e6:,.0f} GB/s of KV cache "
          "(whole calls: the host's checks and Python launch path included)")

# %% [markdown]
# What the numbers say (32k tokens):
#
# * `flash2_fast`, our prefill kernel at one query row, streams 132 GB/s: 256 blocks, each reading its KV
#   head's cache for one query head, so every byte four times, on CUDA cores.
# * One split (64 blocks, each reading its KV head once for the group) reaches 2,121 GB/s on tensor cores:
#   half the SMs idle.
# * The split rule's 4 splits reach 3,987 GB/s, 30 times flash2_fast. The CUDA-core kernel, with the same
#   blocks and 8 splits, reaches 2,402: it holds its loads in flight in registers and issues about 100
#   instructions a key, so it cannot keep more bytes on their way from HBM.
# * PyTorch's flash backend reaches 4,385 GB/s, close to a device copy's rate; ours is at 0.91 of it.
#
# Later the same day one qualifier of one PTX instruction moved our row: each cp.async now asks the L2 for the
# aligned 128 bytes around its 16 (`cp.async.cg.shared.global.L2::128B`, as CUTLASS's copies do), and the step
# reads 4,052-4,112 GB/s at 32k, 0.95 of PyTorch flash in the same run
# (`benchmarks/results/h200-2026-12-02-decode-l2/`). Keeping more bytes in flight (three blocks an SM, deeper
# pipelines) had gained nothing: the memory was already saturated, and what helped was how the requests reach it.
# A rate that stops growing when you add concurrency is the sign to look at the access pattern instead.

# %% [markdown]
# ## What to take away
#
# * A decoding step reads the whole KV cache for about one FLOP a byte: it is memory-bound, and its cost grows
#   with every token generated.
# * GQA reads each KV head once for its group of query heads: $G$ times fewer bytes, $G$ times the intensity.
# * One block per (sequence, KV head) leaves SMs idle; split-KV gives each a chunk of the cache and merges
#   the partials with the online-softmax rescale.
# * A paged cache adds a table lookup per page, and lets sequences grow without copying.

# %% [markdown]
# ## Check

# %%
assert abs(intensity[32] - 1.0) < 0.01 and abs(intensity[8] / intensity[32] - 4) < 0.01
assert worst < 1e-12, worst
assert dec_err < 1e-5, dec_err
assert mine_total == t["KV cache"] + t["q"] // res.num_splits + t["o and lse"]
assert res.hbm.total == sum(t.values())
assert rates["flash_decode"][32768] > 10 * rates["flash2_fast"][32768]
print("lesson 14: all checks passed")
