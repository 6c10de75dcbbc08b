"""The exercises written in NumPy: the steps of the algorithm, one lesson at a time (lessons 2, 3, 5, 7, 8, 9, 12)."""

from __future__ import annotations

import math

import numpy as np

from ... import reference
from ..checking import _close, _compare, _copy, _diff_notes, _equal, _fmt, _Mismatch, _register, _rng


# ============================================================================= lesson 2: standard attention


def _standard_attention_solution(q, k, v):
    d = q.shape[-1]
    S = (q @ k.T) / math.sqrt(d)  # (Nq, Nk) scores
    m = S.max(axis=1, keepdims=True)  # (Nq, 1) row maxima: exp(S - m) <= 1 never overflows
    P = np.exp(S - m)
    P /= P.sum(axis=1, keepdims=True)  # softmax, row by row
    return P @ v  # (Nq, d)


@_register("standard_attention", 2, "O = softmax(Q K^T / sqrt(d)) V in NumPy, stable", _standard_attention_solution)
def _run_standard_attention(answer):
    rng = _rng("standard_attention")

    def qkv(Nq, Nk, d, spread=1.0):
        return tuple(spread * rng.standard_normal(s) for s in ((Nq, d), (Nk, d))) + (rng.standard_normal((Nk, d)),)

    cases = [
        ("Nq = Nk = 4, d = 2", qkv(4, 4, 2)),
        ("Nq = 5, Nk = 3, d = 4", qkv(5, 3, 4)),
        ("one query, one key", qkv(1, 1, 3)),
        ("Nq = 3, Nk = 7, d = 8, scores near +-1000 (exp overflows unless you subtract the row max)",
         qkv(3, 7, 8, 30.0)),
    ]
    return _compare(cases, answer, _standard_attention_solution)


# ============================================================================= lesson 3: online softmax


def _online_softmax_solution(m, l, x_j):
    m_t = float(np.max(x_j))  # max of this block
    m_new = max(m, m_t)  # the running max after this block
    if m_new == -math.inf:  # everything seen so far is -inf (masked): nothing to add yet
        return m_new, 0.0
    # Rescale the old sum to the new max, then add this block's terms at the new max.
    l_new = math.exp(m - m_new) * l + float(np.sum(np.exp(x_j - m_new)))
    return m_new, l_new


def _blocks_of(x, splits):
    return [b for b in np.split(x, splits) if b.size]


def _online_cases():
    rng = _rng("online_softmax")
    ninf = -math.inf
    rows = [
        ("two blocks", np.array([1.0, 5.0, 2.0, 0.5]), [2]),
        ("the max arrives in the last block", np.array([-1.0, 0.0, 0.5, 3.0, 7.0]), [2, 4]),
        ("blocks of one score", rng.standard_normal(6), [1, 2, 3, 4, 5]),
        ("one block holds the whole row", rng.standard_normal(5), []),
        ("random row, uneven blocks", 3 * rng.standard_normal(11), [3, 4, 9]),
        ("scores around 1e4 (exp overflows unless rescaled)", 1e4 + 10 * rng.standard_normal(7), [2, 5]),
        ("a masked (-inf) score inside a block", np.array([0.5, ninf, 2.0, 1.0]), [2]),
        ("the first block fully masked (-inf): m stays -inf, l stays 0, no NaN", np.array([ninf, ninf, 1.0, 3.0]), [2]),
        ("a fully masked row", np.array([ninf, ninf, ninf]), [1]),
    ]
    return [(label, x, _blocks_of(x, s)) for label, x, s in rows]


@_register("online_softmax", 3, "the running (m, l) update for one block of scores", _online_softmax_solution)
def _run_online_softmax(answer):
    cases = _online_cases()
    for n, (label, x, blocks) in enumerate(cases, 1):
        m_y, l_y, m_s, l_s = -math.inf, 0.0, -math.inf, 0.0
        where = f"case {n} of {len(cases)} ({label}; row {_fmt(x)}, blocks " + " ".join(_fmt(b) for b in blocks) + ")"
        for step, x_j in enumerate(blocks, 1):
            before = (m_s, l_s)  # both states agree up to here
            try:
                got = answer(m_y, l_y, x_j.copy())
                m_y, l_y = float(got[0]), float(got[1])
            except NotImplementedError:
                raise
            except Exception as exc:
                return len(cases), _Mismatch(f"{where}, step {step}", _fmt(exc), _fmt((m_s, l_s)))
            m_s, l_s = _online_softmax_solution(m_s, l_s, x_j)
            if not _close((m_y, l_y), (m_s, l_s), 1e-9, 1e-300):
                notes = (f"the state before this step was (m, l) = {_fmt(before)}",)
                return len(cases), _Mismatch(
                    f"{where}, step {step} of {len(blocks)} (block {_fmt(x_j)})",
                    f"(m, l) = {_fmt((m_y, l_y))}", f"(m, l) = {_fmt((m_s, l_s))}", notes,
                )
        ref = reference.online_softmax_stats(x, [])  # the whole row at once
        assert _close((m_s, l_s), ref, 1e-12, 1e-300), "the spec disagrees with the reference"
    return len(cases), None


# ============================================================================= lesson 5: the flash forward step


def _flash_rescale_solution(O_i, l_i, m_i, S_ij, V_j):
    m_t = S_ij.max(axis=1)  # line 10: m~_ij = rowmax(S_ij), (Br,)
    m_t_safe = np.where(m_t == -np.inf, 0.0, m_t)  # a fully masked row: exp(-inf - 0) = 0, not NaN
    P_t = np.exp(S_ij - m_t_safe[:, None])  # line 10: P~_ij = exp(S_ij - m~_ij), (Br, Bc)
    l_t = P_t.sum(axis=1)  # line 10: l~_ij = rowsum(P~_ij), (Br,)
    m_new = np.maximum(m_i, m_t)  # line 11: m_new = max(m_i, m~_ij)
    m_new_safe = np.where(m_new == -np.inf, 0.0, m_new)
    a = np.exp(m_i - m_new_safe)  # line 11: e^(m_i - m_new), the old terms' rescale
    b = np.exp(m_t - m_new_safe)  # line 11: e^(m~_ij - m_new), this block's rescale
    l_new = a * l_i + b * l_t  # line 11
    l_div = np.where(l_new > 0, l_new, 1.0)  # l_new = 0 only on a row that has seen no key: O stays 0
    # line 12: O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j)
    O_new = ((l_i * a)[:, None] * O_i + b[:, None] * (P_t @ V_j)) / l_div[:, None]
    return O_new, l_new, m_new  # line 13


def _flash_states(rng, Br, Bc, d, spread=1.0, masked_rows=(), fresh=False, rise=0.0):
    """A consistent state (O_i, l_i, m_i) after one earlier block, and the next S_ij, V_j (``rise`` added
    to the new scores: with rise > spread * 8 every row's maximum moves up in this block)."""
    O_i, l_i, m_i = np.zeros((Br, d)), np.zeros(Br), np.full(Br, -np.inf)
    if not fresh:
        S0 = spread * rng.standard_normal((Br, Bc))
        O_i, l_i, m_i = _flash_rescale_solution(O_i, l_i, m_i, S0, rng.standard_normal((Bc, d)))
    S_ij = spread * rng.standard_normal((Br, Bc)) + rise
    for r in masked_rows:
        S_ij[r] = -np.inf
    return O_i, l_i, m_i, S_ij, rng.standard_normal((Bc, d))


@_register("flash_rescale", 5, "Algorithm 1, lines 10-13: merge one block S_ij, V_j into O_i, l_i, m_i",
           _flash_rescale_solution)
def _run_flash_rescale(answer):
    rng = _rng("flash_rescale")
    cases = [
        ("the first block: O_i = 0, l_i = 0, m_i = -inf; Br = 3, Bc = 4, d = 2",
         _flash_states(rng, 3, 4, 2, fresh=True)),
        ("a later block whose scores are all higher: every row's maximum moves up, so the old l_i and O_i "
         "must shrink by e^(m_i - m_new); Br = 4, Bc = 3, d = 5", _flash_states(rng, 4, 3, 5, rise=10.0)),
        ("a later block; Br = 4, Bc = 3, d = 5", _flash_states(rng, 4, 3, 5)),
        ("a later block with scores near 1e3", _flash_states(rng, 2, 5, 3, spread=300.0)),
        ("row 1 of this block fully masked (-inf)", _flash_states(rng, 3, 4, 2, masked_rows=(1,))),
        ("the first block, row 0 fully masked: O stays 0, l 0, m -inf", _flash_states(rng, 2, 3, 2, (0,), fresh=True)),
    ]
    return _compare(cases, answer, _flash_rescale_solution)


# ============================================================================= lesson 7: the backward pass


def _compute_D_solution(o, do):
    return (do * o).sum(axis=-1)  # D_i = rowsum(dO_i * O_i), (..., N)


@_register("compute_D", 7, "D_i = rowsum(dO_i * O_i)", _compute_D_solution)
def _run_compute_D(answer):
    rng = _rng("compute_D")
    cases = [
        ("N = 4, d = 3", (rng.standard_normal((4, 3)), rng.standard_normal((4, 3)))),
        ("N = 1, d = 5", (rng.standard_normal((1, 5)), rng.standard_normal((1, 5)))),
        ("three heads: (H, N, d) = (3, 5, 2)", (rng.standard_normal((3, 5, 2)), rng.standard_normal((3, 5, 2)))),
    ]
    return _compare(cases, answer, _compute_D_solution)


def _recompute_P_solution(S, L):
    L_safe = np.where(L == -np.inf, 0.0, L)  # a row that saw no key has L = -inf and P = 0
    return np.exp(S - L_safe[:, None])  # P_ij = exp(S_ij - L_i), (Br, Bc)


@_register("recompute_P", 7, "P_ij = exp(S_ij - L_i) from the saved L", _recompute_P_solution)
def _run_recompute_P(answer):
    rng = _rng("recompute_P")

    def case(Nq, Nk, masked_rows=(), causal=False):
        S = rng.standard_normal((Nq, Nk))
        if causal:
            S = np.where(reference.causal_mask(Nq, Nk), S, -np.inf)
        S[list(masked_rows)] = -np.inf
        m = S.max(axis=1)
        m_safe = np.where(m == -np.inf, 0.0, m)
        l = np.exp(S - m_safe[:, None]).sum(axis=1)
        L = np.where(l > 0, m + np.log(np.where(l > 0, l, 1.0)), -np.inf)
        return S, L

    cases = [
        ("Nq = 3, Nk = 4", case(3, 4)),
        ("causal, Nq = Nk = 5 (masked entries are -inf)", case(5, 5, causal=True)),
        ("causal, Nq = 4 > Nk = 2: the first rows see no key, L = -inf", case(4, 2, causal=True)),
    ]
    return _compare(cases, answer, _recompute_P_solution)


# ============================================================================= lesson 8: causal masking


def _causal_skip_solution(i, j, Br, Bc, Nq, Nk):
    last_query = min((i + 1) * Br, Nq) - 1  # the last row of query block i (it may be short)
    first_key = j * Bc  # the first key of key block j
    # Key c is visible to query r iff c <= r + (Nk - Nq): the block's most visible pair is
    # (last_query, first_key); if even that one is masked, they all are.
    return first_key > last_query + (Nk - Nq)


@_register("causal_skip", 8, "True when block (i, j) is wholly above the causal diagonal", _causal_skip_solution)
def _run_causal_skip(answer):
    shapes = [(8, 8, 4, 4), (8, 8, 4, 2), (7, 7, 3, 2), (5, 9, 2, 3), (9, 4, 4, 2), (6, 3, 5, 1), (1, 6, 2, 4)]
    n_cases = 0
    for Nq, Nk, Br, Bc in shapes:
        mask = reference.causal_mask(Nq, Nk)
        Tr, Tc = -(-Nq // Br), -(-Nk // Bc)
        for i in range(Tr):
            for j in range(Tc):
                n_cases += 1
                rows, cols = slice(i * Br, min((i + 1) * Br, Nq)), slice(j * Bc, min((j + 1) * Bc, Nk))
                spec = not mask[rows, cols].any()
                assert spec == _causal_skip_solution(i, j, Br, Bc, Nq, Nk), "the spec disagrees with the mask"
                try:
                    got = answer(i, j, Br, Bc, Nq, Nk)
                except NotImplementedError:
                    raise
                except Exception as exc:
                    got = exc
                if not isinstance(got, BaseException) and _equal(got, spec):
                    continue
                label = (f"block (i, j) = ({i}, {j}) with Nq = {Nq}, Nk = {Nk}, Br = {Br}, Bc = {Bc}: "
                         f"queries {rows.start}..{rows.stop - 1}, keys {cols.start}..{cols.stop - 1}")
                picture = _block_picture(mask, rows, cols)
                return n_cases, _Mismatch(label, _fmt(got), _fmt(spec), (
                    f"visible pairs in this block: {int(mask[rows, cols].sum())} "
                    "(the block is skipped only when there are none)",
                    "the causal mask (rows: queries, columns: keys; this block in upper case):", *picture,
                ))
    return n_cases, None


def _block_picture(mask, rows, cols):
    """The mask as text: 'x' visible, '.' masked; the block in question as 'X' and ':'."""
    lines = []
    for r in range(mask.shape[0]):
        chars = []
        for c in range(mask.shape[1]):
            inside = rows.start <= r < rows.stop and cols.start <= c < cols.stop
            chars.append(("X" if inside else "x") if mask[r, c] else (":" if inside else "."))
        lines.append("    " + "".join(chars))
    return lines


# ============================================================================= lesson 9: FlashAttention-2


def _flash2_update_solution(O_acc, l, m, S_ij, V_j):
    m_new = np.maximum(m, S_ij.max(axis=1))  # running row max, (Br,)
    m_safe = np.where(m_new == -np.inf, 0.0, m_new)  # rows that have seen no key yet: shift by 0
    P_t = np.exp(S_ij - m_safe[:, None])  # (Br, Bc), at the new max
    alpha = np.exp(m - m_safe)  # rescale of everything accumulated so far
    l_new = alpha * l + P_t.sum(axis=1)
    O_new = alpha[:, None] * O_acc + P_t @ V_j  # (Br, d): no division; that waits until the end
    return O_new, l_new, m_new


def flash2_finish(O_acc, l, m):
    """FlashAttention-2's last step: O_i = O_acc / l_i (0 where l_i = 0) and L_i = m_i + log(l_i)."""
    safe = np.where(l > 0, l, 1.0)
    return O_acc / safe[:, None], np.where(l > 0, m + np.log(safe), -np.inf)


@_register("flash2_update", 9, "FlashAttention-2's block step, normalisation delayed", _flash2_update_solution)
def _run_flash2_update(answer):
    rng = _rng("flash2_update")
    cases = []
    for label, (Nq, Nk, d, Bc, spread, causal) in [
        ("Nq = 3, Nk = 8, d = 2, Bc = 3", (3, 8, 2, 3, 1.0, False)),
        ("scores near 1e3", (2, 6, 3, 2, 30.0, False)),
        ("causal, Nq = 5 > Nk = 4, Bc = 2 (row 0 sees no key)", (5, 4, 2, 2, 1.0, True)),
    ]:
        q, k, v = (spread ** (n < 2) * rng.standard_normal(s) for n, s in enumerate(((Nq, d), (Nk, d), (Nk, d))))
        cases.append((label, q, k, v, Bc, causal))
    for n, (label, q, k, v, Bc, causal) in enumerate(cases, 1):
        Nq, d = q.shape
        Nk = k.shape[0]
        S = (q @ k.T) / math.sqrt(d)
        if causal:
            S = np.where(reference.causal_mask(Nq, Nk), S, -np.inf)
        ys = ss = (np.zeros((Nq, d)), np.zeros(Nq), np.full(Nq, -np.inf))
        Tc = -(-Nk // Bc)
        for j in range(Tc):
            cols = slice(j * Bc, min((j + 1) * Bc, Nk))
            where = f"case {n} of {len(cases)} ({label}), step j = {j} of Tc = {Tc}"
            try:
                got = tuple(answer(*_copy(ys + (S[:, cols], v[cols]))))
            except NotImplementedError:
                raise
            except Exception as exc:
                return len(cases), _Mismatch(where, _fmt(exc), "(O_acc, l, m)")
            ss = _flash2_update_solution(*ss, S[:, cols], v[cols])
            if not _close(got, ss, 1e-9, 1e-12):
                notes = ()
                if len(got) == 3:
                    for name, g, s in zip(("O_acc", "l", "m"), got, ss):
                        if not _close(g, s, 1e-9, 1e-12):
                            notes = (f"{name} differs: " + "; ".join(_diff_notes(g, s)),)
                            break
                return len(cases), _Mismatch(
                    where, "(O_acc, l, m) = " + _fmt(got), "(O_acc, l, m) = " + _fmt(ss), notes
                )
            ys = got
        o, lse = flash2_finish(*ss)
        ro, rlse = reference.attention_forward(q, k, v, causal=causal)
        assert _close((o, lse), (ro, rlse), 1e-9, 1e-12), "the spec disagrees with the reference"
    return len(cases), None


# ============================================================================= lesson 12: into a model


def _split_heads_solution(qkv, n_head):
    B, N, C3 = qkv.shape
    d = C3 // (3 * n_head)
    # (B, N, 3C) -> (B, N, 3, H, d) -> (3, B, H, N, d): the channels are [q | k | v], each [head 0 | head 1 | ...]
    q, k, v = qkv.reshape(B, N, 3, n_head, d).transpose(2, 0, 3, 1, 4)
    return q, k, v


@_register("split_heads", 12, "a fused projection (B, N, 3C) as q, k, v of shape (B, H, N, d)", _split_heads_solution)
def _run_split_heads(answer):
    rng = _rng("split_heads")
    cases = [
        (f"B = {B}, N = {N}, C = {C}, H = {H}", (rng.standard_normal((B, N, 3 * C)), H))
        for B, N, C, H in [(1, 4, 2, 1), (2, 5, 4, 2), (2, 3, 12, 4)]
    ]
    n, mismatch = _compare(cases, answer, _split_heads_solution, rtol=0.0, atol=0.0)
    if mismatch is not None and not mismatch.yours.startswith("raised"):
        mismatch.notes += ("a reshape alone keeps the numbers in (B, N) order: move the 3 and H axes in front of N",)
    return n, mismatch
