"""The bug zoo: FlashAttention kernels with one classic bug each, for lesson 11.

Every exhibit is a packaged solution of :mod:`flash_numba.flash_solutions`
with one to three lines changed: :func:`build` edits the solution's source and
compiles the edited copy, so an exhibit differs from the readable kernel by
exactly its :func:`diff`.  The learner runs an exhibit through the exercise's
checker (``ex.check(exhibit.exercise, build(name))``) and reads the verdict:
which case fails, which output, the hint, the bytes.

What the simulator can show.  It runs the CUDA threads of a block in turn, each
to its next barrier (:mod:`flash_numba.sim.warps`), so whether a missing
``cuda.syncthreads()`` makes a thread read a tile its neighbours have not loaded
yet (NaN: ``sim.warps`` fills shared memory with NaN) depends on that one order,
not on a GPU's.  The checkers
therefore run kernels under the race detector of :mod:`flash_numba.sim.races`,
which names the missing barrier on every run, whatever the order.  (The
solutions write ``max(s, m)``, score first, so that a NaN score wins in the
simulator's Python ``max``; the other order drops it and shows a row of zeros
instead.)  On a GPU the same bug may pass a thousand runs and fail the next; no
test proves a kernel race-free.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import textwrap
from dataclasses import dataclass

from numba import cuda

from . import flash_solutions
from .checking import _fmt, _Mismatch, _register


@dataclass(frozen=True)
class Exhibit:
    """One bug: which solution it edits, the edit, the exercise whose checker runs it, and what it is."""

    name: str
    solution: str  # a device function of flash_solutions
    edits: tuple  # ((old text, new text), ...), each old text found exactly once
    exercise: str  # the checker to run it through
    bug: str  # the bug, in words (the answer to the riddle)


EXHIBITS = {e.name: e for e in [
    Exhibit("missing_barrier", "flash2_rows",
            (("        cuda.syncthreads()  # K_j, V_j are complete\n", ""),),
            "flash2_loop", "no barrier between loading K_j, V_j and reading them"),
    Exhibit("stale_max", "flash2_rows",
            (("                alpha = math.exp(m_i - m_new)",
              "                m_i = m_new\n                alpha = math.exp(m_i - m_new)"),),
            "flash2_loop", "the running max is updated before the rescale factor uses it, so alpha = 1"),
    Exhibit("top_left_mask", "causal_tiles",
            (("    last_key = min((i + 1) * Br, Nq) - 1 + (Nk - Nq)", "    last_key = min((i + 1) * Br, Nq) - 1"),),
            "causal_tiles", "the causal bound aligned top-left (c <= r), right only when Nq = Nk"),
    Exhibit("partial_tile", "flash2_rows",
            (("        cols = min(Bc, Nk - c0)", "        cols = Bc"),),
            "flash2_loop", "every tile taken as full: N not a multiple of the block runs past the end"),
    Exhibit("backward_ignores_causal", "dkdv_step",
            (("        if col > r0 + r + diag:\n            continue  # a masked pair: P = 0, it adds nothing\n",
              ""),),
            "dkdv_block", "the backward recomputes P for masked pairs too"),
    Exhibit("scale_twice", "flash1_step",
            (("            s += Q_i[r, x] * K_j[c, x]", "            s += scale * Q_i[r, x] * K_j[c, x]"),),
            "flash1_block", "the scale folded into the dot product and applied again"),
    Exhibit("uncounted_load", "flash2_rows",
            (("                    s += q_r[x] * K_j[c, x]",
              "                    s += q_r[x] * k[c0 + c, x]  # from HBM, and not counted"),),
            "flash2_loop", "K read from HBM for every score and left out of the counter (the trace sees it)"),
    Exhibit("o_every_tile", "flash2_rows",
            (("                m_i = m_new\n",
              "                m_i = m_new\n"
              "                for x in range(D):  # the output, normalised and written at every tile\n"
              "                    o[row, x] = o_acc[x] / l_i\n"
              "                    nw += E\n"),),
            "flash2_loop", "O normalised and written to HBM at every tile, as flash1 does (right O, more bytes)"),
    Exhibit("reread_k", "flash2_rows",
            (("                    s += q_r[x] * K_j[c, x]",
              "                    s += q_r[x] * k[c0 + c, x]  # from HBM, not from the tile\n"
              "                    nr += E"),),
            "flash2_loop", "K read from HBM for every score although K_j is in shared memory (right O, 5x the bytes)"),
]}


def names() -> list[str]:
    """The exhibits, in the order of the lesson."""
    return list(EXHIBITS)


def _solution_source(ex: Exhibit) -> str:
    return textwrap.dedent(inspect.getsource(getattr(flash_solutions, ex.solution).py_func))


def _edited_source(ex: Exhibit) -> str:
    src = _solution_source(ex)
    for old, new in ex.edits:
        if src.count(old) != 1:
            raise ValueError(f"exhibit {ex.name!r}: the edit {old.strip()!r} matches {src.count(old)} places")
        src = src.replace(old, new)
    return src


def edited(solution: str, edits, label: str = "an edited solution"):
    """A device function of :mod:`.flash_solutions` with ``edits`` ((old, new) text pairs, each old text found
    exactly once) applied, compiled like the solution: how the exhibits are made, and how the tests feed the
    checkers other wrong answers."""
    return _compile(Exhibit(label, solution, tuple(edits), "", label))


def edited_factory(factory: str, edits):
    """A kernel factory of :mod:`.flash_solutions` (``flash2_forward_kernel``, ``dq_kernel``, ``dq_atomic_kernel``)
    with ``edits`` ((old, new) text pairs, each old text found exactly once) applied: a wrong whole kernel."""
    src = textwrap.dedent(inspect.getsource(getattr(flash_solutions, factory)))
    for old, new in edits:
        if src.count(old) != 1:
            raise ValueError(f"{factory}: the edit {old.strip()!r} matches {src.count(old)} places")
        src = src.replace(old, new)
    namespace = dict(vars(flash_solutions))
    exec(compile(src, f"<edited {factory}>", "exec"), namespace)
    return namespace[factory]


#: The atomic dQ kernel with its add made a plain ``+=`` (lesson 7 shows the write race it has).
PLAIN_ADD = (("cuda.atomic.add(dq, (r0 + r, x), scale * dS * k_c[x])", "dq[r0 + r, x] += scale * dS * k_c[x]"),)


def _compile(ex: Exhibit):
    body = _edited_source(ex).replace("@cuda.jit(device=True)\n", "", 1)
    namespace = dict(getattr(flash_solutions, ex.solution).py_func.__globals__)  # the solution's own globals
    exec(compile(body, f"<bug zoo: {ex.name}>", "exec"), namespace)
    fn = namespace[ex.solution]
    fn.__doc__ = f"{ex.name!r}: a copy of flash_solutions.{ex.solution} with one bug."
    return cuda.jit(device=True)(fn)


def _get(name: str) -> Exhibit:
    if name not in EXHIBITS:
        raise ValueError(f"name: unknown exhibit {name!r}; choose one of {', '.join(EXHIBITS)}")
    return EXHIBITS[name]


@functools.lru_cache(maxsize=None)
def build(name: str):
    """The buggy device function of exhibit ``name``, compiled like the solution it edits."""
    return _compile(_get(name))


def diff(name: str) -> str:
    """The exhibit's change to the readable solution, as a unified diff."""
    ex = _get(name)
    lines = difflib.unified_diff(_solution_source(ex).splitlines(), _edited_source(ex).splitlines(),
                                 f"flash_solutions.{ex.solution}", f"bug zoo: {name}", n=2, lineterm="")
    return "\n".join(lines)


def source(name: str) -> str:
    """The exhibit's whole (buggy) source."""
    return _edited_source(_get(name))


# ----------------------------------------------------------------------------- lesson 11's riddle

#: The exhibits lesson 11 shows without their diff: the learner names each from its checker's verdict.
MYSTERIES = {"A": "top_left_mask", "B": "scale_twice", "C": "partial_tile", "D": "backward_ignores_causal"}


def mystery(letter: str):
    """``(exercise, kernel)`` of mystery ``letter``, to run as ``ex.check(*bugzoo.mystery("A"))``."""
    if letter not in MYSTERIES:
        raise ValueError(f"letter: expected one of {', '.join(MYSTERIES)}, got {letter!r}")
    name = MYSTERIES[letter]
    return EXHIBITS[name].exercise, build(name)


def _diagnosis_solution():
    return dict(MYSTERIES)


@_register("bug_zoo", 11, "name the bug of each mystery kernel from its checker's verdict", _diagnosis_solution)
def _run_bug_zoo(answer):
    got = answer() if callable(answer) else answer
    if not isinstance(got, dict):
        return len(MYSTERIES), _Mismatch("the diagnosis", _fmt(got), "a dict {letter: exhibit name}")
    for n, (letter, name) in enumerate(MYSTERIES.items(), 1):
        yours = got.get(letter)
        if yours == name:
            continue
        notes = [f"the exhibits: {', '.join(EXHIBITS)}"]
        if yours not in EXHIBITS:
            notes.append(f"{yours!r} is not an exhibit's name")
        notes.append(f"run ex.check(*bugzoo.mystery({letter!r})) again: which case fails first, and what does "
                     "the last note say?")
        return len(MYSTERIES), _Mismatch(f"mystery {letter} (case {n} of {len(MYSTERIES)})", _fmt(yours),
                                         "another exhibit (not shown: it is the riddle)", tuple(notes))
    return len(MYSTERIES), None
