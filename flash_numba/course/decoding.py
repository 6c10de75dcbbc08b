"""Lesson 14's teaching code: decoding with a KV cache, split-KV (flash-decoding).

* Exercise ``merge_splits``: merge the partial results (O_s, m_s, l_s) of a row's splits into its output and
  log-sum-exp, with lesson 3's rescale.  Checked against float64 attention over all the keys, on splits with
  different maxima, an empty split, huge scores and a row with no key; the classic mistakes are named.
* Exercise ``decode_bytes``: the HBM bytes and FLOPs of one decoding step (one new token a sequence), checked
  against the IO model :mod:`flash_numba.iomodel.flash_decode`.
* :func:`blocks_figure`: thread blocks against SMs, without and with splits.
* :func:`recorded_rates`, :func:`rates_figure`: the H200's decode benchmark (GB/s of KV cache by length),
  ``data/h200-2026-12-02-decode/decode.csv``, with its GPU, date and command.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from .checking import _fmt, _Mismatch, _register

__all__ = ["blocks_figure", "decode_problem", "hints", "model_terms", "rates_figure", "recorded_rates"]

DATA = Path(__file__).resolve().parent / "data"

# ============================================================================= exercise: merge_splits


def merge_splits_solution(O_s, m_s, l_s):
    """Merge S partial results of one query row.

    ``O_s`` (S, d): split s's unnormalised output sum_j exp(x_j - m_s) v_j; ``m_s`` (S,): its maximum score
    (-inf if it saw no key); ``l_s`` (S,): its sum of exp(x_j - m_s) (0 if none).  Returns (o (d,), lse): the
    row's output and log-sum-exp; a row with no key at all gives o = 0 and lse = -inf."""
    m = np.max(m_s)
    if m == -np.inf:  # no split saw a key
        return np.zeros(O_s.shape[1]), -np.inf
    alpha = np.exp(m_s - m)  # each split's rescale to the common maximum (0 for an empty split)
    l = np.sum(alpha * l_s)
    o = (alpha[:, None] * O_s).sum(axis=0) / l
    return o, m + np.log(l)


def _partials(x, V, cuts):
    """float64 partials of one row: scores x (N,), values V (N, d), split at ``cuts`` (np.split's indices)."""
    O, M, L = [], [], []
    for xs, vs in zip(np.split(x, cuts), np.split(V, cuts)):
        if xs.size == 0:
            O.append(np.zeros(V.shape[1]))
            M.append(-np.inf)
            L.append(0.0)
            continue
        m = xs.max()
        p = np.exp(xs - m)
        O.append(p @ vs)
        M.append(m)
        L.append(p.sum())
    return np.array(O), np.array(M), np.array(L)


def _merge_cases():
    rng = np.random.default_rng(14)
    d = 8
    cases = []
    x, V = rng.standard_normal(20), rng.standard_normal((20, d))
    cases.append(("one split", x, V, []))
    x, V = 3 * rng.standard_normal(30), rng.standard_normal((30, d))
    x[25] += 12  # the last split holds the row's maximum: every other split must be rescaled
    cases.append(("three splits, the maximum in the last", x, V, [10, 20]))
    x, V = 3 * rng.standard_normal(24), rng.standard_normal((24, d))
    x[2] += 9  # the first split holds the maximum
    cases.append(("four splits, the maximum in the first", x, V, [6, 12, 18]))
    x, V = rng.standard_normal(9), rng.standard_normal((9, d))
    cases.append(("three splits, the last one empty (m = -inf, l = 0)", x, V, [5, 9]))
    x, V = 1e4 + 20 * rng.standard_normal(16), rng.standard_normal((16, d))
    cases.append(("scores near 1e4 (exp overflows without the maximum)", x, V, [7]))
    cases.append(("no key at all: two empty splits", np.zeros(0), np.zeros((0, d)), [0]))
    return cases


def _truth(x, V):
    """float64 attention of one row over all its keys: (o, lse); no key: (0, -inf)."""
    if x.size == 0:
        return np.zeros(V.shape[1]), -np.inf
    m = x.max()
    p = np.exp(x - m)
    return p @ V / p.sum(), m + np.log(p.sum())


#: Wrong merges the checker recognises: (name, function of (O_s, m_s, l_s) -> (o, lse)).
def _wrong_merges():
    def safe(f):
        def g(O, M, L):
            with np.errstate(all="ignore"):
                return f(O, M, L)
        return g

    def no_rescale_o(O, M, L):
        m = M.max()
        a = np.exp(M - m)
        return O.sum(0) / (a * L).sum(), m + np.log((a * L).sum())

    def no_rescale_l(O, M, L):
        m = M.max()
        a = np.exp(M - m)
        return (a[:, None] * O).sum(0) / L.sum(), m + np.log(L.sum())

    def max_of_l(O, M, L):
        m = M.max()
        a = np.exp(M - m)
        return (a[:, None] * O).sum(0) / (a * L).max(), m + np.log((a * L).max())

    def max_of_l_plain(O, M, L):
        m = M.max()
        a = np.exp(M - m)
        return (a[:, None] * O).sum(0) / L.max(), m + np.log(L.max())

    def no_divide(O, M, L):
        m = M.max()
        a = np.exp(M - m)
        return (a[:, None] * O).sum(0), m + np.log((a * L).sum())

    def lse_without_m(O, M, L):
        m = M.max()
        a = np.exp(M - m)
        return (a[:, None] * O).sum(0) / (a * L).sum(), np.log((a * L).sum())

    def mean_of_outputs(O, M, L):
        return (O / L[:, None]).mean(0), np.log(np.exp(M) @ L)

    return (
        (no_rescale_o, "you did not rescale O_s: each split's output is relative to its own maximum m_s; multiply it "
                       "by exp(m_s - m) before adding, as lesson 3 rescales the running output"),
        (no_rescale_l, "you did not rescale l_s: l = sum_s exp(m_s - m) l_s (each l_s is relative to its own m_s)"),
        (max_of_l, "you took the maximum of the (rescaled) l_s: the denominators add up, l = sum_s exp(m_s - m) l_s"),
        (max_of_l_plain, "you took the maximum of l_s: the denominators add up, l = sum_s exp(m_s - m) l_s"),
        (no_divide, "you did not divide by l: O = sum_s exp(m_s - m) O_s / l"),
        (lse_without_m, "your lse is log(l) without the maximum: lse = m + log(l)"),
        (safe(mean_of_outputs), "you averaged the splits' outputs: a split's weight is its share of the "
                                "softmax denominator, exp(m_s - m) l_s / l, not 1 / S"),
    )


@_register("merge_splits", 14, "merge split-KV partials (O_s, m_s, l_s) into a row's o and lse",
           merge_splits_solution)
def _check_merge_splits(answer):
    cases = _merge_cases()
    for n, (label, x, V, cuts) in enumerate(cases, 1):
        O_s, m_s, l_s = _partials(x, V, cuts)
        where = f"case {n} of {len(cases)} ({label}; m_s = {np.array2string(m_s, precision=4)})"
        want = _truth(x, V)
        try:
            with np.errstate(all="ignore"):
                got = answer(O_s.copy(), m_s.copy(), l_s.copy())
            o, lse = np.asarray(got[0], dtype=np.float64), float(got[1])
        except NotImplementedError:
            raise
        except Exception as exc:
            return len(cases), _Mismatch(where, _fmt(exc), _fmt(want))
        ok = o.shape == want[0].shape and np.allclose(o, want[0], rtol=1e-9, atol=1e-12) and (
            lse == want[1] if math.isinf(want[1]) else math.isclose(lse, want[1], rel_tol=1e-12, abs_tol=1e-9))
        if not ok:
            notes = []
            if np.isnan(o).any() or math.isnan(lse):
                notes.append("yours has NaN: an empty split has m_s = -inf; exp(m_s - m) is 0 unless every m_s is -inf "
                             "(then the row saw no key: o = 0, lse = -inf)")
            for fn, why in _wrong_merges():
                with np.errstate(all="ignore"):
                    wo, wl = fn(O_s, m_s, l_s)
                if o.shape == wo.shape and np.allclose(o, wo, rtol=1e-9, atol=1e-12, equal_nan=True) and (
                        lse == wl or (math.isnan(lse) and math.isnan(wl)) or math.isclose(lse, wl, rel_tol=1e-12)):
                    notes.append(why)
                    break
            return len(cases), _Mismatch(where, _fmt((o, lse)), _fmt(want), tuple(notes))
    return len(cases), None


# ============================================================================= exercise: decode_bytes


def decode_bytes_solution(B, Hq, Hkv, L, d, itemsize):
    """(bytes, FLOPs) of one decoding step: B sequences of L cached tokens, one new token each, Hq query heads
    sharing Hkv KV heads, head dim d, ``itemsize`` bytes an element; lse float32."""
    kv = 2 * B * Hkv * L * d * itemsize  # K and V: each KV head once, for all Hq / Hkv query heads of its group
    q = B * Hq * d * itemsize  # the new token's query, every head
    o = B * Hq * d * itemsize + 4 * B * Hq  # its output and lse
    flops = 4 * B * Hq * L * d  # q . k (2 d) and p v (2 d) for every head and every cached key
    return kv + q + o, flops


def decode_problem(B, Hq, Hkv, L, d, itemsize, num_splits=1):
    """A :class:`flash_numba.decode.DecodeProblem` of one step on an unpaged cache (for the IO model)."""
    from ..decode import DecodeProblem

    dtype = {2: np.dtype(np.float16), 4: np.dtype(np.float32)}[itemsize]
    return DecodeProblem(B=B, Hq=Hq, Hkv=Hkv, Nq=1, d=d, dtype=dtype, paged=False, page_size=max(L, 1), max_pages=1,
                         num_pages=B, seqlens=np.full(B, L, dtype=np.int32), causal=False, scale=1.0,
                         num_splits=num_splits)


def model_terms(B, Hq, Hkv, L, d, itemsize, num_splits=1) -> dict:
    """The IO model's bytes by term (:func:`flash_numba.iomodel.flash_decode.terms`) and the step's FLOPs."""
    from ..iomodel import flash_decode

    prob = decode_problem(B, Hq, Hkv, L, d, itemsize, num_splits)
    return {**flash_decode.terms(prob), "FLOPs": 4 * d * flash_decode.visible_pairs(prob)}


_BYTES_CASES = ((8, 32, 8, 4096, 128, 2, "B = 8, Hq = 32, Hkv = 8 (GQA, groups of 4), L = 4096, d = 128, float16"),
                (1, 1, 1, 1, 8, 4, "one sequence, one head, one cached token, d = 8, float32"),
                (3, 4, 4, 17, 16, 4, "B = 3, Hq = Hkv = 4 (no grouping), L = 17, d = 16, float32"),
                (2, 8, 1, 1000, 64, 2, "B = 2, Hq = 8, Hkv = 1 (MQA: one KV head), L = 1000, d = 64, float16"))


@_register("decode_bytes", 14, "HBM bytes and FLOPs of one decoding step (KV cache, q, o, lse)",
           decode_bytes_solution)
def _check_decode_bytes(answer):
    for n, (B, Hq, Hkv, L, d, s, label) in enumerate(_BYTES_CASES, 1):
        t = model_terms(B, Hq, Hkv, L, d, s)
        want = (t["KV cache"] + t["q"] + t["o and lse"], t["FLOPs"])
        where = f"case {n} of {len(_BYTES_CASES)} ({label})"
        try:
            got = answer(B, Hq, Hkv, L, d, s)
            got = (int(got[0]), int(got[1]))
        except NotImplementedError:
            raise
        except Exception as exc:
            return len(_BYTES_CASES), _Mismatch(where, _fmt(exc), _fmt(want))
        if got != want:
            notes = [f"the IO model's terms: KV cache {t['KV cache']:,}, q {t['q']:,}, o and lse {t['o and lse']:,} "
                     f"bytes (flash_numba.iomodel.flash_decode.terms)"]
            by, fl = got
            kv, rest = t["KV cache"], t["q"] + t["o and lse"]
            named = {
                kv * Hq // Hkv + rest: "you read the cache once per query head: with grouped-query attention the "
                                       "Hq / Hkv query heads of a group share one KV head, read once",
                kv // 2 + rest: "you counted K only: the step reads V too (2 B Hkv L d elements)",
                (kv + t["q"] + B * Hq * d * s) // s: "you counted elements, not bytes: multiply by the itemsize "
                                                     "(the lse is float32: 4 bytes a row)",
                kv + t["q"] + B * Hq * d * s: "you left out the lse: 4 bytes per (sequence, query head)",
                kv + B * Hq * d * s + 4 * B * Hq: "you left out q: the new token's query is read, d elements a head",
            }
            if by != want[0] and by in named:
                notes.append(named[by])
            if fl != want[1]:
                if fl * 2 == want[1]:
                    notes.append("your FLOPs count one product: a step does q . k (2 d FLOPs a key) and p v (2 d)")
                elif fl * Hq == want[1] * Hkv:
                    notes.append("your FLOPs use Hkv heads: every query head computes its own scores and output")
            return len(_BYTES_CASES), _Mismatch(where, f"(bytes, FLOPs) = ({by:,}, {fl:,})",
                                                f"({want[0]:,}, {want[1]:,})", tuple(notes))
    return len(_BYTES_CASES), None


# ============================================================================= blocks against SMs


def wave(blocks: int, sm_count: int, resident: int) -> np.ndarray:
    """Blocks each SM holds in the first wave when ``blocks`` are handed out one an SM in turn, at most
    ``resident`` an SM."""
    per = np.zeros(sm_count, dtype=int)
    for b in range(min(blocks, sm_count * resident)):
        per[b % sm_count] += 1
    return per


def blocks_figure(B: int, Hkv: int, sm_count: int, splits=(1, 8), resident: int = 4):
    """One panel per split count: the SMs as a grid of cells, each coloured by the blocks it holds at once."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4 * len(splits), 3.2), layout="constrained")
    axes = fig.subplots(1, len(splits), squeeze=False)[0]
    cols = int(math.ceil(math.sqrt(sm_count * 1.4)))
    rows = int(math.ceil(sm_count / cols))
    for ax, S in zip(axes, splits):
        blocks = B * Hkv * S
        per = wave(blocks, sm_count, resident)
        grid = np.full(rows * cols, np.nan)
        grid[:sm_count] = per
        im = ax.imshow(grid.reshape(rows, cols), cmap="viridis", vmin=0, vmax=resident)
        idle = int((per == 0).sum())
        ax.set_title(f"{S} split{'s' if S > 1 else ''}: {blocks} blocks on {sm_count} SMs\n"
                     f"{idle} SMs idle, {per.mean():.1f} blocks an SM", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(im, ax=list(axes), label="blocks an SM holds at once", shrink=0.8)
    return fig


# ============================================================================= recorded H200 results

DECODE_CSV = DATA / "h200-2026-12-02-decode" / "decode.csv"
DECODE_SOURCE = ("NVIDIA H200 (sm_90, 132 SMs), 2026-12-02, commit 0579997 (branch decode), "
                 "benchmarks/results/h200-2026-12-02-decode/decode.csv: bash benchmarks/decode_sweep.sh OUT "
                 "(GPU time a step, steps queued back to back)")


def recorded_rates(implementations=("flash_decode", "flash_decode-s1", "flash_decode-cuda", "flash2_fast",
                                    "torch-flash", "torch-efficient", "torch-math"), dtype="float16") -> dict:
    """{implementation: {N: KV GB/s}} from the recorded decode benchmark (B = 8, Hq = 32, Hkv = 8, d = 128,
    ``dtype`` float16 or bfloat16, one new token): ``kv_gbps`` = 2 B Hkv N d s / time."""
    with open(DECODE_CSV) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    out = {name: {} for name in implementations}
    for r in rows:
        if r["implementation"] in out and r["status"] == "ok" and r.get("dtype", "float16") == dtype:
            out[r["implementation"]][int(r["N"])] = float(r["kv_gbps"])
    return {name: by_n for name, by_n in out.items() if by_n}


def recorded_header() -> list[str]:
    """The comment lines of the recorded CSV: GPU, date, command, what was measured."""
    with open(DECODE_CSV) as f:
        return [line[1:].strip() for line in f if line.startswith("#")]


def rates_figure(rates: dict, copy_gbps: float | None = None):
    """KV-cache GB/s against cache length, one line per implementation (recorded)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.6), layout="constrained")
    ax = fig.subplots()
    for name, by_n in rates.items():
        Ns = sorted(by_n)
        ax.plot(Ns, [by_n[n] for n in Ns], marker="o", label=name)
    if copy_gbps:
        ax.axhline(copy_gbps, color="grey", linestyle="--", linewidth=1, label=f"device copy {copy_gbps:,.0f} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("cache length N (tokens)")
    ax.set_ylabel("KV cache GB/s")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("one decoding step, B = 8, Hq = 32, Hkv = 8, d = 128, float16 (H200, recorded)", fontsize=9)
    return fig


# ============================================================================= hints

HINTS = {
    "merge_splits": [
        "m = the largest m_s. If m is -inf no split saw a key: return zeros and -inf.",
        "alpha_s = exp(m_s - m) (0 for an empty split); l = sum_s alpha_s l_s.",
        "o = sum_s alpha_s O_s / l; lse = m + log(l).",
    ],
    "decode_bytes": [
        "The cache: K and V, B sequences, Hkv heads, L keys, d elements, itemsize bytes each; read once.",
        "q and o: one row of d elements per (sequence, query head); the lse: one float32 per (sequence, query head).",
        "FLOPs: every query head, every cached key: 2 d for q . k and 2 d for p v.",
    ],
}


def hints(name: str, upto: int | None = None) -> None:
    """Print the hints of exercise ``name``, the first ``upto`` of them (all by default)."""
    if name not in HINTS:
        raise ValueError(f"name: no hints for {name!r}; choose one of {', '.join(HINTS)}")
    for n, hint in enumerate(HINTS[name][:upto], 1):
        print(f"hint {n} of {len(HINTS[name])}: {hint}")
