"""Source of lessons/03_online_softmax.ipynb (build it with `python lessons/_build.py`)."""
# ruff: noqa: E402

# %% [markdown]
# # Lesson 3: The online softmax
#
# A softmax that starts from a row of scores $x$ alone reads the row three times: once for the maximum
# $m$, once for the sum $\ell = \sum_j e^{x_j - m}$, once to write $e^{x_j - m} / \ell$. (Lesson 2's
# softmax kernel reads $S$ once only because its first kernel already computed $m$ and $\ell$, with the
# trick of this lesson.) The maximum is there for stability: it keeps every exponent $\le 0$. But it
# seems to force a pass over the whole row before the sum can start, and that is what stands in the way
# of computing attention block by block.
#
# Milakov and Gimelshein (*Online normalizer calculation for softmax*, 2018) showed that the maximum and
# the sum can be computed together in one pass, by rescaling the sum whenever the maximum changes.
# FlashAttention applies the same idea to blocks of scores, and to the output as well.

# %%
import sys

if "google.colab" in sys.modules:  # Colab: install flash_numba (see lesson 0)
    # !pip install -q "numba-cuda[cu12]==0.30.4"
    # !pip install -q --no-deps "git+@REPO_URL@"
    pass  # source-only

# %%
import math

import numpy as np

from flash_numba import device, reference

from flash_numba.course import lessonkit, pictures
from flash_numba.course import exercises as ex

print(device.describe())
print("(this lesson is NumPy only: it runs the same in the simulator and on a GPU)")

# %% [markdown]
# ## Why the maximum matters
#
# Attention scores can be large: with unnormalised activations, $q \cdot k / \sqrt d$ in the hundreds is
# not unusual. $e^{x}$ overflows float32 above $x \approx 88.7$ and float64 above $709.8$:

# %%
x = np.array([100.0, 101.0, 99.0], dtype=np.float32)
with np.errstate(over="ignore", invalid="ignore"):
    naive = np.exp(x) / np.exp(x).sum()
safe = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
print("exp(x) / sum(exp(x))       :", naive)
print("exp(x - m) / sum(exp(x - m)):", safe)

# %% [markdown]
# ## One pass: the running maximum and sum
#
# Read the row in blocks $x^{(1)}, x^{(2)}, \ldots$ Keep two numbers: the maximum so far $m$ and the sum
# so far $\ell = \sum e^{x_j - m}$ over the scores seen, *taken relative to the current* $m$. Start
# from $m = -\infty$, $\ell = 0$. For a new block $x^{(j)}$, with $\tilde m = \max x^{(j)}$:
#
# $$m_{\text{new}} = \max(m, \tilde m), \qquad
#   \ell_{\text{new}} = e^{m - m_{\text{new}}}\, \ell + \sum_{x \in x^{(j)}} e^{x - m_{\text{new}}}.$$
#
# The factor $e^{m - m_{\text{new}}} \le 1$ rescales the old terms from the old maximum to the new one:
# $e^{x - m} \cdot e^{m - m_{\text{new}}} = e^{x - m_{\text{new}}}$. No exponent is ever positive, and after
# the last block $(m, \ell)$ are exactly the full row's maximum and sum, whatever the split. This is
# lines 10-11 of the paper's Algorithm 1, where a block of scores is $S_{ij}$ and the statistics of query
# row $i$ are $m_i$ and $\ell_i$. Two details matter in practice:
#
# * A block may be entirely masked ($-\infty$, lesson 8). While every score seen is $-\infty$, $m$ stays
#   $-\infty$, and $e^{m - m_{\text{new}}} = e^{-\infty - (-\infty)}$ is NaN. Guard it: with
#   $m_{\text{new}} = -\infty$ there is nothing to add yet, $\ell$ stays 0.
# * The statistic the kernels keep for the backward pass is $L = m + \log \ell$: the log of the softmax
#   denominator, $\log \sum_j e^{x_j}$, computed without overflow.

# %% [markdown]
# ## Your turn: the update
#
# Write the step for one block `x_j` (a non-empty 1-D array): return the new `(m, l)` as floats.

# %%
def online_softmax_update(m, l, x_j):
    """(m, l) after one more block x_j of scores: the running max and the sum of exp(x - m)."""
    # Your turn
    raise NotImplementedError("m_new = max(m, max(x_j)); l_new = ...")


# %%
mine = ex.check("online_softmax", online_softmax_update)
assert ex.check_solution("online_softmax")
update = online_softmax_update if mine else ex.solution_fn("online_softmax")
print("the cells below use", "your update" if mine else "the packaged solution (yours is not done yet)")

# %% [markdown]
# ## Exact on any split
#
# Run the update over every way of cutting a row into two blocks, and over random cuts into many
# blocks, and compare with the two-pass statistics of the whole row. The maximum is exactly equal (it is
# a max); the sum differs only by rounding:

# %%
rng = np.random.default_rng(3)
row = 4 * rng.standard_normal(24)
m_full = row.max()
l_full = np.exp(row - m_full).sum()


def stats(row, cuts):
    m, l = -math.inf, 0.0
    for block in np.split(row, cuts):
        if block.size:
            m, l = update(m, l, block)
    return m, l


# %%
worst_m, worst_l = 0.0, 0.0
splits = [[c] for c in range(1, len(row))]  # every split into two blocks
splits += [sorted(rng.choice(np.arange(1, 24), n, replace=False)) for n in (3, 7, 23)]  # 4, 8 and 24 blocks
for cuts in splits:
    m, l = stats(row, cuts)
    worst_m = max(worst_m, abs(m - m_full))
    worst_l = max(worst_l, abs(l - l_full) / l_full)
print(f"{len(splits)} splits: max |m - m_full| = {worst_m}, max relative |l - l_full| = {worst_l:.1e}")
m_ref, l_ref = reference.online_softmax_stats(row, [5, 11])
print(f"the package's reference, split at 5 and 11: m = {m_ref:.15g}, l = {l_ref:.15g}")
print(f"the whole row, two passes:                   m = {m_full:.15g}, l = {l_full:.15g}")

# %% [markdown]
# ## Stable with huge scores
#
# Scores around $10^4$ overflow any naive exponential, in float64 too; the running update never forms a
# positive exponent:

# %%
big = 1e4 + 50 * rng.standard_normal(16)
m, l = stats(big, [3, 4, 10])
lse_online = m + math.log(l)
lse_direct = big.max() + math.log(np.exp(big - big.max()).sum())
print(f"L = m + log(l): online {lse_online:.12f}, two-pass {lse_direct:.12f}")
with np.errstate(over="ignore"):
    print("naive log(sum(exp(x))):", np.log(np.exp(big).sum()))

# %% [markdown]
# ## The same trick for the output
#
# Attention does not need the softmax itself, only $o = \sum_j p_j v_j$ with $p_j = e^{x_j - m} / \ell$.
# Keep a running, *unnormalised* output $\tilde o = \sum_j e^{x_j - m} v_j$ and rescale it with the same
# factor $e^{m - m_{\text{new}}}$ whenever the maximum moves; divide by $\ell$ at the end. Here is one
# query row of attention computed over blocks of keys, never holding more than one block of scores:

# %%
d, Nk, Bc = 8, 40, 6
q_row = rng.standard_normal(d)
K, V = rng.standard_normal((Nk, d)), rng.standard_normal((Nk, d))
m, l, o_acc = -math.inf, 0.0, np.zeros(d)
for c0 in range(0, Nk, Bc):
    s_j = K[c0 : c0 + Bc] @ q_row / math.sqrt(d)  # one block of scores, (Bc,)
    m_new, l_new = update(m, l, s_j)
    o_acc = math.exp(m - m_new) * o_acc + np.exp(s_j - m_new) @ V[c0 : c0 + Bc]  # rescale, then add
    m, l = m_new, l_new
o_row = o_acc / l
o_ref, lse_ref = reference.attention_forward(q_row[None, :], K, V)
print("max |o - o_ref| =", np.abs(o_row - o_ref[0]).max())
print("L:", m + math.log(l), "reference:", lse_ref[0])

# %% [markdown]
# ## The running statistics, drawn
#
# One row whose maximum arrives in the last block: each time $m$ jumps, the sum so far is multiplied
# by $e^{m_{old} - m_{new}}$ (the triangles), then the new block's terms are added.
#
# **Predict, then run.** For the row `[0.5, 1, -0.5, 1.5, 0, 2, 6, 1, 0.5]` in blocks of 3, what is
# $\ell$ after the last block (the sum of $e^{x - 6}$)?

# %%
my_prediction = None  # l after the last block

# %%
row = np.array([0.5, 1, -0.5, 1.5, 0, 2, 6, 1, 0.5])
m_row, l_row = stats(row, [3, 6])
lessonkit.compare_prediction("l after the last block", my_prediction, round(l_row, 4))
lessonkit.show(pictures.online_softmax_late_max(row, block=3))

# %% [markdown]
# The loop of the previous section is FlashAttention for one query row. Lesson 5 does it for a block of
# $B_r$ rows at once, with blocks of $B_c$ keys held in shared memory: Algorithm 1 of the paper.

# %% [markdown]
# ## What to take away
#
# * The softmax needs the row maximum and sum, but both can be kept as running values, block by block.
# * When the maximum grows, everything summed so far is rescaled by $e^{m_{old} - m_{new}}$: exact, not approximate,
#   for any split of the row.
# * The same rescaling carries an unnormalised output $\tilde o$ along: FlashAttention for one row.

# %% [markdown]
# ## Check

# %%
assert worst_m == 0.0 and worst_l < 1e-13, (worst_m, worst_l)
assert abs(lse_online - lse_direct) < 1e-9 * abs(lse_direct)
assert np.abs(o_row - o_ref[0]).max() < 1e-12 and abs(m + math.log(l) - lse_ref[0]) < 1e-12
assert stats(np.array([-math.inf, -math.inf, 1.0]), [2]) == (1.0, 1.0), "a masked first block"
print("lesson 3: all checks passed")
