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
from flash_numba import device
from flash_numba.course import bugzoo, lessonkit, pictures
from flash_numba.course import exercises as ex
from flash_numba.course import flash_checks as kx

SIM = device.SIMULATOR
print(device.describe())
caught = {}  # exhibit -> did its checker reject it?
for name in bugzoo.names():
    exhibit = bugzoo.EXHIBITS[name]
    shown = "(a mystery below)" if name in bugzoo.MYSTERIES.values() else exhibit.bug
    print(f"{name:<24} checked by {exhibit.exercise:<13} {shown}")

# %% [markdown]
# First, the readable kernels the exhibits edit: the packaged solutions pass their checkers.

# %%
assert ex.check_solution("flash1_block") and ex.check_solution("flash2_loop")
assert ex.check_solution("dkdv_block") and ex.check_solution("causal_tiles")

# %% [markdown]
# ## Exhibit 1: the missing barrier
#
# The loop of lesson 9 loads $K_j$, $V_j$ with all threads of the block, each thread a few elements, and
# waits at `cuda.syncthreads()` before any thread reads them. Take that barrier out:

# %%
print(bugzoo.diff("missing_barrier"))
caught["missing_barrier"] = not ex.check("flash2_loop", bugzoo.build("missing_barrier"))

# %% [markdown]
# What the simulator can and cannot show. It runs the CUDA threads of a block in turn, each to its next
# barrier, and whether a thread reads $K_j$ before its neighbours have loaded it depends on that order,
# which is not a GPU's: a verdict built on the values alone would hold for one order of threads only. So
# the checker runs the kernel with the package's race detector on (`flash_numba.simrace`): every element
# of a shared array remembers which thread wrote it and which threads read it since the block's last
# `cuda.syncthreads()`, and a read
# of an element another thread wrote, or a write to an element another thread touched, before the next
# barrier is a race, whatever order the threads ran in. The verdict names the array, the element and the
# two threads. A GPU interleaves threads differently (a warp of 32 runs in lockstep), and the same bug may
# pass a thousand runs there and fail the next one; on a GPU, `compute-sanitizer --tool racecheck` and
# `--tool synccheck` look for races (the package's kernels pass both:
# `benchmarks/results/h200-2026-11-30-s3/C/`). The detector sees only the runs and the sizes it watched,
# so it proves no kernel race-free either. The *other* barrier, at the top of the loop, guards against
# overwriting $K_j$ while a slow thread still reads it; without it the detector reports a write to an
# element another thread read before the barrier.
#
# ## Exhibit 2: the stale maximum

# %%
print(bugzoo.diff("stale_max"))
caught["stale_max"] = not ex.check("flash2_loop", bugzoo.build("stale_max"))

# %% [markdown]
# The first case (one tile) passes: with a single tile nothing needs rescaling. The second fails, and
# the checker recognises the answer: it equals what you get when the old $\ell_i$ and $\tilde O_i$ are
# never rescaled, because $e^{m_i - m_{new}}$ was computed after $m_i$ had become $m_{new}$, so it is 1.
# Lesson 3's picture of a row whose maximum arrives late shows what that factor has to do:

# %%
lessonkit.show(pictures.online_softmax_late_max())

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
# only the simulator's trace of every global access (`flash_numba.simtrace`) catches it. On a GPU
# nothing sees single loads, and this exhibit passes the checker there; the profiler's DRAM bytes
# (lesson 6) are then the independent witness.

# %%
print(bugzoo.diff("uncounted_load"))
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
print(bugzoo.diff("o_every_tile"))
caught["o_every_tile"] = not ex.check("flash2_loop", bugzoo.build("o_every_tile"))

# %% [markdown]
# ## Your turn: four mysteries
#
# Four more exhibits, without their diffs. Run each through its checker, read the verdict (which case
# fails first? which output? what do the notes say?) and name the bug, using the exhibit names listed at
# the top.

# %%
for letter in bugzoo.MYSTERIES:
    print(f"--- mystery {letter}")
    caught[letter] = not ex.check(*bugzoo.mystery(letter))


# %%
def my_diagnosis():
    """Which exhibit is each mystery? Return {"A": name, "B": name, "C": name, "D": name}."""
    raise NotImplementedError("read the four verdicts above, then name each bug")


# %%
mine = ex.check("bug_zoo", my_diagnosis)
assert ex.check_solution("bug_zoo")

# %% [markdown]
# Once you have named them, read the diffs:

# %%
for letter, name in bugzoo.MYSTERIES.items():
    print(f"mystery {letter}: {name}\n{bugzoo.diff(name)}\n")

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
#
# ## Check

# %%
simulator_only = {"missing_barrier", "uncounted_load"}  # on a GPU: no trace, no race detector
assert all(ok for name, ok in caught.items() if SIM or name not in simulator_only), caught
assert set(caught) == {"missing_barrier", "stale_max", "reread_k", "uncounted_load", "o_every_tile", *bugzoo.MYSTERIES}
assert ratio > 1
print("lesson 11: all checks passed")
