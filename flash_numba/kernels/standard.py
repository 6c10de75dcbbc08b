"""Standard attention: the paper's baseline, one kernel per step, every step through HBM.

What it does.  The forward pass is the three lines of the FlashAttention paper's
Algorithm 0, each a separate kernel that reads its inputs from HBM and writes its
result back to HBM::

    S = scale * Q K^T        (BH, Nq, Nk)   tiled matrix product; causal entries -> -inf
    P = softmax(S)           (BH, Nq, Nk)   one thread block per row; also L = m + log(l)
    O = P V                  (BH, Nq, d)    tiled matrix product

S and P are N x N matrices, stored in the storage dtype as a plain implementation
does; writing them and reading them back is the HBM traffic FlashAttention removes.
The backward pass is the paper's Algorithm 3 (see :func:`backward`).

What changed since the previous version.  Nothing: this is the first version,
the yardstick for ``flash1`` and ``flash2``.  Every matrix product, forward and
backward, goes through one kernel, :func:`matmul_kernel` (``C = alpha *
op(A) op(B)`` over 16 x 16 shared-memory tiles); :func:`matmul` is its host
wrapper, for lessons and tests.

What the counters count.  Each launch adds to ``counters.array(name)`` the bytes
its threads load from and store to global arrays: in a matrix product, every
in-bounds element of the A and B tiles each thread block stages (A is re-read
once per column tile of C, B once per row tile) and every element of C; in
the softmax, every element of the row of S in each of its three passes (max,
sum, write), P, and one L per row.  Causal masking changes no count: S is
computed in full and the masked entries are overwritten with -inf, as a plain
implementation does.  :mod:`flash_numba.iomodel.standard` gives the same
numbers in closed form.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from .. import _inputs
from ..device import jit
from ..hbm import Counters
from ._common import COUNTER_TYPE, acc_nb_type, array_type

USES_BLOCKS = False

#: Side of the square shared-memory tiles of the matrix product (16 x 16 threads per block).
TILE = 16
#: Threads per block of the row kernels (softmax, dS): one warp per row (PyTorch's
#: softmax also gives each short row one warp).
ROW_THREADS = 32

NEG_INF = -math.inf


def _lse_dtype(dtype) -> np.dtype:
    """The dtype of L: float32, float64 for float64 storage."""
    return _inputs.acc_dtype(dtype)


# ---------------------------------------------------------------------------
# The tiled matrix product
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def matmul_kernel(dtype, trans_a: bool = False, trans_b: bool = False, causal: bool = False, count: bool = False):
    """The kernel ``C[bh] = alpha * op(A[bh]) @ op(B[bh])`` for every batch index ``bh``.

    ``op(A)`` is ``A`` (stored ``(BH, M, K)``) or, with ``trans_a``, ``A^T`` (``A``
    stored ``(BH, K, M)``); likewise ``op(B)`` is ``(K, N)``, stored ``(BH, K, N)`` or,
    with ``trans_b``, ``(BH, N, K)``.  ``C`` is ``(BH, M, N)``; A, B and C have the
    storage dtype ``dtype``, the sums run in float32 (float64 for float64).  With
    ``causal``, ``C[i, j] = -inf`` where ``j > i + (N - M)`` (the attention mask).

    Launch: ``kernel[(ceil(N/TILE), ceil(M/TILE), BH), (TILE, TILE)](a, b, c, alpha, counter)``
    with ``alpha`` of the accumulation dtype.  Thread ``(tx, ty)`` of block
    ``(bx, by, bh)`` owns ``C[bh, by*TILE + ty, bx*TILE + tx]``.  M, N and K come from
    the array shapes and need not be multiples of TILE.
    """
    ACC = acc_nb_type(dtype)
    E = np.dtype(dtype).itemsize  # bytes per element of A, B and C
    TRANS_A, TRANS_B, CAUSAL, COUNT = trans_a, trans_b, causal, count
    T = TILE
    T1 = TILE + 1  # padded row: a column of the tile then sits in 16 different banks

    @jit
    def kernel(a, b, c, alpha, counter):
        M = c.shape[1]
        N = c.shape[2]
        K = a.shape[1] if TRANS_A else a.shape[2]
        bh = cuda.blockIdx.z
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        row0 = cuda.blockIdx.y * T  # first row of this block's C tile
        col0 = cuda.blockIdx.x * T  # first column
        row = row0 + ty
        col = col0 + tx

        a_tile = cuda.shared.array((T, T1), ACC)  # a_tile[r, kk] = op(A)[row0 + r, k0 + kk]
        b_tile = cuda.shared.array((T, T1), ACC)  # b_tile[kk, cc] = op(B)[k0 + kk, col0 + cc]
        acc = ACC(0)  # C[row, col] / alpha, summed over the K tiles
        nr = 0
        nw = 0

        for k0 in range(0, K, T):
            # Stage one (T, T) tile of op(A) and one of op(B).  Neighbouring threads (tx,
            # tx + 1) always load neighbouring addresses in memory (coalesced), so for a
            # transposed operand the thread stores into the tile transposed.  Elements
            # past the edge of the matrix are 0 and add nothing.
            if TRANS_A:  # A is (K, M): load A[k0 + ty, row0 + tx] = op(A)[row0 + tx, k0 + ty]
                k = k0 + ty
                r = row0 + tx
                if k < K and r < M:
                    a_tile[tx, ty] = ACC(a[bh, k, r])
                    if COUNT:
                        nr += E
                else:
                    a_tile[tx, ty] = ACC(0)
            else:  # A is (M, K): load A[row, k0 + tx]
                k = k0 + tx
                if row < M and k < K:
                    a_tile[ty, tx] = ACC(a[bh, row, k])
                    if COUNT:
                        nr += E
                else:
                    a_tile[ty, tx] = ACC(0)
            if TRANS_B:  # B is (N, K): load B[col0 + ty, k0 + tx] = op(B)[k0 + tx, col0 + ty]
                n = col0 + ty
                k = k0 + tx
                if n < N and k < K:
                    b_tile[tx, ty] = ACC(b[bh, n, k])
                    if COUNT:
                        nr += E
                else:
                    b_tile[tx, ty] = ACC(0)
            else:  # B is (K, N): load B[k0 + ty, col]
                k = k0 + ty
                if k < K and col < N:
                    b_tile[ty, tx] = ACC(b[bh, k, col])
                    if COUNT:
                        nr += E
                else:
                    b_tile[ty, tx] = ACC(0)
            cuda.syncthreads()  # both tiles complete before anyone reads them

            for kk in range(T):  # row `ty` of the A tile times column `tx` of the B tile
                acc += a_tile[ty, kk] * b_tile[kk, tx]
            cuda.syncthreads()  # everyone done with the tiles before the next k0 overwrites them

        if row < M and col < N:
            if CAUSAL and col > row + (N - M):  # key col is not visible to query row
                c[bh, row, col] = ACC(NEG_INF)
            else:
                c[bh, row, col] = alpha * acc
            if COUNT:
                nw += E
        if COUNT:
            cuda.atomic.add(counter, 0, nr)
            cuda.atomic.add(counter, 1, nw)

    return kernel


def _launch_matmul(a, b, c, alpha, counter, *, trans_a=False, trans_b=False, causal=False, count=False):
    """Run :func:`matmul_kernel` on device arrays ``a``, ``b`` into ``c`` (BH, M, N)."""
    dtype = np.dtype(c.dtype)
    BH, M, N = c.shape
    kernel = matmul_kernel(dtype, trans_a, trans_b, causal, count)
    grid = (math.ceil(N / TILE), math.ceil(M / TILE), BH)
    kernel[grid, (TILE, TILE)](a, b, c, _inputs.acc_dtype(dtype).type(alpha), counter)


def matmul(a, b, *, trans_a=False, trans_b=False, alpha=1.0, count_hbm=False):
    """``alpha * op(a) @ op(b)`` with :func:`matmul_kernel`, batched over the first axis.

    ``a``: ``(BH, M, K)`` (``(BH, K, M)`` with ``trans_a``), ``b``: ``(BH, K, N)``
    (``(BH, N, K)`` with ``trans_b``); 2-D arrays are one batch.  Both NumPy (the
    result comes back as NumPy) or both device arrays (the result stays on the
    device), one storage dtype (float16, float32, float64).  Returns ``c`` with
    a's rank and dtype, or ``(c, hbm)`` with an :class:`~flash_numba.hbm.HBMCount`
    when ``count_hbm=True``.
    """
    if not isinstance(count_hbm, bool):
        raise TypeError(f"count_hbm: expected True or False, got {count_hbm!r}")
    real = isinstance(alpha, (int, float, np.integer, np.floating)) and not isinstance(alpha, bool)
    if not (real and math.isfinite(alpha)):
        raise TypeError(f"alpha: expected a finite real number, got {alpha!r}")
    (a, a_dev), (b, b_dev) = _inputs._as_array(a, "a"), _inputs._as_array(b, "b")
    if a_dev != b_dev:
        raise TypeError("a and b: give both as NumPy arrays or both as CUDA arrays")
    dtype = _inputs._check_dtype(a, "a")
    if _inputs._check_dtype(b, "b") != dtype:
        raise TypeError(f"b: dtype {np.dtype(b.dtype)} differs from a's {dtype}")
    if a.ndim not in (2, 3) or b.ndim != a.ndim:
        raise ValueError(f"a, b: expected two 2-D or two 3-D arrays, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    a3 = a.shape if a.ndim == 3 else (1,) + tuple(a.shape)
    b3 = b.shape if b.ndim == 3 else (1,) + tuple(b.shape)
    if a3[0] != b3[0]:
        raise ValueError(f"b: batch size {b3[0]} differs from a's {a3[0]}")
    M, K = (a3[2], a3[1]) if trans_a else (a3[1], a3[2])
    Kb, N = (b3[2], b3[1]) if trans_b else (b3[1], b3[2])
    if Kb != K:
        raise ValueError(f"b: inner dimension {Kb} of op(b) differs from op(a)'s {K}")
    if min(M, N, K, a3[0]) < 1:
        raise ValueError(f"a, b: empty matrices {tuple(a.shape)} and {tuple(b.shape)}")
    a_d = _inputs._to_device(a, a_dev, a3, "a")
    b_d = _inputs._to_device(b, b_dev, b3, "b")
    c = _inputs.empty((a3[0], M, N), dtype)
    counters = Counters(count_hbm)
    counter = counters.array("C = alpha*op(A)@op(B)")
    _launch_matmul(a_d, b_d, c, alpha, counter, trans_a=bool(trans_a), trans_b=bool(trans_b), count=count_hbm)
    shape = (a3[0], M, N) if a.ndim == 3 else (M, N)
    c = c.reshape(shape) if a_dev else c.copy_to_host().reshape(shape)
    return (c, counters.result()) if count_hbm else c


# ---------------------------------------------------------------------------
# Row and elementwise kernels
# ---------------------------------------------------------------------------


@jit(device=True)
def _block_max(part, x):
    """The max of ``x`` over the (1-D) thread block; ``part`` has one slot per thread.

    Each thread leaves its partial result in shared memory and, after one barrier,
    reads all of them (broadcast reads).  For one warp of partials this costs about
    what a tree reduction does, with one barrier instead of log2(ROW_THREADS) + 1.
    ``part`` must not be written again in the kernel (use a new array per reduction).
    """
    part[cuda.threadIdx.x] = x
    cuda.syncthreads()  # every partial is in shared memory
    total = part[0]
    for u in range(1, part.shape[0]):
        total = max(total, part[u])
    return total


@jit(device=True)
def _block_sum(part, x):
    """The sum of ``x`` over the thread block, as :func:`_block_max` (the same order
    of additions in every thread, so all threads get the same bits)."""
    part[cuda.threadIdx.x] = x
    cuda.syncthreads()
    total = part[0]
    for u in range(1, part.shape[0]):
        total += part[u]
    return total


@functools.lru_cache(maxsize=None)
def softmax_kernel(dtype, count: bool = False):
    """``P = softmax(S)`` row by row, and ``L = m + log(l)``; one thread block per row.

    ``s``, ``p``: ``(BH, Nq, Nk)`` storage dtype; ``lse``: ``(BH, Nq)`` accumulation
    dtype.  Launch ``kernel[(Nq, BH), ROW_THREADS](s, p, lse, counter)``.  Three
    passes over the row of S in HBM (numerically stable softmax); a row of -inf
    (no visible key) gives ``P = 0`` and ``L = -inf``.
    """
    ACC = acc_nb_type(dtype)
    E = np.dtype(dtype).itemsize
    E_L = _lse_dtype(dtype).itemsize
    COUNT = count
    NT = ROW_THREADS

    @jit
    def kernel(s, p, lse, counter):
        i = cuda.blockIdx.x  # query row
        bh = cuda.blockIdx.y
        t = cuda.threadIdx.x
        Nk = s.shape[2]
        part_m = cuda.shared.array(NT, ACC)  # per-thread partial row max
        part_l = cuda.shared.array(NT, ACC)  # per-thread partial row sum
        nr = 0
        nw = 0

        # Pass 1: m_i = rowmax(S_i); thread t takes columns t, t + NT, ...
        m = ACC(NEG_INF)
        for j in range(t, Nk, NT):
            m = max(m, ACC(s[bh, i, j]))
            if COUNT:
                nr += E
        m_i = _block_max(part_m, m)
        # A row with no visible key has m_i = -inf; shift by 0 instead, so that
        # exp(-inf - 0) = 0 rather than exp(-inf - (-inf)) = NaN.
        shift = m_i if m_i != NEG_INF else ACC(0)

        # Pass 2: l_i = rowsum(exp(S_i - m_i))
        l = ACC(0)
        for j in range(t, Nk, NT):
            l += math.exp(ACC(s[bh, i, j]) - shift)
            if COUNT:
                nr += E
        l_i = _block_sum(part_l, l)
        inv_l = ACC(1) / l_i if l_i != 0 else ACC(0)  # != 0: a NaN row stays NaN

        # Pass 3: P_i = exp(S_i - m_i) / l_i
        for j in range(t, Nk, NT):
            p[bh, i, j] = math.exp(ACC(s[bh, i, j]) - shift) * inv_l
            if COUNT:
                nr += E
                nw += E
        if t == 0:  # L_i = m_i + log(l_i), -inf for a row with no visible key
            lse[bh, i] = m_i + math.log(l_i) if l_i != 0 else ACC(NEG_INF)
            if COUNT:
                nw += E_L
        if COUNT:
            cuda.atomic.add(counter, 0, nr)
            cuda.atomic.add(counter, 1, nw)

    return kernel


@functools.lru_cache(maxsize=None)
def exp_kernel(dtype, count: bool = False):
    """``P = exp(S - L)``, one thread per element (the backward's recompute of P).

    ``s``, ``p``: ``(BH, Nq, Nk)`` storage dtype; ``lse``: ``(BH, Nq)``.  Launch on
    the matrix product's grid, ``kernel[(ceil(Nk/TILE), ceil(Nq/TILE), BH), (TILE, TILE)]``.
    Each thread reads its S_ij and L_i and writes P_ij; ``P = 0`` where ``L_i = -inf``.
    """
    ACC = acc_nb_type(dtype)
    E = np.dtype(dtype).itemsize
    E_L = _lse_dtype(dtype).itemsize
    COUNT = count
    T = TILE

    @jit
    def kernel(s, lse, p, counter):
        bh = cuda.blockIdx.z
        i = cuda.blockIdx.y * T + cuda.threadIdx.y
        j = cuda.blockIdx.x * T + cuda.threadIdx.x
        if i < s.shape[1] and j < s.shape[2]:
            L_i = ACC(lse[bh, i])
            s_ij = ACC(s[bh, i, j])
            if L_i == NEG_INF:  # row with no visible key: P_i = 0 (not exp(-inf + inf) = NaN)
                p[bh, i, j] = ACC(0)
            else:
                p[bh, i, j] = math.exp(s_ij - L_i)
            if COUNT:
                cuda.atomic.add(counter, 0, E + E_L)
                cuda.atomic.add(counter, 1, E)

    return kernel


@functools.lru_cache(maxsize=None)
def ds_kernel(dtype, count: bool = False):
    """``dS = P * (dP - D)`` with ``D_i = rowsum(P_i * dP_i)``; one thread block per row.

    ``p``, ``dp``, ``ds``: ``(BH, Nq, Nk)`` storage dtype.  Launch
    ``kernel[(Nq, BH), ROW_THREADS](p, dp, ds, counter)``.  Two passes over the rows
    of P and dP in HBM: one for D_i, one for dS_i.
    """
    ACC = acc_nb_type(dtype)
    E = np.dtype(dtype).itemsize
    COUNT = count
    NT = ROW_THREADS

    @jit
    def kernel(p, dp, ds, counter):
        i = cuda.blockIdx.x
        bh = cuda.blockIdx.y
        t = cuda.threadIdx.x
        Nk = p.shape[2]
        part = cuda.shared.array(NT, ACC)  # per-thread partial D_i
        nr = 0
        nw = 0

        # Pass 1: D_i = sum_j P_ij dP_ij
        acc = ACC(0)
        for j in range(t, Nk, NT):
            acc += ACC(p[bh, i, j]) * ACC(dp[bh, i, j])
            if COUNT:
                nr += 2 * E
        D_i = _block_sum(part, acc)

        # Pass 2: dS_ij = P_ij (dP_ij - D_i)
        for j in range(t, Nk, NT):
            ds[bh, i, j] = ACC(p[bh, i, j]) * (ACC(dp[bh, i, j]) - D_i)
            if COUNT:
                nr += 2 * E
                nw += E
        if COUNT:
            cuda.atomic.add(counter, 0, nr)
            cuda.atomic.add(counter, 1, nw)

    return kernel


# ---------------------------------------------------------------------------
# The kernel-module protocol
# ---------------------------------------------------------------------------


def forward(prob, ops, block, counters):
    """``S = scale*Q K^T``, ``P = softmax(S)``, ``O = P V``: three launches, S and P in HBM.

    Returns device arrays ``O`` (BH, Nq, d) and ``L`` (BH, Nq).
    """
    BH, Nq, Nk, d, dtype = prob.BH, prob.Nq, prob.Nk, prob.d, prob.dtype
    q, k, v = ops["q"].dev, ops["k"].dev, ops["v"].dev
    count = counters.enabled

    # Algorithm 0, line 1: S = scale * Q K^T, written to HBM
    S = _inputs.empty((BH, Nq, Nk), dtype)
    name = "S = scale*Q@K^T"
    _launch_matmul(q, k, S, prob.scale, counters.array(name), trans_b=True, causal=prob.causal, count=count)

    # line 2: read S, P = softmax(S) (and L = m + log(l) for the backward), written to HBM
    P = _inputs.empty((BH, Nq, Nk), dtype)
    L = _inputs.empty((BH, Nq), prob.acc)
    softmax_kernel(dtype, count)[(Nq, BH), ROW_THREADS](S, P, L, counters.array("P = softmax(S)"))

    # line 3: read P and V, O = P V
    O = _inputs.empty((BH, Nq, d), dtype)
    _launch_matmul(P, v, O, 1.0, counters.array("O = P@V"), count=count)
    return O, L


def backward(prob, ops, block, counters):
    """The standard backward (the paper's Algorithm 3), every N x N matrix in HBM.

    The API is stateless, so P is first recomputed: ``S = scale*Q K^T`` (the forward's
    kernel) and ``P = exp(S - L)`` from the saved L.  Then::

        dV = P^T dO                  (BH, Nk, d)
        dP = dO V^T                  (BH, Nq, Nk)
        dS = P * (dP - D),  D_i = rowsum(P_i * dP_i)
        dQ = scale * dS K            (BH, Nq, d)
        dK = scale * dS^T Q          (BH, Nk, d)

    PyTorch's autograd would instead keep P from the forward pass (N x N memory);
    the per-kernel byte breakdown (``count_hbm=True``) shows what the two recompute
    kernels cost.  ``o`` is not read: D comes from P and dP, as in Algorithm 3.
    Returns device arrays ``dQ``, ``dK``, ``dV``.
    """
    BH, Nq, Nk, d, dtype = prob.BH, prob.Nq, prob.Nk, prob.d, prob.dtype
    q, k, v = ops["q"].dev, ops["k"].dev, ops["v"].dev
    L, dO = ops["lse"].dev, ops["do"].dev
    count = counters.enabled
    tiles = (math.ceil(Nk / TILE), math.ceil(Nq / TILE), BH)

    S = _inputs.empty((BH, Nq, Nk), dtype)
    _launch_matmul(q, k, S, prob.scale, counters.array("S (recompute)"), trans_b=True, causal=prob.causal, count=count)
    P = _inputs.empty((BH, Nq, Nk), dtype)
    exp_kernel(dtype, count)[tiles, (TILE, TILE)](S, L, P, counters.array("P = exp(S-L) (recompute)"))

    # Algorithm 3, line 1: dV = P^T dO
    dV = _inputs.empty((BH, Nk, d), dtype)
    _launch_matmul(P, dO, dV, 1.0, counters.array("dV = P^T@dO"), trans_a=True, count=count)
    # line 2: dP = dO V^T
    dP = _inputs.empty((BH, Nq, Nk), dtype)
    _launch_matmul(dO, v, dP, 1.0, counters.array("dP = dO@V^T"), trans_b=True, count=count)
    # line 3: dS = P * (dP - D), D_i = rowsum(P_i * dP_i)
    dS = _inputs.empty((BH, Nq, Nk), dtype)
    ds_kernel(dtype, count)[(Nq, BH), ROW_THREADS](P, dP, dS, counters.array("dS = P*(dP-D)"))
    # line 4: dQ = scale * dS K  (the scale of S = scale * Q K^T)
    dQ = _inputs.empty((BH, Nq, d), dtype)
    _launch_matmul(dS, k, dQ, prob.scale, counters.array("dQ = scale*dS@K"), count=count)
    # line 5: dK = scale * dS^T Q
    dK = _inputs.empty((BH, Nk, d), dtype)
    _launch_matmul(dS, q, dK, prob.scale, counters.array("dK = scale*dS^T@Q"), trans_a=True, count=count)
    return dQ, dK, dV


def shared_bytes(Br, Bc, d, dtype, pass_) -> int:
    """Static shared memory of the largest kernel of either pass: the matrix product's
    two padded (TILE, TILE + 1) tiles in the accumulation dtype (``Br``, ``Bc``, ``d``
    are ignored: the tiles are fixed)."""
    return 2 * TILE * (TILE + 1) * _inputs.acc_dtype(dtype).itemsize


def block_limits(d, dtype, pass_):
    """Fixed tiles: ``(TILE, TILE)`` (the API passes no block to these kernels)."""
    return TILE, TILE


#: (trans_a, trans_b, causal) of the matrix products: the four transpose patterns
#: (the public :func:`matmul` takes any) and the causal ``Q K^T`` of S.
_MATMUL_VARIANTS = [(ta, tb, False) for ta in (False, True) for tb in (False, True)] + [(False, True, True)]


def compile_all(ccs, dtypes, ds):
    """PTX of every kernel specialisation, as ``[(label, ptx)]``, for the compile tier.

    Per cc, dtype and counting flag: the matrix product in each of
    ``_MATMUL_VARIANTS``, and the softmax, exp and dS kernels.  ``ds`` is unused:
    no kernel here is specialised on the head dim.
    """
    from ..compile_check import compile_ptx

    out = []
    for cc in ccs:
        for dt in map(np.dtype, dtypes):
            s3, lse2, acc = array_type(dt, 3), array_type(_lse_dtype(dt), 2), acc_nb_type(dt)
            for count in (False, True):
                tag = f"{dt.name}{' count' if count else ''} cc{cc[0]}.{cc[1]}"
                todo = [
                    (
                        f"matmul A{'^T' if ta else ''}@B{'^T' if tb else ''}{' causal' if causal else ''}",
                        matmul_kernel(dt, ta, tb, causal, count),
                        (s3, s3, s3, acc, COUNTER_TYPE),
                    )
                    for ta, tb, causal in _MATMUL_VARIANTS
                ]
                todo += [
                    ("softmax", softmax_kernel(dt, count), (s3, s3, lse2, COUNTER_TYPE)),
                    ("exp", exp_kernel(dt, count), (s3, lse2, s3, COUNTER_TYPE)),
                    ("dS", ds_kernel(dt, count), (s3, s3, s3, COUNTER_TYPE)),
                ]
                for name, kernel, argtypes in todo:
                    out.append((f"standard {name} {tag}", compile_ptx(kernel.py_func, argtypes, cc)))
    return out
