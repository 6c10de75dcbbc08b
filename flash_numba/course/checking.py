"""What every exercise checker shares: the registry, the mismatch it reports, and comparing and printing answers.

A checker registers itself with :func:`_register` (name, lesson, task, the
packaged solution) and returns ``(number of cases, _Mismatch or None)``;
:func:`flash_numba.course.exercises.check` prints the mismatch as ``Yours:`` / ``Spec :``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class _Mismatch:
    """Where an answer first differs from the spec."""

    case: str  # which case, in words
    yours: str
    spec: str
    notes: tuple = ()  # extra lines: where the arrays differ, what to look at
    diagnoses: tuple = ()  # lines that name a known mistake the answer matches (held back in a riddle)


@dataclass(frozen=True)
class _Exercise:
    name: str
    lesson: int | str  # a lesson's number, or an appendix's name ("A1")
    task: str
    solution: Callable  # the spec; for kernels a factory taking the exercise's parameters
    run: Callable  # run(answer, **params) -> (number of cases, _Mismatch or None)
    is_kernel: bool = False


_EXERCISES: dict[str, _Exercise] = {}


def _register(name: str, lesson: int | str, task: str, solution: Callable, *, kernel: bool = False):
    def wrap(run):
        _EXERCISES[name] = _Exercise(name, lesson, task, solution, run, kernel)
        return run

    return wrap


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

#: What a race the simulator's detector saw means, and where to look.
RACE_HINT = ("two threads touched one element of a shared array with no cuda.syncthreads() between them: put a "
             "barrier after the loads that fill a tile (before any thread reads it) and after the last read of a "
             "tile (before the loads that overwrite it). Checked on every access, whatever order the threads ran in")


@contextmanager
def _races_watched():
    """Yields the :class:`~flash_numba.sim.races.RaceLog` of the kernels launched inside, in the simulator
    (None on a GPU, where nothing watches shared memory)."""
    from ..device import SIMULATOR

    if not SIMULATOR:
        yield None
        return
    from ..sim.races import race_check

    with race_check() as races:
        yield races


def _race_mismatch(where: str, races) -> _Mismatch | None:
    """A _Mismatch naming the first race ``races`` (a RaceLog or None) saw, else None."""
    if races is None or races.first is None:
        return None
    return _Mismatch(f"{where}: shared memory", str(races.first),
                     "a cuda.syncthreads() between one thread writing a shared element and another touching it",
                     (RACE_HINT,))


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


def _verdict(name: str, who: str, n_cases: int, mismatch: _Mismatch | None, *, diagnoses: bool = True) -> str:
    """The checker's printed verdict; ``diagnoses=False`` leaves out the lines that name a known mistake
    (the bug zoo's mysteries: the learner reads the symptoms and names the bug)."""
    if mismatch is None:
        return f"{name}{who}: passed, {n_cases} cases agree with the spec."
    return "\n".join([
        f"{name}{who}: wrong on {mismatch.case}",
        "Yours: " + _indent(mismatch.yours),
        "Spec : " + _indent(mismatch.spec),
        *mismatch.notes,
        *(mismatch.diagnoses if diagnoses else ()),
    ])


def _course_order(lesson) -> tuple:
    """Sort key of a lesson: the numbered lessons first, then the appendices ("A1", ...)."""
    return (1, lesson) if isinstance(lesson, str) else (0, str(lesson).zfill(3))
