"""Differential fuzz test: every kernel against the float64 reference, NaN and Inf included (issue #17).

Hypothesis draws a problem (Nq, Nk in 1..24, d in {1, 3, 8, 16}, float16/32/64, causal or not,
one or two query heads sharing the key/value head),
a regime of scores (unit, scores of +-1e4 (1e3 in float16), a tiny or a huge scale, or unit scores but one
key's 1e4 below the others, "underflow"), up to three NaN or Inf entries in q, k, v and up to two rows whose
lse the backward is given as -inf or -1000.
Each kernel must put NaN, +Inf and -Inf where the reference does, in o, lse, dq, dk and dv, and
agree with it elsewhere within 3x the error of attention done in the storage dtype (Dao-AILab's
rule, as tests/test_reliability.py's large-score tests) or the arithmetic's bound, whichever is
larger.  Holding each kernel to the reference's pattern holds them to each other.

Visible entries follow IEEE arithmetic (docs/RELIABILITY.md, section 2): a visible entry whose probability is
exactly 0 still multiplies its operands, so 0 * Inf = NaN.  The draws reach it two ways: an infinite k_j
(+-Inf in k) makes S_ij = -inf on the rows whose q_i has the other sign there, and the "underflow" regime gives
one key j a score 1e4 below the others (P_ij = 0 in float64 too) and puts a NaN or an Inf in v_j.  Not drawn:
an lse edited on a row that sees exactly one key (see ``problems``), where dS = Inf * (rounding noise) is
+-Inf or NaN by the last bit.

flash_decode (``attention_decode``) is drawn the same way against ``decode_reference``: ragged lengths (0 included),
contiguous or paged caches, grouped heads, causal new tokens, one to three splits, on both split kernels.

Examples per kernel: ``FLASH_NUMBA_FUZZ_EXAMPLES`` (default 3, make test-all 4; derandomized: the same examples
on every machine; each costs a few seconds in the simulator).
"""

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

import test_kernels as matrix  # tests/ is on sys.path (pytest's default rootdir import)
import test_reliability as rel
import test_reference as reference_tests
import test_standard as standard_tests
import flash_numba as fn
from flash_numba import _inputs, _switches, kernels, reference

EXAMPLES = int(os.environ.get("FLASH_NUMBA_FUZZ_EXAMPLES", "3"))  # make test-all sets 4
#: (kernel, deterministic): every kernel, and flash2_fast's atomic backward
VARIANTS = [(k, True) for k in kernels.NAMES] + [(k, False) for k in kernels.NAMES if kernels.get(k).supports_atomic]
#: regime -> (entries of q and k about this size, scale as a function of d and dtype); scores O(1)
#: except "large", whose scores are +-C + O(1) as in tests/test_reliability.py's LARGE
REGIMES = ("unit", "large", "tiny scale", "huge scale", "underflow")
SPECIALS = {"q": (math.nan, math.inf, -math.inf), "k": (math.nan, math.inf, -math.inf),
            "v": (math.nan, math.inf, -math.inf)}


@st.composite
def problems(draw):
    dtype = np.dtype(draw(st.sampled_from(["float16", "float32", "float64"])))
    Nq, Nk = draw(st.integers(1, 24)), draw(st.integers(1, 24))
    d = draw(st.sampled_from([1, 3, 8, 16]))
    causal = draw(st.booleans())
    G = draw(st.sampled_from([1, 2]))  # query heads per key/value head (grouped-query attention)
    regime = draw(st.sampled_from(REGIMES))
    seed = draw(st.integers(0, 2**32 - 1))
    where = st.tuples(st.sampled_from("qkv"), st.integers(0, 23), st.integers(0, 15), st.integers(0, 2))
    specials = draw(st.lists(where, max_size=3))
    low = draw(st.tuples(st.integers(0, 23), st.integers(0, 15), st.integers(0, 2)))  # "underflow": key, v's entry
    lse_edits = draw(st.lists(st.tuples(st.integers(0, 23), st.sampled_from([-math.inf, -1000.0])), max_size=2))

    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal((h, n, d)) for h, n in ((G, Nq), (1, Nk), (1, Nk), (G, Nq)))
    scale = None
    if regime == "large":
        C = 1e3 if dtype == np.float16 else 1e4
        a = math.sqrt(C * math.sqrt(d))  # scale * a^2 = C
        q[..., 0] = a * rng.choice([-1.0, 1.0], (G, Nq))
        k[..., 0] = a
    elif regime == "tiny scale":
        scale = 1e-30
    elif regime == "huge scale":  # small entries (float16 keeps 1e-3), scores O(1)
        size = 1e-3 if dtype == np.float16 else 1e-10
        q, k = q * size, k * size
        scale = 1 / (size * size * math.sqrt(d))
    elif regime == "underflow":  # key j's score -1e4 + O(1), the others O(1): its P is 0 in every dtype, and v_j
        j = low[0] % Nk  # holds a NaN or an Inf
        q[..., 0] = 1.0
        k[..., j, 0] = -1e4 * math.sqrt(d)
        v[..., j, low[1] % d] = SPECIALS["v"][low[2]]
    arrays = {"q": q, "k": k, "v": v}
    for name, row, col, kind in specials:
        x = arrays[name]
        x[-1, row % x.shape[1], col % d] = SPECIALS[name][kind % len(SPECIALS[name])]  # q: the group's last head
    q, k, v, do = (x.astype(dtype) for x in (q, k, v, do))
    # a row that sees one key has o = v_j and dP - D = 0 up to rounding: with P = +Inf from the edited L,
    # dS = Inf * (rounding noise) is +-Inf or NaN by the last bit, so such rows keep their L
    n_seen = reference.causal_mask(Nq, Nk).sum(axis=1) if causal else np.full(Nq, Nk)
    lse_edits = [(r % Nq, x) for r, x in lse_edits if n_seen[r % Nq] != 1]
    return dict(q=q, k=k, v=v, do=do, causal=causal, scale=scale, lse_edits=lse_edits)


def tolerance(got_plain, want, dtype, Nk, d, s_max):
    """3x the error of attention done in ``dtype`` (over the entries finite in both), at least the
    arithmetic's bound: tests/test_standard.py's ``_tol`` in the storage dtype, plus the error of an
    exponent S - L that the kernel rounds (S a length-d sum, the scale, L) and the reference, given
    the kernel's L, does not: 4 u (d + 3) max|S| in the accumulation dtype (P = 1 exactly in plain
    attention with one key, so 3x its error may be 0)."""
    plain, want = np.asarray(got_plain, np.float64), np.asarray(want, np.float64)
    fin = np.isfinite(plain) & np.isfinite(want)
    err = standard_tests._rel(plain[fin], want[fin]) if fin.any() else 0.0
    u = np.finfo(_inputs.acc_dtype(dtype)).eps / 2
    return max(3 * err, standard_tests._tol(dtype, Nk, d) + 4 * u * (d + 3) * s_max)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("kernel, deterministic", [pytest.param(*x, id=f"{x[0]}{'' if x[1] else '-atomic'}")
                                                   for x in VARIANTS])
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.too_slow])  # no shrinking
@given(problem=problems())
def test_every_kernel_matches_the_reference_nan_and_inf_included(kernel, deterministic, problem):
    """A problem in a dtype the kernel does not run is not drawn for it; a head dim it does not run is padded with
    zero columns to the next it runs (:func:`test_kernels.dim`: the same scores at the drawn d's scale, o and the
    gradients zero there).  A kernel that lacks masked_nonfinite (flash2_tc) is held where no masked Inf or NaN
    operand reaches (:func:`test_kernels.masked_reach`)."""
    q, k, v, do, causal, scale = (problem[x] for x in ("q", "k", "v", "do", "causal", "scale"))
    spec = kernels.get(kernel)
    assume(q.dtype.name in spec.dtypes)
    d_run = matrix.dim(kernel, q.dtype.name, q.shape[-1])
    if d_run != q.shape[-1]:
        scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        q, k, v, do = (np.pad(x, ((0, 0), (0, 0), (0, d_run - x.shape[-1]))) for x in (q, k, v, do))
    dtype, Nk, d = q.dtype, k.shape[-2], q.shape[-1]
    reach = matrix.masked_reach(tuple(x.astype(np.float64) for x in (q, k, v, do)), causal,
                                not spec.has("masked_nonfinite"))
    kw = dict(causal=causal, scale=scale)
    S = np.abs(reference._scores(q.astype(np.float64), k.astype(np.float64), 1 / math.sqrt(d) if scale is None
                                 else scale, False))
    s_max = S[np.isfinite(S)].max(initial=0.0)
    f = rel.forward(kernel, q, k, v, **kw)
    o_ref, lse_ref = reference.attention_forward(q, k, v, **kw)
    plain_o, plain_lse = rel.plain_forward(q, k, v, causal=causal, dtype=dtype, scale=scale)
    held = ~reach[0]
    matrix.assert_like_reference(np.asarray(f.o)[held], o_ref[held], tolerance(plain_o[held], o_ref[held], dtype, Nk,
                                                                               d, s_max), "o")
    matrix.assert_like_reference(f.lse, lse_ref, tolerance(plain_lse, lse_ref, dtype, Nk, d, s_max), "lse")

    lse, lse_ref = np.array(f.lse), np.array(lse_ref)
    for row, value in problem["lse_edits"]:
        lse[-1, row] = lse_ref[-1, row] = value
    b = rel.backward(kernel, q, k, v, f.o, lse, do, deterministic=deterministic, **kw)
    want = reference.attention_backward(q, k, v, o_ref, lse_ref, do, **kw)  # as test_large_scores_backward
    plain = [x if x.shape[0] == ref.shape[0] else x.sum(axis=0, keepdims=True)  # dk, dv summed over the group
             for x, ref in zip(rel.plain_backward(q, k, v, do, causal=causal, dtype=dtype, scale=scale), want)]
    finite = (np.where(np.isfinite(x), x, 0).astype(np.float64) for x in (q, k, v, do))
    sizes = reference_tests.grad_sizes(*finite, scale)  # dS = P (dP - D) cancels: dq, dk are relative to these
    for name, got, base, ref, size, out in zip(("dq", "dk", "dv"), (b.dq, b.dk, b.dv), plain, want, sizes, reach[1:]):
        got, base, ref = np.asarray(got)[~out], np.asarray(base)[~out], ref[~out]
        matrix.assert_like_reference(got, ref, tolerance(base, ref, dtype, Nk, d, s_max), name, size)


#: flash_decode's split kernels (both paths, ``_switches.DECODE_PATH``): the tensor-core one in float16 and bfloat16,
#: the CUDA-core one in float16 and float32
DECODE_PATHS = [("float16", "tc"), ("bfloat16", "tc"), ("float16", "cuda"), ("float32", "cuda")]


@st.composite
def decode_problems(draw):
    """A decoding step: B = 1 or 2 sequences of lengths 0..24 (a contiguous cache or shuffled pages of 1..8 keys),
    Hkv = 1 or 2 KV heads with G = 1, 2 or 4 query heads each, Nq = 1..4 new tokens (causal or not), d = 16, 1..3
    splits; the regimes and the NaN/Inf entries of :func:`problems` (q, k and v of any head, token or key)."""
    B, Hkv, G, Nq = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 4])), \
        draw(st.integers(1, 4))
    lengths = tuple(draw(st.lists(st.integers(0, 24), min_size=B, max_size=B)))
    page_size = draw(st.sampled_from([None, 1, 3, 8]))
    causal, splits = draw(st.booleans()), draw(st.integers(1, 3))
    regime = draw(st.sampled_from(("unit", "large", "underflow")))
    seed = draw(st.integers(0, 2**32 - 1))
    where = st.tuples(st.sampled_from("qkv"), st.integers(0, 63), st.integers(0, 15), st.integers(0, 2))
    specials = draw(st.lists(where, max_size=3))
    low = draw(st.tuples(st.integers(0, 23), st.integers(0, 15), st.integers(0, 2)))
    return dict(B=B, Hkv=Hkv, G=G, Nq=Nq, lengths=lengths, page_size=page_size, causal=causal, splits=splits,
                regime=regime, seed=seed, specials=specials, low=low)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype, path", DECODE_PATHS, ids=[f"{d}-{p}" for d, p in DECODE_PATHS])
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate],  # monkeypatch sets one path for all examples of a test
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(problem=decode_problems())
def test_flash_decode_matches_the_reference_nan_and_inf_included(monkeypatch, dtype, path, problem):
    """flash_decode (``attention_decode``) against :func:`flash_numba.reference.decode_reference`: NaN, +Inf and
    -Inf exactly where it has them, in o and lse (docs/RELIABILITY.md, section 2: a masked key adds nothing, a visible
    one multiplies, a row of -inf scores is NaN, a row that sees no key 0 and -inf); finite values within the
    arithmetic's bound (tests/test_decode.py's ``tolerance``); counted bytes equal to the IO model."""
    import test_decode as dec

    p = problem
    d, Hq = 16, p["Hkv"] * p["G"]
    monkeypatch.setattr(_switches, "DECODE_PATH", path)
    rng = np.random.default_rng(p["seed"])
    q, k, v, seqlens, table = dec.make(rng, p["B"], Hq, p["Hkv"], p["Nq"], d, p["lengths"], np.float64,
                                       p["page_size"])
    if p["regime"] == "large":  # scores +-1e3 (float16) or +-1e4 + O(1): the online rescale
        C = 1e3 if dtype == "float16" else 1e4
        a = math.sqrt(C * math.sqrt(d))
        q[..., 0] = a * rng.choice([-1.0, 1.0], q.shape[:-1])
        k[..., 0] = np.where(np.isnan(k[..., 0]), np.nan, a)  # a paged cache's spare pages stay NaN
    elif p["regime"] == "underflow":  # one key's score -1e4 + O(1) on every row (P = 0), and v there NaN or Inf
        q[..., 0] = 1.0
        k[..., p["low"][0] % k.shape[2], 0] = -1e4 * math.sqrt(d)
        v[..., p["low"][0] % k.shape[2], p["low"][1] % d] = SPECIALS["v"][p["low"][2]]
    for name, at, col, kind in p["specials"]:  # at: (sequence or page, head, token or key) flattened
        x = {"q": q, "k": k, "v": v}[name]
        lead = x.reshape(-1, d)
        lead[at % lead.shape[0], col % d] = SPECIALS[name][kind]
    q, k, v = (x.astype(np.float32 if dtype == "bfloat16" else dtype) for x in (q, k, v))
    q, k, v = dec.as_words(dtype, q, k, v)
    qf, kf, vf = (dec.as_float(dtype, x).astype(np.float64) for x in (q, k, v))
    o_ref, lse_ref = reference.decode_reference(qf, kf, vf, seqlens, table, causal=p["causal"])
    key = "bfloat16" if dtype == "bfloat16" else np.dtype(dtype).type
    tol = dec.tolerance(key, np.nan_to_num(o_ref), *(np.where(np.isfinite(x), x, 0) for x in (qf, kf, vf)),
                        max(p["lengths"]), d, 1 / math.sqrt(d), path)
    r = fn.attention_decode(q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=p["splits"],
                            causal=p["causal"], count_hbm=True)
    dec.assert_like_reference(dec.as_float(dtype, r.o).astype(np.float64), np.asarray(r.lse, np.float64), o_ref,
                              lse_ref, tol)
    assert r.hbm == dec.model_of(r, q, k, seqlens, table, p["causal"], "bfloat16" if dtype == "bfloat16" else "")
