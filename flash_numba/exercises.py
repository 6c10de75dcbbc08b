"""The lessons' "Your turn" exercises: checkers, and the solutions behind them.

Each exercise is a small piece of the course the learner writes in a notebook:
a NumPy function, a closed-form count, or a Numba kernel.  The checker runs it
on a list of cases (awkward sizes, masked rows, huge scores) next to the
*spec*, the packaged solution, and stops at the first case where they differ,
printing both answers in GPU-Puzzles' manner::

    online_softmax: wrong on case 3 of 8 (row [1, 5, 2], blocks [1] [5, 2]), step 2 of 2
    Yours: (m, l) = (5, 1.01832)
    Spec : (m, l) = (5, 1.03514)

Using it in a notebook::

    from flash_numba import exercises as ex
    ex.check("online_softmax", online_softmax_update)   # True, or False with Yours/Spec
    ex.check_solution("online_softmax")                 # the packaged solution, same checker
    ex.solution("online_softmax")                       # print the solution's source

``check`` returns True or False; ``raise_on_fail=True`` raises
:class:`ExerciseFailed` instead of returning False.  An answer that still
raises ``NotImplementedError`` (the notebooks ship their exercise cells that
way) is reported as "not done yet", so a notebook runs top to bottom before the
learner has written anything.  A kernel counts as not done while its source
still contains ``raise NotImplementedError``: on a GPU an exception inside a
kernel is not reported to the host, so the checker looks before launching.

=====================  ======  =====================================================
exercise               lesson  the learner writes
=====================  ======  =====================================================
``axpy``               0       a first kernel: ``out = alpha * x + y``, one thread each
``matmul_intensity``   1       FLOPs per byte of a matrix product
``standard_attention`` 2       ``softmax(scale Q K^T) V`` in NumPy, numerically stable
``online_softmax``     3       the running (m, l) update for one block of scores
``tiled_matmul``       4       the tiled matrix-product kernel, with its byte counter
``flash_rescale``      5       Algorithm 1, lines 10-13: one block step of the forward
``theorem2``           6       Theorem 2's count of HBM accesses of Algorithm 1
``compute_D``          7       ``D_i = rowsum(dO_i * O_i)``
``recompute_P``        7       ``P_ij = exp(S_ij - L_i)`` from the saved L
``causal_skip``        8       the test that a (query, key) block is wholly masked
``flash2_update``      9       FlashAttention-2's step, normalisation delayed
``kv_cache_bytes``     10      the size of a KV cache
``bug_zoo``            11      the bug of each mystery kernel, named from its verdict
``split_heads``        12      a model's fused projection (B, N, 3C) as q, k, v of shape (B, H, N, d)
=====================  ======  =====================================================

The FlashAttention *kernel* exercises (``flash1_block``, ``dkdv_block``,
``causal_tiles``, ``flash2_loop``; lessons 5-9) live in
:mod:`flash_numba.kernel_exercises` and register here: ``check`` runs them too.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from numba import cuda, float32  # cuda: a module global, which the simulator swaps for its own

from . import reference

__all__ = [
    "ExerciseFailed",
    "check",
    "check_solution",
    "describe",
    "flash2_finish",
    "names",
    "solution",
    "solution_fn",
    "tiled_matmul_bytes",
]


class ExerciseFailed(AssertionError):
    """Raised by :func:`check` with ``raise_on_fail=True`` when an answer is wrong or not done."""


@dataclass
class _Mismatch:
    """Where an answer first differs from the spec."""

    case: str  # which case, in words
    yours: str
    spec: str
    notes: tuple = ()  # extra lines: where the arrays differ, what to look at


@dataclass(frozen=True)
class _Exercise:
    name: str
    lesson: int
    task: str
    solution: Callable  # the spec; for kernels a factory taking the exercise's parameters
    run: Callable  # run(answer, **params) -> (number of cases, _Mismatch or None)
    is_kernel: bool = False


_EXERCISES: dict[str, _Exercise] = {}


def _register(name: str, lesson: int, task: str, solution: Callable, *, kernel: bool = False):
    def wrap(run):
        _EXERCISES[name] = _Exercise(name, lesson, task, solution, run, kernel)
        return run

    return wrap


# ----------------------------------------------------------------------------- the public functions


def names() -> list[str]:
    """The exercises, in course order."""
    return sorted(_EXERCISES, key=lambda n: _EXERCISES[n].lesson)



def _get(name: str) -> _Exercise:
    if name not in _EXERCISES:
        raise ValueError(f"unknown exercise {name!r}; choose one of {', '.join(names())}")
    return _EXERCISES[name]


def solution_fn(name: str, **params):
    """The packaged solution of exercise ``name`` as an object to run (a function or a kernel).

    Kernel exercises take their parameters here too (``tiled_matmul`` needs ``tile=``).
    """
    ex = _get(name)
    return ex.solution(**params) if ex.is_kernel else ex.solution


def solution(name: str) -> None:
    """Print the source of the packaged solution of exercise ``name``."""
    ex = _get(name)
    print(f"# Solution of {name!r} (lesson {ex.lesson}): {ex.task}")
    print(inspect.getsource(getattr(ex.solution, "py_func", ex.solution)))  # a device function: its Python source


def check(name: str, answer, *, raise_on_fail: bool = False, **params) -> bool:
    """Run the checker of exercise ``name`` on ``answer``; print the verdict.

    Returns True when every case agrees with the spec.  Otherwise prints the
    first differing case (``Yours:`` / ``Spec :``) and returns False, or raises
    :class:`ExerciseFailed` when ``raise_on_fail``.  An answer that raises
    ``NotImplementedError`` is "not done yet" (False, or raises likewise).
    ``params`` go to the checker (``tile=`` for ``tiled_matmul``).
    """
    return _check(name, answer, "", raise_on_fail, params)


def check_solution(name: str, **params) -> bool:
    """Run the checker of ``name`` on the packaged solution (it must pass: a check of the checker)."""
    return _check(name, solution_fn(name, **params), " [packaged solution]", False, params)


def _check(name, answer, who, raise_on_fail, params) -> bool:
    ex = _get(name)
    try:
        n_cases, mismatch = ex.run(answer, **params)
    except NotImplementedError as exc:
        detail = f": {exc}" if str(exc) else ""
        text = f"{name}{who}: not done yet (NotImplementedError{detail}). Write your answer and run the cell again."
        print(text)
        if raise_on_fail:
            raise ExerciseFailed(text) from exc
        return False
    if mismatch is None:
        print(f"{name}{who}: passed, {n_cases} cases agree with the spec.")
        return True
    lines = [
        f"{name}{who}: wrong on {mismatch.case}",
        "Yours: " + _indent(mismatch.yours),
        "Spec : " + _indent(mismatch.spec),
        *mismatch.notes,
    ]
    text = "\n".join(lines)
    print(text)
    if raise_on_fail:
        raise ExerciseFailed(text)
    return False


# ----------------------------------------------------------------------------- comparing and printing


def _indent(text: str) -> str:
    return text.replace("\n", "\n       ")


def _fmt(x) -> str:
    if isinstance(x, BaseException):
        return f"raised {type(x).__name__}: {x}"
    if isinstance(x, tuple):
        return "(" + ", ".join(_fmt(v) for v in x) + ")"
    if isinstance(x, np.ndarray):
        return np.array2string(x, precision=5, threshold=48, edgeitems=3, max_line_width=100)
    if isinstance(x, (float, np.floating)):
        return f"{float(x):.6g}"
    return repr(x)


#: What a NaN in a kernel's output usually means (the simulator poisons shared and local memory with NaN).
KERNEL_NAN = ("yours has {n} NaN: the simulator fills shared and local memory with NaN, so a thread read a tile "
              "element no thread had written yet (a missing cuda.syncthreads() before the read, or a loop past "
              "the part of the tile that was loaded)")


#: What a kernel whose output changes from run to run on the same inputs has (the checkers launch a failing
#: case again to see).
RACE_NOTE = ("{name} changed between runs on the same inputs: threads race. In the simulator each thread runs on "
             "until it waits at a barrier, so a missing cuda.syncthreads() lets one thread read a tile before "
             "the others have written it, or overwrite it while they still read it")


def _diff_notes(yours, spec, kernel: bool = False) -> tuple:
    """A line saying where two arrays differ most (or why they cannot be compared).

    ``kernel``: the answer is a kernel, whose NaN comes from unwritten shared memory, not from exp(-inf + inf).
    """
    y = np.asarray(yours)
    s = np.asarray(spec)
    if y.shape != s.shape:
        return (f"shapes differ: yours {y.shape}, spec {s.shape}",)
    if not np.issubdtype(y.dtype, np.number) or y.size == 0:
        return ()
    y, s = y.astype(np.float64), s.astype(np.float64)
    notes = []
    if np.isnan(y).any():
        n_nan = int(np.isnan(y).sum())
        notes.append(KERNEL_NAN.format(n=n_nan) if kernel else f"yours has {n_nan} NaN (an exp(-inf - (-inf)) or 0/0?)")
    both_inf = np.isinf(y) & np.isinf(s) & (np.sign(y) == np.sign(s))
    err = np.where(both_inf, 0.0, np.abs(y - s))
    err = np.where(np.isnan(err), np.inf, err)
    idx = np.unravel_index(int(np.argmax(err)), err.shape)
    notes.append(f"largest difference at index {tuple(int(i) for i in idx)}: yours {_fmt(y[idx])}, spec {_fmt(s[idx])}")
    return tuple(notes)


def _close(yours, spec, rtol: float, atol: float) -> bool:
    """Same shape and equal within rtol/atol, with NaN never equal and same-signed infinities equal."""
    if isinstance(spec, tuple):
        return isinstance(yours, tuple) and len(yours) == len(spec) and all(
            _close(y, s, rtol, atol) for y, s in zip(yours, spec)
        )
    try:
        y = np.asarray(yours, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    s = np.asarray(spec, dtype=np.float64)
    return y.shape == s.shape and bool(np.allclose(y, s, rtol=rtol, atol=atol, equal_nan=False))


def _compare(cases, answer, spec, *, rtol=1e-9, atol=1e-12, exact=False):
    """Run ``answer(*args)`` and ``spec(*args)`` on each ``(label, args)``; the first mismatch or None."""
    cases = list(cases)
    for n, (label, args) in enumerate(cases, 1):
        want = spec(*_copy(args))
        try:
            got = answer(*_copy(args))
        except NotImplementedError:
            raise
        except Exception as exc:  # the learner's error is part of the verdict
            return len(cases), _Mismatch(f"case {n} of {len(cases)} ({label})", _fmt(exc), _fmt(want))
        got = tuple(got) if isinstance(got, list) and isinstance(want, tuple) else got
        ok = _equal(got, want) if exact else _close(got, want, rtol, atol)
        if not ok:
            notes = ()
            if isinstance(want, np.ndarray):
                notes = _diff_notes(got, want)
            elif isinstance(want, tuple) and isinstance(got, tuple) and len(got) == len(want):
                for i, (g, w) in enumerate(zip(got, want)):
                    if isinstance(w, np.ndarray) and not _close(g, w, rtol, atol):
                        notes = (f"output {i} differs: " + "; ".join(_diff_notes(g, w)),)
                        break
            return len(cases), _Mismatch(f"case {n} of {len(cases)} ({label})", _fmt(got), _fmt(want), notes)
    return len(cases), None


def _equal(got, want) -> bool:
    """Exactly equal numbers (an int answer may come as a float holding the same value), or the same bool."""
    if isinstance(want, bool) or isinstance(got, bool):
        return got is want or (isinstance(got, np.bool_) and bool(got) is want)
    try:
        return bool(got == want)
    except (TypeError, ValueError):
        return False


def _copy(args):
    """Fresh copies of array arguments, so an answer that writes into its inputs cannot spoil the spec."""
    return tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)


def _rng(name: str) -> np.random.Generator:
    """A generator seeded from the exercise's name: the same cases on every run."""
    return np.random.default_rng(sum(ord(c) * 31**i for i, c in enumerate(name)) % 2**32)


def _kernel_not_done(kernel) -> None:
    """Raise NotImplementedError while a kernel's source still raises it (checked before launching)."""
    func = getattr(kernel, "py_func", kernel)
    code = getattr(func, "__code__", None)
    if code is not None and "NotImplementedError" in code.co_names:
        raise NotImplementedError("the kernel still contains `raise NotImplementedError`; replace it with your code")


# ============================================================================= lesson 0: a first kernel


def _axpy_solution():
    @cuda.jit
    def axpy(alpha, x, y, out):
        i = cuda.grid(1)  # this thread's global index: blockIdx.x * blockDim.x + threadIdx.x
        if i < out.size:  # the last block may run past the end of the arrays
            out[i] = alpha * x[i] + y[i]

    return axpy


@_register("axpy", 0, "out = alpha * x + y, one thread per element", _axpy_solution, kernel=True)
def _run_axpy(kernel, threads: int = 32):
    """Launch ``kernel[ceil(n / threads), threads](alpha, x, y, out)`` for several n (float32).

    The arrays are views into longer buffers whose tail holds a sentinel, so a
    thread that writes past the end is caught on a GPU as well as in the simulator.
    """
    _kernel_not_done(kernel)
    rng = _rng("axpy")
    sizes = [1, threads - 1, threads, 3 * threads + 5]
    PAD = threads
    for n_case, n in enumerate(sizes, 1):
        blocks = -(-n // threads)
        grid = f"{blocks} block{'s' * (blocks > 1)} of {threads} threads"
        label = f"case {n_case} of {len(sizes)} (n = {n}, {grid})"
        alpha = np.float32(rng.uniform(-2, 2))
        x = rng.standard_normal(n + PAD).astype(np.float32)
        y = rng.standard_normal(n + PAD).astype(np.float32)
        out_full = cuda.to_device(np.full(n + PAD, np.nan, dtype=np.float32))
        spec = alpha * x[:n] + y[:n]
        try:
            x_d, y_d = cuda.to_device(x), cuda.to_device(y)
            kernel[blocks, threads](alpha, x_d[:n], y_d[:n], out_full[:n])
            full = out_full.copy_to_host()
        except Exception as exc:
            return len(sizes), _Mismatch(label, _fmt(exc), _fmt(spec), ("did a thread past the end read or write?",))
        got = full[:n]
        if not np.isnan(full[n:]).all():
            return len(sizes), _Mismatch(
                label, f"wrote {int((~np.isnan(full[n:])).sum())} elements past the end", "writes only out[0:n]",
                ("guard the store with `if i < out.size:`",),
            )
        if not _close(got, spec, 1e-6, 1e-6):
            return len(sizes), _Mismatch(label, _fmt(got), _fmt(spec), _diff_notes(got, spec))
    return len(sizes), None


# ============================================================================= lesson 1: arithmetic intensity


def _matmul_intensity_solution(M, N, K, itemsize):
    flops = 2 * M * N * K  # one multiply and one add per (i, j, k)
    bytes_moved = (M * K + K * N + M * N) * itemsize  # read A and B once, write C once
    return flops / bytes_moved


@_register("matmul_intensity", 1, "FLOPs per byte of C = A B at minimum traffic", _matmul_intensity_solution)
def _run_matmul_intensity(answer):
    cases = [
        ("M = N = K = 1024, float32", (1024, 1024, 1024, 4)),
        ("M = N = K = 1024, float16", (1024, 1024, 1024, 2)),
        ("S = Q K^T: M = N = 4096, K = 64, float32", (4096, 4096, 64, 4)),
        ("a matrix-vector product: M = 4096, N = 1, K = 4096, float32", (4096, 1, 4096, 4)),
        ("M = 3, N = 5, K = 7, float64", (3, 5, 7, 8)),
    ]
    return _compare(cases, answer, _matmul_intensity_solution, rtol=1e-12)


# ============================================================================= lesson 2: standard attention


def _standard_attention_solution(q, k, v):
    d = q.shape[-1]
    S = (q @ k.T) / math.sqrt(d)  # (Nq, Nk) scores
    m = S.max(axis=1, keepdims=True)  # (Nq, 1) row maxima: exp(S - m) <= 1 never overflows
    P = np.exp(S - m)
    P /= P.sum(axis=1, keepdims=True)  # softmax, row by row
    return P @ v  # (Nq, d)


@_register("standard_attention", 2, "O = softmax(Q K^T / sqrt(d)) V in NumPy, stable", _standard_attention_solution)
def _run_standard_attention(answer):
    rng = _rng("standard_attention")

    def qkv(Nq, Nk, d, spread=1.0):
        return tuple(spread * rng.standard_normal(s) for s in ((Nq, d), (Nk, d))) + (rng.standard_normal((Nk, d)),)

    cases = [
        ("Nq = Nk = 4, d = 2", qkv(4, 4, 2)),
        ("Nq = 5, Nk = 3, d = 4", qkv(5, 3, 4)),
        ("one query, one key", qkv(1, 1, 3)),
        ("Nq = 3, Nk = 7, d = 8, scores near +-1000 (exp overflows unless you subtract the row max)",
         qkv(3, 7, 8, 30.0)),
    ]
    return _compare(cases, answer, _standard_attention_solution)


# ============================================================================= lesson 3: online softmax


def _online_softmax_solution(m, l, x_j):
    m_t = float(np.max(x_j))  # max of this block
    m_new = max(m, m_t)  # the running max after this block
    if m_new == -math.inf:  # everything seen so far is -inf (masked): nothing to add yet
        return m_new, 0.0
    # Rescale the old sum to the new max, then add this block's terms at the new max.
    l_new = math.exp(m - m_new) * l + float(np.sum(np.exp(x_j - m_new)))
    return m_new, l_new


def _blocks_of(x, splits):
    return [b for b in np.split(x, splits) if b.size]


def _online_cases():
    rng = _rng("online_softmax")
    ninf = -math.inf
    rows = [
        ("two blocks", np.array([1.0, 5.0, 2.0, 0.5]), [2]),
        ("the max arrives in the last block", np.array([-1.0, 0.0, 0.5, 3.0, 7.0]), [2, 4]),
        ("blocks of one score", rng.standard_normal(6), [1, 2, 3, 4, 5]),
        ("one block holds the whole row", rng.standard_normal(5), []),
        ("random row, uneven blocks", 3 * rng.standard_normal(11), [3, 4, 9]),
        ("scores around 1e4 (exp overflows unless rescaled)", 1e4 + 10 * rng.standard_normal(7), [2, 5]),
        ("a masked (-inf) score inside a block", np.array([0.5, ninf, 2.0, 1.0]), [2]),
        ("the first block fully masked (-inf): m stays -inf, l stays 0, no NaN", np.array([ninf, ninf, 1.0, 3.0]), [2]),
        ("a fully masked row", np.array([ninf, ninf, ninf]), [1]),
    ]
    return [(label, x, _blocks_of(x, s)) for label, x, s in rows]


@_register("online_softmax", 3, "the running (m, l) update for one block of scores", _online_softmax_solution)
def _run_online_softmax(answer):
    cases = _online_cases()
    for n, (label, x, blocks) in enumerate(cases, 1):
        m_y, l_y, m_s, l_s = -math.inf, 0.0, -math.inf, 0.0
        where = f"case {n} of {len(cases)} ({label}; row {_fmt(x)}, blocks " + " ".join(_fmt(b) for b in blocks) + ")"
        for step, x_j in enumerate(blocks, 1):
            before = (m_s, l_s)  # both states agree up to here
            try:
                got = answer(m_y, l_y, x_j.copy())
                m_y, l_y = float(got[0]), float(got[1])
            except NotImplementedError:
                raise
            except Exception as exc:
                return len(cases), _Mismatch(f"{where}, step {step}", _fmt(exc), _fmt((m_s, l_s)))
            m_s, l_s = _online_softmax_solution(m_s, l_s, x_j)
            if not _close((m_y, l_y), (m_s, l_s), 1e-9, 1e-300):
                notes = (f"the state before this step was (m, l) = {_fmt(before)}",)
                return len(cases), _Mismatch(
                    f"{where}, step {step} of {len(blocks)} (block {_fmt(x_j)})",
                    f"(m, l) = {_fmt((m_y, l_y))}", f"(m, l) = {_fmt((m_s, l_s))}", notes,
                )
        ref = reference.online_softmax_stats(x, [])  # the whole row at once
        assert _close((m_s, l_s), ref, 1e-12, 1e-300), "the spec disagrees with the reference"
    return len(cases), None


# ============================================================================= lesson 4: the tiled matrix product


@functools.lru_cache(maxsize=None)
def _tiled_matmul_solution(tile: int):
    """A factory so that TILE is a compile-time constant; in the notebook TILE is a global."""
    TILE = tile
    E = 4  # bytes per float32 element

    @cuda.jit
    def matmul_tiled(a, b, c, counter):
        M, K = a.shape
        N = b.shape[1]
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row = cuda.blockIdx.y * TILE + ty  # this thread's element C[row, col]
        col = cuda.blockIdx.x * TILE + tx
        a_tile = cuda.shared.array((TILE, TILE), float32)
        b_tile = cuda.shared.array((TILE, TILE), float32)
        acc = float32(0)
        nr = 0  # bytes this thread loads from A and B in global memory
        for k0 in range(0, K, TILE):
            # Stage one tile of A and one of B: each thread loads one element of each (0 past the edges).
            if row < M and k0 + tx < K:
                a_tile[ty, tx] = a[row, k0 + tx]
                nr += E
            else:
                a_tile[ty, tx] = 0
            if k0 + ty < K and col < N:
                b_tile[ty, tx] = b[k0 + ty, col]
                nr += E
            else:
                b_tile[ty, tx] = 0
            cuda.syncthreads()  # both tiles are complete before anyone reads them
            for kk in range(TILE):
                acc += a_tile[ty, kk] * b_tile[kk, tx]
            cuda.syncthreads()  # everyone has finished with the tiles before they are overwritten
        if row < M and col < N:
            c[row, col] = acc
            cuda.atomic.add(counter, 1, E)  # bytes written
        cuda.atomic.add(counter, 0, nr)  # bytes read

    return matmul_tiled


def tiled_matmul_bytes(M: int, N: int, K: int, tile: int, itemsize: int = 4) -> tuple[int, int]:
    """Bytes a (tile x tile)-tiled product C (M, N) = A (M, K) B (K, N) reads and writes.

    The block of each C tile reads its K-strip of A and of B once: A is read once per
    column of tiles, B once per row of tiles (the same rule as the package's matmul).
    """
    Tm, Tn = -(-M // tile), -(-N // tile)
    return itemsize * (Tn * M * K + Tm * K * N), itemsize * M * N


@_register("tiled_matmul", 4, "the tiled matrix product kernel, counting its global loads", _tiled_matmul_solution,
           kernel=True)
def _run_tiled_matmul(kernel, tile: int):
    """Launch ``kernel[(ceil(N/tile), ceil(M/tile)), (tile, tile)](a, b, c, counter)`` (float32) and
    compare C with NumPy and the counted bytes with :func:`tiled_matmul_bytes`."""
    _kernel_not_done(kernel)
    rng = _rng("tiled_matmul")
    shapes = [(tile, tile, tile), (2 * tile + 3, tile + 5, tile - 1), (1, 2 * tile + 1, 3), (tile + 1, 1, 2 * tile)]
    for n_case, (M, K, N) in enumerate(shapes, 1):
        label = f"case {n_case} of {len(shapes)} (A {M}x{K} @ B {K}x{N}, TILE = {tile})"
        a = rng.standard_normal((M, K)).astype(np.float32)
        b = rng.standard_normal((K, N)).astype(np.float32)
        spec = a.astype(np.float64) @ b.astype(np.float64)
        c = cuda.to_device(np.full((M, N), np.nan, dtype=np.float32))
        counter = cuda.to_device(np.zeros(2, dtype=np.int64))
        grid = (-(-N // tile), -(-M // tile)), (tile, tile)

        def launch():
            out = cuda.to_device(np.full((M, N), np.nan, dtype=np.float32))
            kernel[grid](cuda.to_device(a), cuda.to_device(b), out, cuda.to_device(np.zeros(2, dtype=np.int64)))
            return out.copy_to_host()

        try:
            kernel[grid](cuda.to_device(a), cuda.to_device(b), c, counter)
            got = c.copy_to_host()
        except Exception as exc:
            return len(shapes), _Mismatch(label, _fmt(exc), _fmt(spec), ("an index past the edge of A, B or C?",))
        if not _close(got, spec, 1e-5, 1e-5):
            notes = _diff_notes(got, spec, kernel=True)
            if any(not np.array_equal(got, launch(), equal_nan=True) for _ in range(3)):
                notes = (RACE_NOTE.format(name="C"), *notes)
            return len(shapes), _Mismatch(label, _fmt(got), _fmt(spec), notes)
        read, written = (int(x) for x in counter.copy_to_host())
        want = tiled_matmul_bytes(M, N, K, tile)
        if (read, written) != want:
            return len(shapes), _Mismatch(
                label + ": HBM bytes", f"read {read:,}, written {written:,}", f"read {want[0]:,}, written {want[1]:,}",
                ("count 4 bytes for each element a thread loads from A or B (not for the zeros past the edges)",),
            )
    return len(shapes), None


# ============================================================================= lesson 5: the flash forward step


def _flash_rescale_solution(O_i, l_i, m_i, S_ij, V_j):
    m_t = S_ij.max(axis=1)  # line 10: m~_ij = rowmax(S_ij), (Br,)
    m_t_safe = np.where(m_t == -np.inf, 0.0, m_t)  # a fully masked row: exp(-inf - 0) = 0, not NaN
    P_t = np.exp(S_ij - m_t_safe[:, None])  # line 10: P~_ij = exp(S_ij - m~_ij), (Br, Bc)
    l_t = P_t.sum(axis=1)  # line 10: l~_ij = rowsum(P~_ij), (Br,)
    m_new = np.maximum(m_i, m_t)  # line 11: m_new = max(m_i, m~_ij)
    m_new_safe = np.where(m_new == -np.inf, 0.0, m_new)
    a = np.exp(m_i - m_new_safe)  # line 11: e^(m_i - m_new), the old terms' rescale
    b = np.exp(m_t - m_new_safe)  # line 11: e^(m~_ij - m_new), this block's rescale
    l_new = a * l_i + b * l_t  # line 11
    l_div = np.where(l_new > 0, l_new, 1.0)  # l_new = 0 only on a row that has seen no key: O stays 0
    # line 12: O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j)
    O_new = ((l_i * a)[:, None] * O_i + b[:, None] * (P_t @ V_j)) / l_div[:, None]
    return O_new, l_new, m_new  # line 13


def _flash_states(rng, Br, Bc, d, spread=1.0, masked_rows=(), fresh=False):
    """A consistent state (O_i, l_i, m_i) after one earlier block, and the next S_ij, V_j."""
    O_i, l_i, m_i = np.zeros((Br, d)), np.zeros(Br), np.full(Br, -np.inf)
    if not fresh:
        S0 = spread * rng.standard_normal((Br, Bc))
        O_i, l_i, m_i = _flash_rescale_solution(O_i, l_i, m_i, S0, rng.standard_normal((Bc, d)))
    S_ij = spread * rng.standard_normal((Br, Bc))
    for r in masked_rows:
        S_ij[r] = -np.inf
    return O_i, l_i, m_i, S_ij, rng.standard_normal((Bc, d))


@_register("flash_rescale", 5, "Algorithm 1, lines 10-13: merge one block S_ij, V_j into O_i, l_i, m_i",
           _flash_rescale_solution)
def _run_flash_rescale(answer):
    rng = _rng("flash_rescale")
    cases = [
        ("the first block: O_i = 0, l_i = 0, m_i = -inf; Br = 3, Bc = 4, d = 2",
         _flash_states(rng, 3, 4, 2, fresh=True)),
        ("a later block; Br = 4, Bc = 3, d = 5", _flash_states(rng, 4, 3, 5)),
        ("a later block with scores near 1e3", _flash_states(rng, 2, 5, 3, spread=300.0)),
        ("row 1 of this block fully masked (-inf)", _flash_states(rng, 3, 4, 2, masked_rows=(1,))),
        ("the first block, row 0 fully masked: O stays 0, l 0, m -inf", _flash_states(rng, 2, 3, 2, (0,), fresh=True)),
    ]
    return _compare(cases, answer, _flash_rescale_solution)


# ============================================================================= lesson 6: Theorem 2


def _theorem2_solution(N, d, Bc):
    Tc = -(-N // Bc)  # outer passes (ceil(N / Bc))
    # K and V are read once (2 N d); every outer pass reads Q, O, l, m (2 N d + 2 N)
    # and writes O, l, m (N d + 2 N).
    return 2 * N * d + Tc * (3 * N * d + 4 * N)


@_register("theorem2", 6, "elements Algorithm 1 reads and writes in HBM (Theorem 2)", _theorem2_solution)
def _run_theorem2(answer):
    cases = [
        ("N = 1024, d = 64, Bc = 128", (1024, 64, 128)),
        ("N = 1024, d = 64, Bc = 1024 (one pass)", (1024, 64, 1024)),
        ("N = 100, d = 16, Bc = 48 (Bc does not divide N)", (100, 16, 48)),
        ("N = 1, d = 8, Bc = 16", (1, 8, 16)),
    ]
    n, mismatch = _compare(cases, answer, _theorem2_solution, exact=True)
    if mismatch is not None:
        mismatch.yours += " elements"
        mismatch.spec += " elements"
    return n, mismatch


# ============================================================================= lesson 7: the backward pass


def _compute_D_solution(o, do):
    return (do * o).sum(axis=-1)  # D_i = rowsum(dO_i * O_i), (..., N)


@_register("compute_D", 7, "D_i = rowsum(dO_i * O_i)", _compute_D_solution)
def _run_compute_D(answer):
    rng = _rng("compute_D")
    cases = [
        ("N = 4, d = 3", (rng.standard_normal((4, 3)), rng.standard_normal((4, 3)))),
        ("N = 1, d = 5", (rng.standard_normal((1, 5)), rng.standard_normal((1, 5)))),
        ("three heads: (H, N, d) = (3, 5, 2)", (rng.standard_normal((3, 5, 2)), rng.standard_normal((3, 5, 2)))),
    ]
    return _compare(cases, answer, _compute_D_solution)


def _recompute_P_solution(S, L):
    L_safe = np.where(L == -np.inf, 0.0, L)  # a row that saw no key has L = -inf and P = 0
    return np.exp(S - L_safe[:, None])  # P_ij = exp(S_ij - L_i), (Br, Bc)


@_register("recompute_P", 7, "P_ij = exp(S_ij - L_i) from the saved L", _recompute_P_solution)
def _run_recompute_P(answer):
    rng = _rng("recompute_P")

    def case(Nq, Nk, masked_rows=(), causal=False):
        S = rng.standard_normal((Nq, Nk))
        if causal:
            S = np.where(reference.causal_mask(Nq, Nk), S, -np.inf)
        S[list(masked_rows)] = -np.inf
        m = S.max(axis=1)
        m_safe = np.where(m == -np.inf, 0.0, m)
        l = np.exp(S - m_safe[:, None]).sum(axis=1)
        L = np.where(l > 0, m + np.log(np.where(l > 0, l, 1.0)), -np.inf)
        return S, L

    cases = [
        ("Nq = 3, Nk = 4", case(3, 4)),
        ("causal, Nq = Nk = 5 (masked entries are -inf)", case(5, 5, causal=True)),
        ("causal, Nq = 4 > Nk = 2: the first rows see no key, L = -inf", case(4, 2, causal=True)),
    ]
    return _compare(cases, answer, _recompute_P_solution)


# ============================================================================= lesson 8: causal masking


def _causal_skip_solution(i, j, Br, Bc, Nq, Nk):
    last_query = min((i + 1) * Br, Nq) - 1  # the last row of query block i (it may be short)
    first_key = j * Bc  # the first key of key block j
    # Key c is visible to query r iff c <= r + (Nk - Nq): the block's most visible pair is
    # (last_query, first_key); if even that one is masked, they all are.
    return first_key > last_query + (Nk - Nq)


@_register("causal_skip", 8, "True when block (i, j) is wholly above the causal diagonal", _causal_skip_solution)
def _run_causal_skip(answer):
    shapes = [(8, 8, 4, 4), (8, 8, 4, 2), (7, 7, 3, 2), (5, 9, 2, 3), (9, 4, 4, 2), (6, 3, 5, 1), (1, 6, 2, 4)]
    n_cases = 0
    for Nq, Nk, Br, Bc in shapes:
        mask = reference.causal_mask(Nq, Nk)
        Tr, Tc = -(-Nq // Br), -(-Nk // Bc)
        for i in range(Tr):
            for j in range(Tc):
                n_cases += 1
                rows, cols = slice(i * Br, min((i + 1) * Br, Nq)), slice(j * Bc, min((j + 1) * Bc, Nk))
                spec = not mask[rows, cols].any()
                assert spec == _causal_skip_solution(i, j, Br, Bc, Nq, Nk), "the spec disagrees with the mask"
                try:
                    got = answer(i, j, Br, Bc, Nq, Nk)
                except NotImplementedError:
                    raise
                except Exception as exc:
                    got = exc
                if not isinstance(got, BaseException) and _equal(got, spec):
                    continue
                label = (f"block (i, j) = ({i}, {j}) with Nq = {Nq}, Nk = {Nk}, Br = {Br}, Bc = {Bc}: "
                         f"queries {rows.start}..{rows.stop - 1}, keys {cols.start}..{cols.stop - 1}")
                picture = _block_picture(mask, rows, cols)
                return n_cases, _Mismatch(label, _fmt(got), _fmt(spec), (
                    f"visible pairs in this block: {int(mask[rows, cols].sum())} "
                    "(the block is skipped only when there are none)",
                    "the causal mask (rows: queries, columns: keys; this block in upper case):", *picture,
                ))
    return n_cases, None


def _block_picture(mask, rows, cols):
    """The mask as text: 'x' visible, '.' masked; the block in question as 'X' and ':'."""
    lines = []
    for r in range(mask.shape[0]):
        chars = []
        for c in range(mask.shape[1]):
            inside = rows.start <= r < rows.stop and cols.start <= c < cols.stop
            chars.append(("X" if inside else "x") if mask[r, c] else (":" if inside else "."))
        lines.append("    " + "".join(chars))
    return lines


# ============================================================================= lesson 9: FlashAttention-2


def _flash2_update_solution(O_acc, l, m, S_ij, V_j):
    m_new = np.maximum(m, S_ij.max(axis=1))  # running row max, (Br,)
    m_safe = np.where(m_new == -np.inf, 0.0, m_new)  # rows that have seen no key yet: shift by 0
    P_t = np.exp(S_ij - m_safe[:, None])  # (Br, Bc), at the new max
    alpha = np.exp(m - m_safe)  # rescale of everything accumulated so far
    l_new = alpha * l + P_t.sum(axis=1)
    O_new = alpha[:, None] * O_acc + P_t @ V_j  # (Br, d): no division; that waits until the end
    return O_new, l_new, m_new


def flash2_finish(O_acc, l, m):
    """FlashAttention-2's last step: O_i = O_acc / l_i (0 where l_i = 0) and L_i = m_i + log(l_i)."""
    safe = np.where(l > 0, l, 1.0)
    return O_acc / safe[:, None], np.where(l > 0, m + np.log(safe), -np.inf)


@_register("flash2_update", 9, "FlashAttention-2's block step, normalisation delayed", _flash2_update_solution)
def _run_flash2_update(answer):
    rng = _rng("flash2_update")
    cases = []
    for label, (Nq, Nk, d, Bc, spread, causal) in [
        ("Nq = 3, Nk = 8, d = 2, Bc = 3", (3, 8, 2, 3, 1.0, False)),
        ("scores near 1e3", (2, 6, 3, 2, 30.0, False)),
        ("causal, Nq = 5 > Nk = 4, Bc = 2 (row 0 sees no key)", (5, 4, 2, 2, 1.0, True)),
    ]:
        q, k, v = (spread ** (n < 2) * rng.standard_normal(s) for n, s in enumerate(((Nq, d), (Nk, d), (Nk, d))))
        cases.append((label, q, k, v, Bc, causal))
    for n, (label, q, k, v, Bc, causal) in enumerate(cases, 1):
        Nq, d = q.shape
        Nk = k.shape[0]
        S = (q @ k.T) / math.sqrt(d)
        if causal:
            S = np.where(reference.causal_mask(Nq, Nk), S, -np.inf)
        ys = ss = (np.zeros((Nq, d)), np.zeros(Nq), np.full(Nq, -np.inf))
        Tc = -(-Nk // Bc)
        for j in range(Tc):
            cols = slice(j * Bc, min((j + 1) * Bc, Nk))
            where = f"case {n} of {len(cases)} ({label}), step j = {j} of Tc = {Tc}"
            try:
                got = tuple(answer(*_copy(ys + (S[:, cols], v[cols]))))
            except NotImplementedError:
                raise
            except Exception as exc:
                return len(cases), _Mismatch(where, _fmt(exc), "(O_acc, l, m)")
            ss = _flash2_update_solution(*ss, S[:, cols], v[cols])
            if not _close(got, ss, 1e-9, 1e-12):
                notes = ()
                if len(got) == 3:
                    for name, g, s in zip(("O_acc", "l", "m"), got, ss):
                        if not _close(g, s, 1e-9, 1e-12):
                            notes = (f"{name} differs: " + "; ".join(_diff_notes(g, s)),)
                            break
                return len(cases), _Mismatch(
                    where, "(O_acc, l, m) = " + _fmt(got), "(O_acc, l, m) = " + _fmt(ss), notes
                )
            ys = got
        o, lse = flash2_finish(*ss)
        ro, rlse = reference.attention_forward(q, k, v, causal=causal)
        assert _close((o, lse), (ro, rlse), 1e-9, 1e-12), "the spec disagrees with the reference"
    return len(cases), None


# ============================================================================= lesson 10: the KV cache


def _kv_cache_bytes_solution(layers, heads, d, context, batch, itemsize):
    # Every layer keeps one key and one value vector (heads x d numbers) per token of every sequence.
    return 2 * layers * heads * d * context * batch * itemsize


@_register("kv_cache_bytes", 10, "bytes of a KV cache", _kv_cache_bytes_solution)
def _run_kv_cache_bytes(answer):
    cases = [
        ("Llama-2-7B: 32 layers, 32 heads, d = 128, 4096 tokens, batch 1, float16", (32, 32, 128, 4096, 1, 2)),
        ("the same, batch 8", (32, 32, 128, 4096, 8, 2)),
        ("1 layer, 1 head, d = 1, 1 token, batch 1, float32", (1, 1, 1, 1, 1, 4)),
        ("12 layers, 12 heads, d = 64, 1024 tokens, batch 3, float32", (12, 12, 64, 1024, 3, 4)),
    ]
    n, mismatch = _compare(cases, answer, _kv_cache_bytes_solution, exact=True)
    if mismatch is not None and not mismatch.yours.startswith("raised"):
        mismatch.notes += ("a cache keeps K and V, for every layer, head, token and sequence",)
    return n, mismatch


# ============================================================================= lesson 12: into a model


def _split_heads_solution(qkv, n_head):
    B, N, C3 = qkv.shape
    d = C3 // (3 * n_head)
    # (B, N, 3C) -> (B, N, 3, H, d) -> (3, B, H, N, d): the channels are [q | k | v], each [head 0 | head 1 | ...]
    q, k, v = qkv.reshape(B, N, 3, n_head, d).transpose(2, 0, 3, 1, 4)
    return q, k, v


@_register("split_heads", 12, "a fused projection (B, N, 3C) as q, k, v of shape (B, H, N, d)", _split_heads_solution)
def _run_split_heads(answer):
    rng = _rng("split_heads")
    cases = [
        (f"B = {B}, N = {N}, C = {C}, H = {H}", (rng.standard_normal((B, N, 3 * C)), H))
        for B, N, C, H in [(1, 4, 2, 1), (2, 5, 4, 2), (2, 3, 12, 4)]
    ]
    n, mismatch = _compare(cases, answer, _split_heads_solution, rtol=0.0, atol=0.0)
    if mismatch is not None and not mismatch.yours.startswith("raised"):
        mismatch.notes += ("a reshape alone keeps the numbers in (B, N) order: move the 3 and H axes in front of N",)
    return n, mismatch


from . import bugzoo, kernel_exercises  # noqa: E402,F401  (register the FlashAttention kernel exercises)


def describe() -> str:
    """One line per exercise: name, lesson and task."""
    return "\n".join(f"{n:<20} lesson {_EXERCISES[n].lesson:>2}  {_EXERCISES[n].task}" for n in names())
