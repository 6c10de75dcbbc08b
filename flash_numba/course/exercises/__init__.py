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

    from flash_numba.course import exercises as ex
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

=======================  ======  =====================================================
exercise                 lesson  the learner writes
=======================  ======  =====================================================
``axpy``                 0       a first kernel: ``out = alpha * x + y``, one thread each
``matmul_intensity``     1       FLOPs per byte of a matrix product
``standard_attention``   2       ``softmax(scale Q K^T) V`` in NumPy, numerically stable
``online_softmax``       3       the running (m, l) update for one block of scores
``tiled_matmul``         4       the tiled matrix-product kernel, with its byte counter
``flash_rescale``        5       Algorithm 1, lines 10-13: one block step of the forward
``flash1_block``         5       Algorithm 1, lines 9-13, in a kernel frame
``theorem2``             6       Theorem 2's count of HBM accesses of Algorithm 1
``compute_D``            7       ``D_i = rowsum(dO_i * O_i)``
``recompute_P``          7       ``P_ij = exp(S_ij - L_i)`` from the saved L
``dkdv_block``           7       the dK/dV body of the backward, in a kernel frame
``dq_kernel``            7       a whole dQ kernel, one block per query tile
``dq_atomic``            7       a whole dQ kernel from the key side, with atomic adds
``causal_skip``          8       the test that a (query, key) block is wholly masked
``causal_tiles``         8       a kernel's loop bound under the causal mask
``flash2_update``        9       FlashAttention-2's step, normalisation delayed
``flash2_loop``          9       FlashAttention-2's loop, in a kernel frame
``flash2_kernel``        9       the whole FlashAttention-2 forward kernel
``kv_cache_bytes``       10      the size of a KV cache
``bug_zoo``              11      the bug of each mystery kernel, named from its verdict
``fix_missing_barrier``  11      repair a kernel whose threads race
``fix_stale_max``        11      repair a kernel whose merge of tiles is wrong
``split_heads``          12      a model's fused projection (B, N, 3C) as q, k, v of shape (B, H, N, d)
``mma_tile``             13      a 16 x 16 tile product kernel on ``mma.sync`` (one warp, fragments from shared)
``p_in_registers``       13      one lane's accumulators of S as its A registers of P for P V
``decode_bytes``         14      the HBM bytes and FLOPs of one decoding step
``merge_splits``         14      merge split-KV partials (O_s, m_s, l_s) into a row's o and lse
``tile_bytes``           A1      the shared memory of one flash2_fast forward block
``blocks_per_sm``        A1      the blocks of a kernel one SM holds at once
``loads_per_madd``       A1      shared loads per multiply-add, one product a thread or two
``dq_loads_per_madd``    A1      the dQ loop's loads per useful multiply-add, lanes in one group or two
=======================  ======  =====================================================

The FlashAttention *kernel* exercises (lessons 5-9 and 11) live in
:mod:`flash_numba.course.flash_checks` and register themselves: ``check`` runs them too.
The others live in this package: :mod:`.numpy_steps` (the NumPy steps of the
algorithm), :mod:`.counts` (closed-form counts) and :mod:`.first_kernels`
(``axpy``, ``tiled_matmul``); :mod:`.checking` holds what every checker shares.
"""

from __future__ import annotations

import inspect

from ..checking import _EXERCISES, _course_order, _Exercise, _verdict
from .first_kernels import tiled_matmul_bytes
from .numpy_steps import flash2_finish

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


# ----------------------------------------------------------------------------- the public functions


def names() -> list[str]:
    """The exercises, in course order."""
    return sorted(_EXERCISES, key=lambda n: _course_order(_EXERCISES[n].lesson))



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
    text = _verdict(name, who, n_cases, mismatch)
    print(text)
    if mismatch is None:
        return True
    if raise_on_fail:
        raise ExerciseFailed(text)
    return False


def describe() -> str:
    """One line per exercise: name, lesson and task."""
    return "\n".join(f"{n:<20} lesson {_EXERCISES[n].lesson!s:>2}  {_EXERCISES[n].task}" for n in names())


# Importing a module registers its exercises; names() orders them by lesson, and within a lesson by
# registration: the kernel exercises after the others.
from . import counts, first_kernels, numpy_steps  # noqa: E402,F401
from .. import bugzoo, flash_checks  # noqa: E402,F401  (the FlashAttention kernel exercises and the bug zoo)
from .. import decoding, tensor_cores  # noqa: E402,F401  (lessons 13 and 14)
