"""The lessons' pictures: each function draws one idea and returns a matplotlib Figure (no GPU needed).

=============================  ======================================================================
picture                        what it shows
=============================  ======================================================================
``memory_hierarchy``           capacity and bandwidth of registers/shared memory/L2/HBM of one GPU
``tiling_steps``               Algorithm 1 step by step: the Q_i, K_j, V_j tiles in SRAM, what goes to HBM
``online_softmax_late_max``    the running max m and sum l of one row whose maximum arrives late
``access_map``                 GPU-Puzzles style: which thread touched each element (simulator trace)
``read_counts``                how many times each element was read, kernel beside kernel
``hbm_bytes_by_term``          HBM bytes of standard attention and flash kernels by kernel, N = 1K-16K
``causal_tiles``               which tiles of S a causal kernel skips, masks inside, or runs whole
``recorded_times``             committed GPU timings (flash_numba.course.recorded), labelled as recorded
=============================  ======================================================================

Figures are made with ``matplotlib.figure.Figure`` (no pyplot, no display
backend): save one with ``fig.savefig(path)``, show one in a notebook with
:func:`flash_numba.course.lessonkit.show`.
"""

from __future__ import annotations

import numpy as np

from .. import iomodel


def _figure(width: float, height: float, ncols: int = 1, nrows: int = 1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def memory_hierarchy(levels: dict[str, tuple[float, float | None]], title: str):
    """Bars of capacity (bytes, log scale) and bandwidth (bytes/s, log scale, where known) per level.

    ``levels``: {"shared memory (all SMs)": (capacity bytes, bandwidth bytes/s or None), ...} from the
    fastest, smallest level to the slowest, largest; see :func:`flash_numba.course.recorded.hierarchy`.
    """
    fig, ((ax_cap, ax_bw),) = _figure(9, 3.2, ncols=2)
    names = list(levels)
    y = np.arange(len(names))
    caps = [levels[n][0] for n in names]
    bws = [levels[n][1] or 0 for n in names]
    ax_cap.barh(y, caps, color="#4c72b0")
    ax_bw.barh(y, bws, color="#dd8452")
    for ax, label in ((ax_cap, "capacity (bytes)"), (ax_bw, "bandwidth (bytes/s)")):
        ax.set_xscale("log")
        ax.set_yticks(y, names)
        ax.invert_yaxis()
        ax.set_xlabel(label)
    for n, bw in enumerate(bws):
        ax_bw.text(bw or 1, n, f" {bw / 1e12:.1f} TB/s" if bw else " not measured", va="center", fontsize=8)
    for n, cap in enumerate(caps):
        ax_cap.text(cap, n, f" {_size(cap)}", va="center", fontsize=8)
    ax_bw.set_yticks(y, [""] * len(names))
    fig.suptitle(title, fontsize=10)
    return fig


def _size(b: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= scale:
            return f"{b / scale:.0f} {unit}"
    return f"{b:.0f} B"


def tiling_steps(N: int = 12, Br: int = 4, Bc: int = 6, steps=((0, 0), (0, 1), (1, 0))):
    """Algorithm 1 at a few (j, i) steps: in each panel, Q (left), K^T... the tiles in SRAM are filled.

    Each panel shows Q and O (N x 1 strips of row tiles), K and V (strips of key tiles) and the S matrix
    (N x N): the tile Q_i, K_j, V_j loaded into SRAM, the one S_ij tile computed on chip (never written),
    and the rows of O, l, m read and written in HBM at that step.
    """
    from matplotlib.patches import Rectangle

    fig, axes = _figure(3.4 * len(steps), 3.6, ncols=len(steps))
    for ax, (j, i) in zip(axes[0], steps):
        ax.set_xlim(-3.5, N + 0.5)
        ax.set_ylim(N + 3.5, -1.5)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.add_patch(Rectangle((0, 0), N, N, fill=False, lw=0.8))  # S (N x N), never stored
        ax.add_patch(Rectangle((j * Bc, i * Br), min(Bc, N - j * Bc), min(Br, N - i * Br), color="#c44e52"))
        ax.add_patch(Rectangle((-3, 0), 1, N, fill=False, lw=0.8))  # Q strip
        ax.add_patch(Rectangle((-3, i * Br), 1, min(Br, N - i * Br), color="#4c72b0"))
        ax.add_patch(Rectangle((-1.6, 0), 1, N, fill=False, lw=0.8))  # O, l, m strip
        ax.add_patch(Rectangle((-1.6, i * Br), 1, min(Br, N - i * Br), color="#8172b2"))
        ax.add_patch(Rectangle((0, N + 1), N, 1, fill=False, lw=0.8))  # K^T strip
        ax.add_patch(Rectangle((j * Bc, N + 1), min(Bc, N - j * Bc), 1, color="#55a868"))
        ax.add_patch(Rectangle((0, N + 2.3), N, 1, fill=False, lw=0.8))  # V^T strip
        ax.add_patch(Rectangle((j * Bc, N + 2.3), min(Bc, N - j * Bc), 1, color="#55a868", alpha=0.6))
        ax.text(-2.5, -0.5, "Q", ha="center", fontsize=8)
        ax.text(-1.1, -0.5, "O,l,m", ha="center", fontsize=7)
        ax.text(N / 2, -0.5, "S (never in HBM)", ha="center", fontsize=8)
        ax.text(N + 0.3, N + 1.6, "K", fontsize=8, va="center")
        ax.text(N + 0.3, N + 2.9, "V", fontsize=8, va="center")
        ax.set_title(f"outer j = {j}, inner i = {i}\nSRAM: Q_{i}, K_{j}, V_{j}, S_{i}{j}\n"
                     f"HBM: read+write O_{i}, l_{i}, m_{i}", fontsize=8)
    return fig


def online_softmax_late_max(row=None, block: int = 3):
    """The running max m and sum l (at that max) of one row of scores, block by block.

    ``row`` defaults to scores whose maximum arrives in the last block; where m jumps, the sum so far is
    rescaled by exp(m_old - m_new) (the drop), then the new block's terms are added.
    """
    x = np.array([0.5, 1.0, -0.5, 1.5, 0.0, 2.0, 6.0, 1.0, 0.5]) if row is None else np.asarray(row, float)
    m, l = -np.inf, 0.0
    steps = []  # (after block b: m, l before adding, l after)
    for b0 in range(0, x.size, block):
        xb = x[b0:b0 + block]
        m_new = max(m, xb.max())
        rescaled = l * np.exp(m - m_new) if l else 0.0
        l = rescaled + np.exp(xb - m_new).sum()
        steps.append((m_new, rescaled, l))
        m = m_new
    fig, ((ax_x, ax_m),) = _figure(9, 3.0, ncols=2)
    ax_x.bar(np.arange(x.size), x, color=["#4c72b0" if i // block % 2 == 0 else "#55a868" for i in range(x.size)])
    ax_x.set_title(f"one row of scores, blocks of {block}", fontsize=9)
    ax_x.set_xlabel("key")
    b = np.arange(1, len(steps) + 1)
    ax_m.step(b, [s[0] for s in steps], where="mid", label="running max m", color="#c44e52")
    ax_l = ax_m.twinx()
    ax_l.plot(b, [s[2] for s in steps], "o-", label="running sum l (at m)", color="#4c72b0")
    ax_l.plot(b, [s[1] for s in steps], "v", label="l rescaled by exp(m_old - m_new)", color="#8172b2")
    ax_m.set_xlabel("after block")
    ax_m.set_xticks(b)
    ax_m.set_ylabel("m")
    ax_l.set_ylabel("l")
    ax_m.set_title("the max arrives late: the old sum is scaled down, not thrown away", fontsize=9)
    handles = ax_m.get_legend_handles_labels()[0] + ax_l.get_legend_handles_labels()[0]
    ax_l.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="center left")
    return fig


def access_map(log, name: str, kind: str, shape, title: str | None = None, block=None):
    """GPU-Puzzles style: each element of array ``name`` coloured and labelled by the thread that first
    made a ``kind`` ('r' or 'w') access to it (``log``: a :class:`flash_numba.sim.trace.AccessLog`)."""
    who = log.touch_map(name, kind, shape, block=block)
    grid = who.reshape(shape[0], -1)
    fig, ((ax,),) = _figure(0.45 * grid.shape[1] + 1.5, 0.45 * grid.shape[0] + 1.0)
    ax.imshow(np.where(grid < 0, np.nan, grid), cmap="tab20", vmin=0, vmax=19)
    for (r, c), t in np.ndenumerate(grid):
        ax.text(c, r, "." if t < 0 else str(t), ha="center", va="center", fontsize=7)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title or f"{name}: the thread that {'read' if kind == 'r' else 'wrote'} each element", fontsize=9)
    return fig


def kernel_accesses(log, arrays: dict, block=(0, 0, 0), title: str | None = None):
    """GPU-Puzzles style, one panel per array of a kernel: each element labelled with the thread of ``block`` that
    first touched it ('.' where none did).  ``arrays``: ``{name: (shape, kind)}``, kind 'r' (read) or 'w'
    (written), in the order to draw them; ``log``: a :class:`flash_numba.sim.trace.AccessLog`."""
    panels = [(name, shape, kind, log.touch_map(name, kind, shape, block=block).reshape(shape[0], -1))
              for name, (shape, kind) in arrays.items()]
    width = sum(0.42 * g.shape[1] + 0.9 for *_, g in panels)
    height = 0.42 * max(g.shape[0] for *_, g in panels) + 1.2
    fig, axes = _figure(width, height, ncols=len(panels))
    for ax, (name, shape, kind, grid) in zip(axes[0], panels):
        ax.imshow(np.where(grid < 0, np.nan, grid), cmap="tab20", vmin=0, vmax=19)
        for (r, c), t in np.ndenumerate(grid):
            ax.text(c, r, "." if t < 0 else str(t), ha="center", va="center", fontsize=7)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"{name} ({'read' if kind == 'r' else 'written'})", fontsize=9)
    fig.suptitle(title or f"block {block[0]}: which thread touched each element first", fontsize=10)
    return fig


def read_counts(logs: dict, name: str, shape, kind: str = "r"):
    """How many times each element of ``name`` was read (``kind='r'``) or written (``'w'``), one panel per
    ``{label: AccessLog}``."""
    verb = "reads" if kind == "r" else "writes"
    fig, axes = _figure(3.0 * len(logs), 3.0, ncols=len(logs))
    top = max(int(log.count_map(name, kind, shape).max()) for log in logs.values()) or 1
    for ax, (label, log) in zip(axes[0], logs.items()):
        counts = log.count_map(name, kind, shape).reshape(shape[0], -1)
        ax.imshow(counts, cmap="Reds", vmin=0, vmax=top)
        for (r, c), n in np.ndenumerate(counts):
            ax.text(c, r, str(n), ha="center", va="center", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"{label}: {int(counts.sum())} {verb} of {name}", fontsize=9)
    return fig


def hbm_bytes_by_term(kernels=("standard", "flash1", "flash2"), Ns=(1024, 2048, 4096, 8192, 16384), d: int = 64,
                      dtype=np.float32, blocks: dict | None = None, pass_: str = "forward"):
    """Stacked bars: HBM bytes of one head's ``pass_`` ("forward" or "backward"), per kernel of each
    implementation, from the IO models (``blocks``: {kernel: (Br, Bc)}; default, the block each would
    choose here)."""
    model = {"forward": iomodel.forward, "backward": iomodel.backward}[pass_]
    fig, ((ax,),) = _figure(9, 3.6)
    width = 0.8 / len(kernels)
    colours = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b2", "#937860", "#da8bc3"]
    seen = {}
    for k, kernel in enumerate(kernels):
        block = (blocks or {}).get(kernel)
        for n, N in enumerate(Ns):
            count = model(kernel, 1, N, N, d, dtype, False, block)
            bottom = 0
            for term, kb in count.per_kernel.items():
                label = f"{kernel}: {term}"
                colour = seen.setdefault(label, colours[len(seen) % len(colours)])
                ax.bar(n + (k - (len(kernels) - 1) / 2) * width, kb.total / 1e6, width, bottom=bottom,
                       color=colour, label=label if n == 0 else None, edgecolor="white", lw=0.3)
                bottom += kb.total / 1e6
    ax.set_xticks(range(len(Ns)), [f"N = {N:,}" for N in Ns])
    ax.set_yscale("log")
    ax.set_ylabel("MB moved (IO model)")
    ax.set_title(f"{pass_} pass, one head, d = {d}, {np.dtype(dtype).name}; bars left to right: "
                 + ", ".join(kernels), fontsize=9)
    ax.legend(fontsize=7, ncols=2)
    return fig


def causal_tiles(Nq: int, Nk: int, Br: int, Bc: int):
    """The causal mask (bottom-right: key c visible to query r iff c <= r + Nk - Nq) with the tile grid:
    tiles wholly masked (skipped, nothing loaded), crossing the diagonal (masked inside), or whole."""
    from matplotlib.colors import ListedColormap

    r = np.arange(Nq)[:, None]
    c = np.arange(Nk)[None, :]
    visible = c <= r + (Nk - Nq)
    kind = np.zeros((Nq, Nk))  # 0 skipped tile, 1 masked entry of a crossing tile, 2 visible
    for i0 in range(0, Nq, Br):
        for j0 in range(0, Nk, Bc):
            tile = visible[i0:i0 + Br, j0:j0 + Bc]
            kind[i0:i0 + Br, j0:j0 + Bc] = np.where(tile, 2, 1) if tile.any() else 0
    fig, ((ax,),) = _figure(0.25 * Nk + 2.5, 0.25 * Nq + 1.2)
    ax.imshow(kind, cmap=ListedColormap(["#e0e0e0", "#f4b6b6", "#4c72b0"]), vmin=0, vmax=2)
    for x in range(0, Nk + 1, Bc):
        ax.axvline(x - 0.5, color="black", lw=0.8)
    for y in range(0, Nq + 1, Br):
        ax.axhline(y - 0.5, color="black", lw=0.8)
    skipped = sum(1 for i0 in range(0, Nq, Br) for j0 in range(0, Nk, Bc) if kind[i0, j0] == 0)
    tiles = -(-Nq // Br) * -(-Nk // Bc)
    ax.set_title(f"Nq = {Nq}, Nk = {Nk}, tiles {Br} x {Bc}: {skipped} of {tiles} skipped (grey); "
                 "red: masked inside a crossing tile", fontsize=8)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    return fig


def recorded_times(rows: list[dict], title: str):
    """Bars of recorded times (ms) and fraction of peak, one per row of :func:`.recorded.bench_rows`."""
    fig, ((ax_ms, ax_peak),) = _figure(9, 0.35 * len(rows) + 1.4, ncols=2)
    names = [f"{r['implementation']} {r['pass']}" for r in rows]
    y = np.arange(len(rows))
    ax_ms.barh(y, [float(r["ms"]) for r in rows], color="#4c72b0")
    ax_peak.barh(y, [float(r["peak_fraction"] or 0) for r in rows], color="#55a868")
    ax_ms.set_yticks(y, names, fontsize=8)
    ax_peak.set_yticks(y, [""] * len(rows))
    for ax in (ax_ms, ax_peak):
        ax.invert_yaxis()
    ax_ms.set_xlabel("ms (median)")
    ax_peak.set_xlabel("fraction of the float32 peak")
    fig.suptitle(title, fontsize=9)
    return fig


def saved_for_backward(H: int = 32, d: int = 128, Ns=(1024, 2048, 4096, 8192, 16384), itemsize: int = 4):
    """Bytes one attention layer keeps for its backward, per sequence: Q, K, V, O and L (FlashAttention)
    against the same plus P, an N x N matrix per head (standard attention), as N grows (log scale)."""
    fig, ((ax,),) = _figure(7, 3.2)
    x = np.arange(len(Ns))
    linear = [H * (4 * N * d + N) * itemsize for N in Ns]  # Q, K, V, O (N x d each) and L (N)
    with_p = [b + H * N * N * itemsize for b, N in zip(linear, Ns)]
    ax.bar(x - 0.2, [b / 2**20 for b in linear], 0.4, label="Q, K, V, O, L (FlashAttention)", color="#55a868")
    ax.bar(x + 0.2, [b / 2**20 for b in with_p], 0.4, label="... and P (standard attention)", color="#c44e52")
    ax.set_xticks(x, [f"N = {N:,}" for N in Ns])
    ax.set_yscale("log")
    ax.set_ylabel("MiB kept per layer")
    ax.set_title(f"saved for the backward, one sequence, H = {H}, d = {d}, {itemsize}-byte elements", fontsize=9)
    ax.legend(fontsize=8)
    return fig
