"""The readable kernels behind the kernel exercises: the packaged solutions and the frames around them.

A *solution* is the device function a learner writes in a lesson (the heart of
a kernel); a *frame* is the kernel around it: it declares the tiles, loads what
the exercise does not ask for, adds the bytes to the counter, and calls the
heart.  :mod:`flash_numba.course.flash_checks` checks a learner's heart in its
frame; :mod:`flash_numba.course.bugzoo` edits these solutions to make its exhibits.

Counting follows :mod:`flash_numba.kernels._common`: every global read or write
adds its bytes (``E`` = 4 for float32) to the thread's ``nr``/``nw``, which the
frame adds to ``counter`` with one atomic each.
"""

from __future__ import annotations

import functools
import inspect
import math

import numpy as np
from numba import cuda, float32

NEG_INF = np.float32(-np.inf)
ZERO = np.float32(0)
E = 4  # bytes of a float32


# ============================================================================= the packaged solutions


@cuda.jit(device=True)
def flash1_step(r, row, cols, Q_i, K_j, V_j, S_i, O, l, m, scale):
    """Algorithm 1, lines 9-13, for query row ``row`` (row ``r`` of Q_i) and the ``cols`` keys of K_j, V_j.

    Reads m_i, l_i and O_i's row from HBM and writes them back; returns (bytes read, bytes written).
    """
    D = Q_i.shape[1]
    m_i = m[row]
    l_i = l[row]
    m_ij = NEG_INF
    for c in range(cols):  # line 9: S_ij = scale Q_i K_j^T (row r); line 10: m~_ij = rowmax(S_ij)
        s = ZERO
        for x in range(D):
            s += Q_i[r, x] * K_j[c, x]
        S_i[r, c] = scale * s
        m_ij = max(S_i[r, c], m_ij)  # (score first: in the simulator's Python max a NaN then wins)
    l_ij = ZERO
    for c in range(cols):  # line 10: P~_ij = exp(S_ij - m~_ij) in place, l~_ij = rowsum(P~_ij)
        S_i[r, c] = math.exp(S_i[r, c] - m_ij)
        l_ij += S_i[r, c]
    m_new = max(m_i, m_ij)  # line 11
    e_old = math.exp(m_i - m_new)  # e^(m_i - m_new): 0 on the first tile, where m_i = -inf
    e_new = math.exp(m_ij - m_new)
    l_new = e_old * l_i + e_new * l_ij
    for x in range(D):  # line 12: O_i <- (l_i e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j) / l_new
        pv = ZERO
        for c in range(cols):
            pv += S_i[r, c] * V_j[c, x]
        O[row, x] = (l_i * e_old * O[row, x] + e_new * pv) / l_new
    l[row] = l_new  # line 13
    m[row] = m_new
    return 2 * E + D * E, D * E + 2 * E  # read m_i, l_i, O_i; wrote O_i, l_i, m_i


@cuda.jit(device=True)
def flash2_rows(tid, row, n_tiles, diag, q_r, s_r, o_acc, K_j, V_j, k, v, o, L, scale):
    """FlashAttention-2's loop for query row ``row`` (thread ``tid``; no row when row >= Nq).

    The block walks over ``n_tiles`` key tiles; key c is visible to the row iff c <= row + diag.
    m_i, l_i and the unnormalised O_i row (``o_acc``) stay on chip; O = O_acc / l and
    L = m + log(l) are written once, at the end.  Returns (bytes read, bytes written).
    """
    Bc, D = K_j.shape
    T = cuda.blockDim.x
    Nq = o.shape[0]
    Nk = k.shape[0]
    nr = 0
    nw = 0
    m_i = NEG_INF
    l_i = ZERO
    for x in range(D):
        o_acc[x] = ZERO
    for j in range(n_tiles):
        c0 = j * Bc
        cols = min(Bc, Nk - c0)
        cuda.syncthreads()  # every thread is done with the previous K_j, V_j
        for idx in range(tid, cols * D, T):  # all threads load the tiles, one element each in turn
            K_j[idx // D, idx % D] = k[c0 + idx // D, idx % D]
            V_j[idx // D, idx % D] = v[c0 + idx // D, idx % D]
            nr += 2 * E
        cuda.syncthreads()  # K_j, V_j are complete
        if row < Nq:
            m_new = m_i
            for c in range(cols):  # s = scale q_r K_j^T, masked; the new running max
                s = ZERO
                for x in range(D):
                    s += q_r[x] * K_j[c, x]
                s *= scale
                if c0 + c > row + diag:
                    s = NEG_INF
                s_r[c] = s
                m_new = max(s, m_new)  # (score first: in the simulator's Python max a NaN then wins)
            if m_new != NEG_INF:  # a row that has seen no visible key keeps (O_acc, l, m) = (0, 0, -inf)
                alpha = math.exp(m_i - m_new)  # rescale what was summed at the old max (before m_i moves)
                l_i *= alpha
                for x in range(D):
                    o_acc[x] *= alpha
                for c in range(cols):
                    p = math.exp(s_r[c] - m_new)  # a masked score gives exp(-inf) = 0
                    l_i += p
                    for x in range(D):
                        o_acc[x] += p * V_j[c, x]
                m_i = m_new
    if row < Nq:  # normalise once, at the end
        L_r = NEG_INF
        inv = ZERO
        if l_i > ZERO:
            L_r = m_i + math.log(l_i)
            inv = 1 / l_i
        for x in range(D):
            o[row, x] = o_acc[x] * inv
        L[row] = L_r
        nw += D * E + E
    return nr, nw


@cuda.jit(device=True)
def dkdv_step(col, r0, rows, diag, Q_i, dO_i, L_i, D_i, k_c, v_c, dk_c, dv_c, scale):
    """Add query tile i's share to dK and dV of key ``col`` (this thread's key row k_c, v_c).

    Row r of the tile is query r0 + r; key col is visible to it iff col <= r0 + r + diag.
    P is recomputed from L, never stored: P = exp(scale q k^T - L_r), dS = P (dP - D_r).
    """
    D = Q_i.shape[1]
    for r in range(rows):
        if col > r0 + r + diag:
            continue  # a masked pair: P = 0, it adds nothing
        s = ZERO
        dP = ZERO
        for x in range(D):
            s += Q_i[r, x] * k_c[x]
            dP += dO_i[r, x] * v_c[x]  # dP_rc = dO_r . v_c
        P = math.exp(scale * s - L_i[r])  # P_rc = exp(S_rc - L_r), recomputed from L
        dS = P * (dP - D_i[r])  # dS_rc = P_rc (dP_rc - D_r)
        for x in range(D):
            dv_c[x] += P * dO_i[r, x]  # dV_j += P_ij^T dO_i
            dk_c[x] += scale * dS * Q_i[r, x]  # dK_j += scale dS_ij^T Q_i


@cuda.jit(device=True)
def causal_tiles(i, Br, Bc, Nq, Nk):
    """Key tiles query tile ``i`` visits under the bottom-right causal mask (key c visible to
    query r iff c <= r + Nk - Nq): those up to the one holding the last key its last row sees."""
    last_key = min((i + 1) * Br, Nq) - 1 + (Nk - Nq)
    if last_key < 0:
        return 0  # no row of the tile sees any key
    return min((Nk + Bc - 1) // Bc, last_key // Bc + 1)


# ============================================================================= the frames


@functools.lru_cache(maxsize=None)
def flash1_frame(step, Br: int, Bc: int, d: int):
    """Algorithm 1 around ``step`` (lines 9-13): launch ``[1, max(Br, Bc)](q, k, v, O, l, m, L, scale, counter)``
    with O = 0, l = 0, m = -inf in HBM (line 2)."""
    D = d
    T = max(Br, Bc)

    @cuda.jit
    def flash1_forward(q, k, v, O, l, m, L, scale, counter):
        tid = cuda.threadIdx.x
        Nq = q.shape[0]
        Nk = k.shape[0]
        K_j = cuda.shared.array((Bc, D), float32)
        V_j = cuda.shared.array((Bc, D), float32)
        Q_i = cuda.shared.array((Br, D), float32)
        S_i = cuda.shared.array((Br, Bc), float32)  # S_ij, then P~_ij in place
        nr = 0
        nw = 0
        for j in range((Nk + Bc - 1) // Bc):  # line 5
            c0 = j * Bc
            cols = min(Bc, Nk - c0)
            for idx in range(tid, cols * D, T):  # line 6: K_j, V_j to SRAM, once
                K_j[idx // D, idx % D] = k[c0 + idx // D, idx % D]
                V_j[idx // D, idx % D] = v[c0 + idx // D, idx % D]
                nr += 2 * E
            cuda.syncthreads()
            for i in range((Nq + Br - 1) // Br):  # line 7
                r0 = i * Br
                rows = min(Br, Nq - r0)
                for idx in range(tid, rows * D, T):  # line 8: Q_i to SRAM
                    Q_i[idx // D, idx % D] = q[r0 + idx // D, idx % D]
                    nr += E
                cuda.syncthreads()
                if tid < rows:  # lines 9-13: thread r owns query row r0 + r
                    r_read, r_written = step(tid, r0 + tid, cols, Q_i, K_j, V_j, S_i, O, l, m, scale)
                    nr += r_read
                    nw += r_written
                cuda.syncthreads()  # done with Q_i, K_j, V_j before the next loads
        for row in range(tid, Nq, T):  # L = m + log(l), for the backward
            L[row] = m[row] + math.log(l[row])
            nr += 2 * E
            nw += E
        cuda.atomic.add(counter, 0, nr)
        cuda.atomic.add(counter, 1, nw)

    return flash1_forward


@functools.lru_cache(maxsize=None)
def flash2_frame(rows_fn, Br: int, Bc: int, d: int, causal: bool = False, tiles_fn=causal_tiles):
    """One block per query tile around ``rows_fn``: launch ``[Tr, Br](q, k, v, o, L, scale, counter)``.

    Causal: query tile i visits ``tiles_fn(i, Br, Bc, Nq, Nk)`` key tiles, and rows_fn masks with
    diag = Nk - Nq; otherwise every tile, and diag = Nk (every key visible)."""
    D = d
    CAUSAL = causal

    @cuda.jit
    def flash2_forward(q, k, v, o, L, scale, counter):
        tid = cuda.threadIdx.x
        i = cuda.blockIdx.x
        Nq = q.shape[0]
        Nk = k.shape[0]
        row = i * Br + tid  # this thread's query row
        K_j = cuda.shared.array((Bc, D), float32)
        V_j = cuda.shared.array((Bc, D), float32)
        q_r = cuda.local.array(D, float32)  # the row of Q_i, on chip for the whole loop
        s_r = cuda.local.array(Bc, float32)  # its scores against K_j
        o_acc = cuda.local.array(D, float32)  # its unnormalised output row
        nr = 0
        if row < Nq:
            for x in range(D):
                q_r[x] = q[row, x]
            nr += D * E
        n_tiles = (Nk + Bc - 1) // Bc
        diag = Nk
        if CAUSAL:
            n_tiles = tiles_fn(i, Br, Bc, Nq, Nk)
            diag = Nk - Nq
        r_read, r_written = rows_fn(tid, row, n_tiles, diag, q_r, s_r, o_acc, K_j, V_j, k, v, o, L, scale)
        cuda.atomic.add(counter, 0, nr + r_read)
        cuda.atomic.add(counter, 1, r_written)

    return flash2_forward


@functools.lru_cache(maxsize=None)
def dkdv_frame(step, Br: int, Bc: int, d: int, causal: bool = False):
    """One block per key tile around ``step``: launch ``[Tc, Bc](q, k, v, do, L, Dv, dk, dv, scale, counter)``."""
    D = d
    CAUSAL = causal

    @cuda.jit
    def dkdv(q, k, v, do, L, Dv, dk, dv, scale, counter):
        tid = cuda.threadIdx.x
        Nq = q.shape[0]
        Nk = k.shape[0]
        c0 = cuda.blockIdx.x * Bc
        cols = min(Bc, Nk - c0)
        col = c0 + tid  # this thread's key row
        Q_i = cuda.shared.array((Br, D), float32)
        dO_i = cuda.shared.array((Br, D), float32)
        L_i = cuda.shared.array(Br, float32)
        D_i = cuda.shared.array(Br, float32)
        k_c = cuda.local.array(D, float32)
        v_c = cuda.local.array(D, float32)
        dk_c = cuda.local.array(D, float32)  # dK_j's row, on chip for the whole loop
        dv_c = cuda.local.array(D, float32)
        nr = 0
        nw = 0
        if tid < cols:
            for x in range(D):
                k_c[x] = k[col, x]
                v_c[x] = v[col, x]
                dk_c[x] = ZERO
                dv_c[x] = ZERO
            nr += 2 * D * E
        diag = Nk
        if CAUSAL:
            diag = Nk - Nq
        for i in range((Nq + Br - 1) // Br):
            r0 = i * Br
            rows = min(Br, Nq - r0)
            if CAUSAL and c0 > r0 + rows - 1 + diag:
                continue  # the whole pair is masked: skip it, load nothing (the same for every thread)
            cuda.syncthreads()  # every thread is done with the previous Q_i, dO_i, L_i, D_i
            for idx in range(tid, rows * D, Bc):
                Q_i[idx // D, idx % D] = q[r0 + idx // D, idx % D]
                dO_i[idx // D, idx % D] = do[r0 + idx // D, idx % D]
                nr += 2 * E
            for r in range(tid, rows, Bc):
                L_i[r] = L[r0 + r]
                D_i[r] = Dv[r0 + r]
                nr += 2 * E
            cuda.syncthreads()
            if tid < cols:
                step(col, r0, rows, diag, Q_i, dO_i, L_i, D_i, k_c, v_c, dk_c, dv_c, scale)
        if tid < cols:
            for x in range(D):
                dk[col, x] = dk_c[x]
                dv[col, x] = dv_c[x]
            nw += 2 * D * E
        cuda.atomic.add(counter, 0, nr)
        cuda.atomic.add(counter, 1, nw)

    return dkdv


_FRAMES = {"flash1_block": flash1_frame, "flash2_loop": flash2_frame, "dkdv_block": dkdv_frame,
           "causal_tiles": flash2_frame}


def frame_source(name: str) -> str:
    """The source of the kernel that exercise ``name`` plugs the learner's function into."""
    return inspect.getsource(_FRAMES[name])


# ============================================================================= whole kernels (lessons 7 and 9)
#
# The learner writes these whole: a factory that takes the tile sizes (closure constants, so that the shared
# arrays have compile-time shapes) and returns the @cuda.jit kernel.  The checker launches it.


def flash2_forward_kernel(Br: int, Bc: int, d: int, causal: bool):
    """FlashAttention-2's forward as one kernel: launch ``[ceil(Nq / Br), Br](q, k, v, o, L, scale, counter)``.

    Block i owns query rows i*Br ... (thread tid: row i*Br + tid); it walks over the key tiles, all threads
    loading K_j, V_j into shared memory between two barriers; each thread keeps its row's m, l and
    unnormalised O on chip and writes O and L = m + log(l) once.  Causal: key c is visible to query r iff
    c <= r + Nk - Nq (bottom-right), and the block stops after the last key tile its last row sees.
    Counts its bytes into ``counter`` (read, written).
    """
    D = d
    CAUSAL = causal

    @cuda.jit
    def flash2_forward(q, k, v, o, L, scale, counter):
        tid = cuda.threadIdx.x
        i = cuda.blockIdx.x
        Nq = q.shape[0]
        Nk = k.shape[0]
        row = i * Br + tid
        K_j = cuda.shared.array((Bc, D), float32)
        V_j = cuda.shared.array((Bc, D), float32)
        q_r = cuda.local.array(D, float32)
        s_r = cuda.local.array(Bc, float32)
        o_acc = cuda.local.array(D, float32)
        nr = 0
        nw = 0
        if row < Nq:
            for x in range(D):
                q_r[x] = q[row, x]
                o_acc[x] = ZERO
            nr += D * E
        m_i = NEG_INF
        l_i = ZERO
        n_tiles = (Nk + Bc - 1) // Bc
        diag = Nk  # every key visible
        if CAUSAL:
            diag = Nk - Nq
            last_key = min((i + 1) * Br, Nq) - 1 + diag  # the last key the block's last row sees
            if last_key < 0:
                n_tiles = 0  # no row of the block sees any key
            else:
                n_tiles = min(n_tiles, last_key // Bc + 1)
        for j in range(n_tiles):
            c0 = j * Bc
            cols = min(Bc, Nk - c0)
            cuda.syncthreads()  # every thread is done with the previous K_j, V_j
            for idx in range(tid, cols * D, Br):
                K_j[idx // D, idx % D] = k[c0 + idx // D, idx % D]
                V_j[idx // D, idx % D] = v[c0 + idx // D, idx % D]
                nr += 2 * E
            cuda.syncthreads()  # K_j, V_j are complete
            if row < Nq:
                m_new = m_i
                for c in range(cols):
                    s = ZERO
                    for x in range(D):
                        s += q_r[x] * K_j[c, x]
                    s *= scale
                    if c0 + c > row + diag:
                        s = NEG_INF
                    s_r[c] = s
                    m_new = max(s, m_new)
                if m_new != NEG_INF:  # no visible key yet: keep (0, 0, -inf)
                    alpha = math.exp(m_i - m_new)
                    l_i *= alpha
                    for x in range(D):
                        o_acc[x] *= alpha
                    for c in range(cols):
                        p = math.exp(s_r[c] - m_new)
                        l_i += p
                        for x in range(D):
                            o_acc[x] += p * V_j[c, x]
                    m_i = m_new
        if row < Nq:
            L_r = NEG_INF
            inv = ZERO
            if l_i > ZERO:
                L_r = m_i + math.log(l_i)
                inv = 1 / l_i
            for x in range(D):
                o[row, x] = o_acc[x] * inv
            L[row] = L_r
            nw += D * E + E
        cuda.atomic.add(counter, 0, nr)
        cuda.atomic.add(counter, 1, nw)

    return flash2_forward


def dq_kernel(Br: int, Bc: int, d: int, causal: bool):
    """dQ on its own: launch ``[ceil(Nq / Br), Br](q, k, v, do, L, Dv, dq, scale, counter)``.

    Block i owns query rows i*Br ...; thread tid owns row i*Br + tid, whose q, dO, L and D it keeps on chip.
    It walks over the key tiles it sees (loaded into shared memory by all threads between two barriers):
    P = exp(scale q k^T - L_r), dS = P (dO v^T - D_r), dQ_r += scale dS k.  One thread writes each row of
    dQ, once: no atomics.
    """
    D = d
    CAUSAL = causal

    @cuda.jit
    def dq_pass(q, k, v, do, L, Dv, dq, scale, counter):
        tid = cuda.threadIdx.x
        i = cuda.blockIdx.x
        Nq = q.shape[0]
        Nk = k.shape[0]
        row = i * Br + tid
        K_j = cuda.shared.array((Bc, D), float32)
        V_j = cuda.shared.array((Bc, D), float32)
        q_r = cuda.local.array(D, float32)
        do_r = cuda.local.array(D, float32)
        dq_r = cuda.local.array(D, float32)
        nr = 0
        nw = 0
        L_r = ZERO
        D_r = ZERO
        if row < Nq:
            for x in range(D):
                q_r[x] = q[row, x]
                do_r[x] = do[row, x]
                dq_r[x] = ZERO
            L_r = L[row]
            D_r = Dv[row]
            nr += 2 * D * E + 2 * E
        n_tiles = (Nk + Bc - 1) // Bc
        diag = Nk
        if CAUSAL:
            diag = Nk - Nq
            last_key = min((i + 1) * Br, Nq) - 1 + diag
            if last_key < 0:
                n_tiles = 0  # no row of the block sees any key
            else:
                n_tiles = min(n_tiles, last_key // Bc + 1)
        for j in range(n_tiles):
            c0 = j * Bc
            cols = min(Bc, Nk - c0)
            cuda.syncthreads()
            for idx in range(tid, cols * D, Br):
                K_j[idx // D, idx % D] = k[c0 + idx // D, idx % D]
                V_j[idx // D, idx % D] = v[c0 + idx // D, idx % D]
                nr += 2 * E
            cuda.syncthreads()
            if row < Nq:
                for c in range(cols):
                    if c0 + c > row + diag:
                        continue  # masked: P = 0
                    s = ZERO
                    dP = ZERO
                    for x in range(D):
                        s += q_r[x] * K_j[c, x]
                        dP += do_r[x] * V_j[c, x]
                    P = math.exp(scale * s - L_r)
                    dS = P * (dP - D_r)
                    for x in range(D):
                        dq_r[x] += scale * dS * K_j[c, x]
        if row < Nq:
            for x in range(D):
                dq[row, x] = dq_r[x]
            nw += D * E
        cuda.atomic.add(counter, 0, nr)
        cuda.atomic.add(counter, 1, nw)

    return dq_pass


def dq_atomic_kernel(Br: int, Bc: int, d: int, causal: bool):
    """dQ from the key side, as a fused backward computes it: launch ``[ceil(Nk / Bc), Bc](q, k, v, do, L, Dv,
    dq, scale, counter)`` with dq = 0.

    Block j owns key rows j*Bc ...; thread tid owns key c = j*Bc + tid (k_c, v_c on chip).  For each query
    tile i it sees (Q_i, dO_i, L_i, D_i loaded into shared memory by all threads between two barriers), the
    thread adds scale dS_rc k_c into row r of dQ for every visible query r.  Every thread of every key block
    adds into the same rows of dQ: each add is a cuda.atomic.add (a read and a write of E bytes, counted).
    """
    D = d
    CAUSAL = causal

    @cuda.jit
    def dq_atomic(q, k, v, do, L, Dv, dq, scale, counter):
        tid = cuda.threadIdx.x
        Nq = q.shape[0]
        Nk = k.shape[0]
        c0 = cuda.blockIdx.x * Bc
        col = c0 + tid
        Q_i = cuda.shared.array((Br, D), float32)
        dO_i = cuda.shared.array((Br, D), float32)
        L_i = cuda.shared.array(Br, float32)
        D_i = cuda.shared.array(Br, float32)
        k_c = cuda.local.array(D, float32)
        v_c = cuda.local.array(D, float32)
        nr = 0
        nw = 0
        if col < Nk:
            for x in range(D):
                k_c[x] = k[col, x]
                v_c[x] = v[col, x]
            nr += 2 * D * E
        diag = Nk
        if CAUSAL:
            diag = Nk - Nq
        for i in range((Nq + Br - 1) // Br):
            r0 = i * Br
            rows = min(Br, Nq - r0)
            if CAUSAL and c0 > r0 + rows - 1 + diag:
                continue  # no query of tile i sees a key of this block: the same for every thread
            cuda.syncthreads()
            for idx in range(tid, rows * D, Bc):
                Q_i[idx // D, idx % D] = q[r0 + idx // D, idx % D]
                dO_i[idx // D, idx % D] = do[r0 + idx // D, idx % D]
                nr += 2 * E
            for r in range(tid, rows, Bc):
                L_i[r] = L[r0 + r]
                D_i[r] = Dv[r0 + r]
                nr += 2 * E
            cuda.syncthreads()
            if col < Nk:
                for r in range(rows):
                    if col > r0 + r + diag:
                        continue  # masked: P = 0, nothing to add
                    s = ZERO
                    dP = ZERO
                    for x in range(D):
                        s += Q_i[r, x] * k_c[x]
                        dP += dO_i[r, x] * v_c[x]
                    P = math.exp(scale * s - L_i[r])
                    dS = P * (dP - D_i[r])
                    for x in range(D):
                        cuda.atomic.add(dq, (r0 + r, x), scale * dS * k_c[x])  # other threads add here too
                    nr += D * E
                    nw += D * E
        cuda.atomic.add(counter, 0, nr)
        cuda.atomic.add(counter, 1, nw)

    return dq_atomic
