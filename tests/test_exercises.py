"""The lessons' exercise checkers: each accepts its packaged solution and rejects a typical mistake.

Every exercise in :mod:`flash_numba.course.exercises` has here a wrong answer, the kind
of slip a learner makes (a forgotten rescale, a missing guard, the mask's
offset left out).  The checker must report it as wrong with the ``Yours:`` /
``Spec :`` printout, return False, and raise when asked.  Kernel exercises run
in the simulator with small tiles.
"""

import inspect
import math
import textwrap

import numpy as np
import pytest
from numba import cuda, float32

from flash_numba.course import exercises as ex
from flash_numba.device import SIMULATOR
from flash_numba.course.exercises import first_kernels

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the wrong answers overflow on purpose

TILE = 4  # tiles of the matrix-product exercise: 16 threads per block keep the simulator quick
E = 4


@cuda.jit
def axpy_unguarded(alpha, x, y, out):
    i = cuda.grid(1)
    out[i] = alpha * x[i] + y[i]  # no `if i < out.size`: the last block runs past the end


@cuda.jit
def axpy_wrong_sign(alpha, x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = alpha * x[i] - y[i]


@cuda.jit
def axpy_stub(alpha, x, y, out):
    raise NotImplementedError("write the body of axpy")


@cuda.jit
def matmul_counts_the_zeros(a, b, c, counter):
    """Right product, but counts 4 bytes for the zeros past the edges too."""
    M, K = a.shape
    N = b.shape[1]
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row, col = cuda.blockIdx.y * TILE + ty, cuda.blockIdx.x * TILE + tx
    a_tile = cuda.shared.array((TILE, TILE), float32)
    b_tile = cuda.shared.array((TILE, TILE), float32)
    acc = float32(0)
    nr = 0
    for k0 in range(0, K, TILE):
        a_tile[ty, tx] = a[row, k0 + tx] if row < M and k0 + tx < K else 0
        b_tile[ty, tx] = b[k0 + ty, col] if k0 + ty < K and col < N else 0
        nr += 2 * E
        cuda.syncthreads()
        for kk in range(TILE):
            acc += a_tile[ty, kk] * b_tile[kk, tx]
        cuda.syncthreads()
    if row < M and col < N:
        c[row, col] = acc
        cuda.atomic.add(counter, 1, E)
    cuda.atomic.add(counter, 0, nr)


@cuda.jit
def matmul_transposed_tile(a, b, c, counter):
    """Stages B's tile transposed but reads it untransposed: C is wrong."""
    M, K = a.shape
    N = b.shape[1]
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row, col = cuda.blockIdx.y * TILE + ty, cuda.blockIdx.x * TILE + tx
    a_tile = cuda.shared.array((TILE, TILE), float32)
    b_tile = cuda.shared.array((TILE, TILE), float32)
    acc = float32(0)
    nr = 0
    for k0 in range(0, K, TILE):
        a_tile[ty, tx] = 0
        b_tile[tx, ty] = 0
        if row < M and k0 + tx < K:
            a_tile[ty, tx] = a[row, k0 + tx]
            nr += E
        if k0 + ty < K and col < N:
            b_tile[tx, ty] = b[k0 + ty, col]
            nr += E
        cuda.syncthreads()
        for kk in range(TILE):
            acc += a_tile[ty, kk] * b_tile[kk, tx]
        cuda.syncthreads()
    if row < M and col < N:
        c[row, col] = acc
        cuda.atomic.add(counter, 1, E)
    cuda.atomic.add(counter, 0, nr)


def _no_guard_softmax_update(m, l, x_j):
    m_new = max(m, float(np.max(x_j)))
    return m_new, math.exp(m - m_new) * l + float(np.sum(np.exp(x_j - m_new)))  # NaN when m_new = -inf


def _unstable_attention(q, k, v):
    P = np.exp(q @ k.T / math.sqrt(q.shape[1]))  # no max subtracted: overflows on large scores
    return (P / P.sum(axis=1, keepdims=True)) @ v


def _rescale_without_guard(O_i, l_i, m_i, S_ij, V_j):
    m_t = S_ij.max(axis=1)
    P_t = np.exp(S_ij - m_t[:, None])
    m_new = np.maximum(m_i, m_t)
    a, b = np.exp(m_i - m_new), np.exp(m_t - m_new)
    l_new = a * l_i + b * P_t.sum(axis=1)
    return ((l_i * a)[:, None] * O_i + b[:, None] * (P_t @ V_j)) / l_new[:, None], l_new, m_new


def _flash2_normalising_every_step(O_acc, l, m, S_ij, V_j):
    O_new, l_new, m_new = ex.solution_fn("flash2_update")(O_acc, l, m, S_ij, V_j)
    return O_new / np.where(l_new > 0, l_new, 1.0)[:, None], l_new, m_new  # divides too early


#: One typical mistake per exercise: (answer, checker parameters, a phrase the report must contain).
WRONG = {
    "axpy": (axpy_wrong_sign, {}, "largest difference"),
    "matmul_intensity": (lambda M, N, K, e: 2 * M * N * K / ((M * K + K * N) * e), {}, "case 1"),
    "standard_attention": (_unstable_attention, {}, "NaN"),
    "online_softmax": (lambda m, l, x: (max(m, x.max()), l + np.exp(x - max(m, x.max())).sum()), {}, "step 2"),
    "tiled_matmul": (matmul_counts_the_zeros, {"tile": TILE}, "HBM bytes"),
    "flash_rescale": (_rescale_without_guard, {}, "NaN"),
    "theorem2": (lambda N, d, Bc: 2 * N * d + (N // Bc) * (3 * N * d + 4 * N), {}, "Bc does not divide N"),
    "compute_D": (lambda o, do: (do * o).sum(axis=0), {}, "shapes differ"),
    "recompute_P": (lambda S, L: np.exp(S - L[:, None]), {}, "NaN"),
    "causal_skip": (lambda i, j, Br, Bc, Nq, Nk: j * Bc > min((i + 1) * Br, Nq) - 1, {}, "Nq = 5, Nk = 9"),
    "flash2_update": (_flash2_normalising_every_step, {}, "O_acc differs"),
    "kv_cache_bytes": (lambda layers, heads, d, ctx, batch, e: layers * heads * d * ctx * batch * e, {}, "K and V"),
    "tile_bytes": (lambda d, TM, TN, e: (2 * d * 8 * TM + 2 * d * 16 * TN) * e, {}, "padded by 16 bytes"),
    "blocks_per_sm": (lambda t, r, n, s: min(65536 // (r * n), s // t), {}, "57,600 bytes"),  # no 1 KB, no rounding
    "loads_per_madd": (lambda TM, TN, split: (2 * TM + 2 * TN) / (2 * TM * TN), {}, "one product of a"),  # no split
    "dq_loads_per_madd": (lambda RW, DP, g: (g * DP / 32 + RW / g) / (RW * DP / 32), {}, "idle lanes"),  # no ceil
    "bug_zoo": (lambda: {"A": "scale_twice", "B": "top_left_mask"}, {}, "mystery A"),
    "split_heads": (lambda qkv, H: tuple(qkv.reshape(len(qkv), 3, H, qkv.shape[1], -1).swapaxes(0, 1)), {}, "the 3"),
}


def _params(name):
    return {"tile": TILE} if name == "tiled_matmul" else {}


def test_every_exercise_has_a_wrong_answer_here():
    """Here, or in the bug zoo for the FlashAttention kernel exercises (tests/test_bugzoo.py), or for the
    repairs and the whole kernels in tests/test_checker_holes.py and tests/test_whole_kernels.py, or for lessons
    13 and 14 in tests/test_lessons_13_14.py."""
    from flash_numba.course import bugzoo
    from flash_numba.course import flash_checks as kx

    zoo = {exhibit.exercise for exhibit in bugzoo.EXHIBITS.values()}
    elsewhere = set(kx.REPAIRS) | set(getattr(kx, "WHOLE_KERNELS", ()))
    elsewhere |= {"mma_tile", "p_in_registers", "merge_splits", "decode_bytes"}  # tests/test_lessons_13_14.py
    assert sorted(set(WRONG) | zoo | elsewhere) == sorted(ex.names())


@pytest.mark.parametrize("name", sorted(WRONG))
def test_the_solution_passes(name, capsys):
    assert ex.check_solution(name, **_params(name)) is True
    out = capsys.readouterr().out
    assert "passed" in out and "[packaged solution]" in out
    assert ex.check(name, ex.solution_fn(name, **_params(name)), raise_on_fail=True, **_params(name)) is True


@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_wrong_answer_is_reported(name, capsys):
    answer, params, phrase = WRONG[name]
    assert ex.check(name, answer, **params) is False
    out = capsys.readouterr().out
    assert f"{name}: wrong on" in out
    assert "\nYours: " in out and "\nSpec : " in out, out
    assert phrase in out, out
    with pytest.raises(ex.ExerciseFailed, match="Yours: "):
        ex.check(name, answer, raise_on_fail=True, **params)


@pytest.mark.parametrize("name", sorted(WRONG))
def test_not_done_yet(name, capsys):
    """An answer that still raises NotImplementedError (or a kernel that contains it) is 'not done yet'."""
    if name == "axpy":
        stub = axpy_stub
    else:

        def stub(*args):
            raise NotImplementedError("your code here")

    assert ex.check(name, stub, **_params(name)) is False
    assert "not done yet" in capsys.readouterr().out
    with pytest.raises(ex.ExerciseFailed, match="not done yet"):
        ex.check(name, stub, raise_on_fail=True, **_params(name))


def test_kernel_that_runs_past_the_end_is_reported(capsys):
    assert ex.check("axpy", axpy_unguarded) is False
    out = capsys.readouterr().out
    assert "Yours: raised IndexError" in out and "Spec : " in out


def test_tiled_matmul_with_a_wrong_product(capsys):
    assert ex.check("tiled_matmul", matmul_transposed_tile, tile=TILE) is False
    out = capsys.readouterr().out
    assert "Yours: " in out and "largest difference" in out


def _tiled_matmul_without_barrier(which: int):
    """The packaged tiled product with its ``which``-th cuda.syncthreads() (0: after the loads, 1: before the
    next loads) replaced by ``pass``."""
    lines = textwrap.dedent(inspect.getsource(first_kernels._tiled_matmul_solution)).splitlines(keepends=True)
    barriers = [i for i, line in enumerate(lines) if "cuda.syncthreads()" in line]
    assert len(barriers) == 2, barriers
    i = barriers[which]
    lines[i] = lines[i].replace("cuda.syncthreads()", "pass")
    namespace = dict(vars(first_kernels))
    exec(compile("".join(lines), "<tiled matmul without a barrier>", "exec"), namespace)
    return namespace["_tiled_matmul_solution"](TILE)


@pytest.mark.skipif(not SIMULATOR, reason="the race detector watches the simulator's shared arrays")
@pytest.mark.parametrize("which", [0, 1])
def test_tiled_matmul_without_a_barrier_is_a_race(which, capsys):
    """Reported as a race on every run, whether or not the simulator's thread order changed C."""
    for _ in range(2):
        assert ex.check("tiled_matmul", _tiled_matmul_without_barrier(which), tile=TILE) is False
        out = capsys.readouterr().out
        assert "Yours: threads race on shared array " in out and "before any syncthreads" in out, out


def test_answer_that_raises_is_shown(capsys):
    assert ex.check("compute_D", lambda o, do: o @ do) is False  # (4, 3) @ (4, 3): a shape error
    assert "Yours: raised ValueError" in capsys.readouterr().out


def test_solution_prints_its_source(capsys):
    for name in ex.names():
        ex.solution(name)
        out = capsys.readouterr().out
        assert out.startswith(f"# Solution of {name!r}") and "def " in out
        assert "return" in out or "@cuda.jit(device=True)" in out  # a device function may update arrays only


def test_unknown_exercise():
    with pytest.raises(ValueError, match="unknown exercise 'nope'; choose one of axpy"):
        ex.check("nope", lambda: None)
    with pytest.raises(ValueError, match="unknown exercise"):
        ex.solution("nope")


def test_describe_lists_every_exercise_in_course_order():
    lines = ex.describe().splitlines()
    assert [line.split()[0] for line in lines] == ex.names()
    lessons = [line.split()[2] for line in lines]
    numbered = [int(x) for x in lessons if x.isdigit()]
    appendix = lessons[len(numbered):]
    assert numbered == sorted(numbered) and numbered[0] == 0 and numbered[-1] == 14
    assert appendix and set(appendix) == {"A1"}  # the appendix's exercises come last


def test_flash2_finish_handles_rows_that_saw_no_key():
    O, L = ex.flash2_finish(np.zeros((2, 3)), np.array([0.0, 2.0]), np.array([-np.inf, 1.0]))
    assert np.all(O[0] == 0) and L[0] == -np.inf and L[1] == pytest.approx(1.0 + math.log(2.0))


def test_tiled_matmul_bytes_matches_the_package_model():
    from flash_numba.iomodel import standard

    for M, N, K in ((16, 16, 16), (17, 5, 33), (1, 40, 3)):
        kb = standard.matmul(1, M, N, K, np.float32)
        assert ex.tiled_matmul_bytes(M, N, K, standard.TILE) == (kb.bytes_read, kb.bytes_written)
