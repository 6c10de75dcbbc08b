"""The first two kernel exercises: ``axpy`` (lesson 0) and the tiled matrix product ``tiled_matmul`` (lesson 4)."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32  # cuda: a module global, which the simulator swaps for its own

from ..checking import (RACE_NOTE, _close, _diff_notes, _fmt, _kernel_not_done,
    _Mismatch, _race_mismatch, _races_watched, _register, _rng)


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
            with _races_watched() as races:
                kernel[grid](cuda.to_device(a), cuda.to_device(b), c, counter)
            got = c.copy_to_host()
        except Exception as exc:
            return len(shapes), _Mismatch(label, _fmt(exc), _fmt(spec), ("an index past the edge of A, B or C?",))
        race = _race_mismatch(label, races)
        if race is not None:
            return len(shapes), race
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
