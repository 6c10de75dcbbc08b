"""NumPy float64 reference for attention: the ground truth every kernel is tested against.

What each function is for:

* :func:`attention_forward`, :func:`attention_backward`: plain attention,
  ``O = softmax(scale * Q K^T) V`` and its gradients, on whole matrices.  These
  are the answers.
* :func:`flash_forward_tiled`, :func:`flash_backward_tiled`: the same results
  computed block by block, following the paper's loops with its names, so that
  a kernel can be read side by side with them.  The forward is Algorithm 1 of
  FlashAttention (Dao et al. 2022): K/V blocks outer, Q blocks inner, O, l, m
  read and written "in HBM" at every step.  The backward is Algorithm 2 of
  FlashAttention-2 (Dao 2023), which recomputes ``P_ij = exp(S_ij - L_i)`` from
  the single saved statistic ``L = m + log(l)`` (FlashAttention's own backward,
  its Algorithm 4, does the same from m and l).  Comments give the line numbers
  of those two algorithms.
* :func:`online_softmax_stats`: the running max and sum of Algorithm 1,
  lines 10-11, on one row, for the online-softmax lesson and its tests.
* :func:`plain_attention`: attention computed entirely in a low precision
  (float16 by default, no upcast).  Its error against float64 is the baseline
  of Dao-AILab's test rule: a float16 kernel may be off by at most a few times
  this much.
* :func:`plain_matmul`: ``a @ b`` rounded in the inputs' dtype in a summation
  order fixed here, not by the machine's BLAS: the matrix product of every
  low-precision baseline.
* :func:`causal_mask`: the mask all of the above (and the kernels) use.

Shapes: ``q`` is ``(..., Nq, d)`` and ``k``, ``v`` are ``(..., Nk, d)`` with
leading dims ``()``, ``(H,)`` or ``(B, H)``; ``lse`` is ``(..., Nq)``.
``scale=None`` means ``1/sqrt(d)``.

Masking: with ``causal=True`` key ``j`` is visible to query ``i`` iff
``j <= i + (Nk - Nq)`` (aligned to the bottom-right corner, as in
FlashAttention >= 2.1 and PyTorch's ``causal_lower_right`` bias; PyTorch's
``is_causal=True`` aligns top-left, which agrees only when ``Nq == Nk``).
A masked score is ``-inf``, so its probability is 0.

Non-finite values: the rule every kernel follows (issue #17; docs/RELIABILITY.md,
section 2, says how, and what it leaves open):

* A row that the causal mask hides completely (``Nq > Nk``: the first
  ``Nq - Nk`` rows see no key) gets ``o = 0`` and ``lse = -inf`` and contributes
  nothing to any gradient; never NaN.  This is the only row that gets
  ``lse = -inf``.
* Every other row follows IEEE arithmetic as PyTorch does: NaN in, NaN out;
  a row whose visible scores are all ``-inf`` (nothing masked them: the inputs
  made them so) or that has a ``+inf`` score has no defined softmax, and gets
  ``o = NaN`` and ``lse = NaN``.
* A masked key contributes nothing, whatever its values: a NaN or Inf in k or v
  at a position a row cannot see never reaches that row (no ``0 * Inf``).
* A visible entry always contributes its product, even where its probability (dS,
  dropout's ``Z * P``) is exactly 0 (a score far below the row's max, a ``-inf``
  score, a dropped entry): ``0 * Inf = NaN`` and ``0 * NaN = NaN`` reach the result,
  as IEEE arithmetic gives and PyTorch does (:func:`_masked_matmul` skips by the mask only).
* The backward takes ``P = exp(S - L)`` with the ``L`` it is given, unclamped,
  on visible entries (0 on masked ones), and ``D = rowsum(dO * O)``.

Why float64: every input is converted to float64 first, whatever its dtype,
and all arithmetic is float64.  Its rounding (about 1e-16) is far below the
float32 kernels' tolerance (1e-5) and the float16 error, so a test's measured
error is the kernel's error and not the reference's.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "attention_backward",
    "attention_forward",
    "causal_mask",
    "flash_backward_tiled",
    "flash_forward_tiled",
    "online_softmax_stats",
    "plain_attention",
]


# --------------------------------------------------------------------------- helpers


def causal_mask(Nq: int, Nk: int) -> np.ndarray:
    """Bool ``(Nq, Nk)``: True where key ``j`` is visible to query ``i``, i.e. ``j <= i + (Nk - Nq)``."""
    i = np.arange(Nq)[:, None]
    j = np.arange(Nk)[None, :]
    return j <= i + (Nk - Nq)


def _finite(m):
    """``m`` with ``-inf`` replaced by 0: ``exp(x - _finite(m))`` is then 0, not NaN, on a row whose max is -inf."""
    return np.where(m == -np.inf, 0.0, m)


def _lse(m, l):
    """``L = m + log(l)``, and ``-inf`` where ``l == 0`` (a row with no visible key)."""
    return np.where(l > 0, m + np.log(np.where(l > 0, l, 1.0)), -np.inf)


def _visible(Nq: int, Nk: int, causal: bool) -> np.ndarray:
    """Bool ``(Nq, Nk)``: which keys each query row sees."""
    return causal_mask(Nq, Nk) if causal else np.ones((Nq, Nk), dtype=bool)


def _masked_matmul(A, B, vis):
    """``A @ B`` where entries of ``A`` outside ``vis`` contribute nothing, even against an Inf or NaN in ``B``.

    A: ``(..., M, K)`` with 0 outside ``vis`` ``(M, K)``; B: ``(..., K, n)``.  A plain
    product would give ``0 * Inf = NaN`` there; the extra work is only done for the
    non-finite entries of B (none, in the common case).
    """
    out = np.where(vis, A, 0.0) @ np.where(np.isfinite(B), B, 0.0)  # (..., M, n)
    for idx in zip(*np.nonzero(~np.isfinite(B))):  # idx = (*lead, kk, c)
        *lead, kk, c = idx
        lead = tuple(lead)
        a = A[lead + (slice(None), kk)]  # (M,)
        out[lead + (slice(None), c)] += np.where(vis[:, kk], a * B[idx], 0.0)
    return out


def as_float64(x) -> np.ndarray:
    """``x`` as float64; bfloat16 inputs (``flash_numba.as_bfloat16`` words, ``ml_dtypes.bfloat16``) by value,
    not as the integers of their words."""
    from ._inputs import Bfloat16Words
    from .kernels._bf16 import from_bf16_bits

    if isinstance(x, Bfloat16Words) or getattr(getattr(x, "dtype", None), "name", "") == "bfloat16":
        return from_bf16_bits(np.asarray(x).view(np.uint16)).astype(np.float64)
    return np.asarray(x, dtype=np.float64)


def _qkv(q, k, v, scale):
    """Check shapes, convert to float64, resolve the scale; returns ``(q, k, v, scale, G)``.

    Grouped-query attention: k and v may have Hkv heads where q has Hq = G * Hkv; they come
    back repeated over each group, (..., Hq, Nk, d), query head h seeing key/value head h // G.
    """
    q, k, v = (as_float64(x) for x in (q, k, v))
    if q.ndim not in (2, 3, 4) or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"q, k, v: expected (N, d), (H, N, d) or (B, H, N, d), got {q.shape}, {k.shape}, {v.shape}")
    G = 1
    if q.ndim > 2 and k.shape[-3] and q.shape[-3] % k.shape[-3] == 0:
        G = q.shape[-3] // k.shape[-3]
    if k.shape != v.shape or k.shape[:-3] != q.shape[:-3] or k.shape[-1] != q.shape[-1] or (
            q.ndim > 2 and k.shape[-3] * G != q.shape[-3]):
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape}: need equal batch dims and d, k and v of one shape, "
                         "and k's heads dividing q's")
    k, v = (np.repeat(x, G, axis=-3) if G > 1 else x for x in (k, v))  # (..., Hq, Nk, d)
    d = q.shape[-1]
    return q, k, v, (1.0 / math.sqrt(d) if scale is None else float(scale)), G


def _sum_groups(x, G):
    """``(..., Hq, N, d)`` -> ``(..., Hq / G, N, d)``: the sum over each group of G query heads."""
    return x if G == 1 else x.reshape(x.shape[:-3] + (x.shape[-3] // G, G) + x.shape[-2:]).sum(axis=-3)


def _scores(q, k, scale, causal):
    """``S = scale * Q K^T``, ``(..., Nq, Nk)``, with ``-inf`` on masked entries."""
    S = scale * (q @ k.swapaxes(-1, -2))  # (..., Nq, Nk)
    if causal:
        S = np.where(causal_mask(q.shape[-2], k.shape[-2]), S, -np.inf)
    return S


def _dropout_scale(lead, Nq: int, Nk: int, p, seed):
    """Dropout's factor on P, ``(*lead, Nq, Nk)``: 1 / (1 - p) where kept, 0 where dropped; None when p = 0.

    The mask of :func:`flash_numba.kernels._dropout.keep_mask`, with query head
    bh = the flat index over the leading dims (b * H + h), as the kernels number them.
    """
    from .kernels import _dropout

    _dropout.check_p(p)
    if p == 0:
        return None
    _dropout.check_seed(seed, required=True)
    bh = np.arange(math.prod(lead), dtype=np.int64).reshape(lead)
    return _dropout.keep_mask(seed, bh, Nq, Nk, p) / (1.0 - float(p))


def _check_block(Br, Bc):
    for name, B in (("Br", Br), ("Bc", Bc)):
        if not isinstance(B, (int, np.integer)) or B < 1:
            raise ValueError(f"{name}: expected a positive integer, got {B!r}")


# --------------------------------------------------------------------------- plain attention


def attention_forward(q, k, v, *, causal=False, scale=None, dropout_p=0.0, dropout_seed=None):
    """Plain attention ``O = softmax(S) V`` with ``S = scale * Q K^T``.

    q: ``(..., Nq, d)``; k, v: ``(..., Nk, d)``.  Returns float64
    ``o`` ``(..., Nq, d)`` and ``lse`` ``(..., Nq)`` with ``lse = m + log(l)``,
    ``m = rowmax(S)``, ``l = rowsum(exp(S - m))``.  k and v may have fewer heads than q
    (grouped-query attention: Hkv dividing Hq; query head h uses key/value head h // (Hq / Hkv)).
    ``dropout_p > 0``: ``O = (Z * P / (1 - p)) V / l`` with the keep mask Z of the kernels
    (:mod:`flash_numba.kernels._dropout`, ``dropout_seed`` an int in [0, 2**32), required);
    m, l and lse are those of the undropped scores (the paper's Algorithm 2).
    """
    q, k, v, scale, _ = _qkv(q, k, v, scale)
    Z = _dropout_scale(q.shape[:-2], q.shape[-2], k.shape[-2], dropout_p, dropout_seed)  # (..., Nq, Nk) or None
    vis = _visible(q.shape[-2], k.shape[-2], causal)  # (Nq, Nk)
    hidden = ~vis.any(axis=-1)  # (Nq,): rows that see no key
    S = _scores(q, k, scale, causal)  # (..., Nq, Nk), -inf where masked
    m = np.where(hidden, 0.0, S.max(axis=-1))  # (..., Nq); NaN propagates, -inf or +inf give NaN below
    with np.errstate(invalid="ignore", divide="ignore"):
        P = np.where(vis, np.exp(S - m[..., None]), 0.0)  # (..., Nq, Nk), unnormalised
        l = P.sum(axis=-1)  # (..., Nq)
        if Z is not None:
            P = P * Z  # dropout after the row statistics
        o = _masked_matmul(P, v, vis) / np.where(hidden, 1.0, l)[..., None]  # (..., Nq, d); 0 on hidden rows
        lse = np.where(hidden, -np.inf, m + np.log(np.where(hidden, 1.0, l)))  # (..., Nq)
    return o, lse


def attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None, dropout_p=0.0, dropout_seed=None):
    """Gradients of plain attention, from the forward's ``o`` and ``lse``.

    q, o, do: ``(..., Nq, d)``; k, v: ``(..., Nk, d)``; lse: ``(..., Nq)``.
    With ``P = exp(S - L)``, ``D = rowsum(dO * O)`` and ``dS = P * (dP - D)``:
    ``dV = P^T dO``, ``dP = dO V^T``, ``dQ = scale dS K``, ``dK = scale dS^T Q``.
    Returns float64 ``dq`` ``(..., Nq, d)``, ``dk``, ``dv`` ``(..., Nk, d)``, shaped like k and v
    (grouped-query attention: summed over the query heads of each key/value head).
    With dropout (the forward's ``dropout_p`` and ``dropout_seed``; the paper's Algorithm 4)
    and Zs = Z / (1 - p): ``dV = (Zs * P)^T dO`` and ``dS = P * (Zs * dP - D)``.
    """
    q, k, v, scale, G = _qkv(q, k, v, scale)
    Z = _dropout_scale(q.shape[:-2], q.shape[-2], k.shape[-2], dropout_p, dropout_seed)  # (..., Nq, Nk) or None
    o, do, L = (np.asarray(x, dtype=np.float64) for x in (o, do, lse))
    vis = _visible(q.shape[-2], k.shape[-2], causal)  # (Nq, Nk)
    S = _scores(q, k, scale, causal)  # (..., Nq, Nk)
    with np.errstate(invalid="ignore", over="ignore"):
        P = np.where(vis, np.exp(S - L[..., None]), 0.0)  # (..., Nq, Nk); the given L, unclamped
        dv = _masked_matmul((P if Z is None else Z * P).swapaxes(-1, -2), do, vis.T)  # (..., Nk, d)
        dP = do @ v.swapaxes(-1, -2)  # (..., Nq, Nk); masked entries are dropped below
        if Z is not None:
            dP = Z * dP  # the gradient of the kept, rescaled probabilities
        D = (do * o).sum(axis=-1)  # (..., Nq)
        dS = np.where(vis, P * (dP - D[..., None]), 0.0)  # (..., Nq, Nk)
        dq = scale * _masked_matmul(dS, k, vis)  # (..., Nq, d)
        dk = scale * _masked_matmul(dS.swapaxes(-1, -2), q, vis.T)  # (..., Nk, d)
    return dq, _sum_groups(dk, G), _sum_groups(dv, G)


def plain_matmul(a, b):
    """``a @ b`` rounded in the inputs' dtype, the same on every machine.

    a: ``(..., M, K)``; b: ``(..., K, N)``.  float32 and float64 sum over K one
    term after another, each product and each sum rounded (no FMA): the order
    of a kernel's FMA chain.  ``a @ b`` would call the BLAS, whose summation
    order and FMA use depend on the build and the CPU, and with them the
    rounding error of a float32 baseline.  float16 keeps NumPy's own matmul
    loop (never a BLAS: it sums in float32 and rounds the result to float16).
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == np.float16 and b.dtype == np.float16:
        return a @ b
    dtype = np.result_type(a, b)
    a, b = a.astype(dtype, copy=False), b.astype(dtype, copy=False)
    if a.shape[-1] == 0:
        return np.zeros(np.broadcast_shapes(a.shape[:-1], b.shape[:-2] + (1,)) + b.shape[-1:], dtype)
    out = a[..., :, :1] * b[..., :1, :]  # (..., M, N): term 0
    for t in range(1, a.shape[-1]):
        out = out + a[..., :, t : t + 1] * b[..., t : t + 1, :]
    return out


def plain_attention(q, k, v, *, causal=False, scale=None, dtype=np.float16):
    """Attention with every operation done and rounded in ``dtype`` (no upcast).

    q: ``(..., Nq, d)``; k, v: ``(..., Nk, d)``.  Returns ``o`` ``(..., Nq, d)``
    in ``dtype``.  In float16 its error against :func:`attention_forward` is
    the baseline of Dao-AILab's rule; in float64 it is the reference itself.
    """
    dtype = np.dtype(dtype)
    q, k, v = (np.asarray(x).astype(dtype) for x in (q, k, v))
    Nq, d = q.shape[-2:]
    Nk = k.shape[-2]
    s = dtype.type(1.0 / math.sqrt(d) if scale is None else scale)
    S = plain_matmul(q * s, k.swapaxes(-1, -2))  # (..., Nq, Nk) in dtype
    if causal:
        S = np.where(causal_mask(Nq, Nk), S, dtype.type(-np.inf))
    m = S.max(axis=-1, keepdims=True)  # (..., Nq, 1)
    P = np.exp(S - np.where(m == -np.inf, dtype.type(0), m))  # (..., Nq, Nk)
    l = P.sum(axis=-1, keepdims=True)  # (..., Nq, 1)
    P = P / np.where(l > 0, l, dtype.type(1))  # softmax; rows with no visible key stay 0
    return plain_matmul(P, v).astype(dtype)  # (..., Nq, d)


# --------------------------------------------------------------------------- online softmax


def online_softmax_stats(x, splits):
    """Softmax statistics of a 1-D row read block by block, as Algorithm 1 does.

    x: ``(N,)``; splits: the indices where the row is cut into blocks
    (``np.split`` convention; empty blocks are skipped).  Returns the floats
    ``(m, l)`` equal to ``max(x)`` and ``sum(exp(x - max(x)))`` (``-inf, 0`` for an all ``-inf`` row).
    """
    x = np.asarray(x, dtype=np.float64)
    m, l = -math.inf, 0.0  # Algorithm 1, line 2: m = -inf, l = 0
    for x_j in np.split(x, splits):  # line 5: one block of scores S_ij at a time
        if x_j.size == 0:
            continue
        m_t = float(x_j.max())  # line 10: m~ = rowmax(S_ij)
        l_t = float(np.exp(x_j - _finite(m_t)).sum())  # line 10: l~ = rowsum(exp(S_ij - m~))
        m_new = max(m, m_t)  # line 11: m_new = max(m, m~)
        l = math.exp(m - _finite(m_new)) * l + math.exp(m_t - _finite(m_new)) * l_t  # line 11: l_new
        m = m_new  # line 13: m <- m_new, l <- l_new
    return float(m), float(l)


# --------------------------------------------------------------------------- tiled mirrors


def flash_forward_tiled(q, k, v, *, Br, Bc, causal=False, scale=None):
    """FlashAttention forward, Algorithm 1 (Dao et al. 2022), loop for loop.

    q: ``(..., Nq, d)``; k, v: ``(..., Nk, d)``; ``Br``, ``Bc``: query and key
    block sizes (need not divide Nq, Nk).  The scale and the causal mask are
    applied to ``S_ij`` at line 9, as the paper's forward pass with masking
    (its Algorithm 2) does.
    Returns ``o`` ``(..., Nq, d)`` and ``lse = m + log(l)`` ``(..., Nq)``,
    equal to :func:`attention_forward` up to rounding.
    """
    _check_block(Br, Bc)
    q, k, v, scale, _ = _qkv(q, k, v, scale)
    Nq, Nk = q.shape[-2], k.shape[-2]
    mask = causal_mask(Nq, Nk)
    O = np.zeros(q.shape)  # line 2: O = 0, (..., Nq, d)
    l = np.zeros(q.shape[:-1])  # line 2: l = 0, (..., Nq)
    m = np.full(q.shape[:-1], -np.inf)  # line 2: m = -inf, (..., Nq)
    Tr, Tc = -(-Nq // Br), -(-Nk // Bc)  # line 3: Tr = ceil(Nq / Br), Tc = ceil(Nk / Bc); last blocks may be short
    for j in range(Tc):  # line 5
        c0, c1 = j * Bc, min((j + 1) * Bc, Nk)
        K_j, V_j = k[..., c0:c1, :], v[..., c0:c1, :]  # line 6: load K_j, V_j, (..., Bc, d)
        for i in range(Tr):  # line 7
            r0, r1 = i * Br, min((i + 1) * Br, Nq)
            if causal and c0 > (r1 - 1) + (Nk - Nq):
                # Block wholly above the diagonal: its first key is invisible even to its last query,
                # so every entry is masked and the update would leave O_i, l_i, m_i unchanged.
                continue
            Q_i, O_i = q[..., r0:r1, :], O[..., r0:r1, :]  # line 8: load Q_i, O_i, (..., Br, d)
            l_i, m_i = l[..., r0:r1], m[..., r0:r1]  # line 8: load l_i, m_i, (..., Br)
            S_ij = scale * (Q_i @ K_j.swapaxes(-1, -2))  # line 9: S_ij = scale * Q_i K_j^T, (..., Br, Bc)
            if causal:
                S_ij = np.where(mask[r0:r1, c0:c1], S_ij, -np.inf)  # line 9: masked entries = -inf
            m_t = S_ij.max(axis=-1)  # line 10: m~_ij = rowmax(S_ij), (..., Br)
            P_t = np.exp(S_ij - _finite(m_t)[..., None])  # line 10: P~_ij = exp(S_ij - m~_ij), (..., Br, Bc)
            l_t = P_t.sum(axis=-1)  # line 10: l~_ij = rowsum(P~_ij), (..., Br)
            m_new = np.maximum(m_i, m_t)  # line 11: m_new = max(m_i, m~_ij)
            a = np.exp(m_i - _finite(m_new))  # line 11: e^(m_i - m_new), 0 where m_i = -inf
            b = np.exp(m_t - _finite(m_new))  # line 11: e^(m~_ij - m_new), 0 where m~_ij = -inf
            l_new = a * l_i + b * l_t  # line 11: l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
            l_div = np.where(l_new > 0, l_new, 1.0)  # l_new = 0 only while the row has seen no key: O_i stays 0
            # line 12: O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j)
            O[..., r0:r1, :] = ((l_i * a)[..., None] * O_i + b[..., None] * (P_t @ V_j)) / l_div[..., None]
            l[..., r0:r1] = l_new  # line 13: l_i <- l_new
            m[..., r0:r1] = m_new  # line 13: m_i <- m_new
    return O, _lse(m, l)  # line 16: return O (and L = m + log(l), FlashAttention-2's saved statistic)


def flash_backward_tiled(q, k, v, o, lse, do, *, Br, Bc, causal=False, scale=None):
    """FlashAttention backward, Algorithm 2 of FlashAttention-2 (Dao 2023), loop for loop.

    q, o, do: ``(..., Nq, d)``; k, v: ``(..., Nk, d)``; lse: ``(..., Nq)``
    (``L`` from the forward).  ``P_ij = exp(S_ij - L_i)`` is recomputed from
    Q, K and L; dQ lives "in HBM" and is accumulated across the outer loop,
    dK_j and dV_j "on chip" within it.  The scale and mask enter at line 10,
    the scale again at lines 15-16 (the chain rule through ``S = scale Q K^T``).
    Returns ``dq`` ``(..., Nq, d)``, ``dk``, ``dv`` ``(..., Nk, d)``, equal to
    :func:`attention_backward` up to rounding.
    """
    _check_block(Br, Bc)
    q, k, v, scale, G = _qkv(q, k, v, scale)
    o, do, L = (np.asarray(x, dtype=np.float64) for x in (o, do, lse))
    Nq, Nk = q.shape[-2], k.shape[-2]
    mask = causal_mask(Nq, Nk)
    Tr, Tc = -(-Nq // Br), -(-Nk // Bc)  # line 1: Tr = ceil(Nq / Br), Tc = ceil(Nk / Bc)
    dQ = np.zeros(q.shape)  # line 3: dQ = 0 in HBM, (..., Nq, d)
    dK = np.zeros(k.shape)  # line 3: dK, dV in HBM, (..., Nk, d)
    dV = np.zeros(v.shape)
    D = (do * o).sum(axis=-1)  # line 4: D = rowsum(dO * O), (..., Nq)
    for j in range(Tc):  # line 5
        c0, c1 = j * Bc, min((j + 1) * Bc, Nk)
        K_j, V_j = k[..., c0:c1, :], v[..., c0:c1, :]  # line 6: load K_j, V_j, (..., Bc, d)
        dK_j = np.zeros(K_j.shape)  # line 7: dK_j = 0 on chip, (..., Bc, d)
        dV_j = np.zeros(V_j.shape)  # line 7: dV_j = 0 on chip
        for i in range(Tr):  # line 8
            r0, r1 = i * Br, min((i + 1) * Br, Nq)
            if causal and c0 > (r1 - 1) + (Nk - Nq):
                # Block wholly above the diagonal: every P_ij entry is 0, so it adds nothing to dQ, dK, dV.
                continue
            Q_i, dO_i = q[..., r0:r1, :], do[..., r0:r1, :]  # line 9: load Q_i, dO_i (O_i only via D_i), (..., Br, d)
            L_i, D_i = L[..., r0:r1], D[..., r0:r1]  # line 9: load L_i, D_i, (..., Br)
            S_ij = scale * (Q_i @ K_j.swapaxes(-1, -2))  # line 10: S_ij = scale * Q_i K_j^T, (..., Br, Bc)
            if causal:
                S_ij = np.where(mask[r0:r1, c0:c1], S_ij, -np.inf)  # line 10: masked entries = -inf
            P_ij = np.exp(S_ij - _finite(L_i)[..., None])  # line 11: P_ij = exp(S_ij - L_i); 0 where masked
            dV_j += P_ij.swapaxes(-1, -2) @ dO_i  # line 12: dV_j += P_ij^T dO_i, (..., Bc, d)
            dP_ij = dO_i @ V_j.swapaxes(-1, -2)  # line 13: dP_ij = dO_i V_j^T, (..., Br, Bc)
            dS_ij = P_ij * (dP_ij - D_i[..., None])  # line 14: dS_ij = P_ij * (dP_ij - D_i)
            dQ[..., r0:r1, :] += scale * (dS_ij @ K_j)  # line 15: dQ_i <- dQ_i + scale dS_ij K_j, written to HBM
            dK_j += scale * (dS_ij.swapaxes(-1, -2) @ Q_i)  # line 16: dK_j += scale dS_ij^T Q_i, (..., Bc, d)
        dK[..., c0:c1, :] = dK_j  # line 18: write dK_j, dV_j to HBM
        dV[..., c0:c1, :] = dV_j
    return dQ, _sum_groups(dK, G), _sum_groups(dV, G)  # line 20 (grouped-query attention: summed per group)


def decode_reference(q, k_cache, v_cache, cache_seqlens=None, block_table=None, causal=False, scale=None):
    """One decoding step in float64: o ``(B, Hq, Nq, d)`` and lse ``(B, Hq, Nq)`` (natural log).

    The arguments are :func:`flash_numba.attention_decode`'s: a contiguous cache ``(B, Hkv, Nmax, d)`` or a
    paged one ``(num_pages, Hkv, P, d)`` with ``block_table``; sequence b's keys are gathered first
    (``K_b[j] = k_cache[block_table[b, j // P], :, j % P]``), then each query head h of b attends to KV head
    ``h // (Hq / Hkv)`` over its visible keys: all L_b of them, or with ``causal`` keys ``j <= L_b - Nq + i``
    for new token i.  A row with no visible key gets o = 0 and lse = -inf.
    """
    q = np.asarray(q, dtype=np.float64)
    k_cache, v_cache = np.asarray(k_cache, dtype=np.float64), np.asarray(v_cache, dtype=np.float64)
    B, Hq, Nq, d = q.shape
    Hkv, P = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    if cache_seqlens is None:
        cache_seqlens = [P * (1 if block_table is None else np.shape(block_table)[1])] * B
    o = np.zeros((B, Hq, Nq, d))
    lse = np.full((B, Hq, Nq), -np.inf)
    for b in range(B):
        L = int(cache_seqlens[b])
        if block_table is None:
            K, V = k_cache[b, :, :L], v_cache[b, :, :L]  # (Hkv, L, d)
        else:
            pages = [int(block_table[b][p]) for p in range(-(-L // P))]
            K = np.concatenate([k_cache[p] for p in pages], axis=1)[:, :L] if pages else np.zeros((Hkv, 0, d))
            V = np.concatenate([v_cache[p] for p in pages], axis=1)[:, :L] if pages else np.zeros((Hkv, 0, d))
        for h in range(Hq):
            S = scale * q[b, h] @ K[h // G].T  # (Nq, L)
            for i in range(Nq):
                last = min(L - 1, i + L - Nq) if causal else L - 1
                if last < 0:
                    continue
                s = S[i, : last + 1]
                m = s.max()
                p = np.exp(s - m)
                o[b, h, i] = p @ V[h // G, : last + 1] / p.sum()
                lse[b, h, i] = m + np.log(p.sum())
    return o, lse
