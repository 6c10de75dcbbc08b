"""HBM bytes by term: compulsory, re-reads, S/P round trips (the paper's Theorem 2 made visible).

Every kernel's bytes (the closed forms of this package, equal to the counted
bytes) split into three terms:

``compulsory``
    Each input read once and each output written once: Q, K, V read and O, L
    written in the forward; Q, K, V, O, dO, L read and dQ, dK, dV written in the
    backward.  No algorithm that reads all its inputs can do with less.
``re-reads``
    Everything else that is not an N x N matrix: Q, K, V, dO... read again once
    per block (the count depends on the block sizes, so on the SRAM size M),
    flash1's O, l, m read and written every pass, row statistics (D) and
    accumulators.  It is the model's total minus the two other terms.
``S/P``
    The N x N matrices through HBM: S and P written and read back (with the
    softmax's row statistics m, l) in the forward, P and dS in the backward (and S in
    float16, whose backward runs the forward's S launch again); only the standard
    kernels have it (:func:`flash_numba.iomodel.standard.sp_bytes`).

At equal blocks the standard forward does exactly flash2's reads and writes
plus the S/P term (Q once, K and V once per query block, O and L once), so
``standard - flash2 == S/P`` holds exactly (tests/test_standard.py).  The
backwards are organised differently (standard's dV, dK and dQ kernels re-read
Q, dO and K per tile pair, flash2's recompute S instead), so there the
difference of the totals is not the S/P term alone.

The counters only count totals per kernel launch; the split is the model's
attribution (:class:`flash_numba.hbm.HBMCount` ``terms``), exact because the
tests assert counted == model per kernel.  Theorem 2 in these terms: the
compulsory term is Theta(N d), the re-reads Theta(N^2 d / B) for a block side B
that grows with M (Theta(N^2 d^2 / M) for flash1), the S/P term Theta(N^2)
whatever M is.
"""

from __future__ import annotations

import numpy as np

from .._inputs import acc_dtype

TERMS = ("compulsory", "re-reads", "S/P")


def compulsory_bytes(BH, Nq, Nk, d, dtype, pass_: str = "forward", G: int = 1) -> int:
    """Inputs read once, outputs written once (see the module docstring).

    ``BH`` query heads, ``G`` of them per key/value head: K and V (dK and dV) have BH / G heads.
    """
    s, a = np.dtype(dtype).itemsize, acc_dtype(dtype).itemsize
    BHkv = BH // G
    if pass_ == "forward":
        return BH * (s * 2 * Nq * d + a * Nq) + BHkv * s * 2 * Nk * d
    return BH * (s * 4 * Nq * d + a * Nq) + BHkv * s * 4 * Nk * d


def _model(kernel, pass_, BH, Nq, Nk, d, dtype, causal, block, deterministic=True, G=1):
    from .. import kernels

    return kernels.get(kernel).io_model(pass_, deterministic)(BH, Nq, Nk, d, dtype, causal, block, G=G)


def split(kernel, pass_, BH, Nq, Nk, d, dtype, causal, block, deterministic=True, G=1) -> dict[str, int]:
    """The model's bytes of one call by term, ``{"compulsory", "re-reads", "S/P"}``; they sum to its total.

    ``G``: query heads per key/value head (grouped-query attention; ``BH`` counts query heads).
    """
    if pass_ not in ("forward", "backward"):
        raise ValueError(f"pass_: expected 'forward' or 'backward', got {pass_!r}")
    total = _model(kernel, pass_, BH, Nq, Nk, d, dtype, causal, block, deterministic, G).total
    comp = compulsory_bytes(BH, Nq, Nk, d, dtype, pass_, G)
    sp = 0
    if kernel == "standard":
        from .standard import sp_bytes

        sp = sp_bytes(BH, Nq, Nk, d, dtype, causal, block, pass_)
    return {"compulsory": comp, "re-reads": total - comp - sp, "S/P": sp}


def block_for(kernel: str, d: int, dtype, M_bytes: int, pass_: str = "forward") -> tuple[int, int]:
    """The block ``kernel`` would choose with ``M_bytes`` of shared memory (model only beyond 48 KB)."""
    from .. import kernels

    return kernels.get(kernel).block(d, dtype, pass_, budget=M_bytes)


def rows(BH=32, d=64, dtype=np.float32, Ns=(512, 1024, 2048, 4096, 8192), N_fixed=4096,
         Ms=(12 * 1024, 16 * 1024, 24 * 1024, 32 * 1024, 48 * 1024), M_fixed=48 * 1024,
         pass_="forward", causal=False, kernels=None) -> list[dict]:
    """CSV rows of :func:`figure`: for each kernel (default: all of :data:`flash_numba.kernels.NAMES`), the bytes
    by term over N (at ``M_fixed``) and over M (at ``N_fixed``), with the block each call would use."""
    from .. import kernels as _kernels

    kernels = _kernels.NAMES if kernels is None else kernels
    out = []
    for axis, points in (("N", Ns), ("M", Ms)):
        for x in points:
            N, M = (x, M_fixed) if axis == "N" else (N_fixed, x)
            for kernel in kernels:
                try:
                    block = block_for(kernel, d, dtype, M, pass_)
                except ValueError:  # no block of this kernel fits M
                    continue
                t = split(kernel, pass_, BH, N, N, d, dtype, causal, block)
                out.append(dict(axis=axis, kernel=kernel, pass_=pass_, BH=BH, N=N, d=d, dtype=np.dtype(dtype).name,
                                causal=causal, M_bytes=M, Br=block[0], Bc=block[1], **t, total=sum(t.values())))
    return out


def figure(BH=32, d=64, dtype=np.float32, pass_="forward", causal=False, **kw):
    """Stacked bars of the bytes by term for each kernel, over N (left) and over the SRAM size M (right).

    Left: each kernel's bytes over standard's total at the same N (linear, so the segments are to
    scale; standard's total in GB above each group).  Right: GB at fixed N for each M.  Kernels are
    told apart by hatching.  Returns ``(fig, rows)``: a matplotlib Figure and the CSV rows of :func:`rows`.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    data = rows(BH=BH, d=d, dtype=dtype, pass_=pass_, causal=causal, **kw)
    colors = {"compulsory": "0.6", "re-reads": "C0", "S/P": "C3"}
    kernels = list(dict.fromkeys(r["kernel"] for r in data))
    hatches = {k: ("", "//", "..", "xx", "\\\\", "oo", "++")[i % 7] for i, k in enumerate(kernels)}
    width = 0.8 / len(kernels)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, axis in zip(axes, ("N", "M")):
        sel = [r for r in data if r["axis"] == axis]
        key = "N" if axis == "N" else "M_bytes"
        xs = sorted({r[key] for r in sel})
        for xi, x in enumerate(xs):
            group = {r["kernel"]: r for r in sel if r[key] == x}
            unit = group["standard"]["total"] if axis == "N" and "standard" in group else 1e9
            if axis == "N" and "standard" in group:
                ax.annotate(f"{unit / 1e9:.3g} GB", (xi - 0.4 + width / 2, 1.01), fontsize=7)
            for ki, kernel in enumerate(kernels):
                r = group.get(kernel)
                if r is None:
                    continue
                bottom = 0.0
                for term in TERMS:
                    h = r[term] / unit
                    ax.bar(xi + (ki - (len(kernels) - 1) / 2) * width, h, width * 0.95, bottom=bottom,
                           color=colors[term], hatch=hatches[kernel], edgecolor="k", linewidth=0.3)
                    bottom += h
        ax.set_xticks(range(len(xs)))
        if axis == "N":
            ax.set_xticklabels([str(x) for x in xs])
            ax.set_xlabel(f"sequence length N (shared memory {sel[0]['M_bytes'] // 1024} KB per block)")
            ax.set_ylabel("bytes / standard's bytes at this N")
        else:
            ax.set_xticklabels([f"{x // 1024} KB" for x in xs])
            beyond = " (beyond 48 KB: model only)" if xs[-1] > 48 * 1024 else ""
            ax.set_xlabel(f"shared memory M per block, N = {sel[0]['N']}{beyond}")
            ax.set_ylabel("HBM bytes (GB; model = counted)")
    handles = [Patch(facecolor=c, edgecolor="k", label=t) for t, c in colors.items()]
    handles += [Patch(facecolor="w", edgecolor="k", hatch=hatches[k], label=k) for k in kernels]
    axes[1].legend(handles=handles, fontsize=8, loc="upper right")
    fig.suptitle(f"{pass_} HBM bytes by term, B*H = {BH}, d = {d}, {np.dtype(dtype).name}"
                 f"{', causal' if causal else ''}: the re-reads shrink as M grows, the S/P term does not")
    fig.tight_layout()
    return fig, data
