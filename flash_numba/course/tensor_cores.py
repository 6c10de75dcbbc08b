"""Lesson 13's teaching code: tensor cores (``mma.sync``) and FlashAttention-2 on them.

* :func:`fragment_figure`: the m16n8k16 fragment layout drawn: which lane holds which element of A, B, C.
* Exercise ``mma_tile``: the learner's ``@cuda.jit`` kernel ``C = A B`` for 16 x 16 float16 tiles, one warp,
  two ``mma_m16n8k16_f16`` products, fragments built from shared memory.  The checker compares C with NumPy
  and, in the simulator, reads the registers every lane hands to the instruction and compares them with the
  PTX ISA's fragment map, naming the classic mistakes (A or B transposed, a1 and a2 swapped, the two halves of a
  register swapped, both products on B's first 8 columns, C written in the wrong place).
* Exercise ``p_in_registers``: one lane's accumulators of S (two n8 tiles) rearranged as its A registers of
  P V: the step that keeps P in registers in flash2_tc.
* :func:`ceilings`, :func:`half_precision_peers`, :func:`forward_times`, :func:`standard_launch_shares`: recorded
  H200 numbers, each with its GPU, date, commit and file (``data/README.md``).

The building blocks are :mod:`flash_numba.kernels._mma`'s: one PTX instruction on a GPU, a stand-in with the
same fragment layouts in the simulator.
"""

from __future__ import annotations

import csv
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from numba import cuda, float32
from numba.types import float16

from ..kernels import _mma
from ..kernels._mma import fragment_a, lanes_of_c, mma_m16n8k16_f16, pack_f16x2, pack_host
from .checking import _kernel_not_done, _Mismatch, _race_mismatch, _races_watched, _register

__all__ = [
    "ceilings",
    "fragment_figure",
    "forward_times",
    "fragment_of",
    "half_precision_peers",
    "hints",
    "mma_m16n8k16_f16",
    "pack_f16x2",
    "standard_launch_shares",
]

WARP = 32
DATA = Path(__file__).resolve().parent / "data"

# ============================================================================= the fragment map


def fragment_of(matrix: str, row: int, col: int) -> tuple[int, str, str]:
    """(lane, register, half) that holds element [row][col] of ``matrix`` ("A" 16 x 16, "B" 16 x 8, "C" 16 x 8)
    in mma.sync m16n8k16 (PTX ISA 9.7.14.5.8); half is "lo" or "hi" (C's registers hold one float32: "")."""
    if matrix == "A":
        g, t, half = row % 8, (col % 8) // 2, col % 2
        return 4 * g + t, f"a{(row >= 8) + 2 * (col >= 8)}", ("lo", "hi")[half]
    if matrix == "B":  # k = row, n = col
        g, t, half = col, (row % 8) // 2, row % 2
        return 4 * g + t, f"b{int(row >= 8)}", ("lo", "hi")[half]
    if matrix == "C":
        g, t = row % 8, col // 2
        return 4 * g + t, f"c{2 * (row >= 8) + col % 2}", ""
    raise ValueError(f"matrix: expected 'A', 'B' or 'C', got {matrix!r}")


def fragment_figure(lanes=None):
    """The m16n8k16 fragment layout: A (16 x 16), B (16 x 8), C (16 x 8); each element labelled with the lane
    that holds it and the register, coloured by lane.  ``lanes``: draw only these lanes' elements (the rest grey)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 5.6), layout="constrained")
    axes = fig.subplots(1, 3, width_ratios=[16, 8, 8])
    cmap = colormaps["tab20"]
    for ax, (name, rows, cols, title) in zip(axes, (("A", 16, 16, "A (16 x 16, row): a0..a3"),
                                                    ("B", 16, 8, "B (16 x 8, col): b0, b1"),
                                                    ("C", 16, 8, "C, D (16 x 8, float32): c0..c3"))):
        for r in range(rows):
            for c in range(cols):
                lane, reg, half = fragment_of(name, r, c)
                shown = lanes is None or lane in lanes
                colour = cmap(lane % 20) if shown else (0.92, 0.92, 0.92)
                ax.add_patch(_rect(c, r, colour))
                if shown:
                    ax.text(c + 0.5, r + 0.5, f"{lane}\n{reg}{half[:1]}", ha="center", va="center", fontsize=5.5)
        ax.set_xlim(0, cols)
        ax.set_ylim(rows, 0)
        ax.set_aspect("equal")
        ax.set_xticks(np.arange(cols) + 0.5, [str(c) for c in range(cols)], fontsize=6)
        ax.set_yticks(np.arange(rows) + 0.5, [str(r) for r in range(rows)], fontsize=6)
        ax.set_xlabel("k" if name == "A" else "n", fontsize=8)
        ax.set_ylabel("k" if name == "B" else "row", fontsize=8)
        ax.set_title(title, fontsize=9)
    fig.suptitle("mma.sync.m16n8k16: lane (g = lane >> 2, t = lane % 4) and register of each element "
                 "(l/h: low or high half of the 32-bit register)", fontsize=9)
    return fig


def _rect(x, y, colour):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), 1, 1, facecolor=colour, edgecolor="white", linewidth=0.5)


# ============================================================================= exercise: mma_tile


def mma_tile_solution():
    """The packaged kernel: C (16 x 16, float32) = A B, A and B 16 x 16 float16, one warp of 32 lanes."""
    @cuda.jit
    def tile_product(A, B, C):
        As = cuda.shared.array(256, float16)  # A row-major: As[16 r + k]
        Bs = cuda.shared.array(256, float16)  # B row-major: Bs[16 k + n]
        lane = cuda.threadIdx.x
        for e in range(8):  # 32 lanes x 8: every element of A and B read from global memory once
            i = 8 * lane + e
            As[i] = A[i // 16, i % 16]
            Bs[i] = B[i // 16, i % 16]
        cuda.syncthreads()
        g = lane >> 2  # the row (of A, C) or column (of B) this lane holds
        t = lane % 4  # which pair of k (or of C's columns)
        a0 = pack_f16x2(float32(As[16 * g + 2 * t]), float32(As[16 * g + 2 * t + 1]))
        a1 = pack_f16x2(float32(As[16 * (g + 8) + 2 * t]), float32(As[16 * (g + 8) + 2 * t + 1]))
        a2 = pack_f16x2(float32(As[16 * g + 2 * t + 8]), float32(As[16 * g + 2 * t + 9]))
        a3 = pack_f16x2(float32(As[16 * (g + 8) + 2 * t + 8]), float32(As[16 * (g + 8) + 2 * t + 9]))
        for n in range(2):  # C's columns 0..7, then 8..15: one m16n8k16 each
            col = 8 * n + g
            b0 = pack_f16x2(float32(Bs[16 * (2 * t) + col]), float32(Bs[16 * (2 * t + 1) + col]))
            b1 = pack_f16x2(float32(Bs[16 * (2 * t + 8) + col]), float32(Bs[16 * (2 * t + 9) + col]))
            zero = float32(0)
            c0, c1, c2, c3 = mma_m16n8k16_f16(a0, a1, a2, a3, b0, b1, zero, zero, zero, zero)
            C[g, 8 * n + 2 * t] = c0
            C[g, 8 * n + 2 * t + 1] = c1
            C[g + 8, 8 * n + 2 * t] = c2
            C[g + 8, 8 * n + 2 * t + 1] = c3

    return tile_product


@contextmanager
def _recording(kernel):
    """Record the registers every lane passes to mma_m16n8k16_f16 while ``kernel`` runs in the simulator:
    yields {lane: [regs of its 1st call, 2nd call, ...]}.  The learner's kernel finds the function among its
    globals (``from ... import mma_m16n8k16_f16``) or as ``_mma``'s attribute: both are swapped for a recorder."""
    from ..sim.warps import current_thread

    calls: dict[int, list] = {}
    real = _mma.mma_m16n8k16_f16

    def recorder(*regs):
        calls.setdefault(current_thread().thread_id % WARP, []).append(tuple(regs))
        return real(*regs)

    func = getattr(kernel, "py_func", kernel)
    glb = getattr(func, "__globals__", {})
    names = [n for n, v in glb.items() if v is real]
    for n in names:
        glb[n] = recorder
    _mma.mma_m16n8k16_f16 = recorder
    try:
        yield calls
    finally:
        for n in names:
            glb[n] = real
        _mma.mma_m16n8k16_f16 = real


#: Codes of the coded case: A[i][k] = 1 + 16 i + k (1..256), B[k][n] = 512 + 16 k + n (512..767): exact in
#: float16, distinct, and their products' sums exact in float32.
def _coded():
    i = np.arange(16)
    A = (1 + 16 * i[:, None] + i[None, :]).astype(np.float16)
    B = (512 + 16 * i[:, None] + i[None, :]).astype(np.float16)
    return A, B


def _where(v: float) -> tuple:
    """What a coded value is: ("A", row, col), ("B", k, n), ("0",), ("NaN",) or ("?", v)."""
    if np.isnan(v):
        return ("NaN",)
    x = int(v)
    if x != v:
        return ("?", v)
    if 1 <= x <= 256:
        return ("A", (x - 1) // 16, (x - 1) % 16)
    if 512 <= x <= 767:
        return ("B", (x - 512) // 16, (x - 512) % 16)
    return ("0",) if x == 0 else ("?", v)


def _halves(word) -> tuple[float, float]:
    lo, hi = _mma._halves(np.uint32(word), "f16")
    return float(lo), float(hi)


def _expected_a(lane, r, h):
    g, t = lane >> 2, lane % 4
    return ("A", g + 8 * (r % 2), 2 * t + 8 * (r // 2) + h)


def _expected_b(lane, r, h, tile):
    g, t = lane >> 2, lane % 4
    return ("B", 2 * t + 8 * r + h, g + 8 * tile)


#: Known wrong maps of A's registers: (lane, register, half) -> element, and what the mistake is.
_A_MISTAKES = (
    (lambda L, r, h: ("A", 2 * (L % 4) + 8 * (r // 2) + h, (L >> 2) + 8 * (r % 2)),
     "you transposed A's fragment: A is row-major ('.row'): a0 holds A[g][2t] and A[g][2t+1], two columns of row g"),
    (lambda L, r, h: ("A", (L >> 2) + 8 * (r // 2), 2 * (L % 4) + 8 * (r % 2) + h),
     "you swapped a1 and a2: a1 holds rows g+8 (columns 2t, 2t+1), a2 holds row g (columns 2t+8, 2t+9)"),
    (lambda L, r, h: ("A", (L >> 2) + 8 * (r % 2), 2 * (L % 4) + 8 * (r // 2) + 1 - h),
     "you swapped the halves of A's registers: the lower 16 bits hold the lower column (pack_f16x2(lo, hi))"),
    (lambda L, r, h: ("B", 2 * (L % 4) + 8 * (r // 2) + h, (L >> 2) + 8 * (r % 2)),
     "A's registers hold elements of B: the first four operands are A's fragment, then B's two, then C's four"),
)

#: Known wrong maps of B's registers (tile: which 8 columns of B the product should use).
_B_MISTAKES = (
    (lambda L, r, h, n: ("B", (L >> 2) + 8 * r, 2 * (L % 4) + h + 8 * n),
     "you transposed B's fragment: B is column-major ('.col'): b0 holds B[2t][g] and B[2t+1][g], two k of "
     "column g, not B[g][2t], B[g][2t+1]"),
    (lambda L, r, h, n: ("B", 2 * (L % 4) + 8 * (1 - r) + h, (L >> 2) + 8 * n),
     "you swapped b0 and b1: b0 holds k = 2t, 2t+1 and b1 holds k = 2t+8, 2t+9"),
    (lambda L, r, h, n: ("B", 2 * (L % 4) + 8 * r + 1 - h, (L >> 2) + 8 * n),
     "you swapped the halves of B's registers: the lower 16 bits hold the lower k (pack_f16x2(lo, hi))"),
)


def _decoded(calls, call: int):
    """For call number ``call``: {lane: (A elements [4][2], B elements [2][2], C inputs [4])}."""
    out = {}
    for lane in range(WARP):
        regs = calls[lane][call]
        a = [[_where(v) for v in _halves(w)] for w in regs[:4]]
        b = [[_where(v) for v in _halves(w)] for w in regs[4:6]]
        out[lane] = (a, b, [float(c) for c in regs[6:10]])
    return out


def _fmt_el(el) -> str:
    if el[0] in ("A", "B"):
        return f"{el[0]}[{el[1]}][{el[2]}]"
    if el[0] == "NaN":
        return "NaN (a shared element no lane had written: a missing cuda.syncthreads()?)"
    return "0" if el[0] == "0" else f"{el[1]!r} (not an element of A or B)"


def _fragment_mismatch(calls, label: str) -> _Mismatch | None:
    """Compare the recorded registers with the fragment map; a _Mismatch naming the mistake, or None."""
    counts = {len(calls.get(lane, [])) for lane in range(WARP)}
    if counts == {0}:
        return _Mismatch(label, "no call of mma_m16n8k16_f16", "two calls per lane (C's columns 0..7 and 8..15)",
                         ("the exercise is to compute C with the tensor-core instruction: call "
                          "mma_m16n8k16_f16 by that name (imported as in the cell above)",))
    if len(counts) > 1:
        return _Mismatch(label, f"lanes made {sorted(counts)} calls", "every lane the same number of calls",
                         ("mma.sync is a warp instruction: all 32 lanes call it together, the same number of times",))
    n_calls = counts.pop()
    if n_calls != 2:
        return _Mismatch(label, f"{n_calls} call(s) of mma_m16n8k16_f16 per lane", "2",
                         ("one m16n8k16 computes a 16 x 8 block of C; C is 16 x 16: one product for columns 0..7 "
                          "and one for 8..15",))
    tiles = []
    for call in range(2):
        dec = _decoded(calls, call)
        for lane in range(WARP):
            a, b, c = dec[lane]
            if any(v != 0.0 for v in c):
                return _Mismatch(f"{label}, product {call + 1}", f"lane {lane} passes c = {c}", "c0..c3 = 0",
                                 ("the accumulators start at 0: D = A B + C with C = 0",))
        wrong_a = [(L, r, h) for L in range(WARP) for r in range(4) for h in range(2)
                   if dec[L][0][r][h] != _expected_a(L, r, h)]
        if wrong_a:
            for fn, why in _A_MISTAKES:
                if all(dec[L][0][r][h] == fn(L, r, h) for L in range(WARP) for r in range(4) for h in range(2)):
                    return _fragment_note(label, call, "A", wrong_a[0], dec, why)
            return _fragment_note(label, call, "A", wrong_a[0], dec, None)
        tile = _b_tile(dec)
        wrong_b = [(L, r, h) for L in range(WARP) for r in range(2) for h in range(2)
                   if dec[L][1][r][h] != _expected_b(L, r, h, tile)]
        if wrong_b:
            for fn, why in _B_MISTAKES:
                if all(dec[L][1][r][h] == fn(L, r, h, tile) for L in range(WARP) for r in range(2) for h in range(2)):
                    return _fragment_note(label, call, "B", wrong_b[0], dec, why, tile)
            return _fragment_note(label, call, "B", wrong_b[0], dec, None, tile)
        tiles.append(tile)
    if sorted(tiles) != [0, 1]:
        cols = " and ".join(f"{8 * n}..{8 * n + 7}" for n in tiles)
        return _Mismatch(label, f"the two products use B's columns {cols}", "columns 0..7, then 8..15",
                         ("the second product needs B's columns 8..15: b0 = B[2t][8 + g], B[2t+1][8 + g]",))
    return None


def _b_tile(dec) -> int:
    """Which 8 columns of B the call's B registers come from (by lane 0's b0 low half; 0 if not B)."""
    el = dec[0][1][0][0]
    return el[2] // 8 if el[0] == "B" else 0


def _fragment_note(label, call, which, where, dec, why, tile=0) -> _Mismatch:
    L, r, h = where
    half = ("lo", "hi")[h]
    if which == "A":
        got, want, reg = dec[L][0][r][h], _expected_a(L, r, h), f"a{r}"
    else:
        got, want, reg = dec[L][1][r][h], _expected_b(L, r, h, tile), f"b{r}"
    g, t = L >> 2, L % 4
    rule = ("a0 = A[g][2t..2t+1], a1 = A[g+8][2t..2t+1], a2 = A[g][2t+8..2t+9], a3 = A[g+8][2t+8..2t+9]"
            if which == "A" else "b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]")
    notes = [why] if why else [f"lane {L} has g = {g}, t = {t}; the fragment map: {rule}"]
    return _Mismatch(f"{label}, product {call + 1}: {which}'s fragment",
                     f"lane {L}, {reg} ({half}) holds {_fmt_el(got)}", f"{_fmt_el(want)}", tuple(notes))


def _write_mismatch(C, want, label) -> _Mismatch:
    """C differs while the products' registers were right: where the learner wrote D's elements."""
    if np.isnan(C).any():
        i, j = (int(x) for x in np.argwhere(np.isnan(C))[0])
        lane, reg, _ = fragment_of("C", i, j % 8)
        return _Mismatch(label, f"C[{i}][{j}] is NaN (never written)", f"{want[i, j]:.8g}",
                         (f"C[{i}][{j}] is {reg} of lane {lane} in the product of B's columns {8 * (j // 8)}.."
                          f"{8 * (j // 8) + 7}: c0, c1 = C[g][2t], C[g][2t+1]; c2, c3 = C[g+8][2t], C[g+8][2t+1], "
                          "plus 8 columns for the second product",))
    if np.array_equal(C, want.T):
        return _Mismatch(label, "C = (A B) transposed", "A B", ("you wrote C[col][row]: c0 belongs at C[g][2t]",))
    i, j = (int(x) for x in np.argwhere(C != want)[0])
    src = np.argwhere(want == C[i, j])
    found = f"; yours holds the value of C[{src[0][0]}][{src[0][1]}]" if len(src) else ""
    lane, reg, _ = fragment_of("C", i, j % 8)
    return _Mismatch(label, f"C[{i}][{j}] = {C[i, j]:.8g}", f"{want[i, j]:.8g}",
                     (f"C[{i}][{j}] is {reg} of lane {lane} (product {j // 8 + 1}){found}: c0, c1 = C[g][2t], "
                      "C[g][2t+1]; c2, c3 = C[g+8][2t], C[g+8][2t+1]",))


def _launch(kernel, A, B):
    C = np.full((16, 16), np.nan, dtype=np.float32)  # poisoned: an element never written stays NaN
    dA, dB, dC = cuda.to_device(A), cuda.to_device(B), cuda.to_device(C)
    kernel[1, WARP](dA, dB, dC)
    return dC.copy_to_host()


@_register("mma_tile", 13, "C = A B for 16 x 16 float16 tiles in one warp, two mma.sync m16n8k16 products",
           mma_tile_solution, kernel=True)
def _check_mma_tile(kernel):
    from ..device import SIMULATOR

    _kernel_not_done(kernel)
    rng = np.random.default_rng(13)
    A, B = _coded()
    cases = [("coded: A[i][k] = 1 + 16 i + k, B[k][n] = 512 + 16 k + n; exact", A, B, True)]
    for n in range(2):
        cases.append((f"random normal float16, draw {n + 1}", rng.standard_normal((16, 16)).astype(np.float16),
                      rng.standard_normal((16, 16)).astype(np.float16), False))
    for n, (label, A, B, coded) in enumerate(cases, 1):
        label = f"case {n} of {len(cases)} ({label})"
        want = A.astype(np.float64) @ B.astype(np.float64)
        try:
            if SIMULATOR and coded:
                with _races_watched() as races, _recording(kernel) as calls:
                    C = _launch(kernel, A, B)
                race = _race_mismatch(label, races)
                if race is not None:
                    return len(cases), race
                bad = _fragment_mismatch(calls, label)
                if bad is not None:
                    return len(cases), bad
            else:
                C = _launch(kernel, A, B)
        except NotImplementedError:
            raise
        except Exception as exc:  # the learner's error is part of the verdict
            notes = ("mma.sync is a warp instruction: all 32 lanes of the warp call it together, the same number "
                     "of times (no `if lane < ...` around it)",) if "full warp" in str(exc) else ()
            return len(cases), _Mismatch(label, f"raised {type(exc).__name__}: {exc}", "C = A B", notes)
        # tensor cores add in float32 (in some order): error at most a few float32 roundings of sum |a b|
        tol = 16 * np.finfo(np.float32).eps * (np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64)))
        if coded:
            if not np.array_equal(C, want.astype(np.float32)):
                return len(cases), _write_mismatch(C, want.astype(np.float32), label)
        elif not (np.abs(C - want) <= tol).all():
            return len(cases), _write_mismatch(C, want.astype(np.float32), label)
    return len(cases), None


# ============================================================================= exercise: p_in_registers


def p_in_registers_solution(s_lo, s_hi):
    """One lane's A registers of P (16 x 16, keys along k) from its accumulators of S = Q K^T.

    ``s_lo``: (c0, c1, c2, c3) of the product for keys 0..7; ``s_hi``: the same for keys 8..15.
    Returns (a0, a1, a2, a3), each a pair (lo, hi) of floats (pack_f16x2 would make the uint32)."""
    return (s_lo[0], s_lo[1]), (s_lo[2], s_lo[3]), (s_hi[0], s_hi[1]), (s_hi[2], s_hi[3])


_P_MISTAKES = (
    (lambda lo, hi: ((lo[0], lo[1]), (hi[0], hi[1]), (lo[2], lo[3]), (hi[2], hi[3])),
     "you swapped a1 and a2: a1 is rows g+8 of keys 0..7 (s_lo's c2, c3); a2 is row g of keys 8..15 (s_hi's c0, c1)"),
    (lambda lo, hi: ((lo[1], lo[0]), (lo[3], lo[2]), (hi[1], hi[0]), (hi[3], hi[2])),
     "you swapped lo and hi: the lower half holds the lower key (c0 is column 2t, c1 column 2t+1)"),
    (lambda lo, hi: ((hi[0], hi[1]), (hi[2], hi[3]), (lo[0], lo[1]), (lo[2], lo[3])),
     "you swapped the two products: keys 0..7 (s_lo) are k = 0..7 of A, in a0 and a1"),
)


@_register("p_in_registers", 13, "one lane's accumulators of S (two n8 tiles) as its A registers of P for P V",
           p_in_registers_solution)
def _check_p_in_registers(answer):
    i = np.arange(16)
    S = (1 + 16 * i[:, None] + i[None, :]).astype(np.float32)  # S[row][key]: distinct, exact in float16
    lo_regs, hi_regs = lanes_of_c(S[:, :8]), lanes_of_c(S[:, 8:])  # (32, 4) each: every lane's c0..c3
    words = np.zeros((WARP, 4), dtype=np.uint32)
    label = "case 1 of 1 (S[row][key] = 1 + 16 row + key, all 32 lanes)"
    for lane in range(WARP):
        lo, hi = tuple(float(x) for x in lo_regs[lane]), tuple(float(x) for x in hi_regs[lane])
        try:
            got = answer(lo, hi)
            pairs = [tuple(float(x) for x in p) for p in got]
            if len(pairs) != 4 or any(len(p) != 2 for p in pairs):
                raise ValueError("expected four (lo, hi) pairs")
        except NotImplementedError:
            raise
        except Exception as exc:
            return 1, _Mismatch(label, f"lane {lane}: raised {type(exc).__name__}: {exc}", "((lo, hi),) * 4")
        words[lane] = [pack_host(p[0], p[1], "f16") for p in pairs]
        want = p_in_registers_solution(lo, hi)
        if tuple(pairs) != tuple(want):
            notes = [why for fn, why in _P_MISTAKES if tuple(pairs) == fn(lo, hi)]
            return 1, _Mismatch(f"{label}, lane {lane} (g = {lane >> 2}, t = {lane % 4})", repr(tuple(pairs)),
                                repr(want), tuple(notes) or (
                                    "A's map: a0 = P[g][2t..2t+1], a1 = P[g+8][2t..], a2 = P[g][2t+8..], "
                                    "a3 = P[g+8][2t+8..]; C's map: c0, c1 = S[g][2t..2t+1], c2, c3 = S[g+8][..]",))
    P = fragment_a(words, "f16", 16)
    assert np.array_equal(P, S), "the packed fragment must be S itself"  # the solution's map, checked whole
    return 1, None


# ============================================================================= recorded H200 numbers


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def _header(path: Path) -> list[str]:
    with open(path) as f:
        return [line[1:].strip() for line in f if line.startswith("#")]


CEILINGS_CSV = DATA / "h200-2026-12-01-ceilings" / "ceilings.csv"
PEERS_CSV = DATA / "h200-2026-12-01-ceilings" / "half_precision_peers.csv"
SHARES_CSV = DATA / "h200-2026-12-01-standard-tc" / "launch_shares_float16.csv"
SHARES_SOURCE = ("NVIDIA H200 (sm_90, 132 SMs), 2026-12-01, commit da6fdbd (branch stdtc), "
                 "benchmarks/results/h200-2026-12-01-standard-tc/launch_shares_float16.csv: "
                 "python -m flash_numba.tools.launch_shares --dtype float16 --BH 32 --N 1024 4096 16384 --d 64 128")


TC_FORWARD_CSV = DATA / "h200-2026-12-01-tensor-cores" / "tc_forward.csv"
TC_SOURCE = ("NVIDIA H200 (sm_90, 132 SMs), 2026-12-01, commit 66a3ae8 (branch tc), "
             "benchmarks/results/h200-2026-12-01-tensor-cores/tc_forward.csv: "
             "NUMBA_ENABLE_CUDASIM=0 python benchmarks/tc_check.py --out OUT")
TC_FORWARD_RUN2_CSV = DATA / "h200-2026-12-01-tensor-cores" / "run2_tc_forward.csv"
TC_RUN2_SOURCE = ("the same GPU and command a few minutes later, commit 1d10b9d (the sm80 kernel unchanged), "
                  "benchmarks/results/h200-2026-12-01-tensor-cores/run2_tc_forward.csv")


def forward_times(d: int = 64, dtype: str = "float16", causal: bool = False, path: Path = TC_FORWARD_CSV) -> dict:
    """{implementation: (ms, TFLOP/s)} of the recorded tensor-core forward (B*H = 32, N = 4096): flash2_tc on the
    sm_80 instructions and on the T4's (forced), PyTorch's flash and memory-efficient backends, same process."""
    out = {}
    for r in _rows(path):
        if int(r["d"]) == d and r["dtype"] == dtype and r["causal"] == str(causal):
            name = f"{r['implementation']} ({r['path']} path)" if r["path"] else r["implementation"]
            out[name] = (float(r["ms"]), float(r["tflops"]))
    return out


def ceilings() -> list[dict]:
    """The H200's arithmetic ceilings from a Numba kernel: FFMA (CUDA cores) and mma.sync (tensor cores),
    TFLOP/s, with the date, commit and file of each (``data/h200-2026-12-01-ceilings/``)."""
    return _rows(CEILINGS_CSV)


def half_precision_peers() -> list[dict]:
    """Forward and forward+backward times (ms) in float16 on the H200, B*H = 32, N = 4096: PyTorch's backends
    and our CUDA-core kernels, with their source."""
    return _rows(PEERS_CSV)


def standard_launch_shares(N: int = 4096, d: int = 64, path: Path = SHARES_CSV) -> list[dict]:
    """Standard attention's float16 forward on tensor cores (sm_80 path), each launch's time, share and bytes."""
    return [r for r in _rows(path) if int(r["N"]) == N and int(r["d"]) == d and r["mma_path"] == "sm80"]


def shares_figure(rows_by_shape: dict):
    """Stacked bars: each standard launch's share of the float16 forward, one bar per (N, d)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.2), layout="constrained")
    ax = fig.subplots()
    colours = {"S = scale*Q@K^T": "#4c72b0", "P = softmax(S)": "#dd8452", "O = P@V": "#55a868"}
    labels = list(rows_by_shape)
    for n, key in enumerate(labels):
        left = 0.0
        for r in rows_by_shape[key]:
            w = float(r["share"]) * 100
            ax.barh(n, w, left=left, color=colours.get(r["launch"], "grey"), label=r["launch"] if n == 0 else None)
            ax.text(left + w / 2, n, f"{w:.0f}%", ha="center", va="center", fontsize=8, color="white")
            left += w
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("share of the forward's time (%)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3)
    ax.set_title("standard attention in float16 on tensor cores, H200 (recorded)", fontsize=9)
    return fig


# ============================================================================= hints

HINTS = {
    "mma_tile": [
        "Load first: 32 lanes, 256 elements of A and of B, 8 each, into two cuda.shared.array(256, float16) "
        "(row-major: As[16 r + k]); then cuda.syncthreads() before any lane reads them.",
        "g = lane >> 2, t = lane % 4. a0 = pack_f16x2(A[g][2t], A[g][2t+1]) (as float32), a1 the same for row "
        "g + 8, a2 and a3 the same for columns 2t + 8, 2t + 9.",
        "B is 'col': b0 = pack_f16x2(B[2t][n0 + g], B[2t+1][n0 + g]), b1 = the same for k = 2t+8, 2t+9; "
        "n0 = 0 for the first product, 8 for the second.",
        "c0, c1, c2, c3 = mma_m16n8k16_f16(a0, a1, a2, a3, b0, b1, 0, 0, 0, 0) (float32 zeros); write "
        "C[g][n0 + 2t] = c0, C[g][n0 + 2t + 1] = c1, C[g + 8][n0 + 2t] = c2, C[g + 8][n0 + 2t + 1] = c3.",
    ],
    "p_in_registers": [
        "Draw one lane: its c0, c1 are S[g][2t], S[g][2t+1]; its c2, c3 are S[g+8][2t], S[g+8][2t+1]; in s_hi the "
        "same rows, keys 8 + 2t, 8 + 2t + 1.",
        "A's a0 is P[g][2t..2t+1], a1 P[g+8][2t..2t+1], a2 P[g][2t+8..2t+9], a3 P[g+8][2t+8..2t+9]: match them up.",
    ],
}


def hints(name: str, upto: int | None = None) -> None:
    """Print the hints of exercise ``name``, the first ``upto`` of them (all by default)."""
    if name not in HINTS:
        raise ValueError(f"name: no hints for {name!r}; choose one of {', '.join(HINTS)}")
    for n, hint in enumerate(HINTS[name][:upto], 1):
        print(f"hint {n} of {len(HINTS[name])}: {hint}")

