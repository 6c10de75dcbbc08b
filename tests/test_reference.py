"""Tests of the float64 NumPy reference (flash_numba.reference), the ground truth of every kernel test.

All NumPy, no kernels.  Any floating-point warning (an exp(-inf - (-inf)) or a
log(0) slipping through) fails the test.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_numba import reference as ref

pytestmark = pytest.mark.filterwarnings("error")


# --------------------------------------------------------------------------- helpers


def rand(rng, shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def qkv(rng, lead, Nq, Nk, d):
    return rand(rng, lead + (Nq, d)), rand(rng, lead + (Nk, d)), rand(rng, lead + (Nk, d))


def assert_close(a, b, rtol, size=0.0):
    """Same shape, same -inf entries, finite elsewhere, max|a - b| <= rtol * max(max|b|, size).

    ``size`` is the magnitude of the terms that sum to ``b`` where they may cancel (see grad_sizes);
    with size = 0 and b all 0, a must be exactly 0.
    """
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape
    np.testing.assert_array_equal(a == -np.inf, b == -np.inf)
    fin = b != -np.inf
    assert np.isfinite(a[fin]).all() and np.isfinite(b[fin]).all()
    if fin.any():
        err, size = np.abs(a[fin] - b[fin]).max(), max(np.abs(b[fin]).max(), size)
        assert err <= rtol * size, f"max abs error {err:.3e} > {rtol:.0e} * {size:.3e}"


def direct_attention(q, k, v, causal, scale):
    """Row by row over the visible keys only (no -inf masking), logsumexp by hand; shapes (N, d)."""
    Nq, Nk = q.shape[0], k.shape[0]
    o, lse = np.zeros(q.shape), np.zeros(Nq)
    for i in range(Nq):
        keys = [j for j in range(Nk) if not causal or j - (Nk - Nq) <= i]
        if not keys:
            lse[i] = -np.inf
            continue
        s = [scale * math.fsum(q[i] * k[j]) for j in keys]
        top = max(s)
        lse[i] = top + math.log(math.fsum(math.exp(x - top) for x in s))
        for x, j in zip(s, keys):
            o[i] += math.exp(x - lse[i]) * v[j]
    return o, lse


def per_head(fn, *arrays):
    """Apply an (N, d) function to every head of (..., N, d) arrays; stack the results."""
    lead = arrays[0].shape[:-2]
    outs = [fn(*(a[idx] for a in arrays)) for idx in np.ndindex(*lead)]
    return [np.stack([out[n] for out in outs]).reshape(lead + outs[0][n].shape) for n in range(len(outs[0]))]


def grad_sizes(q, k, v, do, scale=None):
    """Term sizes of dq, dk, dv.  dS = P * (dP - D) cancels when P is nearly one-hot, leaving dq and dk
    near 0 with rounding of order eps * scale * |dP| * |K| (resp. |Q|); dv = P^T dO does not cancel."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    dP = np.abs(do @ v.swapaxes(-1, -2)).max()
    return scale * dP * np.abs(k).max(), scale * dP * np.abs(q).max(), 0.0


def assert_grads_close(got, want, rtol, q, k, v, do, scale=None):
    for g, w, size in zip(got, want, grad_sizes(q, k, v, do, scale)):
        assert_close(g, w, rtol, size)


SHAPES = [(1, 1), (5, 5), (7, 4), (4, 7), (17, 9), (9, 17)]  # (Nq, Nk)


# --------------------------------------------------------------------------- causal mask


@pytest.mark.parametrize("Nq,Nk", SHAPES + [(3, 1), (1, 3)])
def test_causal_mask_is_bottom_right_aligned(Nq, Nk):
    mask = ref.causal_mask(Nq, Nk)
    assert mask.shape == (Nq, Nk) and mask.dtype == bool
    # Row i sees a prefix of the keys, of length i + 1 + (Nk - Nq) clipped to [0, Nk].
    visible = np.clip(np.arange(Nq) + 1 + Nk - Nq, 0, Nk)
    for i in range(Nq):
        np.testing.assert_array_equal(mask[i], np.arange(Nk) < visible[i])
    assert mask[-1].all()  # the last query sees every key
    if Nq == Nk:
        np.testing.assert_array_equal(mask, np.tril(np.ones((Nq, Nq), bool)))


# --------------------------------------------------------------------------- forward


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq,Nk", SHAPES)
@pytest.mark.parametrize("lead", [(), (2,), (2, 3)])
def test_forward_matches_direct_formula(rng, lead, Nq, Nk, causal):
    d = 5
    q, k, v = qkv(rng, lead, Nq, Nk, d)
    o, lse = ref.attention_forward(q, k, v, causal=causal)
    assert o.shape == lead + (Nq, d) and lse.shape == lead + (Nq,)
    assert o.dtype == lse.dtype == np.float64
    o_want, lse_want = per_head(lambda q, k, v: direct_attention(q, k, v, causal, 1 / math.sqrt(d)), q, k, v)
    assert_close(o, o_want, 1e-13)
    assert_close(lse, lse_want, 1e-13)


def test_forward_explicit_scale(rng):
    q, k, v = qkv(rng, (), 6, 8, 4)
    o, lse = ref.attention_forward(q, k, v, scale=0.3)
    o_want, lse_want = direct_attention(q, k, v, False, 0.3)
    assert_close(o, o_want, 1e-13)
    assert_close(lse, lse_want, 1e-13)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_forward_computes_in_float64(rng, dtype):
    q, k, v = (x.astype(dtype) for x in qkv(rng, (2,), 6, 6, 4))
    o, lse = ref.attention_forward(q, k, v)
    assert o.dtype == lse.dtype == np.float64
    o_want, lse_want = ref.attention_forward(*(x.astype(np.float64) for x in (q, k, v)))
    np.testing.assert_array_equal(o, o_want)
    np.testing.assert_array_equal(lse, lse_want)


@pytest.mark.parametrize("Nq,Nk", [(5, 2), (9, 4), (3, 1)])
def test_fully_masked_rows_give_zero_and_minus_inf(rng, Nq, Nk):
    q, k, v = qkv(rng, (2,), Nq, Nk, 3)
    dead = Nq - Nk  # rows 0 .. Nq-Nk-1 see no key
    results = [ref.attention_forward(q, k, v, causal=True)]
    results += [ref.flash_forward_tiled(q, k, v, Br=Br, Bc=Bc, causal=True) for Br, Bc in [(1, 1), (2, 3), (4, 1)]]
    for o, lse in results:
        assert (o[:, :dead] == 0).all() and (lse[:, :dead] == -np.inf).all()
        assert np.isfinite(o[:, dead:]).all() and np.isfinite(lse[:, dead:]).all()
    o, lse = results[0]
    do = rand(rng, o.shape)
    for dq, dk, dv in [
        ref.attention_backward(q, k, v, o, lse, do, causal=True),
        ref.flash_backward_tiled(q, k, v, o, lse, do, Br=2, Bc=1, causal=True),
    ]:
        assert (dq[:, :dead] == 0).all()
        assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    assert (ref.plain_attention(q, k, v, causal=True)[:, :dead] == 0).all()


# --------------------------------------------------------------------------- tiled mirrors


BLOCKS = [(1, 1), (1, 4), (4, 1), (2, 3), (3, 2), (4, 4), (5, 7), (16, 16), (32, 8)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq,Nk", SHAPES + [(13, 13)])
@pytest.mark.parametrize("Br,Bc", BLOCKS)
def test_tiled_forward_equals_plain(rng, Br, Bc, Nq, Nk, causal):
    q, k, v = qkv(rng, (2,), Nq, Nk, 4)
    o, lse = ref.attention_forward(q, k, v, causal=causal)
    o_t, lse_t = ref.flash_forward_tiled(q, k, v, Br=Br, Bc=Bc, causal=causal)
    assert_close(o_t, o, 1e-12)
    assert_close(lse_t, lse, 1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq,Nk", SHAPES + [(13, 13)])
@pytest.mark.parametrize("Br,Bc", BLOCKS)
def test_tiled_backward_equals_plain(rng, Br, Bc, Nq, Nk, causal):
    q, k, v = qkv(rng, (2,), Nq, Nk, 4)
    o, lse = ref.attention_forward(q, k, v, causal=causal)
    do = rand(rng, o.shape)
    want = ref.attention_backward(q, k, v, o, lse, do, causal=causal)
    got = ref.flash_backward_tiled(q, k, v, o, lse, do, Br=Br, Bc=Bc, causal=causal)
    assert_grads_close(got, want, 1e-12, q, k, v, do)


def test_tiled_accepts_all_ranks(rng):
    q, k, v = qkv(rng, (2, 3), 7, 5, 4)
    o, lse = ref.attention_forward(q, k, v, causal=True)
    do = rand(rng, o.shape)
    grads = ref.attention_backward(q, k, v, o, lse, do, causal=True)
    o1, lse1 = ref.flash_forward_tiled(q[0, 1], k[0, 1], v[0, 1], Br=3, Bc=2, causal=True)
    assert_close(o1, o[0, 1], 1e-12)
    assert_close(lse1, lse[0, 1], 1e-12)
    g3 = ref.flash_backward_tiled(q[1], k[1], v[1], o[1], lse[1], do[1], Br=3, Bc=2, causal=True)
    assert_grads_close(g3, [g[1] for g in grads], 1e-12, q, k, v, do)


@pytest.mark.parametrize("Br,Bc", [(0, 2), (2, 0), (1.5, 2)])
def test_tiled_rejects_bad_blocks(rng, Br, Bc):
    q, k, v = qkv(rng, (), 4, 4, 2)
    with pytest.raises(ValueError):
        ref.flash_forward_tiled(q, k, v, Br=Br, Bc=Bc)


# --------------------------------------------------------------------------- backward


def loss(q, k, v, do, causal, scale):
    return float(np.sum(do * ref.attention_forward(q, k, v, causal=causal, scale=scale)[0]))


def finite_differences(q, k, v, do, causal, scale, h=1e-6):
    grads = []
    for x in (q, k, v):
        g = np.zeros_like(x)
        for idx in np.ndindex(*x.shape):
            x0 = x[idx]
            x[idx] = x0 + h
            up = loss(q, k, v, do, causal, scale)
            x[idx] = x0 - h
            down = loss(q, k, v, do, causal, scale)
            x[idx] = x0
            g[idx] = (up - down) / (2 * h)
        grads.append(g)
    return grads


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq,Nk", [(1, 1), (4, 4), (5, 3), (3, 6)])
@pytest.mark.parametrize("scale", [None, 0.7])
def test_backward_matches_finite_differences(rng, Nq, Nk, causal, scale):
    q, k, v = qkv(rng, (2,), Nq, Nk, 3)
    o, lse = ref.attention_forward(q, k, v, causal=causal, scale=scale)
    do = rand(rng, o.shape)
    want = finite_differences(q, k, v, do, causal, scale)
    for got in (
        ref.attention_backward(q, k, v, o, lse, do, causal=causal, scale=scale),
        ref.flash_backward_tiled(q, k, v, o, lse, do, Br=2, Bc=2, causal=causal, scale=scale),
    ):
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            assert g.shape == w.shape and g.dtype == np.float64
            assert np.abs(g - w).max() <= 1e-7 * max(np.abs(w).max(), 1.0), name


# --------------------------------------------------------------------------- online softmax (hypothesis)


scores = st.one_of(
    st.floats(min_value=-1e4, max_value=1e4, allow_nan=False),
    st.just(-math.inf),  # a masked score
)


@st.composite
def row_and_splits(draw):
    x = draw(st.lists(scores, min_size=1, max_size=64))
    splits = sorted(draw(st.lists(st.integers(0, len(x)), max_size=len(x) + 2)))
    return np.array(x), splits


def full_softmax_stats(x):
    m = float(np.max(x))
    if m == -math.inf:
        return m, 0.0
    return m, math.fsum(math.exp(t - m) for t in x)


@settings(max_examples=300, deadline=None)
@given(row_and_splits())
def test_online_softmax_stats_equal_full(case):
    x, splits = case
    m, l = ref.online_softmax_stats(x, splits)
    m_want, l_want = full_softmax_stats(x)
    assert m == m_want
    assert abs(l - l_want) <= 1e-12 * l_want


@pytest.mark.parametrize("x", [[3.0, -1e4, 1e4, 5.0, 1e4 - 1], [-math.inf, 2.0, -math.inf], [-math.inf] * 3, [7.0]])
def test_online_softmax_blocks_of_one(x):
    m, l = ref.online_softmax_stats(x, list(range(1, len(x))))
    m_want, l_want = full_softmax_stats(np.array(x))
    assert m == m_want
    assert abs(l - l_want) <= 1e-12 * l_want


@settings(max_examples=150, deadline=None)
@given(
    Nq=st.integers(1, 24),
    Nk=st.integers(1, 24),
    d=st.integers(1, 8),
    Br=st.integers(1, 30),
    Bc=st.integers(1, 30),
    causal=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_tiled_random_blocks_equal_plain(Nq, Nk, d, Br, Bc, causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, (1,), Nq, Nk, d)
    o, lse = ref.attention_forward(q, k, v, causal=causal)
    o_t, lse_t = ref.flash_forward_tiled(q, k, v, Br=Br, Bc=Bc, causal=causal)
    assert_close(o_t, o, 1e-12)
    assert_close(lse_t, lse, 1e-12)
    do = rand(rng, o.shape)
    want = ref.attention_backward(q, k, v, o, lse, do, causal=causal)
    got = ref.flash_backward_tiled(q, k, v, o, lse, do, Br=Br, Bc=Bc, causal=causal)
    assert_grads_close(got, want, 1e-12, q, k, v, do)


# --------------------------------------------------------------------------- plain_attention (the float16 baseline)


@pytest.mark.parametrize("causal", [False, True])
def test_plain_attention_error_magnitudes(rng, causal):
    q, k, v = qkv(rng, (2,), 64, 48, 32)
    o, _ = ref.attention_forward(q, k, v, causal=causal)
    o16 = ref.plain_attention(q, k, v, causal=causal)
    o32 = ref.plain_attention(q, k, v, causal=causal, dtype=np.float32)
    o64 = ref.plain_attention(q, k, v, causal=causal, dtype=np.float64)
    assert (o16.dtype, o32.dtype, o64.dtype) == (np.float16, np.float32, np.float64)
    err16, err32 = np.abs(o16 - o).max(), np.abs(o32 - o).max()
    # float16 keeps 11 bits (unit roundoff 4.9e-4) and |o| < ~1.5 here: about 1e-3 of error, not 1e-2.
    assert 1e-4 < err16 < 1e-2
    # float32 (unit roundoff 6e-8): a few 1e-7, more than three orders below float16.
    assert 1e-8 < err32 < 5e-6 and err16 > 1000 * err32
    assert_close(o64, o, 1e-14)


def test_plain_attention_rounds_inputs_to_dtype(rng):
    q, k, v = qkv(rng, (), 16, 16, 8)
    from_64 = ref.plain_attention(q, k, v)
    from_16 = ref.plain_attention(*(x.astype(np.float16) for x in (q, k, v)))
    np.testing.assert_array_equal(from_64, from_16)


# --------------------------------------------------------------------------- large scores


@pytest.mark.parametrize("causal", [False, True])
def test_large_scores_are_exact(rng, causal):
    # scale = 1: S = q k^T has entries of size ~1e3, and in each row the max beats the next
    # score by >= 100, so exp(-100) = 4e-44 vanishes against 1: l = 1, lse = max, o = v[argmax] exactly.
    q = np.array([[10.0, 0.0], [-10.0, 0.0], [30.0, 0.0], [-5.0, 0.0]])
    k = np.array([[100.0, 0.0], [50.0, 0.0], [-80.0, 0.0], [20.0, 0.0], [-60.0, 0.0]])
    v = rand(rng, (5, 2))
    S = q @ k.T
    if causal:
        S = np.where(ref.causal_mask(4, 5), S, -np.inf)
    best = S.argmax(axis=1)
    top = S.max(axis=1)
    gaps = top - np.sort(S, axis=1)[:, -2]
    assert (gaps >= 100).all() and np.abs(top).max() >= 1e3
    for o, lse in [
        ref.attention_forward(q, k, v, causal=causal, scale=1.0),
        ref.flash_forward_tiled(q, k, v, Br=1, Bc=1, causal=causal, scale=1.0),
        ref.flash_forward_tiled(q, k, v, Br=3, Bc=2, causal=causal, scale=1.0),
    ]:
        np.testing.assert_array_equal(lse, top)
        np.testing.assert_array_equal(o, v[best])


@pytest.mark.parametrize("causal", [False, True])
def test_large_random_scores_stay_finite(rng, causal):
    q, k, v = qkv(rng, (2,), 9, 11, 4)
    q, k = 40 * q, 40 * k  # scores of size ~1e3 with scale = 1/2
    o, lse = ref.attention_forward(q, k, v, causal=causal)
    s = np.abs(q @ k.swapaxes(-1, -2) / 2).max()
    assert s > 1e3
    o_want, lse_want = per_head(lambda q, k, v: direct_attention(q, k, v, causal, 0.5), q, k, v)
    assert_close(o, o_want, 1e-12)
    assert_close(lse, lse_want, 1e-13)
    o_t, lse_t = ref.flash_forward_tiled(q, k, v, Br=3, Bc=4, causal=causal)
    assert_close(o_t, o, 1e-12)
    assert_close(lse_t, lse, 1e-12)
    do = rand(rng, o.shape)
    grads = ref.attention_backward(q, k, v, o, lse, do, causal=causal)
    assert all(np.isfinite(g).all() for g in grads)
    got = ref.flash_backward_tiled(q, k, v, o, lse, do, Br=2, Bc=5, causal=causal)
    assert_grads_close(got, grads, 1e-12, q, k, v, do)
