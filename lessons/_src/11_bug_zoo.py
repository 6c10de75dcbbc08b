"""Source of lessons/11_bug_zoo.ipynb (build it with `python lessons/_build.py`)."""
# ruff: noqa: E402

# %% [markdown]
# # Lesson 11: The bug zoo
#
# Every FlashAttention kernel you wrote in lessons 5 to 9 can go wrong in a handful of classic ways: a
# barrier left out, the running maximum updated one line too early, the causal diagonal in the wrong
# corner, a last tile that is not full, a backward pass that forgets the mask, the scale applied twice, a
# tile read from HBM again, a load left out of the count, an output written at every tile.
# `flash_numba.course.bugzoo` keeps one kernel for each: the packaged solution of an exercise with a few
# lines changed. Here you run them through the same checkers as your own code and learn to read what the
# checker says: which case fails first, which output, the largest difference, the bytes against the IO
# model, and the access trace of the simulator.
#
# How the checkers find a bug. Each runs the kernel on a few tiny cases chosen so that each classic
# mistake fails on a case whose label names it (one tile; several tiles; the maximum of every row in the
# last tile; $N$ not a multiple of the block; $N_q \ne N_k$), compares with the float64 reference, checks
# whether the wrong answer equals what a known mistake would give, then compares the bytes the kernel
# counted with the IO model, and, in the simulator, with every global access it really made.

# %%
import sys

if "google.colab" in sys.modules:  # Colab: install flash_numba (see lesson 0)
    # !pip install -q "numba-cuda[cu12]==0.30.4"
    # !pip install -q --no-deps "git+@REPO_URL@"
    pass  # source-only

# %%
import math

from numba import cuda

from flash_numba import device
from flash_numba.course import bugzoo, lessonkit, pictures
from flash_numba.course import exercises as ex
from flash_numba.course import flash_checks as kx
from flash_numba.course.flash_solutions import E, NEG_INF, ZERO  # the constants the kernels use

SIM = device.SIMULATOR
print(device.describe())
caught = {}  # exhibit -> did its checker reject it?
print("the zoo:", ", ".join(bugzoo.names()))

# %% [markdown]
# First, the readable kernels the exhibits edit: the packaged solutions pass their checkers.

# %%
assert ex.check_solution("flash1_block") and ex.check_solution("flash2_loop")
assert ex.check_solution("dkdv_block") and ex.check_solution("causal_tiles")

# %% [markdown]
# ## Exhibit 1: threads that race
#
# Lesson 9's loop, with one line changed. Run it through the loop's checker:

# %%
caught["missing_barrier"] = not ex.check("flash2_loop", bugzoo.build("missing_barrier"))

# %% [markdown]
# The verdict names a *race*: one thread wrote an element of a shared tile, and another thread read it
# with no `cuda.syncthreads()` between them.
#
# The simulator runs the threads of a block one after another, each up to its next barrier. Whether a
# thread reads $K_j$ before its neighbours have loaded it depends on that order, and a GPU's order is
# different. So the checker runs the kernel under the package's race detector (`flash_numba.sim.races`).
# Every shared element remembers who wrote it and who read it since the last barrier. A conflicting
# access by another thread before the next barrier is a race, whatever order the threads ran in.
#
# On a GPU the same bug may pass a thousand runs and fail the next. There, `compute-sanitizer --tool
# racecheck` looks for races. Neither tool proves a kernel race-free: they see only the runs they watched.

# %% [markdown]
# ## Your turn: repair exhibit 1
#
# The cell below holds the broken loop. Find where the threads race and repair it (one line). The
# checker runs it on the loop's nine cases, with and without the causal mask, with the race detector on.

# %%
@cuda.jit(device=True)
def repaired_barrier(tid, row, n_tiles, diag, q_r, s_r, o_acc, K_j, V_j, k, v, o, L, scale):
    """FlashAttention-2's loop for query row ``row`` (thread ``tid``; no row when row >= Nq).

    The block walks over ``n_tiles`` key tiles; key c is visible to the row iff c <= row + diag.
    m_i, l_i and the unnormalised O_i row (``o_acc``) stay on chip; O = O_acc / l and
    L = m + log(l) are written once, at the end.  Returns (bytes read, bytes written).
    """
    Bc, D = K_j.shape
    T = cuda.blockDim.x
    Nq = o.shape[0]
    Nk = k.shape[0]
    nr = 0
    nw = 0
    m_i = NEG_INF
    l_i = ZERO
    for x in range(D):
        o_acc[x] = ZERO
    for j in range(n_tiles):
        c0 = j * Bc
        cols = min(Bc, Nk - c0)
        cuda.syncthreads()  # every thread is done with the previous K_j, V_j
        for idx in range(tid, cols * D, T):  # all threads load the tiles, one element each in turn
            K_j[idx // D, idx % D] = k[c0 + idx // D, idx % D]
            V_j[idx // D, idx % D] = v[c0 + idx // D, idx % D]
            nr += 2 * E
        if row < Nq:
            m_new = m_i
            for c in range(cols):  # s = scale q_r K_j^T, masked; the new running max
                s = ZERO
                for x in range(D):
                    s += q_r[x] * K_j[c, x]
                s *= scale
                if c0 + c > row + diag:
                    s = NEG_INF
                s_r[c] = s
                m_new = max(s, m_new)  # (score first: in the simulator's Python max a NaN then wins)
            if m_new != NEG_INF:  # a row that has seen no visible key keeps (O_acc, l, m) = (0, 0, -inf)
                alpha = math.exp(m_i - m_new)  # rescale what was summed at the old max (before m_i moves)
                l_i *= alpha
                for x in range(D):
                    o_acc[x] *= alpha
                for c in range(cols):
                    p = math.exp(s_r[c] - m_new)  # a masked score gives exp(-inf) = 0
                    l_i += p
                    for x in range(D):
                        o_acc[x] += p * V_j[c, x]
                m_i = m_new
    if row < Nq:  # normalise once, at the end
        L_r = NEG_INF
        inv = ZERO
        if l_i > ZERO:
            L_r = m_i + math.log(l_i)
            inv = 1 / l_i
        for x in range(D):
            o[row, x] = o_acc[x] * inv
        L[row] = L_r
        nw += D * E + E
    return nr, nw


# %%
fixed_barrier = ex.check("fix_missing_barrier", repaired_barrier)
assert ex.check_solution("fix_missing_barrier")

# %% [markdown]
# ## Exhibit 2: right with one tile, wrong with two

# %%
caught["stale_max"] = not ex.check("flash2_loop", bugzoo.build("stale_max"))

# %% [markdown]
# The first case (one tile) passes. The second (several tiles) fails. So the step that merges a new
# tile into the running $(m_i, \ell_i, \tilde O_i)$ is wrong, and with one tile there is nothing to merge.
# Lesson 3's picture shows what the factor $e^{m_i - m_{new}}$ must do when a row's maximum arrives late:

# %%
lessonkit.show(pictures.online_softmax_late_max())

# %% [markdown]
# ## Your turn: repair exhibit 2
#
# Find the line that breaks the merge and repair it.

# %%
@cuda.jit(device=True)
def repaired_max(tid, row, n_tiles, diag, q_r, s_r, o_acc, K_j, V_j, k, v, o, L, scale):
    """FlashAttention-2's loop for query row ``row`` (thread ``tid``; no row when row >= Nq).

    The block walks over ``n_tiles`` key tiles; key c is visible to the row iff c <= row + diag.
    m_i, l_i and the unnormalised O_i row (``o_acc``) stay on chip; O = O_acc / l and
    L = m + log(l) are written once, at the end.  Returns (bytes read, bytes written).
    """
    Bc, D = K_j.shape
    T = cuda.blockDim.x
    Nq = o.shape[0]
    Nk = k.shape[0]
    nr = 0
    nw = 0
    m_i = NEG_INF
    l_i = ZERO
    for x in range(D):
        o_acc[x] = ZERO
    for j in range(n_tiles):
        c0 = j * Bc
        cols = min(Bc, Nk - c0)
        cuda.syncthreads()  # every thread is done with the previous K_j, V_j
        for idx in range(tid, cols * D, T):  # all threads load the tiles, one element each in turn
            K_j[idx // D, idx % D] = k[c0 + idx // D, idx % D]
            V_j[idx // D, idx % D] = v[c0 + idx // D, idx % D]
            nr += 2 * E
        cuda.syncthreads()  # K_j, V_j are complete
        if row < Nq:
            m_new = m_i
            for c in range(cols):  # s = scale q_r K_j^T, masked; the new running max
                s = ZERO
                for x in range(D):
                    s += q_r[x] * K_j[c, x]
                s *= scale
                if c0 + c > row + diag:
                    s = NEG_INF
                s_r[c] = s
                m_new = max(s, m_new)  # (score first: in the simulator's Python max a NaN then wins)
            if m_new != NEG_INF:  # a row that has seen no visible key keeps (O_acc, l, m) = (0, 0, -inf)
                m_i = m_new
                alpha = math.exp(m_i - m_new)  # rescale what was summed at the old max (before m_i moves)
                l_i *= alpha
                for x in range(D):
                    o_acc[x] *= alpha
                for c in range(cols):
                    p = math.exp(s_r[c] - m_new)  # a masked score gives exp(-inf) = 0
                    l_i += p
                    for x in range(D):
                        o_acc[x] += p * V_j[c, x]
                m_i = m_new
    if row < Nq:  # normalise once, at the end
        L_r = NEG_INF
        inv = ZERO
        if l_i > ZERO:
            L_r = m_i + math.log(l_i)
            inv = 1 / l_i
        for x in range(D):
            o[row, x] = o_acc[x] * inv
        L[row] = L_r
        nw += D * E + E
    return nr, nw


# %%
fixed_max = ex.check("fix_stale_max", repaired_max)
assert ex.check_solution("fix_stale_max")

# %% [markdown]
# ## Exhibit 3: a tile read again from HBM
#
# This kernel computes the right $O$: it reads each key from global memory instead of from the tile
# $K_j$ the block has just loaded, and counts those reads honestly. **Predict, then run:** with
# $N = B_r = B_c = 4$ and $d = 4$, how many times the model's reads of $K$ (16 elements, once) does it
# make? (Every thread reads all of $K$ for its scores, and the tile load reads it once more.)

# %%
my_prediction = None  # how many times the model's count of K reads

# %%
caught["reread_k"] = not ex.check("flash2_loop", bugzoo.build("reread_k"))
run = kx.measure_forward("flash2_loop", bugzoo.build("reread_k"), 4, 4)
ratio = run["bytes"][0] / kx.measure_forward("flash2_loop", kx.flash2_rows, 4, 4)["bytes"][0]
k_ratio = run["log"].elements("k", "r") / 16 if SIM else None
lessonkit.compare_prediction("K reads / the model's", my_prediction, k_ratio if SIM else ratio)

# %% [markdown]
# ## Exhibit 4: a load the counter forgot
#
# The same re-read, but without `nr += E`: the kernel's own counter now agrees with the IO model, and
# only the simulator's trace of every global access (`flash_numba.sim.trace`) catches it. On a GPU
# nothing sees single loads, and this exhibit passes the checker there; the profiler's DRAM bytes
# (lesson 6) are then the independent witness.

# %%
# print(bugzoo.diff("uncounted_load"))  # uncomment: the change to the readable loop
caught["uncounted_load"] = not ex.check("flash2_loop", bugzoo.build("uncounted_load"))

# %% [markdown]
# Where those reads go, thread by thread: each square is an element of $K$ ($N_k = 4$ rows, $d = 4$
# columns), coloured by how many times it was read, for the right kernel and for this one:

# %%
if SIM:
    good = kx.measure_forward("flash2_loop", kx.flash2_rows, 4, 4)["log"]
    bad = kx.measure_forward("flash2_loop", bugzoo.build("uncounted_load"), 4, 4)["log"]
    lessonkit.show(pictures.read_counts({"flash2_rows": good, "uncounted_load": bad}, "k", (4, 4)))
else:
    print("the access trace exists only in the simulator")

# %% [markdown]
# ## Exhibit 5: the output written at every tile
#
# flash1 keeps $O_i$ normalised in HBM and writes it back after every key tile; FlashAttention-2 keeps
# it on chip and writes it once. Here is lesson 9's loop with flash1's habit put back. The final $O$ is
# right, so only the bytes can tell:

# %%
# print(bugzoo.diff("o_every_tile"))  # uncomment: the change to the readable loop
caught["o_every_tile"] = not ex.check("flash2_loop", bugzoo.build("o_every_tile"))

# %% [markdown]
# ## Your turn: four mysteries
#
# Four more exhibits of the zoo, hidden behind letters. `kx.examine` runs each through its checker
# and prints what the checker sees: the failing case, the values, the rows that differ. It holds back
# the lines that would name the mistake. Read each verdict: which case fails first? Which output? Which
# rows? Then name the exhibit (the zoo's names are printed at the top).

# %%
for letter in bugzoo.MYSTERIES:
    print(f"--- mystery {letter}")
    caught[letter] = kx.examine(letter)


# %%
def my_diagnosis():
    """Which exhibit is each mystery? Return {"A": name, "B": name, "C": name, "D": name}."""
    raise NotImplementedError("read the four verdicts above, then name each bug")


# %%
mine = ex.check("bug_zoo", my_diagnosis)
assert ex.check_solution("bug_zoo")

# %% [markdown]
# Once your diagnosis passes, read each mystery's change to the readable kernel (uncomment):

# %%
# for letter, name in bugzoo.MYSTERIES.items():
#     print(f"mystery {letter}: {name}\n{bugzoo.diff(name)}\n")

# %% [markdown]
# ## What to take away
#
# * Test a kernel on cases that each isolate one mistake: one tile, several tiles, the row maximum in
#   the last tile, $N$ not a multiple of the block, $N_q \ne N_k$. The first failing case names the bug.
# * Compare with a float64 reference *and* with the IO model's bytes: a kernel can be exactly right and
#   still read a tile from HBM five times.
# * A counter only counts what its author remembered to count; an independent witness (the simulator's
#   trace, or a profiler on a GPU) keeps it honest.
# * The simulator's race detector names a missing barrier on every run, whatever order Python ran the
#   threads in; on a GPU a race may not show in the values, and no test proves a kernel race-free.
# * Read the symptom before the code: which case fails first, which rows, which array's bytes.

# %% [markdown]
# ## Check

# %%
simulator_only = {"missing_barrier", "uncounted_load"}  # on a GPU: no trace, no race detector
assert all(ok for name, ok in caught.items() if SIM or name not in simulator_only), caught
assert set(caught) == {"missing_barrier", "stale_max", "reread_k", "uncounted_load", "o_every_tile", *bugzoo.MYSTERIES}
assert fixed_barrier in (True, False) and fixed_max in (True, False)  # yours: True once repaired
assert ratio > 1
print("lesson 11: all checks passed")
