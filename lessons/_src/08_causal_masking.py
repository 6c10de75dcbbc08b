"""Source of lessons/08_causal_masking.ipynb (build it with `python lessons/_build.py`)."""
# ruff: noqa: E402

# %% [markdown]
# # Lesson 8: Causal masking
#
# A language model predicts each token from the tokens before it, so query $i$ may only attend to keys
# $j \le i$: *causal* attention. The masked scores are set to $-\infty$ before the softmax, which makes
# their probabilities exactly 0. Standard attention computes all of $S$ and then masks it; a blocked
# algorithm can do better, since whole tiles of $S$ lie above the diagonal and need not be computed,
# loaded or even looked at. This lesson classifies the tiles, skips the masked ones, deals with rows
# that see no key at all, and measures the saving.

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
from flash_numba.course import lessonkit, pictures
from flash_numba.course import exercises as ex
from flash_numba.course import flash_checks as kx

SIM = device.SIMULATOR
print(device.describe())


def median_ms(run):
    """Median time of run() in milliseconds over CUDA events, or None in the simulator."""
    times = device.time_ms(run)
    return None if times is None else float(np.median(times))


# %% [markdown]
# ## Which keys a query sees
#
# With as many queries as keys the rule is $j \le i$. When they differ ($N_q \ne N_k$) there are two
# conventions. The package aligns the mask to the *bottom-right* corner, as FlashAttention 2.1 and later
# do: key $j$ is visible to query $i$ iff $j \le i + (N_k - N_q)$. That is the right rule for generation
# with a cache of earlier keys: the $N_q$ new queries are the last $N_q$ positions of the sequence, and
# the last query sees every key. PyTorch's `is_causal=True` aligns it to the top-left corner instead
# ($j \le i$); its `torch.nn.attention.bias.causal_lower_right` gives the bottom-right mask. The two agree
# on square masks. (`x`: visible, `.`: masked.)

# %%
def show(mask):
    for row in mask:
        print("    " + "".join("x" if v else "." for v in row))


for Nq, Nk in ((6, 6), (3, 8), (7, 4)):
    print(f"Nq = {Nq}, Nk = {Nk}:")
    show(reference.causal_mask(Nq, Nk))

# %% [markdown]
# In the last picture the first $N_q - N_k = 3$ queries see no key at all. We come back to them below.

# %% [markdown]
# ## Three kinds of tiles
#
# Cut $S$ into tiles of $B_r \times B_c$. A tile is either entirely visible (compute it as usual), cut by
# the diagonal (compute it, then set its masked entries to $-\infty$), or entirely masked: every entry
# would be $-\infty$, its $\tilde P_{ij}$ would be 0, and the update of lines 10-13 would leave $O_i$,
# $\ell_i$, $m_i$ unchanged. Such a tile can be skipped: no loads of $K_j$, $V_j$, no arithmetic.
# (`#`: visible, `/`: on the diagonal, `.`: skipped.)

# %%
def tile_picture(Nq, Nk, Br, Bc):
    """One character per tile of S; returns (lines, number of skipped tiles, number of tiles)."""
    mask = reference.causal_mask(Nq, Nk)
    lines, skipped = [], 0
    for i in range(math.ceil(Nq / Br)):
        row = ""
        for j in range(math.ceil(Nk / Bc)):
            tile = mask[i * Br : (i + 1) * Br, j * Bc : (j + 1) * Bc]
            row += "#" if tile.all() else "/" if tile.any() else "."
            skipped += not tile.any()
        lines.append("    " + row)
    return lines, skipped, math.ceil(Nq / Br) * math.ceil(Nk / Bc)


for Nq, Nk, Br, Bc in ((64, 64, 8, 8), (40, 64, 8, 16), (64, 40, 16, 8)):
    lines, skipped, total = tile_picture(Nq, Nk, Br, Bc)
    print(f"Nq = {Nq}, Nk = {Nk}, Br = {Br}, Bc = {Bc}: {skipped} of {total} tiles skipped")
    print("\n".join(lines))

# %% [markdown]
# For a square mask with $T$ tiles on a side, $T(T-1)/2$ of the $T^2$ tiles are skipped: half the work
# as $T$ grows.

# %% [markdown]
# ## Your turn: the skip condition
#
# Query block $i$ holds rows $iB_r$ to $\min((i+1)B_r, N_q) - 1$ (the last block may be short); key block
# $j$ holds keys $jB_c$ to $\min((j+1)B_c, N_k) - 1$. Return True exactly when every (query, key) pair of
# the tile is masked. One comparison suffices: find the pair of the tile that is *most* visible.

# %%
def causal_skip(i, j, Br, Bc, Nq, Nk):
    """True when tile (i, j) of S lies wholly above the causal diagonal (every entry masked)."""
    # Your turn
    raise NotImplementedError("compare the tile's first key with its last query")


# %%
mine = ex.check("causal_skip", causal_skip)
assert ex.check_solution("causal_skip")

# %% [markdown]
# In the kernels this test decides how far a loop runs. flash2's forward pass, for example, stops its loop
# over key blocks at the last block its query block can see; flash1 `continue`s past the skipped tiles
# of its inner loop. Look for it in flash2's forward kernel, `flash_numba/kernels/flash2/forward.py`:

# %%
import inspect

from flash_numba.kernels import flash2

lines, first = inspect.getsourcelines(flash2._forward_kernel)
for n_line, line in enumerate(lines, first):
    if "CAUSAL" in line:
        print(f"flash2/forward.py:{n_line:<4} {line.strip()}")

# %% [markdown]
# ## Your turn: the loop bound, in a kernel
#
# flash2 turns the skip test into a loop bound: query tile $i$ visits key tiles $0, 1, \dots, n_i - 1$
# and never loads the rest. Write $n_i$ as a device function. Keys are visible as a prefix of each row
# (key $c$ is visible to query $r$ iff $c \le r + N_k - N_q$), so $n_i$ is set by the last key that the
# tile's *last* row sees; 0 when it sees none ($N_q > N_k$). The checker first compares your bound with
# the mask tile by tile, then runs it as the loop bound of a FlashAttention-2 kernel (lesson 9's, the
# packaged one) and compares $O$, $L$ and the bytes with flash2's causal IO model: a bound too large
# loads masked tiles for nothing, one too small loses visible keys.

# %%
@cuda.jit(device=True)
def causal_tiles(i, Br, Bc, Nq, Nk):
    """How many key tiles (Bc keys each) query tile i (Br queries) visits under the causal mask."""
    # Your turn: the last key the tile's last row sees, then the tile that holds it (0 if none).
    raise NotImplementedError("the causal loop bound")


# %%
mine_bound = ex.check("causal_tiles", causal_tiles)
assert ex.check_solution("causal_tiles")
# kx.hints("causal_tiles", upto=1)  # uncomment for a hint; upto=2 for two, and so on

# %% [markdown]
# **Predict, then run.** With $N_q = N_k = 16$ and $B_r = B_c = 4$, how many rows of $K$ does the causal
# kernel load in all (each query tile loads its visible key tiles, 4 rows each)? Without the mask it
# would be $4 \times 16 = 64$.

# %%
my_prediction = None  # your number of K rows loaded

# %%
run16 = kx.measure_forward("causal_tiles", causal_tiles if mine_bound else kx.causal_tiles, 16, 16)
k_rows = run16["log"].elements("k", "r") // 4 if SIM else sum(iomodel.flash2.kv_rows_read(16, 16, True, (4, 4)))
lessonkit.compare_prediction("rows of K loaded, causal, N = 16", my_prediction, k_rows)

# %% [markdown]
# ## Rows with no visible key
#
# When $N_q > N_k$, the first $N_q - N_k$ query rows have every score $-\infty$. Their softmax is $0/0$:
# undefined. The package defines their output as $O_i = 0$ and $L_i = -\infty$ (the log of a sum of no
# terms), and guards every $e^{-\infty - (-\infty)}$ so that no NaN appears, in the forward and in the
# backward pass (where such rows contribute nothing to any gradient).

# %%
rng = np.random.default_rng(8)
BH, Nq, Nk, d = (1, 20, 12, 16) if SIM else (16, 1100, 1000, 64)
BLOCK = (8, 8) if SIM else None
q = rng.standard_normal((BH, Nq, d)).astype(np.float32)
k, v = (rng.standard_normal((BH, Nk, d)).astype(np.float32) for _ in range(2))
res = fn.flash_attention_forward(q, k, v, causal=True, kernel="flash2", block=BLOCK)
o_ref, lse_ref = reference.attention_forward(q, k, v, causal=True)
blind = Nq - Nk
print(f"Nq = {Nq}, Nk = {Nk}: rows 0..{blind - 1} see no key")
print("  their O is all 0:", bool(np.all(res.o[:, :blind] == 0)), "  their L:", np.unique(res.lse[:, :blind]))
print("  any NaN anywhere:", bool(np.isnan(res.o).any() or np.isnan(res.lse).any()))
causal_err = np.abs(res.o - o_ref).max() / np.abs(o_ref).max()
print(f"  max relative error of O against the reference: {causal_err:.1e}")

# %% [markdown]
# ## Half the work, measured
#
# Bytes first: with `count_hbm=True` the kernels count what they actually load, so skipped tiles show up
# as bytes not moved. At a tiny size in the simulator the diagonal tiles are a large part of the whole;
# the IO model gives the ratio at real sizes too.

# %%
Nc, dc = (32, 16) if SIM else (4096, 64)
qc, kc, vc = (rng.standard_normal((1, Nc, dc)).astype(np.float32) for _ in range(3))
counted = {}
for causal in (False, True):
    r = fn.flash_attention_forward(qc, kc, vc, causal=causal, kernel="flash2", block=BLOCK, count_hbm=True)
    counted[causal] = r.hbm.total
print(f"flash2, N = {Nc}, blocks {r.block}: {counted[False]:,} bytes, causal {counted[True]:,} "
      f"({counted[True] / counted[False]:.2f})")
print(f"\n{'N':>6} " + " ".join(f"{name:>12}" for name in ("flash1", "flash2")) + "   causal / full bytes, d = 64")
model_ratio = {}
for n_ in (256, 1024, 4096, 16384):
    cells = []
    for name in ("flash1", "flash2"):
        blk = fn.resolve_block(name, 64, np.float32)
        full = iomodel.forward(name, 1, n_, n_, 64, np.float32, False, blk).total
        half = iomodel.forward(name, 1, n_, n_, 64, np.float32, True, blk).total
        model_ratio[name, n_] = half / full
        cells.append(f"{half / full:>12.3f}")
    print(f"{n_:>6} " + " ".join(cells))

# %% [markdown]
# flash1 re-reads $Q$ and $O$ once per key block, and with the mask query block $i$ meets only the key
# blocks up to the diagonal: its bytes halve. flash2 reads $K$ and $V$ once per query block, up to the
# diagonal: they halve too, while $Q$ and $O$, read and written once, stay. On a GPU, the time:

# %%
if SIM:
    t_full = t_causal = None
    print(f"not timed: {device.CudaTimer.note}")
else:
    Nt = 4096
    dev = [cuda.to_device(rng.standard_normal((16, Nt, 64)).astype(np.float32)) for _ in range(3)]
    t_full = median_ms(lambda: fn.flash_attention_forward(*dev, kernel="flash2"))
    t_causal = median_ms(lambda: fn.flash_attention_forward(*dev, causal=True, kernel="flash2"))
    print(f"flash2 forward, B*H = 16, N = {Nt}, d = 64: {t_full:.2f} ms, causal {t_causal:.2f} ms "
          f"({t_causal / t_full:.2f})")

# %% [markdown]
# ## The tiles, drawn
#
# Which tiles a causal kernel skips (grey: nothing loaded), masks inside (red entries) or runs whole, for
# a square mask and for $N_q < N_k$, where the diagonal starts at key $N_k - N_q$:

# %%
lessonkit.show(pictures.causal_tiles(16, 16, 4, 4))
lessonkit.show(pictures.causal_tiles(8, 20, 4, 4))

# %% [markdown]
# ## What to take away
#
# * Causal masks here are bottom-right aligned: key $c$ is visible to query $r$ iff $c \le r + N_k - N_q$.
# * Tiles wholly above the diagonal are skipped (nothing loaded); only tiles crossing it are masked entry by entry:
#   about half the work for $N_q = N_k$.
# * A row that sees no key ends with $O = 0$ and $L = -\infty$, not NaN.

# %% [markdown]
# ## Check

# %%
assert not np.isnan(res.o).any() and not np.isnan(res.lse).any()
assert np.all(res.o[:, :blind] == 0) and np.all(res.lse[:, :blind] == -np.inf)
assert causal_err < 1e-5, causal_err
assert counted[True] < counted[False]
assert all(0.45 < model_ratio[name, 16384] < 0.55 for name in ("flash1", "flash2")), model_ratio
assert tile_picture(64, 64, 8, 8)[1] == 8 * 7 // 2
assert (t_full is None) == SIM
print("lesson 8: all checks passed")
