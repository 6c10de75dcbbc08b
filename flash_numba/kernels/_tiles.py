"""Device-function building blocks of the register-tiled kernels (128 threads, an 8 x 16 grid).

Each factory returns a ``@cuda.jit(device=True)`` function specialised on its
tile shape and strides (closure constants), so that NVVM inlines it and every
shared-memory access has a constant offset, as in the hand-written loops of
:mod:`flash_numba.kernels.flash2_fast` (whose docstring says why each trick
pays: unsigned indices, loads batched before the first shared store, ``while``
loops over uint32 offsets that NVVM unrolls, 16-byte vector loads).

* :func:`tile_loader`: a ``R x C`` tile of head bh of a global input ``(B, H, rows, cols)``
  or ``(BH, rows, cols)`` array into a flat shared buffer, element ``(r, c)`` at ``r * RS + c * CS`` (so
  ``RS = 1`` stores it transposed), zeros past the array's edge.
* :func:`micro_product`: a thread's ``TM x TN`` register tile ``acc += A^T B``
  summed over ``K`` rows of two shared buffers.
* :func:`tile_store`: a thread's ``TM x TN`` register tile into a global array.

The kernels of :mod:`flash_numba.kernels.standard` are built from these.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda, types, uint32

from ..device import jit
from ._common import element, madd_unless_zero

#: Threads per block: TY rows of TX threads (a half warp each).
TY, TX = 8, 16
NT = TY * TX
#: fast math without 'ninf'/'nnan': the kernels compare against -inf on purpose
FASTMATH = {"contract", "afn", "arcp", "nsz", "reassoc"}



def fast_kernel(kernel):
    """``kernel`` compiled as a CUDA kernel with :data:`FASTMATH` (also kept on it as ``_fastmath``)."""
    kernel._fastmath = FASTMATH
    return jit(fastmath=FASTMATH)(kernel)


def check_micro_tile_block(block, what: str) -> None:
    """Refuse, by name, a block (Br, Bc) that is not a multiple of the TY x TX thread grid.

    ``what`` names the kernel in the message ("standard", "flash2_fast's forward").
    Anything that is not a pair of ints is left to blocks.validate, which names the problem.
    """
    try:
        Br, Bc = block
    except (TypeError, ValueError):
        return
    if isinstance(Br, int) and isinstance(Bc, int) and (Br % TY or Bc % TX or Br < 1 or Bc < 1):
        raise ValueError(
            f"block: {what} needs Br a multiple of {TY} and Bc a multiple of {TX} "
            f"(its {TY} x {TX} thread grid), got ({Br}, {Bc})"
        )
@lru_cache(maxsize=None)
def tile_loader(R: int, C: int, RS: int, CS: int, acc_name: str):
    """``load(x, bh, r0, c0, n_r, n_c, buf, tid) -> elements read``.

    Copies element ``(r0 + r, c0 + c)`` of head bh of ``x`` (a ``(B, H, N, d)`` input, any
    strides, or a ``(B*H, rows, cols)`` array of the kernels', :func:`._common.element`) for ``r < R``, ``c < C`` into
    ``buf[r * RS + c * CS]`` (accumulation dtype), where rows ``r >= n_r`` and
    columns ``c >= n_c`` (past the array's edge) become 0.  A whole tile whose
    C columns divide the 128 threads takes the fast path: each thread loads one
    fixed column, ``R * C / 128`` rows apart, all loads issued before the first
    shared store, with unsigned indices.  Call it from all 128 threads.
    """
    ACC = getattr(types, acc_name)
    ZERO = np.float64(0) if acc_name == "float64" else np.float32(0)
    FAST = NT % C == 0 and (R * C) % NT == 0
    ROWSTEP = NT // C if FAST else 1
    NLOAD = (R * C) // NT if FAST else 1
    C_U, RS_U, CS_U = np.uint32(C), np.uint32(RS), np.uint32(CS)

    @jit(device=True)
    def load(x, bh, r0, c0, n_r, n_c, buf, tid):
        if FAST and n_r >= R and n_c >= C:
            reg = cuda.local.array(NLOAD, ACC)
            c = uint32(tid) % C_U
            r = uint32(tid) // C_U
            gr = uint32(r0) + r
            gc = uint32(c0) + c
            bh_u = uint32(bh)
            for t in range(NLOAD):
                reg[t] = ACC(element(x, bh_u, gr + uint32(t * ROWSTEP), gc))
            for t in range(NLOAD):
                buf[(r + uint32(t * ROWSTEP)) * RS_U + c * CS_U] = reg[t]
            return NLOAD
        n = 0
        for e in range(tid, R * C, NT):
            r = e // C
            c = e % C
            val = ZERO
            if r < n_r and c < n_c:
                val = ACC(element(x, bh, r0 + r, c0 + c))
                n += 1
            buf[r * RS + c * CS] = val
        return n

    return load


@lru_cache(maxsize=None)
def micro_product(TM: int, TN: int, K: int, AS: int, BS: int, acc_name: str, skip_zero: bool = False):
    """``product(A, a0, B, b0, acc)``: ``acc[a, b] += sum_k A[a0 + k AS + a] * B[b0 + k BS + b]``.

    ``A`` and ``B`` are flat shared buffers holding ``K`` rows of stride ``AS``
    and ``BS``; the thread's ``TM`` (``TN``) values of row k are adjacent, so
    with 16-byte aligned buffers and offsets they come in vector loads.  With
    ``skip_zero`` a 0 in A adds nothing, even against Inf or NaN in B (a select per
    multiply-add, for tiles that hold masked entries: :func:`~._common.madd_unless_zero`).
    """
    ACC = getattr(types, acc_name)
    SKIP_ZERO = skip_zero
    K_U, AS_U, BS_U, ONE_U = np.uint32(K), np.uint32(AS), np.uint32(BS), np.uint32(1)

    @jit(device=True, fastmath=FASTMATH)
    def product(A, a0, B, b0, acc):
        av = cuda.local.array(TM, ACC)
        bv = cuda.local.array(TN, ACC)
        ai = uint32(a0)
        bi = uint32(b0)
        k = uint32(0)
        while k < K_U:
            for a in range(TM):
                av[a] = A[ai + uint32(a)]
            for b in range(TN):
                bv[b] = B[bi + uint32(b)]
            for a in range(TM):
                for b in range(TN):
                    if SKIP_ZERO:
                        acc[a, b] = madd_unless_zero(acc[a, b], av[a], bv[b])
                    else:
                        acc[a, b] += av[a] * bv[b]
            ai += AS_U
            bi += BS_U
            k += ONE_U

    return product


@lru_cache(maxsize=None)
def tile_store(TM: int, TN: int, store_name: str):
    """``store(x, bh, r0, c0, n_r, n_c, vals) -> elements written``.

    Writes ``x[bh, r0 + a, c0 + b] = vals[a, b]`` for ``a < min(TM, n_r)``,
    ``b < min(TN, n_c)`` (the part of the thread's tile inside the array),
    converting to the storage dtype; unsigned indices when the whole tile is in.
    """
    ST = getattr(types, store_name)

    @jit(device=True)
    def store(x, bh, r0, c0, n_r, n_c, vals):
        if n_r >= TM and n_c >= TN:
            bh_u = uint32(bh)
            for a in range(TM):
                for b in range(TN):
                    x[bh_u, uint32(r0) + uint32(a), uint32(c0) + uint32(b)] = ST(vals[a, b])
            return TM * TN
        n = 0
        for a in range(TM):
            if a < n_r:
                for b in range(TN):
                    if b < n_c:
                        x[bh, r0 + a, c0 + b] = ST(vals[a, b])
                        n += 1
        return n

    return store
