"""Checkers of the kernel exercises that build FlashAttention, from a kernel's heart to whole kernels.

Heart exercises: the learner writes a CUDA device function (``@cuda.jit(device=True)``)
that the checker compiles into a readable kernel *frame* of :mod:`.flash_solutions`
(print one with :func:`frame_source`). The frame declares the tiles, loads what the
exercise does not ask for and adds the bytes to the counter; the learner's function
does the part of the algorithm the exercise is about and counts the global reads and
writes it makes (``nr``/``nw``, as every kernel of the package does).

Whole-kernel exercises: the learner writes a factory ``make(Br, Bc, d, causal)`` that
returns the ``@cuda.jit`` kernel (the tile sizes are closure constants, so shared arrays
have compile-time shapes); the checker gives the launch (:data:`WHOLE_KERNELS`).

=======================  ======  =======================================================
exercise                 lesson  the learner writes
=======================  ======  =======================================================
``flash1_block``         5       Algorithm 1, lines 9-13: one query row against K_j, V_j
``dkdv_block``           7       the dK_j, dV_j body of the backward: P from L, dS
``dq_kernel``            7       a whole dQ kernel, one block per query tile
``dq_atomic``            7       a whole dQ kernel, one block per key tile, atomic adds
``causal_tiles``         8       how many key tiles a query tile visits under the mask
``flash2_loop``          9       FlashAttention-2's loop over K_j, V_j (with the mask)
``flash2_kernel``        9       the whole FlashAttention-2 forward kernel
``fix_missing_barrier``  11      a repair of a bug-zoo exhibit (threads that race)
``fix_stale_max``        11      a repair of a bug-zoo exhibit (a wrong merge of tiles)
=======================  ======  =======================================================

The checker runs the kernel at tiny sizes (N = 1, 13, 16; Nq != Nk; causal cases with
rows that see no key); in the simulator it watches shared memory for races
(:mod:`flash_numba.sim.races`) and, for dQ, records who wrote each element of the output
and how (a plain store beside another thread's write is a lost update: the atomic is
needed).  Then it compares, in this order: the outputs with the float64 reference
(:mod:`flash_numba.reference`), where a NaN or a known mistake (the scale applied twice,
a stale maximum, a top-left or off-by-one mask) is named; the bytes the kernel's counter
reports with the IO model (:mod:`flash_numba.iomodel`); and, in the simulator, every
global access the kernel really made (:mod:`flash_numba.sim.trace`) with its counter and
with the model, array by array, so a tile re-read from HBM or an uncounted load is named.
:func:`examine` prints a bug-zoo mystery's verdict without the lines that name the bug.

Sizes: float32, one (batch, head), arrays ``(N, d)``; the tile sizes ``Br``, ``Bc`` and
``d`` are the checker's parameters (``ex.check("flash2_loop", f, Br=4, Bc=4, d=4)``).
"""

from __future__ import annotations

import functools
import math
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
from numba import cuda

from .. import iomodel, reference
from ..device import SIMULATOR
from .flash_solutions import (  # noqa: F401  (the solutions and frames, re-exported for the lessons)
    E,
    causal_tiles,
    dkdv_frame,
    dq_atomic_kernel,
    dq_kernel,
    dkdv_step,
    flash1_frame,
    flash1_step,
    flash2_forward_kernel,
    flash2_frame,
    flash2_rows,
    frame_source,
)
from . import bugzoo
from .checking import (RACE_NOTE, _EXERCISES, _close, _fmt, _kernel_not_done, _verdict,
    _Mismatch, _race_mismatch, _races_watched, _register, _rng)
from ..iomodel.flash1 import query_rows_processed
from ..iomodel.flash2 import kv_rows_read

#: float32 sums of at most 16 (d) and 64 (N) terms of size ~1 are off by about n * 6e-8 each;
#: 1e-4 leaves a margin of ~10 over that, while every mistake named below is off by > 1e-2.
TOL = 1e-4

#: A failing case is launched again up to this many times, to see whether its output changes (a race the
#: simulator's detector cannot see: on a GPU, or one a warp shuffle separates).
RERUNS = 3

NAN_HINT = (
    "yours has NaN. The simulator fills shared and local memory with NaN, so a NaN usually means a read of "
    "a tile element no thread had written: a missing cuda.syncthreads() between loading a tile and using it, "
    "or a loop over Bc (or Br) where the last, partial tile holds fewer rows (cols = min(Bc, N - c0)). "
    "With a mask it can also be exp(-inf - (-inf)) for a row that has seen no key yet."
)
INDEX_HINT = "an index past the end of an array: when N is not a multiple of the block, the last tile is partial"


# ============================================================================= running a kernel, watching its bytes


def _launch(kernel, grid, threads, arrays, scalars, where=None, atomics=None):
    """Launch ``kernel[grid, threads](*arrays, *scalars, counter)``; arrays are ``(name, host array)``.

    Returns ({name: host copy after the launch}, (bytes read, bytes written) by the counter,
    the :class:`~flash_numba.sim.trace.AccessLog` in the simulator, else None, and, when ``where``
    (the case, in words) is given, a _Mismatch naming the first shared-memory race the simulator's
    detector saw, else None).
    """
    from ..sim.trace import AccessLog, traced

    log = AccessLog() if SIMULATOR else None
    devs = [traced(a, n, log) if SIMULATOR else cuda.to_device(a) for n, a in arrays]
    counter = cuda.to_device(np.zeros(2, dtype=np.int64))
    races = None
    with _atomics_recorded(atomics, {id(dev): n for (n, _), dev in zip(arrays, devs)}):
        if where is None:
            kernel[grid, threads](*devs, *scalars, counter)
        else:
            with _races_watched() as races:
                kernel[grid, threads](*devs, *scalars, counter)
    out = {n: dev.copy_to_host() for (n, _), dev in zip(arrays, devs)}
    return out, tuple(int(x) for x in counter.copy_to_host()), log, _race_mismatch(where, races)


@contextmanager
def _atomics_recorded(atomics, names):
    """In the simulator, while ``atomics`` is a list: every ``cuda.atomic.add`` on an array of ``names`` ({id: name})
    appends ``(name, flat index, block, thread)``, and is traced as one read and one write (as on a GPU)."""
    if atomics is None or not SIMULATOR:
        yield
        return
    from numba.cuda.simulator import kernelapi
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    from ..sim import warps as _simwarp

    original = kernelapi.FakeCUDAAtomic.add

    def add(self, array, index, val):
        inner = array.__dict__.get("_item", array)  # inside a kernel the simulator wraps device arrays
        name = names.get(id(inner))
        if name is None:
            return original(self, array, index, val)
        with kernelapi.addlock:
            old = FakeCUDAArray.__getitem__(inner, index)  # untraced: the add is one read and one write
            array[index] += val
        me = _simwarp.current_thread()
        flat = int(np.ravel_multi_index(tuple(int(i) for i in np.atleast_1d(index)), inner.shape))
        atomics.append((name, flat, tuple(getattr(me, "blockIdx", (0, 0, 0))), getattr(me, "thread_id", -1)))
        return old

    kernelapi.FakeCUDAAtomic.add = add
    try:
        yield
    finally:
        kernelapi.FakeCUDAAtomic.add = original


def _bytes_verdict(label, counted, model, per_array, log):
    """A _Mismatch when the counter disagrees with the trace (simulator) or with the IO model, else None.

    ``model``: (bytes read, bytes written) of the IO model; ``per_array``: {name: (element reads,
    element writes)} of the same model, array by array (their sum is ``model``).
    """
    assert (E * sum(r for r, _ in per_array.values()), E * sum(w for _, w in per_array.values())) == model
    notes = []
    if log is not None:
        for name, (r, w) in log.per_array().items():
            mr, mw = per_array.get(name, (0, 0))
            if r > mr:
                notes.append(f"{name}: {r} element reads, the model {mr} ({r / max(mr, 1):.1f}x): a tile read from "
                             f"HBM again where shared memory (or a register) already holds it?")
            elif r < mr:
                notes.append(f"{name}: {r} element reads, the model {mr}: a load missing?")
            if w > mw:
                why = ("an output written more often than the model allows (at every tile, instead of once at the "
                       "end?)" if mw > 0 else "the model never writes it: an intermediate belongs on chip")
                notes.append(f"{name}: {w} element writes, the model {mw}: {why}")
            elif w < mw:
                notes.append(f"{name}: {w} element writes, the model {mw}: a store missing?")
        really = (log.bytes("r"), log.bytes("w"))
        if really != counted:
            return _Mismatch(
                f"{label}: your counter", f"read {counted[0]:,}, written {counted[1]:,} bytes (your nr, nw)",
                f"read {really[0]:,}, written {really[1]:,} bytes (every global access, watched by the simulator)",
                ("count E = 4 bytes for every element read from or written to a global array, once per access",
                 *notes),
            )
    if counted != model:
        return _Mismatch(f"{label}: HBM bytes", f"read {counted[0]:,}, written {counted[1]:,}",
                         f"read {model[0]:,}, written {model[1]:,} (the IO model)", tuple(notes))
    return None


def _values_verdict(label, got: dict, spec: dict, mistakes: dict):
    """A _Mismatch naming the first output that differs from the float64 spec (and a known mistake
    it matches, if any), else None."""
    for name, want in spec.items():
        have = got[name]
        if _close(have, want, TOL, TOL):
            continue
        notes = []
        if np.isnan(have).any():
            notes.append(NAN_HINT)
        err = np.where(np.isinf(have) & np.isinf(want) & (have == want), 0.0, np.abs(have - want))
        err = np.where(np.isnan(err), np.inf, err)
        idx = np.unravel_index(int(np.argmax(err)), err.shape)
        notes.append(f"largest difference at {name}{list(int(i) for i in idx)}: yours {_fmt(have[idx])}, "
                     f"spec {_fmt(want[idx])}")
        if have.ndim == 2:
            rows = np.nonzero((err > TOL).any(axis=1))[0]
            shown = ", ".join(str(int(r)) for r in rows[:12]) + (", ..." if len(rows) > 12 else "")
            notes.append(f"rows of {name} that differ: {len(rows)} of {have.shape[0]} ({shown})")
        named = tuple(f"yours equals what {mistake} gives" for mistake, wrong in mistakes.items()
                      if name in wrong and _close(have, wrong[name], TOL, TOL))
        return _Mismatch(f"{label}: {name}", _fmt(have), _fmt(want), tuple(notes), named[:1])
    return None


def _note_race(bad, got: dict, rerun) -> None:
    """Launch the same case again (up to RERUNS times); if an output changes, threads race: say so in ``bad``."""
    for _ in range(RERUNS):
        again = rerun()
        changed = [n for n, h in got.items() if n in again and not np.array_equal(h, again[n], equal_nan=True)]
        if changed:
            bad.notes = (RACE_NOTE.format(name=changed[0]), *bad.notes)
            return


def _qkv(rng, Nq, Nk, d, late_max=False):
    q = rng.standard_normal((Nq, d)).astype(np.float32)
    k = rng.standard_normal((Nk, d)).astype(np.float32)
    v = rng.standard_normal((Nk, d)).astype(np.float32)
    if late_max:  # positive queries and one large last key: every row's max is in the last tile
        q = np.abs(q) + np.float32(0.3)
        k[-1] = 2.5
    return q, k, v


def _scores(q, k, mask, scale):
    S = scale * (q.astype(np.float64) @ k.astype(np.float64).T)
    return np.where(mask, S, -np.inf)


def _stale_max_o(S, v, Bc):
    """O when the old terms are never rescaled: each tile summed at the running max after it."""
    Nq, Nk = S.shape
    m = np.full(Nq, -np.inf)
    acc = np.zeros((Nq, v.shape[1]))
    l = np.zeros(Nq)
    for c0 in range(0, Nk, Bc):
        m = np.maximum(m, S[:, c0:c0 + Bc].max(axis=1))
        p = np.exp(S[:, c0:c0 + Bc] - np.where(m == -np.inf, 0.0, m)[:, None])
        l += p.sum(axis=1)
        acc += p @ v[c0:c0 + Bc]
    return acc / np.where(l > 0, l, 1.0)[:, None]


def _top_left(Nq, Nk):
    return np.arange(Nk)[None, :] <= np.arange(Nq)[:, None]


def _forward_mistakes(q, k, v, causal, Bc):
    d = q.shape[1]
    scale = 1 / math.sqrt(d)
    mask = reference.causal_mask(*_shape(q, k)) if causal else np.ones(_shape(q, k), bool)
    out = {
        "the scale applied twice (S = scale^2 Q K^T)": {"O": reference.attention_forward(
            q, k, v, causal=causal, scale=scale * scale)[0]},
        "a stale maximum (the old l_i and O_i not rescaled by exp(m_old - m_new); computed after m_i was "
        "overwritten, that factor is 1)": {"O": _stale_max_o(_scores(q, k, mask, scale), v, Bc)},
    }
    if causal:
        tl = _scores(q, k, _top_left(*_shape(q, k)), scale)
        out["a top-left mask (key c visible to query r iff c <= r: right only when Nq = Nk; ours is "
            "bottom-right, c <= r + Nk - Nq)"] = {"O": _softmax_v(tl, v)}
        out["no causal mask at all"] = {"O": reference.attention_forward(q, k, v)[0]}
        Nq, Nk = _shape(q, k)
        strict = np.arange(Nk)[None, :] < (np.arange(Nq) + Nk - Nq)[:, None]
        out["a mask off by one (the diagonal key c = r + Nk - Nq masked too)"] = {
            "O": _softmax_v(_scores(q, k, strict, scale), v)}
    return out


def _shape(q, k):
    """(Nq, Nk)."""
    return q.shape[0], k.shape[0]


def _softmax_v(S, v):
    m = S.max(axis=1, keepdims=True)
    p = np.exp(S - np.where(np.isinf(m), 0.0, m))
    l = p.sum(axis=1, keepdims=True)
    return (p @ v) / np.where(l > 0, l, 1.0)


class Case(NamedTuple):
    """One case of a kernel exercise: what it tests (the label), its sizes and what it asks of the inputs."""

    label: str
    Nq: int | None = None  # None: one query tile, Nq = Br
    Nk: int | None = None  # None: one key tile, Nk = Bc
    late_max: bool = False  # every row's max in the last key tile (forward)
    causal: bool = False  # under the causal mask (backward; the forward's mask is the checker's)


def _sized(cases, Br, Bc):
    """``cases`` at the tile sizes Br, Bc: a size left None becomes one tile."""
    return [case._replace(Nq=case.Nq or Br, Nk=case.Nk or Bc) for case in cases]


FORWARD_CASES = [  # at Br = Bc = 4 by default
    Case("one tile: Nq = Nk = Br = Bc"),
    Case("Nq = Nk = 16: several tiles each way", 16, 16),
    Case("every row's max arrives in the last tile (the old terms must be rescaled)", 12, 12, late_max=True),
    Case("N = 13, not a multiple of the block", 13, 13),
    Case("Nq = 5 queries, Nk = 11 keys", 5, 11),
    Case("N = 1", 1, 1),
]


def _run_forward(kernel_for, name, cases, d, Bc, causal, model, per_array, first=1, total=None):
    """Check a forward kernel on ``cases``: O and L, then bytes.  ``kernel_for(Nq, Nk)`` gives
    (kernel, grid, threads, extra arrays); ``model(Nq, Nk)`` the IO model's (read, written).
    The cases are numbered from ``first`` out of ``total`` (a checker may run two lists)."""
    rng = _rng(name + (" causal" if causal else ""))
    total = total or first - 1 + len(cases)
    for n, (label, Nq, Nk, late, _) in enumerate(cases, first):
        where = f"case {n} of {total} ({label}; Nq = {Nq}, Nk = {Nk}, d = {d})"
        q, k, v = _qkv(rng, Nq, Nk, d, late)
        o_ref, lse_ref = reference.attention_forward(q, k, v, causal=causal)
        kernel, grid, threads, arrays = kernel_for(Nq, Nk)
        arrays = [("q", q), ("k", k), ("v", v), *arrays]
        try:
            out, counted, log, race = _launch(kernel, grid, threads, arrays, (np.float32(1 / math.sqrt(d)),), where)
        except Exception as exc:  # the learner's error is part of the verdict
            if isinstance(exc, IndexError):
                return total, _Mismatch(where, _fmt(exc), "O, L", ("an index past the end of an array",),
                                        (INDEX_HINT,))
            return total, _Mismatch(where, _fmt(exc), "O, L", ("the kernel raised",))
        if race is not None:
            return total, race
        got = {"O": out["O"], "L": out["L"]}
        bad = _values_verdict(where, got, {"O": o_ref, "L": lse_ref}, _forward_mistakes(q, k, v, causal, Bc))
        if bad is not None:
            _note_race(bad, got, lambda: _launch(kernel, grid, threads, arrays, (np.float32(1 / math.sqrt(d)),))[0])
        if bad is None:
            bad = _bytes_verdict(where, counted, model(Nq, Nk), per_array(Nq, Nk), log)
        if bad is not None:
            return total, bad
    return total, None


def _bytes_of(count, which):
    kb = list(count.per_kernel.values())[which]
    return kb.bytes_read, kb.bytes_written


# ============================================================================= (a) flash1_block, lesson 5


def _flash1_launcher(step, Br, Bc, d):
    kernel = flash1_frame(step, Br, Bc, d)

    def kernel_for(Nq, Nk):
        init = [("O", np.zeros((Nq, d), np.float32)), ("l", np.zeros(Nq, np.float32)),
                ("m", np.full(Nq, -np.inf, np.float32)), ("L", np.full(Nq, np.nan, np.float32))]
        return kernel, 1, max(Br, Bc), init

    return kernel_for


@_register("flash1_block", 5, "Algorithm 1, lines 9-13, in a kernel: one query row against K_j, V_j", flash1_step)
def _run_flash1_block(step, Br: int = 4, Bc: int = 4, d: int = 4):
    _kernel_not_done(step)
    kernel_for = _flash1_launcher(step, Br, Bc, d)

    def model(Nq, Nk):  # "Algorithm 1" of flash1's IO model (its init kernel is the checker's)
        return _bytes_of(iomodel.flash1.forward(1, Nq, Nk, d, np.float32, False, (Br, Bc)), 1)

    def per_array(Nq, Nk):
        R = query_rows_processed(Nq, Nk, Br, Bc, False)  # Tc * Nq: every pass reads every query row
        return {"q": (R * d, 0), "k": (Nk * d, 0), "v": (Nk * d, 0), "O": (R * d, R * d),
                "l": (R + Nq, R), "m": (R + Nq, R), "L": (0, Nq)}

    return _run_forward(kernel_for, "flash1_block", _sized(FORWARD_CASES, Br, Bc), d, Bc, False, model, per_array)


# ============================================================================= (b) flash2_loop, lesson 9


def _flash2_model(Br, Bc, d, causal):
    def model(Nq, Nk):
        return _bytes_of(iomodel.flash2.forward(1, Nq, Nk, d, np.float32, causal, (Br, Bc)), 0)

    def per_array(Nq, Nk):
        kv = sum(kv_rows_read(Nq, Nk, causal, (Br, Bc)))  # K, V rows loaded by all query tiles
        return {"q": (Nq * d, 0), "k": (kv * d, 0), "v": (kv * d, 0), "O": (0, Nq * d), "L": (0, Nq)}

    return model, per_array


def _flash2_launcher(rows_fn, tiles_fn, Br, Bc, d, causal):
    kernel = flash2_frame(rows_fn, Br, Bc, d, causal, tiles_fn)

    def kernel_for(Nq, Nk):
        outs = [("O", np.full((Nq, d), np.nan, np.float32)), ("L", np.full(Nq, np.nan, np.float32))]
        return kernel, -(-Nq // Br), Br, outs

    return kernel_for


def measure_forward(exercise: str, heart, Nq: int, Nk: int, Br: int = 4, Bc: int = 4, d: int = 4,
                    causal: bool = False, seed: int = 0) -> dict:
    """Run a forward exercise's frame around ``heart`` once on random inputs (no checking).

    ``exercise``: "flash1_block" or "flash2_loop" (``causal`` with the packaged loop bound), or
    "causal_tiles" (``heart`` is the bound, the loop the packaged one).  Returns {"O", "L",
    "bytes": (read, written) by the kernel's counter, "log": the simulator's AccessLog or None}.
    """
    if exercise == "flash1_block":
        kernel_for = _flash1_launcher(heart, Br, Bc, d)
    elif exercise in ("flash2_loop", "causal_tiles"):
        rows_fn, tiles_fn = (flash2_rows, heart) if exercise == "causal_tiles" else (heart, causal_tiles)
        causal = causal or exercise == "causal_tiles"
        kernel_for = _flash2_launcher(rows_fn, tiles_fn, Br, Bc, d, causal)
    else:
        raise ValueError(f"exercise: expected 'flash1_block', 'flash2_loop' or 'causal_tiles', got {exercise!r}")
    q, k, v = _qkv(np.random.default_rng(seed), Nq, Nk, d)
    kernel, grid, threads, arrays = kernel_for(Nq, Nk)
    out, counted, log, _ = _launch(kernel, grid, threads, [("q", q), ("k", k), ("v", v), *arrays],
                                (np.float32(1 / math.sqrt(d)),))
    return {"O": out["O"], "L": out["L"], "bytes": counted, "log": log}


def _flash2_check(rows_fn, tiles_fn, name, cases, Br, Bc, d, causal, first=1, total=None):
    kernel_for = _flash2_launcher(rows_fn, tiles_fn, Br, Bc, d, causal)
    model, per_array = _flash2_model(Br, Bc, d, causal)
    return _run_forward(kernel_for, name, cases, d, Bc, causal, model, per_array, first, total)


#: flash2_loop under the causal mask (the packaged loop bound; the learner's loop masks with ``diag``).  At
#: Br = Bc = 4: in (13, 6) queries 0-6 see no key, and tile 1 (queries 4-7) is visited for query 7, so rows 4-6
#: meet a tile with every score masked (m_new = -inf: the -inf guard) and end with l_i = 0 (the l_i > 0 guard).
CAUSAL_FORWARD_CASES = [
    Case("causal, Nq = Nk = 13: the diagonal of each row is its last visible key", 13, 13),
    Case("causal, Nq = 6 < Nk = 14: query r sees keys 0..r + 8", 6, 14),
    Case("causal, Nq = 13 > Nk = 6: queries 0-6 see no key (O = 0, L = -inf), some beside rows that do", 13, 6),
]


def _check_loop(rows_fn, name, Br, Bc, d):
    """A FlashAttention-2 loop without the mask (FORWARD_CASES), then with it (CAUSAL_FORWARD_CASES)."""
    plain = _sized(FORWARD_CASES, Br, Bc)
    total = len(plain) + len(CAUSAL_FORWARD_CASES)
    n, bad = _flash2_check(rows_fn, causal_tiles, name, plain, Br, Bc, d, False, 1, total)
    if bad is not None:
        return n, bad
    return _flash2_check(rows_fn, causal_tiles, name, CAUSAL_FORWARD_CASES, Br, Bc, d, True, len(plain) + 1, total)


@_register("flash2_loop", 9, "FlashAttention-2's loop over K_j, V_j for one query row, normalised at the end",
           flash2_rows)
def _run_flash2_loop(rows_fn, Br: int = 4, Bc: int = 4, d: int = 4):
    _kernel_not_done(rows_fn)
    return _check_loop(rows_fn, "flash2_loop", Br, Bc, d)


# ============================================================================= (c) dkdv_block, lesson 7


def _dkdv_numpy(q, k, v, do, L, Dv, mask, scale):
    """dK, dV in float64 from L and D: P = exp(S - L) where visible, dS = P (dP - D)."""
    q, k, v, do = (a.astype(np.float64) for a in (q, k, v, do))
    S = scale * (q @ k.T)
    P = np.where(mask, np.exp(S - np.where(np.isinf(L), 0.0, L)[:, None]), 0.0)
    P = np.where(np.isinf(L)[:, None], 0.0, P)  # a row with no visible key: L = -inf, P = 0
    dS = P * (do @ v.T - Dv[:, None])
    return {"dK": scale * dS.T @ q, "dV": P.T @ do}


DKDV_CASES = [
    Case("one tile each way: Nq = Br, Nk = Bc"),
    Case("N = 13, not a multiple of the block", 13, 13),
    Case("Nq = 5 queries, Nk = 11 keys", 5, 11),
    Case("causal, Nq = Nk = 13", 13, 13, causal=True),
    Case("causal, Nq = 6 < Nk = 14 (the mask's diagonal starts at key Nk - Nq = 8)", 6, 14, causal=True),
    Case("causal, Nq = 14 > Nk = 6 (the first 8 queries see no key: L = -inf)", 14, 6, causal=True),
]


@_register("dkdv_block", 7, "the backward's dK_j, dV_j body: P from L, dS = P * (dP - D)", dkdv_step)
def _run_dkdv_block(step, Br: int = 4, Bc: int = 4, d: int = 4):
    _kernel_not_done(step)
    rng = _rng("dkdv_block")
    scale = 1 / math.sqrt(d)
    cases = _sized(DKDV_CASES, Br, Bc)
    for n, (label, Nq, Nk, _, causal) in enumerate(cases, 1):
        where = f"case {n} of {len(cases)} ({label}; Br = {Br}, Bc = {Bc}, d = {d})"
        q, k, v = _qkv(rng, Nq, Nk, d)
        do = rng.standard_normal((Nq, d)).astype(np.float32)
        o, lse = reference.attention_forward(q, k, v, causal=causal)
        Dv = (do.astype(np.float64) * o).sum(axis=1)  # D_i = rowsum(dO_i * O_i)
        spec_g = reference.attention_backward(q, k, v, o, lse, do, causal=causal)
        mask = reference.causal_mask(Nq, Nk) if causal else np.ones((Nq, Nk), bool)
        spec = _dkdv_numpy(q, k, v, do, lse, Dv, mask, scale)
        assert _close((spec["dK"], spec["dV"]), tuple(spec_g[1:]), 1e-9, 1e-9), "the spec disagrees with the reference"
        mistakes = {}
        if causal:
            visited = _visited(Nq, Nk, Br, Bc)  # the frame skips the wholly masked tiles itself
            mistakes["a backward that ignores the causal mask inside the tiles it visits"] = _dkdv_numpy(
                q, k, v, do, lse, Dv, visited, scale)
            mistakes["a top-left mask (right only when Nq = Nk)"] = _dkdv_numpy(
                q, k, v, do, lse, Dv, _top_left(Nq, Nk) & visited, scale)
        mistakes["dK without its factor scale"] = {"dK": spec["dK"] / scale}
        mistakes["the scale applied twice in dK"] = {"dK": spec["dK"] * scale}
        arrays = [("q", q), ("k", k), ("v", v), ("do", do), ("L", lse.astype(np.float32)),
                  ("D", Dv.astype(np.float32)), ("dK", np.full((Nk, d), np.nan, np.float32)),
                  ("dV", np.full((Nk, d), np.nan, np.float32))]
        try:
            out, counted, log, race = _launch(dkdv_frame(step, Br, Bc, d, causal), -(-Nk // Bc), Bc, arrays,
                                              (np.float32(scale),), where)
        except Exception as exc:  # the learner's error is part of the verdict
            if isinstance(exc, IndexError):
                return len(cases), _Mismatch(where, _fmt(exc), "dK, dV", ("an index past the end of an array",),
                                             (INDEX_HINT,))
            return len(cases), _Mismatch(where, _fmt(exc), "dK, dV", ("the kernel raised",))
        if race is not None:
            return len(cases), race
        bad = _values_verdict(where, {"dK": out["dK"], "dV": out["dV"]}, spec, mistakes)
        if bad is not None:
            frame = dkdv_frame(step, Br, Bc, d, causal)
            _note_race(bad, out, lambda: _launch(frame, -(-Nk // Bc), Bc, arrays, (np.float32(scale),))[0])
        if bad is None:
            model = _bytes_of(iomodel.flash2.backward(1, Nq, Nk, d, np.float32, causal, (Br, Bc)), 1)
            q_rows = _pairs_rows(Nq, Nk, Br, Bc, causal)
            per_array = {"q": (q_rows * d, 0), "k": (Nk * d, 0), "v": (Nk * d, 0), "do": (q_rows * d, 0),
                         "L": (q_rows, 0), "D": (q_rows, 0), "dK": (0, Nk * d), "dV": (0, Nk * d)}
            bad = _bytes_verdict(where, counted, model, per_array, log)
        if bad is not None:
            return len(cases), bad
    return len(cases), None


def _visited(Nq, Nk, Br, Bc):
    """Bool (Nq, Nk): True where the pair's tiles are visited under the causal mask (not wholly masked)."""
    r0 = np.arange(Nq) // Br * Br
    last_row = np.minimum(r0 + Br, Nq) - 1
    c0 = np.arange(Nk) // Bc * Bc
    return c0[None, :] <= (last_row + Nk - Nq)[:, None]


def _pairs_rows(Nq, Nk, Br, Bc, causal):
    """Query rows loaded by all key tiles: for each visited pair (i, j), the rows of query tile i."""
    Tc = -(-Nk // Bc)
    total = 0
    for i, r0 in enumerate(range(0, Nq, Br)):
        rows = min(Br, Nq - r0)
        visits = Tc
        if causal:
            last_key = r0 + rows - 1 + Nk - Nq
            visits = 0 if last_key < 0 else min(Tc, last_key // Bc + 1)
        total += rows * visits
    return total


# ============================================================================= (d) causal_tiles, lesson 8


CAUSAL_SHAPES = [(16, 16), (13, 13), (6, 14), (14, 6), (1, 9), (9, 1)]  # (Nq, Nk) at the checker's Br, Bc


def _tiles_spec(i, Br, Bc, Nq, Nk):
    """From the mask itself: key tiles up to the one holding the last key some row of tile i sees."""
    visible = reference.causal_mask(Nq, Nk)[i * Br:(i + 1) * Br]
    cols = np.nonzero(visible.any(axis=0))[0]
    return 0 if cols.size == 0 else int(cols.max()) // Bc + 1


@_register("causal_tiles", 8, "how many key tiles query tile i visits under the causal mask (a kernel's loop bound)",
           causal_tiles)
def _run_causal_tiles(tiles_fn, Br: int = 4, Bc: int = 4, d: int = 4):
    _kernel_not_done(tiles_fn)
    py = getattr(tiles_fn, "py_func", tiles_fn)
    top_left = functools.partial(_tiles_top_left, Bc=Bc)
    n = 0
    for Nq, Nk in CAUSAL_SHAPES:  # first the bound itself, tile by tile, on the host
        for i in range(-(-Nq // Br)):
            n += 1
            spec = _tiles_spec(i, Br, Bc, Nq, Nk)
            try:
                got = py(i, Br, Bc, Nq, Nk)
            except NotImplementedError:
                raise
            except Exception as exc:  # the learner's error is part of the verdict
                got = exc
            if not isinstance(got, BaseException) and int(got) == spec:
                continue
            notes = [f"tile i = {i} holds queries {i * Br}..{min((i + 1) * Br, Nq) - 1}; key tile j holds keys "
                     f"j*{Bc}..j*{Bc}+{Bc - 1}; key c is visible to query r iff c <= r + Nk - Nq = r + {Nk - Nq}"]
            named = ()
            if not isinstance(got, BaseException):
                if int(got) > spec:
                    notes.append("too many: the extra tiles are wholly masked, loaded from HBM for nothing")
                else:
                    notes.append("too few: a tile with visible keys is skipped, so O would be wrong")
                if int(got) == top_left(i, Br, Nq):
                    named = ("yours is the top-left bound (c <= r): right only when Nq = Nk; ours is bottom-right",)
            return n, _Mismatch(f"case {n} (Nq = {Nq}, Nk = {Nk}, Br = {Br}, Bc = {Bc}, query tile i = {i})",
                                _fmt(got), _fmt(spec), tuple(notes), named)
    cases = [Case(f"causal, Nq = {Nq}, Nk = {Nk}", Nq, Nk) for Nq, Nk in CAUSAL_SHAPES[:4]]
    return _flash2_check(flash2_rows, tiles_fn, "causal_tiles", cases, Br, Bc, d, True, n + 1, n + len(cases))


def _tiles_top_left(i, Br, Nq, Bc):
    last_key = min((i + 1) * Br, Nq) - 1
    return last_key // Bc + 1


# ============================================================================= whole kernels: lessons 7 and 9
#
# The learner writes the whole kernel: a factory ``make(Br, Bc, d, causal)`` returning the @cuda.jit kernel (the
# tile sizes are closure constants, so the shared arrays have compile-time shapes).  The checker gives the launch.

#: The whole-kernel exercises: name -> (lesson, what the learner writes, the launch).
WHOLE_KERNELS = {
    "flash2_kernel": "[ceil(Nq / Br), Br](q, k, v, o, L, scale, counter)",
    "dq_kernel": "[ceil(Nq / Br), Br](q, k, v, do, L, D, dq, scale, counter), dq poisoned with NaN",
    "dq_atomic": "[ceil(Nk / Bc), Bc](q, k, v, do, L, D, dq, scale, counter), dq = 0",
}


def _factory_not_done(factory) -> None:
    """Raise NotImplementedError while the factory, or a kernel defined inside it, still raises it."""
    if not callable(factory) or hasattr(factory, "py_func"):
        raise TypeError("the answer must be a factory make(Br, Bc, d, causal) that returns a @cuda.jit kernel "
                        f"(got {type(factory).__name__})")
    todo = [factory.__code__]
    while todo:
        code = todo.pop()
        if "NotImplementedError" in code.co_names:
            raise NotImplementedError("the kernel still contains `raise NotImplementedError`: replace it with yours")
        todo += [c for c in code.co_consts if hasattr(c, "co_names")]


def _bytes_hint(bad, causal):
    """A note for a whole kernel whose bytes are off under the causal mask."""
    if bad is not None and causal and ("HBM bytes" in bad.case or "your counter" in bad.case):
        bad.notes = (*bad.notes, "under the causal mask a block need not load a key tile that none of its rows "
                                 "sees: stop the loop after the tile holding the last key its last row sees")
    return bad


@_register("flash2_kernel", 9, "FlashAttention-2's forward as a whole kernel: tiles, barriers, the K/V loop, the "
           "causal mask, one write of O and L", flash2_forward_kernel)
def _run_flash2_kernel(make, Br: int = 4, Bc: int = 4, d: int = 4):
    _factory_not_done(make)
    plain = _sized(FORWARD_CASES, Br, Bc)
    total = len(plain) + len(CAUSAL_FORWARD_CASES)
    for causal, cases, first in ((False, plain, 1), (True, CAUSAL_FORWARD_CASES, len(plain) + 1)):
        kernel = make(Br, Bc, d, causal)

        def kernel_for(Nq, Nk, kernel=kernel):
            outs = [("O", np.full((Nq, d), np.nan, np.float32)), ("L", np.full(Nq, np.nan, np.float32))]
            return kernel, -(-Nq // Br), Br, outs

        model, per_array = _flash2_model(Br, Bc, d, causal)
        n, bad = _run_forward(kernel_for, "flash2_kernel", cases, d, Bc, causal, model, per_array, first, total)
        if bad is not None:
            return n, _bytes_hint(bad, causal)
    return total, None


def _dq_numpy(q, k, v, do, L, Dv, mask, scale):
    """dQ in float64 from L and D: P = exp(S - L) where visible, dS = P (dP - D), dQ = scale dS K."""
    q, k, v, do = (a.astype(np.float64) for a in (q, k, v, do))
    S = scale * (q @ k.T)
    P = np.where(mask, np.exp(S - np.where(np.isinf(L), 0.0, L)[:, None]), 0.0)
    P = np.where(np.isinf(L)[:, None], 0.0, P)
    dS = P * (do @ v.T - Dv[:, None])
    return scale * dS @ k


DQ_CASES = [
    Case("one tile each way: Nq = Br, Nk = Bc"),
    Case("N = 13, not a multiple of the block", 13, 13),
    Case("Nq = 5 queries, Nk = 11 keys", 5, 11),
    Case("causal, Nq = Nk = 13", 13, 13, causal=True),
    Case("causal, Nq = 6 < Nk = 14", 6, 14, causal=True),
    Case("causal, Nq = 14 > Nk = 6: queries 0-7 see no key (L = -inf, dQ = 0)", 14, 6, causal=True),
]


def _visible(Nq, Nk, causal):
    return reference.causal_mask(Nq, Nk) if causal else np.ones((Nq, Nk), bool)


def _dq_model(Nq, Nk, Br, Bc, d, causal, atomic):
    """((bytes read, written), {array: (element reads, element writes)}) of a dQ kernel.

    Without atomics: flash2's "dQ" launch (:func:`flash_numba.iomodel.flash2.backward`): q, dO, L, D once per
    query row, K and V once per (query tile, key tile it sees), dQ written once.  With atomics (one block per key
    tile): K and V once, q, dO, L, D once per visited (key tile, query row), and one atomic add (a read and a
    write of E bytes) per element of dQ per visible (query, key) pair."""
    if not atomic:
        model = _bytes_of(iomodel.flash2.backward(1, Nq, Nk, d, np.float32, causal, (Br, Bc)), 2)
        kv = sum(kv_rows_read(Nq, Nk, causal, (Br, Bc)))
        per = {"q": (Nq * d, 0), "k": (kv * d, 0), "v": (kv * d, 0), "do": (Nq * d, 0), "L": (Nq, 0),
               "D": (Nq, 0), "dQ": (0, Nq * d)}
    else:
        rows = _pairs_rows(Nq, Nk, Br, Bc, causal)
        adds = int(_visible(Nq, Nk, causal).sum()) * d
        per = {"q": (rows * d, 0), "k": (Nk * d, 0), "v": (Nk * d, 0), "do": (rows * d, 0), "L": (rows, 0),
               "D": (rows, 0), "dQ": (adds, adds)}
        model = (E * sum(r for r, _ in per.values()), E * sum(w for _, w in per.values()))
    return model, per


def _global_conflicts(log, atomics, name, shape=None):
    """A _Mismatch when two threads wrote one element of global array ``name`` and one of them with a plain store
    (a read-add-write that another thread's can interleave with, losing an add), else None.  ``atomics``:
    [(name, flat, block, thread)] of every cuda.atomic.add the kernel made."""
    if log is None:
        return None
    from collections import Counter

    writes = Counter((f, b, t) for n, kind, f, b, t in log.events if n == name and kind == "w")
    atomic = Counter((f, b, t) for n, f, b, t in atomics if n == name)
    writers: dict = {}
    for (f, b, t), count in writes.items():
        writers.setdefault(f, []).append(((b, t), count - atomic[(f, b, t)]))
    for f, ws in sorted(writers.items()):
        plain = [w for w, n_plain in ws if n_plain > 0]
        if plain and len(ws) > 1:
            (b1, t1), (b2, t2) = plain[0], next(w for w, _ in ws if w != plain[0])
            where = list(int(i) for i in np.unravel_index(f, shape)) if shape else f"{f}] (flat index"
            return _Mismatch(f"{name}: a write race in global memory", f"{name}{where} written by thread "
                             f"{t1} of block {b1[0]} with a plain store, and by thread {t2} of block {b2[0]}",
                             "one thread a row, or every add a cuda.atomic.add",
                             ("two threads that add into one element with `x[i] += v` each read x[i], add and write "
                              "back; on a GPU they can both read the old value and one add is lost. The simulator "
                              "runs one thread at a time, so the values may look right here: the checker looks at "
                              "who wrote what. cuda.atomic.add(x, i, v) does the read-add-write as one step",))
    return None


def _run_dq(make, name, atomic, Br, Bc, d):
    _factory_not_done(make)
    rng = _rng(name)
    scale = 1 / math.sqrt(d)
    cases = _sized(DQ_CASES, Br, Bc)
    kernels = {}
    for n, (label, Nq, Nk, _, causal) in enumerate(cases, 1):
        where = f"case {n} of {len(cases)} ({label}; Br = {Br}, Bc = {Bc}, d = {d})"
        q, k, v = _qkv(rng, Nq, Nk, d)
        do = rng.standard_normal((Nq, d)).astype(np.float32)
        o, lse = reference.attention_forward(q, k, v, causal=causal)
        Dv = (do.astype(np.float64) * o).sum(axis=1)
        want = reference.attention_backward(q, k, v, o, lse, do, causal=causal)[0]
        spec = {"dQ": want}
        assert _close(_dq_numpy(q, k, v, do, lse, Dv, _visible(Nq, Nk, causal), scale), want, 1e-9, 1e-9)
        mistakes = {"dQ without its factor scale": {"dQ": want / scale},
                    "the scale applied twice in dQ": {"dQ": want * scale}}
        if causal:
            visited = _visited(Nq, Nk, Br, Bc)  # the pairs of the tiles a correct loop visits
            mistakes["a backward that ignores the causal mask inside the tiles it visits"] = {"dQ": _dq_numpy(
                q, k, v, do, lse, Dv, visited, scale)}
            mistakes["a backward that ignores the causal mask"] = {"dQ": _dq_numpy(
                q, k, v, do, lse, Dv, np.ones((Nq, Nk), bool), scale)}
            mistakes["a top-left mask (right only when Nq = Nk)"] = {"dQ": _dq_numpy(
                q, k, v, do, lse, Dv, _top_left(Nq, Nk) & visited, scale)}
        init = np.zeros((Nq, d), np.float32) if atomic else np.full((Nq, d), np.nan, np.float32)
        arrays = [("q", q), ("k", k), ("v", v), ("do", do), ("L", lse.astype(np.float32)),
                  ("D", Dv.astype(np.float32)), ("dQ", init)]
        if causal not in kernels:
            kernels[causal] = make(Br, Bc, d, causal)
        kernel = kernels[causal]
        grid, threads = (-(-Nk // Bc), Bc) if atomic else (-(-Nq // Br), Br)
        atomics = []
        try:
            out, counted, log, race = _launch(kernel, grid, threads, arrays, (np.float32(scale),), where, atomics)
        except Exception as exc:  # the learner's error is part of the verdict
            return len(cases), _Mismatch(where, _fmt(exc), "dQ", ("an index past the end of an array"
                                         if isinstance(exc, IndexError) else "the kernel raised",),
                                         (INDEX_HINT,) if isinstance(exc, IndexError) else ())
        bad = race or _global_conflicts(log, atomics, "dQ", (Nq, d))
        if bad is not None:
            bad.case = f"{where}: {bad.case}" if not bad.case.startswith("case") else bad.case
            return len(cases), bad
        bad = _values_verdict(where, {"dQ": out["dQ"]}, spec, mistakes)
        if bad is None:
            model, per_array = _dq_model(Nq, Nk, Br, Bc, d, causal, atomic)
            bad = _bytes_verdict(where, counted, model, per_array, log)
            if bad is not None and atomic and causal:
                bad.notes = (*bad.notes, "every atomic add costs a read and a write of E bytes: skip the masked "
                                         "pairs (P = 0 adds nothing) and the key tiles no query of the tile sees")
            elif not atomic:
                bad = _bytes_hint(bad, causal)
        if bad is not None:
            return len(cases), bad
    return len(cases), None


@_register("dq_kernel", 7, "dQ as its own kernel: one block per query tile, K_j, V_j through shared memory",
           dq_kernel)
def _run_dq_kernel(make, Br: int = 4, Bc: int = 4, d: int = 4):
    return _run_dq(make, "dq_kernel", False, Br, Bc, d)


@_register("dq_atomic", 7, "dQ from the key side: one block per key tile, every add into dQ atomic", dq_atomic_kernel)
def _run_dq_atomic(make, Br: int = 4, Bc: int = 4, d: int = 4):
    return _run_dq(make, "dq_atomic", True, Br, Bc, d)


def measure_kernel(exercise: str, make, Nq: int, Nk: int, Br: int = 4, Bc: int = 4, d: int = 4,
                   causal: bool = False, seed: int = 0) -> dict:
    """Launch a whole-kernel exercise's kernel ``make(Br, Bc, d, causal)`` once on random inputs, unchecked.

    Returns {name: output array, "bytes": (read, written) by its counter, "log": the simulator's AccessLog or
    None, "atomics": [(array, flat, block, thread)] of its atomic adds}."""
    if exercise not in WHOLE_KERNELS:
        raise ValueError(f"exercise: expected one of {', '.join(WHOLE_KERNELS)}, got {exercise!r}")
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, Nq, Nk, d)
    scale = np.float32(1 / math.sqrt(d))
    if exercise == "flash2_kernel":
        arrays = [("q", q), ("k", k), ("v", v), ("O", np.full((Nq, d), np.nan, np.float32)),
                  ("L", np.full(Nq, np.nan, np.float32))]
        grid, threads = -(-Nq // Br), Br
    else:
        do = rng.standard_normal((Nq, d)).astype(np.float32)
        o, lse = reference.attention_forward(q, k, v, causal=causal)
        Dv = (do.astype(np.float64) * o).sum(axis=1).astype(np.float32)
        atomic = exercise == "dq_atomic"
        init = np.zeros((Nq, d), np.float32) if atomic else np.full((Nq, d), np.nan, np.float32)
        arrays = [("q", q), ("k", k), ("v", v), ("do", do), ("L", lse.astype(np.float32)), ("D", Dv), ("dQ", init)]
        grid, threads = (-(-Nk // Bc), Bc) if atomic else (-(-Nq // Br), Br)
    atomics = []
    out, counted, log, _ = _launch(make(Br, Bc, d, causal), grid, threads, arrays, (scale,), None, atomics)
    return {**out, "bytes": counted, "log": log, "atomics": atomics, "shapes": {n: a.shape for n, a in arrays}}


def write_races(run: dict, name: str = "dQ"):
    """The global write race (a _Mismatch, printable) a :func:`measure_kernel` run shows on ``name``, or None."""
    return _global_conflicts(run["log"], run["atomics"], name, run["shapes"][name])


# ============================================================================= lesson 11: riddles and repairs


def examine(letter: str) -> bool:
    """Run bug-zoo mystery ``letter`` through its exercise's checker and print what it sees: the failing case,
    the values, the bytes, the race, but not the lines that would name the mistake (that is the riddle).
    True when the checker rejects the kernel."""
    exercise, kernel = bugzoo.mystery(letter)
    n, bad = _EXERCISES[exercise].run(kernel)
    print(_verdict(f"mystery {letter}", f" (through the checker of {exercise})", n, bad, diagnoses=False))
    return bad is not None


#: The bug-zoo exhibits lesson 11 asks the learner to repair: exercise name -> exhibit.
REPAIRS = {"fix_missing_barrier": "missing_barrier", "fix_stale_max": "stale_max"}


def broken(exercise: str) -> str:
    """The broken source the learner starts a repair exercise from (what lesson 11's cell holds)."""
    return bugzoo.source(REPAIRS[exercise])


@_register("fix_missing_barrier", 11, "repair a FlashAttention-2 loop whose threads race on K_j, V_j", flash2_rows)
def _run_fix_missing_barrier(rows_fn, Br: int = 4, Bc: int = 4, d: int = 4):
    _kernel_not_done(rows_fn)
    return _check_loop(rows_fn, "fix_missing_barrier", Br, Bc, d)


@_register("fix_stale_max", 11, "repair a FlashAttention-2 loop whose output is wrong from the second tile on",
           flash2_rows)
def _run_fix_stale_max(rows_fn, Br: int = 4, Bc: int = 4, d: int = 4):
    _kernel_not_done(rows_fn)
    return _check_loop(rows_fn, "fix_stale_max", Br, Bc, d)


# ============================================================================= hints

HINTS = {
    "flash1_block": [
        "Read m_i = m[row] and l_i = l[row] first (2 * E bytes), and O[row, x] once per x (D * E bytes).",
        "Line 9: S_i[r, c] = scale * (Q_i[r, :] . K_j[c, :]) for c < cols, never c < Bc: the last tile may be "
        "partial. Keep the running max m~ as you go.",
        "Line 10: overwrite S_i[r, c] with P~ = exp(S_i[r, c] - m~) and add it up into l~.",
        "Line 11: m_new = max(m_i, m~); l_new = exp(m_i - m_new) l_i + exp(m~ - m_new) l~. Compute both "
        "exponentials from the OLD m_i before you store anything.",
        "Line 12: O[row, x] = (l_i exp(m_i - m_new) O[row, x] + exp(m~ - m_new) sum_c P~[r, c] V_j[c, x]) / l_new; "
        "line 13: l[row] = l_new, m[row] = m_new. Return the bytes you read and wrote.",
    ],
    "flash2_loop": [
        "Inside `if row < Nq:` compute s_r[c] = scale * (q_r . K_j[c]) for c < cols, and -inf where "
        "c0 + c > row + diag (the mask); take the new running max m_new over them and m_i.",
        "If m_new is still -inf the row has seen no visible key: leave o_acc, l_i, m_i as they are (no NaN).",
        "Otherwise alpha = exp(m_i - m_new) with the OLD m_i: l_i *= alpha and o_acc[x] *= alpha; then add "
        "p = exp(s_r[c] - m_new) to l_i and p * V_j[c, x] to o_acc[x]; only then m_i = m_new.",
        "After the loop, once: o[row, x] = o_acc[x] / l_i and L[row] = m_i + log(l_i) (0 and -inf when "
        "l_i = 0); nw += D * E + E.",
    ],
    "dkdv_block": [
        "Skip the pair when col > r0 + r + diag: a masked key gets P = 0 and adds nothing.",
        "s = Q_i[r, :] . k_c and dP = dO_i[r, :] . v_c, in one loop over x.",
        "P = exp(scale * s - L_i[r]): the saved L = m + log(l) normalises it already; dS = P * (dP - D_i[r]).",
        "For every x: dv_c[x] += P * dO_i[r, x] and dk_c[x] += scale * dS * Q_i[r, x] (the scale of S = scale Q K^T "
        "comes back in dK).",
    ],
    "causal_tiles": [
        "Visibility is a prefix of each row, so the tile's last query row (min((i + 1) * Br, Nq) - 1) sees the "
        "most keys.",
        "That row sees keys 0 .. last_row + (Nk - Nq): the bottom-right diagonal. Forgetting Nk - Nq is the "
        "top-left mask, right only when Nq = Nk.",
        "The tiles to visit are 0 .. last_key // Bc, at most Tc = ceil(Nk / Bc), and none when last_key < 0.",
    ],
}


HINTS["flash2_kernel"] = [
    "Block i owns query rows i*Br + tid. Declare K_j, V_j as cuda.shared.array((Bc, D), float32) and the row's "
    "q, scores and O accumulator as cuda.local.array; load q's row once (if row < Nq) and count D * E bytes.",
    "The loop over key tiles: c0 = j * Bc, cols = min(Bc, Nk - c0). Barrier; all Br threads load K_j, V_j "
    "(for idx in range(tid, cols * D, Br)), 2 * E bytes each; barrier again before anyone reads them.",
    "Inside the loop, only threads with row < Nq compute: scores masked to -inf where c0 + c > row + diag "
    "(diag = Nk - Nq under the mask, every key visible otherwise), then lesson 9's update with the old m_i.",
    "Guard the row that has seen no visible key (m_new = -inf: skip the update) and the end (l_i = 0: O = 0, "
    "L = -inf). Under the mask, stop after the tile holding key min((i + 1) * Br, Nq) - 1 + diag.",
    "After the loop: o[row, x] = o_acc[x] / l_i, L[row] = m_i + log(l_i), D * E + E bytes; at the very end "
    "cuda.atomic.add(counter, 0, nr) and cuda.atomic.add(counter, 1, nw), outside any `if row < Nq`.",
]
HINTS["dq_kernel"] = [
    "The forward kernel's skeleton: block i owns query rows i*Br + tid; K_j, V_j tiles in shared memory between "
    "two barriers, loaded by all threads; the same tile bound under the causal mask.",
    "Keep the row's q, dO (local arrays), L_r and D_r in registers: 2 * D * E + 2 * E bytes, once.",
    "For each visible key c of the tile: s = q . k_c, dP = dO . v_c, P = exp(scale * s - L_r), dS = P (dP - D_r), "
    "dq_r[x] += scale * dS * K_j[c, x].",
    "Write dq[row, x] once after the loop (D * E bytes). One thread owns each row of dQ: no atomics needed.",
]
HINTS["dq_atomic"] = [
    "Block j owns keys j*Bc + tid (k_c, v_c in registers, 2 * D * E bytes); it walks over the query tiles: "
    "Q_i, dO_i (Br x D) and L_i, D_i (Br) through shared memory between two barriers, like dkdv_block's frame.",
    "Skip a query tile none of whose rows sees this block's first key (c0 > r0 + rows - 1 + diag): the same "
    "decision for every thread of the block, so the barriers stay matched.",
    "For each visible row r (col <= r0 + r + diag): dS as in dq_kernel, then add scale * dS * k_c[x] into "
    "dq[r0 + r, x] with cuda.atomic.add(dq, (r0 + r, x), value): every thread of every key block adds there.",
    "Count each atomic add as a read and a write of E bytes.",
]


def hints(name: str, upto: int | None = None) -> None:
    """Print the hints of kernel exercise ``name``, the first ``upto`` of them (all by default)."""
    if name not in HINTS:
        raise ValueError(f"name: no hints for {name!r}; choose one of {', '.join(HINTS)}")
    for n, hint in enumerate(HINTS[name][:upto], 1):
        print(f"hint {n} of {len(HINTS[name])}: {hint}")


# ============================================================================= the compile tier


def compile_all(cc=(7, 5)) -> list[tuple[str, str]]:
    """PTX of every frame around its packaged solution and around each bug-zoo exhibit, at Br = Bc = d = 4.

    Returns ``[(label, ptx)]``.  Needs ``NUMBA_ENABLE_CUDASIM=0`` (NVVM, no GPU): the simulator never
    type-checks, and a learner's kernel must also run on Colab's GPU.
    """
    from numba import types

    from ..compile_check import compile_ptx

    F2, F1 = types.Array(types.float32, 2, "C"), types.Array(types.float32, 1, "C")
    F, C = types.float32, types.Array(types.int64, 1, "C")
    frames = {  # exercise: (frame of a heart, the kernel's argument types)
        "flash1_block": (lambda h: flash1_frame(h, 4, 4, 4), (F2, F2, F2, F2, F1, F1, F1, F, C)),
        "flash2_loop": (lambda h: flash2_frame(h, 4, 4, 4), (F2, F2, F2, F2, F1, F, C)),
        "causal_tiles": (lambda h: flash2_frame(flash2_rows, 4, 4, 4, True, h), (F2, F2, F2, F2, F1, F, C)),
        "dkdv_block": (lambda h: dkdv_frame(h, 4, 4, 4, True), (F2, F2, F2, F2, F1, F1, F2, F2, F, C)),
    }
    solutions = {"flash1_block": flash1_step, "flash2_loop": flash2_rows, "causal_tiles": causal_tiles,
                 "dkdv_block": dkdv_step}
    hearts = [(name, name, fn) for name, fn in solutions.items()]
    hearts += [(f"bug zoo {n}", bugzoo.EXHIBITS[n].exercise, bugzoo.build(n)) for n in bugzoo.names()]
    out = []
    for label, exercise, heart in hearts:
        frame, signature = frames[exercise]
        out.append((f"{label} sm_{cc[0]}{cc[1]}", compile_ptx(frame(heart).py_func, signature, cc)))
    whole = {"flash2_kernel": (flash2_forward_kernel, (F2, F2, F2, F2, F1, F, C)),
             "dq_kernel": (dq_kernel, (F2, F2, F2, F2, F1, F1, F2, F, C)),
             "dq_atomic": (dq_atomic_kernel, (F2, F2, F2, F2, F1, F1, F2, F, C))}
    for name, (make, signature) in whole.items():
        for causal in (False, True):
            label = f"{name}{' causal' if causal else ''} sm_{cc[0]}{cc[1]}"
            out.append((label, compile_ptx(make(4, 4, 4, causal).py_func, signature, cc)))
    return out
