"""The test matrix: the checks every kernel must pass, once for each kernel and each storage dtype it runs.

Every check below runs for every spec in :data:`flash_numba.kernels.NAMES` and every dtype in its
``dtypes`` (a kernel appended to NAMES gets the whole matrix; ``make test`` runs each check once per kernel, in
float32 or the kernel's first dtype, but the values against float64 (at two of its shapes) and the large scores in
every dtype; ``make test-all`` all of it: :func:`matrix`); a check that needs a feature runs
where the spec does not list it in ``lacks`` (``KernelSpec.has``; a kernel that lacks ``masked_nonfinite``,
flash2_tc, is held to the reference on what no masked Inf or NaN reaches: :func:`check_like_reference`).  Each
check runs its head dim or the smallest above it that the kernel runs (:func:`dim`: flash2_tc's multiples of 16),
and a block that both passes take (:func:`small_block`).  Per-kernel files keep only the
kernel's own rules (its block choice, its IO model's closed form, its variants).

What a result is held to, against the float64 reference computed from the same (rounded) inputs:

* **float32, float64**: ``max |x - ref| / max(max |ref|, 1) <= floor``, the arithmetic's bound
  ``floor = 4 u (d + Nk + 8)`` (u the unit roundoff of the accumulation dtype: a dot product of n terms
  is off by at most about n u; O and the gradients chain a length-d product, the exp and a length-Nk
  product).
* **float16, bfloat16**: Dao-AILab's rule, the error at most ``DAO`` times that of a plain
  implementation done and rounded in the same dtype (:func:`plain`), plus the floor of the float32
  accumulation and the output's own rounding (u; on a handful of outputs the plain error can be a
  lucky fraction of an ulp).  Where there is no plain baseline (grouped, strided, dropout), the floor plus
  ``ROUNDINGS`` roundings to the storage dtype of quantities of size ``max |ref|`` (inputs rounded
  once, P and dS stored at most once each on the way, the output rounded once).

Sizes are the simulator's (N <= 29, d <= 16) and awkward: N = 1, 17, Nq != Nk both ways, blocks that
cut the sequences (``small_block``), causal rows that see no key.  Outputs are poisoned (NaN-filled
before launch, tests/conftest.py), so an element a kernel forgets shows up as NaN.  bfloat16 inputs are
``ml_dtypes.bfloat16`` arrays (flash_numba's host path for bfloat16), compared in float64 from their
uint16 words.
"""

import math

import numpy as np
import pytest

import flash_numba as fn
from conftest import FULL
from flash_numba import _inputs, _switches, iomodel, kernels, reference

DAO = 3  # Dao-AILab's rule: at most ~2x a plain same-precision implementation's error; 3 leaves room for the draw
ROUNDINGS = 4
HALF = ("float16", "bfloat16")

def matrix(feature=None, dtypes=None, every_dtype=False):
    """The (kernel, dtype) pairs that run a check: those whose spec has ``feature``, at ``dtypes`` (None: all).

    ``make test`` runs each kernel in one of them, its float32 (else the first listed: flash2_tc's float16), and
    ``make test-all`` every one (the others are marked ``full``, tests/conftest.py); ``every_dtype``: every one in
    both (the values against float64, where each dtype's own rounding is held to its rule)."""
    pairs = [(name, dtype) for name in kernels.NAMES for dtype in kernels.get(name).dtypes
             if (feature is None or kernels.get(name).has(feature, dtype)) and (dtypes is None or dtype in dtypes)]
    first = {}
    for name, dtype in pairs:
        if name not in first or dtype == "float32":
            first[name] = dtype
    return [pytest.param(name, dtype, id=f"{name}-{dtype}", marks=() if every_dtype or first[name] == dtype else FULL)
            for name, dtype in pairs]


MATRIX = matrix()


# ---------------------------------------------------------------------------------- dtypes and bounds


def unit_roundoff(dtype: str) -> float:
    return {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}[dtype]


def acc_name(dtype: str) -> str:
    """The accumulation dtype: float64 for float64 storage, else float32."""
    return "float64" if dtype == "float64" else "float32"


def floor(dtype: str, Nk: int, d: int) -> float:
    """The accumulation's bound (module docstring)."""
    return 4 * unit_roundoff(acc_name(dtype)) * (d + Nk + 8)


def feature_tol(dtype: str, Nk: int, d: int) -> float:
    """The bound where there is no plain baseline (module docstring)."""
    extra = ROUNDINGS * 2 * unit_roundoff(dtype) if dtype in HALF else 0.0
    return floor(dtype, Nk, d) + extra


def bf16_round(x):
    """float64/float32 values rounded to bfloat16 (nearest even), as float32."""
    words = bf16_words(x)
    return (words.astype(np.uint32) << 16).view(np.float32)


def bf16_words(x):
    """bfloat16 words (uint16) of float values: round to nearest even, NaN kept NaN."""
    x = np.asarray(x, np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    words = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), words)


def stored(x, dtype: str):
    """Float values as a kernel's input in ``dtype`` (bfloat16: an ``ml_dtypes.bfloat16`` array)."""
    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 host arrays are ml_dtypes.bfloat16")
        return bf16_words(x).view(ml_dtypes.bfloat16)
    return np.asarray(x).astype(dtype)


def as64(x, dtype: str | None = None):
    """A result (host or device array) as float64; bfloat16 results from their 16-bit words."""
    x = np.asarray(x.copy_to_host() if hasattr(x, "copy_to_host") else x)
    if dtype == "bfloat16" or x.dtype == np.uint16 or x.dtype.name == "bfloat16":
        return (x.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def err(got, want, dtype=None) -> float:
    """max |got - want| / max(max |want|, 1): relative, absolute where every entry is below 1 (gradients
    that cancel to rounding noise); NaN in ``got`` where ``want`` is finite fails."""
    got, want = as64(got, dtype), np.asarray(want, np.float64)
    fin = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), fin), "non-finite entries where the reference has none"
    if not fin.any():
        return 0.0
    return float(np.abs(got[fin] - want[fin]).max() / max(np.abs(want[fin]).max(), 1.0))


def inputs(rng, dtype, lead, Nq, Nk, d, Hkv=None, spread=1.0):
    """q, k, v, do in ``dtype`` and their float64 values (q and k times ``spread``); ``Hkv``: k and v with
    that many heads (grouped-query attention, lead[-1] query heads)."""
    kv_lead = lead if Hkv is None else lead[:-1] + (Hkv,)
    raw = (spread * rng.standard_normal(lead + (Nq, d)), spread * rng.standard_normal(kv_lead + (Nk, d)),
           rng.standard_normal(kv_lead + (Nk, d)), rng.standard_normal(lead + (Nq, d)))
    xs = tuple(stored(x, dtype) for x in raw)
    return xs, tuple(as64(x, dtype) for x in xs)


def dim(name, dtype, d):
    """The smallest head dim >= ``d`` that the kernel runs in ``dtype`` (its spec's ``supports``): ``d`` itself for
    the CUDA-core kernels, the next multiple of 16 (at least 16) for flash2_tc's tensor cores.  Every test that picks
    a head dim runs this one, and uses it everywhere after (IO models, scales, bounds)."""
    spec = kernels.get(name)
    for x in range(d, 129):
        if spec.supports(x, dtype) is None:
            return x
    raise AssertionError(f"{name} runs no head dim from {d} to 128 in {dtype}")


def storage(dtype: str):
    """The NumPy dtype a kernel stores ``dtype`` in (bfloat16: uint16 words)."""
    return np.dtype(np.uint16 if dtype == "bfloat16" else dtype)


#: Blocks that cut the test sizes (N <= 29) into several: the CUDA-core kernels' small ones first, then those of the
#: tensor-core forwards (Br = 64: four warps of 16 rows; Bc = 16, 32, 64: standard's float16/bfloat16 forward)
SMALL_BLOCKS = ((16, 16), (8, 16), (16, 32), (32, 16), (32, 32), (64, 16), (64, 32), (64, 64))


def small_block(name, d, dtype):
    """The first of :data:`SMALL_BLOCKS` that both passes of the kernel take at head dim ``d``; None where the kernel
    has fixed tiles (``uses_blocks`` False, or each pass takes only its own block, as flash2_tc's: the kernel's
    defaults then, :func:`ran_block`)."""
    spec = kernels.get(name)
    if not spec.uses_blocks:
        return None
    dt = storage(dtype)

    def takes(block, pass_):
        try:
            spec.block(d, dt, pass_, block, budget=fn.device.STATIC_SHARED_LIMIT)
        except ValueError:
            return False
        return True

    for block in SMALL_BLOCKS:
        if takes(block, "forward") and takes(block, "backward"):
            return block
    own = {pass_: spec.block(d, dt, pass_) for pass_ in ("forward", "backward")}
    if all(spec.block_limits(d, dt, pass_) == own[pass_] and not any(takes(b, pass_) for b in SMALL_BLOCKS
                                                                      if b != own[pass_])
           for pass_ in own):
        return None  # fixed tiles: each pass takes its own block only
    raise AssertionError(f"{name} takes none of the small blocks at d = {d}")


def ran_block(name, d, dtype, pass_, block, deterministic=True):
    """The block a pass runs when the call passes ``block``: ``block`` itself, or (None) the kernel's own."""
    return block if block is not None else kernels.get(name).block(d, storage(dtype), pass_,
                                                                    deterministic=deterministic)


def backwards(name):
    """The ``deterministic`` values whose backwards differ: (True, False) with an atomic backward."""
    return (True, False) if kernels.get(name).supports_atomic else (True,)


def _dtype_of(x) -> str:
    """The storage dtype's name of an input (bfloat16 for ml_dtypes' and for flash_numba.as_bfloat16's words)."""
    return _inputs.dtype_name_of(x)


def run(name, q, k, v, do, *, causal=False, block=None, count_hbm=False, deterministic=True, **kw):
    f = fn.attention_forward(q, k, v, kernel=name, causal=causal, block=block, count_hbm=count_hbm, **kw)
    b = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel=name, causal=causal, block=block, count_hbm=count_hbm,
                              deterministic=deterministic, **kw) if kernels.get(name).has("backward", _dtype_of(q)) \
        else None
    return f, b


# ------------------------------------------------------------------------- the plain baseline (Dao's rule)


def _plain_ops(dtype):
    """(work dtype, rounding) of an implementation done and rounded in ``dtype``."""
    if dtype == "bfloat16":
        return np.float32, bf16_round
    return np.dtype(dtype).type, lambda x: x


def plain(q, k, v, do, *, causal, dtype, scale=None):
    """o and (dq, dk, dv) of attention with every operation done and rounded in ``dtype`` (P kept from the
    forward, as autograd keeps it): the baseline of Dao-AILab's rule.  Sums in the storage dtype (float16: NumPy
    sums in float32 and rounds; bfloat16: float32 sums rounded to bfloat16), the same on every machine."""
    W, R = _plain_ops(dtype)
    mm = reference.plain_matmul
    q, k, v, do = (np.asarray(x, np.float64).astype(W) for x in (q, k, v, do))
    s = W(1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    S = R(mm(R(q * s), k.swapaxes(-1, -2)))
    if causal:
        S = np.where(reference.causal_mask(q.shape[-2], k.shape[-2]), S, W(-np.inf))
    m = S.max(axis=-1, keepdims=True)
    P = R(np.exp(R(S - np.where(np.isfinite(m), m, W(0)))))
    l_ = R(P.sum(axis=-1, keepdims=True))
    P = R(P / np.where(l_ > 0, l_, W(1)))
    o = R(mm(P, v))
    dv = R(mm(P.swapaxes(-1, -2), do))
    dS = R(P * R(R(mm(do, v.swapaxes(-1, -2))) - R((do * o).sum(axis=-1, keepdims=True))))
    return o, (R(R(mm(dS, k)) * s), R(R(mm(dS.swapaxes(-1, -2), q)) * s), dv)


def check(got, want, dtype, Nk, d, plain_value=None, what=""):
    """``got`` within the floor (float32, float64) or within Dao's rule against ``plain_value``."""
    e = err(got, want, dtype)
    bound = floor(dtype, Nk, d)
    if dtype in HALF:  # plus the output's own rounding to the storage dtype, which no implementation avoids
        bound = (bound + DAO * err(plain_value, want) + unit_roundoff(dtype) if plain_value is not None
                 else feature_tol(dtype, Nk, d))
    assert e <= bound, f"{what}: error {e:.3g} > {bound:.3g}"


# ------------------------------------------------------------------------------ values against float64

# (lead, Nq, Nk, d, causal): tiles cut by both sequences, Nq < Nk and Nq > Nk (rows that see no key when
# causal), a single query row that sees every key, a single key (one query and one key:
# test_a_single_query_and_key; several heads: the grouped, strided and dropout checks)
SHAPES = [
    ((1,), 17, 17, 8, False),
    ((1, 1), 13, 29, 5, True),
    ((), 29, 11, 4, True),
    ((1,), 1, 9, 4, True),
    ((1,), 9, 1, 4, True),
]


#: Every (kernel, dtype) at the first two shapes (tiles cut by both sequences, causal with Nq < Nk), the kernel's own
#: dtype of the test matrix (:func:`matrix`) at all of them; make test-all every dtype at every shape
VALUE_CASES = [pytest.param(*p.values, *shape, id=f"{p.id}-lead{i}-{'-'.join(map(str, shape[1:]))}",
                            marks=FULL if p.marks and i >= 2 else ())
               for p in matrix() for i, shape in enumerate(SHAPES)]


@pytest.mark.parametrize("name, dtype, lead, Nq, Nk, d, causal", VALUE_CASES)
def test_values_against_float64(rng, name, dtype, lead, Nq, Nk, d, causal):
    """Forward, then every backward from the kernel's own o and lse, against the float64 reference from the
    same inputs; rows that see no key give o = 0, lse = -inf, dq = 0 exactly; nothing left unwritten."""
    spec = kernels.get(name)
    if causal and not spec.has("causal"):
        pytest.skip(f"{name} lacks causal (its spec)")
    assert _switches.POISON_OUTPUTS  # outputs start as NaN: an element never written fails below
    d = dim(name, dtype, d)
    (q, k, v, do), (q64, k64, v64, do64) = inputs(rng, dtype, lead, Nq, Nk, d)
    block = small_block(name, d, dtype)
    f = fn.attention_forward(q, k, v, kernel=name, causal=causal, block=block)
    assert f.kernel == name and f.block == ran_block(name, d, dtype, "forward", block)
    assert f.o.shape == q.shape and f.lse.shape == lead + (Nq,) and f.o.dtype == q.dtype
    assert f.lse.dtype == np.dtype(acc_name(dtype))
    o_ref, lse_ref = reference.attention_forward(q64, k64, v64, causal=causal)
    plain_o, plain_grads = plain(q64, k64, v64, do64, causal=causal, dtype=dtype)
    check(f.o, o_ref, dtype, Nk, d, plain_o, "o")
    blind = np.isneginf(lse_ref)
    assert np.array_equal(np.isneginf(f.lse), blind)
    assert np.all(as64(f.o, dtype)[blind] == 0)
    fin = ~blind
    if fin.any():  # lse in the accumulation dtype: the floor relative to |lse|, plus S stored once in a half dtype
        S = q64 @ k64.swapaxes(-1, -2) / math.sqrt(d)
        bound = floor(dtype, Nk, d) * max(1.0, np.abs(lse_ref[fin]).max())
        bound += 2 * unit_roundoff(dtype) * max(1.0, np.abs(S).max()) if dtype in HALF else 0.0
        assert np.abs(f.lse[fin] - lse_ref[fin]).max() <= bound
    if not spec.has("backward", dtype):
        return
    o_in, lse_in = as64(f.o, dtype), np.asarray(f.lse, np.float64)
    grads_ref = reference.attention_backward(q64, k64, v64, o_in, lse_in, do64, causal=causal)
    for deterministic in backwards(name):
        b = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel=name, causal=causal, block=block,
                                  deterministic=deterministic)
        assert b.kernel == name and b.block == ran_block(name, d, dtype, "backward", block, deterministic)
        for what, g, like, ref, base in zip(("dq", "dk", "dv"), (b.dq, b.dk, b.dv), (q, k, v), grads_ref, plain_grads):
            assert g.shape == like.shape and g.dtype == like.dtype, what
            check(g, ref, dtype, Nk, d, base, f"{what} (deterministic={deterministic})")
        assert np.all(as64(b.dq, dtype)[blind] == 0)


@pytest.mark.parametrize("name, dtype", matrix(every_dtype=True))
def test_large_scores_stay_finite_and_within_the_rule(name, dtype):
    """Scores of +-C + O(1) (rows alternate sign), v ~ 1000: an implementation that exponentiates without
    subtracting the running max overflows.  Dao's rule against the plain implementation in every dtype
    (its scores round alike: C u is not small), float32's C = 1e4, the half dtypes' 1e3 (causal)."""
    half = dtype in HALF
    C, causal, Nq, Nk, d = (1e3, True, 9, 11, 8) if half else (1e4, False, 9, 12, 8)
    d = dim(name, dtype, d)
    if causal and not kernels.get(name).has("causal"):
        causal = False
    rng = np.random.default_rng(6)
    q, k, v, do = (rng.standard_normal((1, n, d)) for n in (Nq, Nk, Nk, Nq))
    a = math.sqrt(C * math.sqrt(d))  # scale * a^2 = C
    q[..., 0] = a * np.where(np.arange(Nq) % 2, 1, -1)
    k[..., 0] = a
    xs = tuple(stored(x, dtype) for x in (q, k, 1000 * v, 1e-3 * do))
    q64, k64, v64, do64 = (as64(x, dtype) for x in xs)
    f, b = run(name, *xs, causal=causal)
    o_ref, lse_ref = reference.attention_forward(q64, k64, v64, causal=causal)
    plain_o, plain_grads = plain(q64, k64, v64, do64, causal=causal, dtype=dtype)
    assert np.isfinite(as64(f.o, dtype)).all() and np.isfinite(f.lse).all()
    assert err(f.o, o_ref, dtype) <= DAO * err(plain_o, o_ref) + 1e-6
    if b is None:
        return
    grads = reference.attention_backward(q64, k64, v64, o_ref, lse_ref, do64, causal=causal)
    for what, g, base, want in zip(("dq", "dk", "dv"), (b.dq, b.dk, b.dv), plain_grads, grads):
        assert np.isfinite(as64(g, dtype)).all(), what
        assert err(g, want, dtype) <= DAO * err(base, want) + 1e-6, what


# ------------------------------------------------------------------ counted bytes, determinism, poisoning


#: make test: the kernel's own dtype, causal where the kernel has it (the grouped-query and dropout checks count
#: non-causal calls); make test-all: both, every dtype
COUNTED_CASES = [pytest.param(*p.values, causal, id=f"{p.id}-{causal}",
                              marks=FULL if p.marks or (not causal and kernels.get(p.values[0]).has("causal")) else ())
                 for p in matrix("count_hbm") for causal in (False, True)]


@pytest.mark.parametrize("name, dtype, causal", COUNTED_CASES)
def test_counted_bytes_equal_the_io_model(rng, name, dtype, causal):
    """Counted bytes == the IO model, launch by launch, for every backward; counting changes no bit of a
    result; repeated calls (deterministic=True) are bitwise identical."""
    spec = kernels.get(name)
    if causal and not spec.has("causal"):
        pytest.skip(f"{name} lacks causal (its spec)")
    BH, Nq, Nk, d = 1, 9, 20, dim(name, dtype, 4)
    (q, k, v, do), _ = inputs(rng, dtype, (BH,), Nq, Nk, d)
    block = small_block(name, d, dtype)
    dt = q.dtype
    for deterministic in backwards(name):
        fc, bc = run(name, q, k, v, do, causal=causal, block=block, count_hbm=True, deterministic=deterministic)
        assert fc.hbm == iomodel.forward(name, BH, Nq, Nk, d, dt, causal, fc.block)
        assert list(fc.hbm.per_kernel) == [n for n in spec.launches("forward") if n in fc.hbm.per_kernel]
        plain_runs = [run(name, q, k, v, do, causal=causal, block=block, deterministic=deterministic)
                      for _ in range(2 if deterministic else 1)]
        for f, b in plain_runs:
            assert f.hbm is None and np.array_equal(f.o, fc.o) and np.array_equal(f.lse, fc.lse)
        if bc is None:
            continue
        assert bc.hbm == iomodel.backward(name, BH, Nq, Nk, d, dt, causal, bc.block, deterministic=deterministic)
        assert set(bc.hbm.per_kernel) <= set(spec.launches("backward", deterministic))
        for f, b in plain_runs[: 2 if deterministic else 0]:  # the atomic backward may round dQ differently
            for x, y in zip((b.dq, b.dk, b.dv), (bc.dq, bc.dk, bc.dv)):
                assert np.array_equal(x, y)


@pytest.mark.parametrize("count", (False, True), ids=("plain", "count"))
@pytest.mark.parametrize("name, dtype", MATRIX)
def test_default_blocks_at_sizes_that_fit_no_block(rng, name, dtype, count):
    """Nq = 13, Nk = 11, d = 7 (count: causal, Nq and Nk swapped), the kernel's own blocks: an index past an
    array's end raises IndexError in the simulator, a forgotten element stays NaN; counts == model."""
    spec = kernels.get(name)
    if count and not (spec.has("count_hbm") and spec.has("causal")):
        pytest.skip(f"{name} lacks count_hbm or causal (its spec)")
    Nq, Nk, causal = (11, 13, True) if count else (13, 11, False)
    d = dim(name, dtype, 7)
    (q, k, v, do), (q64, k64, v64, do64) = inputs(rng, dtype, (1,), Nq, Nk, d)
    f, b = run(name, q, k, v, do, causal=causal, count_hbm=count)
    o_ref, lse_ref = reference.attention_forward(q64, k64, v64, causal=causal)
    plain_o, plain_grads = plain(q64, k64, v64, do64, causal=causal, dtype=dtype)
    check(f.o, o_ref, dtype, Nk, d, plain_o, "o")
    if b is not None:
        grads = reference.attention_backward(q64, k64, v64, o_ref, lse_ref, do64, causal=causal)
        for what, g, ref, base in zip(("dq", "dk", "dv"), (b.dq, b.dk, b.dv), grads, plain_grads):
            check(g, ref, dtype, Nk, d, base, what)
    if count:
        assert f.hbm == iomodel.forward(name, 1, Nq, Nk, d, q.dtype, causal, f.block)
        assert b is None or b.hbm == iomodel.backward(name, 1, Nq, Nk, d, q.dtype, causal, b.block)
    else:
        assert f.hbm is None and (b is None or b.hbm is None)


# ------------------------------------------------------------------------------------- edge values


@pytest.mark.parametrize("name, dtype", MATRIX)
def test_a_single_query_and_key(rng, name, dtype):
    """N = 1: softmax of one score is 1, so o = v, lse = s, dv = do and dq = dk = 0 (up to rounding)."""
    d = dim(name, dtype, 5)
    (q, k, v, do), (q64, k64, v64, do64) = inputs(rng, dtype, (1,), 1, 1, d)
    f, b = run(name, q, k, v, do)
    u = unit_roundoff(dtype)
    np.testing.assert_allclose(as64(f.o, dtype), v64, rtol=2 * u)
    s = float(q64[0, 0] @ k64[0, 0]) / math.sqrt(d)
    tol = floor(dtype, 1, d) + (2 * u * max(1.0, abs(s)) if dtype in HALF else 0.0)  # S stored in a half dtype
    np.testing.assert_allclose(f.lse, [[s]], rtol=tol, atol=tol)
    if b is not None:
        np.testing.assert_allclose(as64(b.dv, dtype), do64, rtol=2 * u)
        size = np.abs(do64).sum() * np.abs(v64).max() * np.abs(k64).max()  # |dS| <= its rounding, times |k|
        assert np.abs(as64(b.dq, dtype)).max() <= 4 * u * size and np.abs(as64(b.dk, dtype)).max() <= 4 * u * size


@pytest.mark.parametrize("name, dtype", MATRIX)
def test_scale_zero_is_uniform_attention(rng, name, dtype):
    """scale = 0: row i attends uniformly to its visible keys: o_i = their mean, lse_i = log(count), dq = dk = 0."""
    causal = kernels.get(name).has("causal")
    Nq, Nk, d = 5, 7, dim(name, dtype, 3)
    (q, k, v, do), (_, _, v64, do64) = inputs(rng, dtype, (1,), Nq, Nk, d)
    f, b = run(name, q, k, v, do, causal=causal, scale=0.0)
    visible = reference.causal_mask(Nq, Nk) if causal else np.ones((Nq, Nk), bool)
    count = visible.sum(axis=1)
    tol = floor(dtype, Nk, d) + 2 * unit_roundoff(dtype)
    np.testing.assert_allclose(as64(f.o, dtype)[0], (visible @ v64[0]) / count[:, None], rtol=tol, atol=tol)
    np.testing.assert_allclose(f.lse[0], np.log(count), rtol=floor(dtype, Nk, d))
    if b is not None:
        assert np.all(as64(b.dq, dtype) == 0) and np.all(as64(b.dk, dtype) == 0)
        np.testing.assert_allclose(as64(b.dv, dtype)[0], (visible / count[:, None]).T @ do64[0], rtol=tol, atol=tol)


# --------------------------------------------------------------------------------- grouped-query attention


# (lead of q, heads of k and v, Nq, Nk, d, causal): G = 2 over a batch of 2 (kv head b Hkv + h // G), a key
# block walking two query blocks of each query head of its group; multi-query with one query row
GQA = [((2, 2), 1, 17, 9, 4, False), ((1, 4), 1, 1, 17, 8, True)]


@pytest.mark.parametrize("lead, Hkv, Nq, Nk, d, causal", GQA)
@pytest.mark.parametrize("name, dtype", matrix("grouped_query"))
def test_grouped_query_attention(rng, name, dtype, lead, Hkv, Nq, Nk, d, causal):
    """Query head h attends with key/value head h // G; dK, dV sum over the group.  Against the float64
    reference, and the counted bytes against the IO model with G."""
    spec = kernels.get(name)
    causal = causal and spec.has("causal")
    d = dim(name, dtype, d)
    (q, k, v, do), (q64, k64, v64, do64) = inputs(rng, dtype, lead, Nq, Nk, d, Hkv=Hkv)
    BH, G, block = int(np.prod(lead)), lead[-1] // Hkv, small_block(name, d, dtype)
    count = spec.has("count_hbm")
    f = fn.attention_forward(q, k, v, kernel=name, causal=causal, block=block, count_hbm=count)
    o_ref, lse_ref = reference.attention_forward(q64, k64, v64, causal=causal)
    check(f.o, o_ref, dtype, Nk, d, what="o")
    assert not count or f.hbm == iomodel.forward(name, BH, Nq, Nk, d, q.dtype, causal, f.block, G=G)
    if not spec.has("backward", dtype):
        return
    grads_ref = reference.attention_backward(q64, k64, v64, as64(f.o, dtype), np.asarray(f.lse, np.float64), do64,
                                             causal=causal)
    for deterministic in backwards(name):
        b = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel=name, causal=causal, block=block, count_hbm=count,
                                  deterministic=deterministic)
        for what, g, ref, like in zip(("dq", "dk", "dv"), (b.dq, b.dk, b.dv), grads_ref, (q, k, v)):
            assert g.shape == like.shape, what
            check(g, ref, dtype, Nk * G, d, what=f"{what} (deterministic={deterministic})")
        if count:
            want = iomodel.backward(name, BH, Nq, Nk, d, q.dtype, causal, b.block, deterministic=deterministic, G=G)
            assert b.hbm == want and b.hbm.terms == want.terms


@pytest.mark.parametrize("name, dtype", matrix("grouped_query", dtypes=HALF))
def test_grouped_query_equals_repeated_kv_in_half_precision(rng, name, dtype):
    """GQA is attention on K and V repeated over each group: O, L and dQ bitwise (the same arithmetic on the
    same values), dK and dV the group sums.  Ours rounds each sum once to the storage dtype (after adding in
    float32), the repeated call rounds every head's term: |diff| <= u (|sum| + sum |term|), plus float32
    rounding of the sum (2^-24 per term, far below).  (float32 and float64 sum the group in their own
    precision, where the order of the additions shows: test_grouped_query_attention holds them.)"""
    causal = kernels.get(name).has("causal")
    lead, Hkv, N, d, G = (1, 2), 1, 9, dim(name, dtype, 4), 2
    (q, k, v, do), _ = inputs(rng, dtype, lead, N, N, d, Hkv=Hkv)
    kr, vr = (np.repeat(x, G, axis=-3) for x in (k, v))
    f = fn.attention_forward(q, k, v, kernel=name, causal=causal)
    fr = fn.attention_forward(q, kr, vr, kernel=name, causal=causal)
    assert np.array_equal(f.o, fr.o) and np.array_equal(f.lse, fr.lse)
    if not kernels.get(name).has("backward", dtype):
        return
    b = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel=name, causal=causal)
    br = fn.attention_backward(q, kr, vr, f.o, f.lse, do, kernel=name, causal=causal)
    assert np.array_equal(b.dq, br.dq)
    for g, gr in ((b.dk, br.dk), (b.dv, br.dv)):
        terms = as64(gr, dtype).reshape(1, Hkv, G, N, d)
        total = terms.sum(axis=2)
        bound = unit_roundoff(dtype) * (np.abs(total) + np.abs(terms).sum(axis=2)) + 1e-6
        assert g.shape == k.shape
        assert np.all(np.abs(as64(g, dtype) - total) <= bound)


# ------------------------------------------------------------------------------------------- dropout


@pytest.mark.parametrize("causal, p", [(False, 0.25), (True, 0.5)])
@pytest.mark.parametrize("name, dtype", matrix("dropout"))
def test_dropout_matches_the_reference_with_the_same_mask(rng, name, dtype, causal, p):
    """Grouped heads where the kernel has them (G = 2: the mask is per query head), Nq = 9, Nk = 20:
    O and L, then every backward, against the reference with the same mask; counted bytes == the IO
    model (no mask in HBM)."""
    spec = kernels.get(name)
    causal = causal and spec.has("causal")
    Hkv = 1 if spec.has("grouped_query") else 2
    lead, Nq, Nk, d, seed = (1, 2), 9, 20, dim(name, dtype, 4), 2024
    (q, k, v, do), (q64, k64, v64, do64) = inputs(rng, dtype, lead, Nq, Nk, d, Hkv=Hkv)
    BH, G, block = 2, 2 // Hkv, small_block(name, d, dtype)
    count = spec.has("count_hbm")
    f = fn.attention_forward(q, k, v, kernel=name, causal=causal, block=block, count_hbm=count, dropout_p=p,
                             dropout_seed=seed)
    assert f.dropout_seed == seed
    o_ref, lse_ref = reference.attention_forward(q64, k64, v64, causal=causal, dropout_p=p, dropout_seed=seed)
    check(f.o, o_ref, dtype, Nk, d, what="o")
    assert err(f.lse, lse_ref) <= feature_tol(dtype, Nk, d) * max(1.0, np.abs(lse_ref).max())
    assert not count or f.hbm == iomodel.forward(name, BH, Nq, Nk, d, q.dtype, causal, f.block, G=G)
    if not spec.has("backward", dtype):
        return
    grads_ref = reference.attention_backward(q64, k64, v64, as64(f.o, dtype), np.asarray(f.lse, np.float64), do64,
                                             causal=causal, dropout_p=p, dropout_seed=seed)
    for deterministic in backwards(name):
        b = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel=name, causal=causal, block=block, count_hbm=count,
                                  deterministic=deterministic, dropout_p=p, dropout_seed=seed)
        for what, g, ref in zip(("dq", "dk", "dv"), (b.dq, b.dk, b.dv), grads_ref):
            check(g, ref, dtype, Nk * G, d, what=f"{what} (deterministic={deterministic})")
        assert not count or b.hbm == iomodel.backward(name, BH, Nq, Nk, d, q.dtype, causal, b.block,
                                                      deterministic=deterministic, G=G)


@pytest.mark.parametrize("name, dtype", MATRIX)
def test_dropout_p_zero_is_attention_without_dropout_bitwise(rng, name, dtype):
    """dropout_p=0 (with or without a seed) runs the kernels without dropout: bitwise the same results, and
    no seed in the result (every kernel, dropout or not)."""
    causal = kernels.get(name).has("causal")
    (q, k, v, do), _ = inputs(rng, dtype, (1, 1), 5, 9, dim(name, dtype, 4))
    plain_ = fn.attention_forward(q, k, v, kernel=name, causal=causal)
    zero = fn.attention_forward(q, k, v, kernel=name, causal=causal, dropout_p=0.0, dropout_seed=3)
    assert zero.dropout_seed is None and plain_.dropout_seed is None
    assert np.array_equal(plain_.o, zero.o) and np.array_equal(plain_.lse, zero.lse)
    if kernels.get(name).has("backward", dtype):
        b0 = fn.attention_backward(q, k, v, plain_.o, plain_.lse, do, kernel=name, causal=causal)
        b1 = fn.attention_backward(q, k, v, plain_.o, plain_.lse, do, kernel=name, causal=causal, dropout_p=0)
        assert all(np.array_equal(x, y) for x, y in zip((b0.dq, b0.dk, b0.dv), (b1.dq, b1.dk, b1.dv)))


# ------------------------------------------------------------------------------------- strided inputs


def _strided_check(name, dtype, xs, xs64, dev, causal, relayout):
    """Forward and every backward on the device views ``dev`` (q, k, v, do) against the reference on the
    float64 values; o strided too; outputs contiguous; counted bytes == the IO model (layout-free)."""
    from test_strides import host

    spec = kernels.get(name)
    q, k = xs[0], xs[1]
    q64, k64, v64, do64 = xs64
    dq, dk, dv, ddo = dev
    BH, G = int(np.prod(q.shape[:-2])), q.shape[-3] // k.shape[-3]
    Nq, Nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    count, block = spec.has("count_hbm"), small_block(name, d, dtype)
    f = fn.attention_forward(dq, dk, dv, kernel=name, causal=causal, block=block, count_hbm=count)
    o_ref, lse_ref = reference.attention_forward(q64, k64, v64, causal=causal)
    check(host(f.o), o_ref, dtype, Nk, d, what="o")
    assert not count or f.hbm == iomodel.forward(name, BH, Nq, Nk, d, q.dtype, causal, f.block, G=G)
    if not spec.has("backward", dtype):
        return
    dev_o = relayout(host(f.o))
    grads_ref = reference.attention_backward(q64, k64, v64, as64(host(f.o), dtype), as64(host(f.lse)), do64,
                                             causal=causal)
    for deterministic in backwards(name):
        b = fn.attention_backward(dq, dk, dv, dev_o, f.lse, ddo, kernel=name, causal=causal, block=block,
                                  count_hbm=count, deterministic=deterministic)
        for what, g, ref in zip(("dq", "dk", "dv"), (b.dq, b.dk, b.dv), grads_ref):
            assert g.is_c_contiguous(), what  # outputs: contiguous arrays of our own
            check(host(g), ref, dtype, Nk * G, d, what=f"{what} (deterministic={deterministic})")
        assert not count or b.hbm == iomodel.backward(name, BH, Nq, Nk, d, q.dtype, causal, b.block,
                                                      deterministic=deterministic, G=G)


@pytest.mark.parametrize("layout, causal, B, H", [("transposed", False, 2, 1), ("packed", True, 2, 2)])
@pytest.mark.parametrize("name, dtype", MATRIX)
def test_strided_views(rng, name, dtype, layout, causal, B, H):
    """(B, H, N, d) = (B, H, 9, dim(4)), q, k, v, o and dO all strided device views: x (B, N, H, d) seen as
    (B, H, N, d) (``transposed``), or q, k, v slices of one packed (B, N, 3, H, d) buffer (``packed``)."""
    if dtype == "bfloat16":
        pytest.skip("Numba device arrays have no bfloat16 dtype: bfloat16 reaches the kernels from PyTorch tensors "
                    "and NumPy (tests/test_flash2_tc.py holds strided bfloat16 torch views)")
    from test_strides import packed, transposed

    causal = causal and kernels.get(name).has("causal")
    xs, xs64 = inputs(rng, dtype, (B, H), 9, 9, dim(name, dtype, 4))
    q, k, v, do = (np.asarray(x) for x in xs)
    if layout == "transposed":
        dev = tuple(transposed(x) for x in (q, k, v, do))
        relayout = transposed
    else:
        dev = (*packed(q, k, v), packed(do, do)[1])
        relayout = lambda o: packed(o, o, o)[2]  # noqa: E731
    _strided_check(name, dtype, xs, xs64, dev, causal, relayout)


@pytest.mark.parametrize("name, dtype", matrix("grouped_query"))
def test_grouped_query_with_strided_kv(rng, name, dtype):
    """GQA (Hq = 4, Hkv = 2) with k, v slices of one packed kv buffer, q transposed; Nq = 1, Nk = 17, d = dim(8)."""
    if dtype == "bfloat16":
        pytest.skip("Numba device arrays have no bfloat16 dtype: bfloat16 reaches the kernels from PyTorch tensors "
                    "and NumPy (tests/test_flash2_tc.py holds strided bfloat16 torch views)")
    from test_strides import packed, transposed

    causal = kernels.get(name).has("causal")
    xs, xs64 = inputs(rng, dtype, (1, 4), 1, 17, dim(name, dtype, 8), Hkv=2)
    q, k, v, do = (np.asarray(x) for x in xs)
    dev = (transposed(q), *packed(k, v), transposed(do))
    _strided_check(name, dtype, xs, xs64, dev, causal, transposed)


# ------------------------------------------------------------------------- NaN and Inf (docs/RELIABILITY.md)


def _cuda_max(a, b):
    """max() as CUDA compiles it for floats (fmax): a NaN operand is dropped, whichever side it is on."""
    if a != a:
        return b
    if b != b:
        return a
    return a if a >= b else b


def _cuda_min(a, b):
    if a != a:
        return b
    if b != b:
        return a
    return a if a <= b else b


@pytest.fixture(params=["python-max", "cuda-max"])
def max_semantics(request, monkeypatch):
    """Run the kernels with Python's max() (the simulator) or with CUDA's fmax semantics.

    Python's max(a, nan) is a but max(nan, a) is nan; on a GPU Numba lowers float max/min to
    fmax/fmin, which drop NaN on either side.  The kernels' module globals shadow the builtins.
    """
    import sys

    if request.param == "cuda-max":
        if not fn.device.SIMULATOR:
            pytest.skip("on a GPU the kernels use fmax already")
        for name in kernels.NAMES:
            kernels.module(name)  # imported, with its submodules (flash2_fast's forward and backward)
            for modname, mod in list(sys.modules.items()):
                if modname == f"flash_numba.kernels.{name}" or modname.startswith(f"flash_numba.kernels.{name}."):
                    monkeypatch.setattr(mod, "max", _cuda_max, raising=False)
                    monkeypatch.setattr(mod, "min", _cuda_min, raising=False)
    return request.param


def _rows(mask2d):
    return [int(i) for i in np.nonzero(mask2d)[0]]


def classes(x):
    """Element by element: 0 finite, 1 NaN, 2 +Inf, 3 -Inf."""
    x = np.asarray(x, np.float64)
    return np.select([np.isnan(x), np.isposinf(x), np.isneginf(x)], [1, 2, 3], 0)


def assert_like_reference(got, want, tol, what, size=1.0):
    """NaN, +Inf and -Inf exactly where the reference has them; finite values within ``tol`` of it:
    max |got - want| / max(max |want|, size), with ``size`` at least 1 or the size of terms that cancel in
    ``want`` (tests/test_reference.py's grad_sizes; tests/test_fuzz.py)."""
    np.testing.assert_array_equal(classes(got), classes(want), err_msg=f"{what}: NaN/Inf pattern")
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    fin = np.isfinite(want)
    if fin.any():
        e = np.abs(got[fin] - want[fin]).max() / max(np.abs(want[fin]).max(), size, 1.0)
        assert e <= tol, f"{what}: error {e:.2e} > {tol:.2e}"


def masked_reach(xs64, causal, lacking=True):
    """Where a kernel that lacks ``masked_nonfinite`` (``lacking``) may differ from the reference: o, dq, dk, dv
    (bool arrays; none where the kernel has it).

    Its products meet a masked P = 0 (dS = 0) against whatever the operand holds: o[i, c] when a masked key j of a
    row that sees some key has a non-finite v[j, c] (P V); dq row i when a masked key j of row i has a non-finite
    k[j] or v[j] (dS K; dP = dO V^T); dk row j when a masked row i has a non-finite q[i] or v[j] (dS^T Q); dv row j
    when a masked row i has a non-finite dO[i] (P^T dO).  Every masked key counts (a tile may hold any of them);
    rows the mask hides keep o = 0, lse = -inf.  Where the reference backward is given the reference's o (the fuzz
    test), a row i whose o is reached has D_i = rowsum(dO_i o_i) reached too, so dS_ij: dk row j for every key j row i
    sees.  Causal or not, dk and dv row j when k[j] is non-finite: the rows of zeros that pad a query block give
    S = 0 * Inf = NaN there, and P, dS of NaN against their zero dO, Q."""
    q64, k64, v64, do64 = xs64
    Nq, Nk = q64.shape[-2], k64.shape[-2]
    none = tuple(np.zeros(x.shape, bool) for x in (q64, q64, k64, v64))
    if not lacking:
        return none
    masked = ~reference.causal_mask(Nq, Nk) if causal else np.zeros((Nq, Nk), bool)  # (Nq, Nk), every head alike
    seeing = masked & ~masked.all(axis=1, keepdims=True)  # of rows that see some key
    bad = {n: ~np.isfinite(x) for n, x in zip("qkvo", xs64)}  # "o": dO
    rows = {n: bad[n].any(axis=-1).astype(np.int64) for n in bad}  # (..., N): a non-finite entry in that row
    m = masked.astype(np.int64)
    o = (seeing.astype(np.int64) @ bad["v"].astype(np.int64)) > 0
    dq = ((rows["k"] | rows["v"]) @ m.T) > 0  # row i: a masked key j with a non-finite k[j] or v[j]
    dk = ((rows["q"] @ m) > 0) | ((rows["v"] > 0) & masked.any(axis=0))  # row j: a masked row i with q[i] bad
    dk |= (o.any(axis=-1).astype(np.int64) @ (~masked).astype(np.int64)) > 0  # row j: a row i whose o (D_i) is reached
    dv = (rows["o"] @ m) > 0  # row j: a masked row i with a non-finite dO[i]
    dk, dv = dk | (rows["k"] > 0), dv | (rows["k"] > 0)  # padding rows of zeros against a non-finite k[j]
    dk, dv = (r.any(axis=0, keepdims=True) if r.shape[0] != k64.shape[0] else r for r in (dk, dv))  # a group
    return np.broadcast_to(o, q64.shape), *(np.broadcast_to(r[..., None], x.shape)
                                            for r, x in zip((dq, dk, dv), (q64, k64, v64)))


def check_like_reference(name, dtype, xs, xs64, *, causal=False, lse_edit=None, backward_too=True, grads=None,
                         **kw):
    """Forward and every backward of ``name`` held to the float64 reference, non-finite pattern included.

    The backward gets the kernel's own o and lse (``lse_edit`` may change lse first), the reference
    backward the same ones; ``kw`` (dropout's ``dropout_p``, ``dropout_seed``) goes to both.  Returns the forward
    result; each backward's result is appended to the list ``grads`` where one is given.

    A kernel that lacks ``masked_nonfinite`` (flash2_tc: its mma multiplies a masked P = 0 by an Inf or NaN, as
    PyTorch and FlashAttention-2 do; docs/RELIABILITY.md) is held to the same on what no masked non-finite operand
    reaches (:func:`masked_reach`): every other entry of o and of each gradient, all of lse."""
    q, k, v, do = xs
    q64, k64, v64, do64 = xs64
    tol = feature_tol(dtype, k.shape[-2], q.shape[-1])
    f = fn.attention_forward(q, k, v, kernel=name, causal=causal, **kw)
    o_ref, lse_ref = reference.attention_forward(q64, k64, v64, causal=causal, **kw)
    reach = masked_reach(xs64, causal, not kernels.get(name).has("masked_nonfinite"))
    assert_like_reference(as64(f.o, dtype)[~reach[0]], o_ref[~reach[0]], tol, "o")
    assert_like_reference(f.lse, lse_ref, tol, "lse")
    if backward_too and kernels.get(name).has("backward", dtype):
        lse = np.array(f.lse)
        if lse_edit is not None:
            lse_edit(lse)
        want = reference.attention_backward(q64, k64, v64, as64(f.o, dtype), np.asarray(lse, np.float64), do64,
                                            causal=causal, **kw)
        for deterministic in backwards(name):
            b = fn.attention_backward(q, k, v, f.o, lse, do, kernel=name, causal=causal, deterministic=deterministic,
                                      **kw)
            if grads is not None:
                grads.append(b)
            for what, got, ref, out in zip(("dq", "dk", "dv"), (b.dq, b.dk, b.dv), want, reach[1:]):
                assert_like_reference(as64(got, dtype)[~out], ref[~out], tol, f"{what} (deterministic={deterministic})")
    return f


def _special(rng, dtype, Nq, Nk, d, edit):
    """Inputs of one head with ``edit(q, k, v)`` applied to their float64 values before storing."""
    raw = [rng.standard_normal((1, n, d)) for n in (Nq, Nk, Nk, Nq)]
    edit(*raw[:3])
    xs = tuple(stored(x, dtype) for x in raw)
    return xs, tuple(as64(x, dtype) for x in xs)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name, dtype", MATRIX)
def test_nan_and_inf_in_a_row_of_q(rng, name, dtype, max_semantics):
    """NaN in q row 3, +Inf in row 7 (scores of both signs), -Inf in row 9 against a positive column
    of k (every score of row 9 is -inf): those rows of o and lse are NaN, the others finite and right.

    The backward (with Python's max; it takes no max) gives NaN in dq rows 3, 7, 9 and in all of dk
    and dv, as PyTorch does; every position and value as the reference.
    """
    def edit(q, k, v):
        q[0, 3, 2], q[0, 7, 1], q[0, 9, 4] = np.nan, np.inf, -np.inf
        k[0, :, 4] = np.abs(k[0, :, 4]) + 0.5

    xs, xs64 = _special(rng, dtype, 11, 9, dim(name, dtype, 7), edit)
    f = check_like_reference(name, dtype, xs, xs64, backward_too=max_semantics == "python-max")
    o = as64(f.o, dtype)
    assert _rows(np.isnan(o[0]).all(axis=1)) == [3, 7, 9] and _rows(np.isnan(f.lse[0])) == [3, 7, 9]
    assert np.isfinite(np.delete(o[0], [3, 7, 9], axis=0)).all()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name, dtype", matrix("causal"))
def test_nan_in_k_and_inf_in_v(rng, name, dtype, max_semantics):
    """Causal, N = 9.  NaN in k row 6: o rows 6..8 (those that see key 6) are NaN.  +Inf in v[3, 0]:
    column 0 of o is +Inf on rows 3..8 (NaN where k made them NaN) and finite on rows 0..2, which
    do not see key 3 (a masked key adds nothing: no 0 * Inf).  Backward as the reference.  A kernel that lacks
    masked_nonfinite (flash2_tc) gets NaN from that 0 * Inf: column 0 of rows 0..2 is not held, nor its
    backward (:func:`check_like_reference`); the rest of o and all of lse are."""
    def edit(q, k, v):
        k[0, 6, 2] = np.nan
        v[0, 3, 0] = np.inf

    xs, xs64 = _special(rng, dtype, 9, 9, dim(name, dtype, 5), edit)
    f = check_like_reference(name, dtype, xs, xs64, causal=True, backward_too=max_semantics == "python-max")
    o = as64(f.o, dtype)
    assert np.isnan(o[0, 6:]).all() and np.isposinf(o[0, 3:6, 0]).all()
    unseen = o[0, :3] if kernels.get(name).has("masked_nonfinite") else o[0, :3, 1:]  # rows 0..2: key 3 masked
    assert np.isfinite(unseen).all() and np.isfinite(o[0, :6, 1:]).all()


#: The visible-zero checks run one dtype a kernel (float32 where it runs it: the products are the same code in every
#: dtype) and standard's float16, whose forward multiplies P V on tensor cores (its masked tiles on CUDA cores), in
#: both tiers
VISIBLE_ZERO = [p for p in matrix(every_dtype=True)
                if p.values[1] == ("float32" if "float32" in kernels.get(p.values[0]).dtypes
                                   else kernels.get(p.values[0]).dtypes[0]) or p.values == ("standard", "float16")]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name, dtype", VISIBLE_ZERO)
def test_a_visible_probability_of_zero_meets_inf_and_nan(rng, name, dtype):
    """IEEE arithmetic on visible entries: a visible key whose P is exactly 0 still multiplies its operands, so
    0 * Inf = NaN and 0 * NaN = NaN reach the result as in the reference (and PyTorch); only masked keys add nothing.

    Causal, Nq = 10 > Nk = 8: rows 0, 1 see no key, row i >= 2 the keys up to i - 2 (the blocks cross the
    diagonal).  Column 0 of q is 1 and of k 0, but for key 2, k[2, 0] = -inf (its score is -inf), and key 3,
    k[3, 0] = -1e4 sqrt(d) (its score -1e4 + O(1): P underflows to 0 in every dtype, float64 too); the other
    scores are O(1).  +Inf in v[3, 1], NaN in v[3, 3]: o[5:, 1] and o[5:, 3] are NaN (P V), rows 2..4 (key 3
    masked) finite.  Row 4 (o finite) has dS_42 = 0 * (dP - D) = 0 against k[2, 0] = -inf: dq[4, 0] NaN (dS K), rows
    2, 3 (key 2 masked) finite.  +Inf in dO[6, 1]: dv[2, 1] = 0 * Inf + .. NaN (P^T dO).  Every entry held to the
    reference's NaN, +Inf and -Inf positions and its values; flash2_tc (lacks masked_nonfinite) on what no masked
    Inf or NaN reaches (:func:`check_like_reference`)."""
    d = dim(name, dtype, 4)
    raw = [rng.standard_normal((1, 1, n, d)) for n in (10, 8, 8, 10)]
    q, k, v, do = raw
    q[..., 0], k[..., 0] = 1.0, 0.0
    k[0, 0, 2, 0], k[0, 0, 3, 0] = -np.inf, -1e4 * math.sqrt(d)
    v[0, 0, 3, 1], v[0, 0, 3, 3] = np.inf, np.nan
    do[0, 0, 6, 1] = np.inf
    xs = tuple(stored(x, dtype) for x in raw)
    xs64 = tuple(as64(x, dtype) for x in xs)
    o_ref, lse_ref = reference.attention_forward(*xs64[:3], causal=True)
    dq_ref, _, dv_ref = reference.attention_backward(*xs64[:3], o_ref, lse_ref, xs64[3], causal=True)
    assert np.isnan(o_ref[0, 0, 5:, [1, 3]]).all() and np.isfinite(o_ref[0, 0, 2:5]).all()  # the case is drawn
    assert np.isnan(dq_ref[0, 0, 4, 0]) and np.isfinite(dq_ref[0, 0, :4]).all() and np.isnan(dv_ref[0, 0, 2, 1])
    grads = []
    f = check_like_reference(name, dtype, xs, xs64, causal=True, grads=grads)
    o = as64(f.o, dtype)
    assert np.isnan(o[0, 0, 5:, [1, 3]]).all() and np.all(o[0, 0, :2] == 0)
    for b in grads:  # the visible cases themselves, where a kernel that lacks masked_nonfinite is not held above
        assert np.isnan(as64(b.dq, dtype)[0, 0, 4, 0]) and np.isnan(as64(b.dv, dtype)[0, 0, 2, 1])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name, dtype", [p for p in VISIBLE_ZERO if kernels.get(p.values[0]).has("dropout")])
def test_a_dropped_entry_meets_inf(rng, name, dtype):
    """Dropout (p = 0.5), causal, Nq = Nk = 9: a dropped visible entry has Zs P = 0, and 0 * Inf = NaN, as in the
    reference and PyTorch.  +Inf in v[1, 2]: o[i, 2] is NaN on the rows i >= 1 that dropped key 1, +Inf on those
    that kept it.  +Inf in dO[5, 0]: dv[j, 0] NaN for the keys j <= 5 that row 5 dropped (dv = (Zs P)^T dO)."""
    d, seed = dim(name, dtype, 4), 7
    raw = [rng.standard_normal((1, 1, 9, d)) for _ in range(4)]
    raw[2][0, 0, 1, 2] = np.inf
    raw[3][0, 0, 5, 0] = np.inf
    xs = tuple(stored(x, dtype) for x in raw)
    xs64 = tuple(as64(x, dtype) for x in xs)
    dropped = ~_dropout_keep(seed, 1, 9, 9)[0] & reference.causal_mask(9, 9)
    assert dropped[1:, 1].any() and dropped[5, :6].any()  # the case is drawn
    grads = []
    f = check_like_reference(name, dtype, xs, xs64, causal=True, dropout_p=0.5, dropout_seed=seed, grads=grads)
    o = as64(f.o, dtype)
    assert np.isnan(o[0, 0, 1:, 2][dropped[1:, 1]]).all() and np.isposinf(o[0, 0, 1:, 2][~dropped[1:, 1]]).all()
    for b in grads:
        assert np.isnan(as64(b.dv, dtype)[0, 0, :6, 0][dropped[5, :6]]).all()


def _dropout_keep(seed, BH, Nq, Nk):
    """Dropout's keep mask (BH, Nq, Nk) at p = 0.5, as the kernels and the reference draw it."""
    from flash_numba.kernels import _dropout

    return _dropout.keep_mask(seed, np.arange(BH), Nq, Nk, 0.5)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name, dtype", matrix("causal"))
def test_rows_the_causal_mask_hides_stay_zero_whatever_the_inputs(rng, name, dtype, max_semantics):
    """Nq = 13 > Nk = 5, causal: rows 0..7 see no key.  NaN in q row 2 (hidden) and row 9, +Inf in
    v[4, 3] (seen by row 12 only): hidden rows get o = 0, lse = -inf, dq = 0 and add nothing to dk, dv;
    row 9 is NaN; everything else as the reference (a kernel that lacks masked_nonfinite: column 3 of rows
    8..11, which have key 4 masked, and the backward but for the hidden rows' dq, are not held:
    :func:`check_like_reference`)."""
    def edit(q, k, v):
        q[0, 2, 1], q[0, 9, 0] = np.nan, np.nan
        v[0, 4, 3] = np.inf

    xs, xs64 = _special(rng, dtype, 13, 5, dim(name, dtype, 6), edit)
    f = check_like_reference(name, dtype, xs, xs64, causal=True, backward_too=max_semantics == "python-max")
    o = as64(f.o, dtype)
    assert np.all(o[0, :8] == 0) and np.isneginf(f.lse[0, :8]).all() and np.isnan(f.lse[0, 9])
    if max_semantics == "python-max" and kernels.get(name).has("backward", dtype):
        q, k, v, do = xs
        b = fn.attention_backward(q, k, v, f.o, f.lse, do, kernel=name, causal=True)
        assert np.all(as64(b.dq, dtype)[0, :8] == 0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name, dtype", matrix("backward"))
def test_backward_given_an_lse_of_minus_inf_or_minus_1000(rng, name, dtype, causal):
    """The backward takes P = exp(S - L) with the L it is given, unclamped: for a row that sees keys,
    L = -inf or -1000 gives P = +Inf there and non-finite gradients where the reference has them (no
    clamp, no "row sees nothing" shortcut); rows the causal mask hides (Nq = 8 > Nk = 5) still add 0."""
    if causal and not kernels.get(name).has("causal"):
        pytest.skip(f"{name} lacks causal (its spec)")
    xs, xs64 = _special(rng, dtype, 8, 5 if causal else 7, dim(name, dtype, 4), lambda q, k, v: None)

    def edit(lse):
        lse[0, 4], lse[0, 6] = -np.inf, -1000.0

    check_like_reference(name, dtype, xs, xs64, causal=causal, lse_edit=edit)
