"""Reliability (issue 6): bad input, numerics at the edges, NaN and Inf, the simulator as a safety
net, and the scripts benchmarks/sanitize.py and benchmarks/reliability.py.

docs/RELIABILITY.md lists every bad-input case with its behaviour; the first test checks that
each row of that table names tests that exist (here or in tests/test_inputs.py) and that the
exception it states is the one those tests expect.  Every kernel test runs one (batch, head)
at sizes that are not multiples of any block, so an out-of-bounds index raises IndexError in
the simulator.
"""

import csv
import functools
import importlib.util
import math
import os
import pathlib
import re
import subprocess
import sys
import types

import numpy as np
import pytest
from numba import cuda

import flash_numba
import test_inputs as inputs_tests  # tests/ is on sys.path (pytest's default rootdir import)
import test_standard as standard_tests
import test_strides as strides_tests
from flash_numba import _inputs, blocks, iomodel, kernels, reference
from flash_numba.kernels import flash2_fast

ON_GPU = not flash_numba.device.SIMULATOR
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the kernels these float32 cases run (flash2_tc runs float16 and bfloat16: tests/test_flash2_tc.py, and its
# sanitizer run is benchmarks/tc_check.py)
KERNELS = tuple(name for name in kernels.NAMES if "float32" in kernels.get(name).dtypes)
ALL, FWD, BWD, FLASH = inputs_tests.ALL, inputs_tests.FWD, inputs_tests.BWD, inputs_tests.FLASH
make_args, call = inputs_tests.make_args, inputs_tests.call


def forward(kernel, q, k, v, **kw):
    return flash_numba.attention_forward(q, k, v, kernel=kernel, **kw)


def backward(kernel, q, k, v, o, lse, do, **kw):
    return flash_numba.attention_backward(q, k, v, o, lse, do, kernel=kernel, **kw)


def rel_err(got, want):
    """Max absolute error over max |want| (both as float64)."""
    want = np.asarray(want, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


def qkv(rng, Nq, Nk, d, dtype=np.float32, lead=(1,)):
    """q, k, v and dO of one (batch, head) by default."""
    q, k, v, do = (rng.standard_normal(lead + (n, d)) for n in (Nq, Nk, Nk, Nq))
    return tuple(x.astype(dtype) for x in (q, k, v, do))


def tiny_call_works():
    """The cheapest real kernel path (flash1, 1 x 1 blocks, Nq = 1, Nk = 2, d = 1) gives the right answer."""
    q, k, v = np.array([[0.5]]), np.array([[1.0], [-1.0]]), np.array([[2.0], [4.0]])
    res = flash_numba.flash_attention_forward(q, k, v, kernel="flash1", block=(1, 1))
    np.testing.assert_allclose(res.o, reference.attention_forward(q, k, v)[0], rtol=1e-12)


# ----------------------------------------------------------------------- the table in RELIABILITY.md


def _table_rows():
    """(case, functions, behaviour, tests) of each row of the bad-input table in docs/RELIABILITY.md."""
    with open(os.path.join(ROOT, "docs", "RELIABILITY.md")) as f:
        text = f.read()
    table = text.split("<!-- bad-input table -->")[1]
    rows = []
    for line in table.strip().splitlines():
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if cells[0] == "case" or set(line.strip()) <= set("|-"):  # header, separator
            continue
        assert len(cells) == 4, line
        rows.append(cells)
    return rows


def test_every_table_row_names_tests_that_exist():
    rows = _table_rows()
    assert len(rows) >= 30
    cases = {"inputs": {c[0]: c[2] for c in inputs_tests.CASES}, "reliability": {c[0]: c[2] for c in NEW_CASES},
             "strides": {}}
    modules = {"inputs": inputs_tests, "reliability": sys.modules[__name__], "strides": strides_tests}
    cited = {"inputs": set(), "reliability": set(), "strides": set()}
    for case, functions, behaviour, tests in rows:
        names = re.findall(r"`([^`]+)`", tests)
        assert names, f"row {case!r} names no test"
        stated = re.match(r"\*\*(\w+)\*\*", behaviour)
        for name in names:
            where, _, test = name.partition(":")
            assert where in cases, name
            cited[where].add(test)
            if test in cases[where]:
                assert stated and stated.group(1) == cases[where][test].__name__, (case, test)
            else:
                assert test.startswith("test_") and callable(getattr(modules[where], test, None)), name
    for where in cases:
        missing = set(cases[where]) - cited[where]
        assert not missing, f"cases of {where} missing from the table: {missing}"


# ------------------------------------------------------------------------ bad input not in test_inputs


class _FakeGpuArray:
    """An object that says it lives on a GPU (``__cuda_array_interface__``), as a torch CUDA tensor does."""

    def __init__(self, x):
        self.shape, self.dtype = x.shape, x.dtype
        self.__cuda_array_interface__ = {"shape": x.shape, "typestr": x.dtype.str, "data": (0, False), "version": 3}


LONGDOUBLE = np.dtype(np.longdouble)
_all3 = inputs_tests._all3

NEW_CASES = [
    # (id, functions, exception, message regex, changes) as in test_inputs.CASES
    (
        "uint8",
        ALL,
        TypeError,
        r"^q: dtype uint8 is not supported; use float16, bfloat16, float32 or float64",
        _all3(lambda x: (x > 0).astype(np.uint8)),
    ),
    ("object", ALL, TypeError, r"^k: dtype object is not supported", {"k": lambda a: a["k"].astype(object)}),
    (
        "bfloat16-as-V2",
        ALL,
        TypeError,
        r"^q: dtype \|V2 is not supported",
        _all3(lambda x: x.astype(np.float16).view("V2")),
    ),
    (
        "d-over-block-limits",
        FLASH,
        ValueError,
        r"^block: \(Br, Bc\) = \(64, 8\) exceeds this kernel's limits Br <= 32",
        {"*": lambda a: make_args(np.random.default_rng(0), d=128), "kernel": "flash2", "block": (64, 8)},
    ),
    (
        "do-on-device",
        BWD,
        TypeError,
        r"^q, k, v, o, lse on the host but do on the device",
        {"do": lambda a: cuda.to_device(a["do"])},
    ),
    (
        "longdouble",
        ALL,
        TypeError,
        rf"^q: dtype {LONGDOUBLE.name} is not supported",
        _all3(lambda x: x.astype(np.longdouble)),
    ),
    (
        "kv-heads-not-dividing-q-heads",
        ALL,
        ValueError,
        r"^k: leading \(batch, head\) dims \(3,\) differ from q's \(2,\); only the head count may differ",
        {name: (lambda a, name=name: np.concatenate([a[name], a[name][:1]])) for name in ("k", "v")},
    ),
    (
        "gpu-array-in-simulator",
        ALL,
        TypeError,
        r"^q: a GPU array was given but flash_numba runs in the CUDA simulator",
        {"q": lambda a: _FakeGpuArray(a["q"])},
    ),
]
NEW_CASE_SKIPS = {
    "longdouble": (LONGDOUBLE.itemsize <= 8, "long double is float64 on this platform"),
    "gpu-array-in-simulator": (ON_GPU, "runs in the simulator only"),
}


def _skip_mark(case_id):
    skip, why = NEW_CASE_SKIPS.get(case_id, (False, "applies here"))
    return pytest.mark.skipif(skip, reason=why)


def _new_params():
    return [pytest.param(f, c, id=f"{f}-{c[0]}", marks=_skip_mark(c[0])) for c in NEW_CASES for f in ALL if f in c[1]]


@pytest.mark.parametrize("fname, case", _new_params())
def test_bad_argument_raises_and_the_next_call_works(rng, fname, case):
    _, _, exc, match, changes = case
    args, kwargs = inputs_tests.apply(changes, make_args(rng))
    with pytest.raises(exc, match=match):
        call(fname, args, **kwargs)
    tiny_call_works()


@pytest.mark.parametrize("pass_", ("forward", "backward"))
def test_flash2_fast_block_too_big_for_shared_memory(rng, monkeypatch, pass_):
    """The largest block flash2_fast's limits allow, at d = 128 in float64, needs more than 48 KB: refused on a
    device whose blocks get 48 KB (a T4's budget, stood in for here: an H200 opts in to 227 KB and runs it)."""
    monkeypatch.setattr(blocks, "dynamic_budget", blocks.shared_budget)
    d, dt = 128, np.float64
    Br, Bc = flash2_fast.block_limits(d, dt, pass_)
    need = flash2_fast.shared_bytes(Br, Bc, d, dt, pass_)
    assert need > blocks.shared_budget()
    args = make_args(rng, dtype=dt, Nq=3, Nk=3, d=d)
    fname = "flash_attention_forward" if pass_ == "forward" else "flash_attention_backward"
    with pytest.raises(ValueError, match=rf"^block: \(Br, Bc\) = \({Br}, {Bc}\) needs {need} bytes of shared memory"):
        call(fname, args, kernel="flash2_fast", block=(Br, Bc))
    tiny_call_works()


def test_flash2_fast_block_that_is_not_a_micro_tile(rng):
    with pytest.raises(ValueError, match=r"^block: .*multiple"):
        call("flash_attention_forward", make_args(rng), kernel="flash2_fast", block=(8, 24))


@pytest.mark.parametrize("kernel", ("flash1", "flash2", "flash2_fast"))
@pytest.mark.parametrize("dtype", ("float16", "float32", "float64"))
def test_every_head_dim_gets_a_block_that_fits(kernel, dtype):
    """d = 1..128 in every dtype: the default block of both passes exists and fits the shared memory a block of
    that kernel gets here (48 KB, or the opt-in limit for kernels with dynamic shared memory from cc 9.0)."""
    mod = kernels.get(kernel)
    budget = blocks.dynamic_budget() if mod.dynamic_shared else blocks.shared_budget()
    for d in range(1, _inputs.MAX_HEAD_DIM + 1):
        for pass_ in ("forward", "backward"):
            Br, Bc = flash_numba.resolve_block(kernel, d, dtype, pass_=pass_)
            assert mod.shared_bytes(Br, Bc, d, np.dtype(dtype), pass_) <= budget, (d, pass_)


@pytest.mark.parametrize("fname", ALL)
def test_arrays_on_another_gpu_are_refused(rng, fname, monkeypatch):
    """k on GPU 1 while the kernels run on GPU 0 (the device query is stubbed: one GPU here)."""
    args = inputs_tests.on_device(make_args(rng))
    k_ptr = None if not ON_GPU else args["k"].device_ctypes_pointer.value

    def ordinal(arr):  # the simulator hands the array itself on; a GPU, a view of the same memory
        is_k = arr is args["k"] if k_ptr is None else arr.device_ctypes_pointer.value == k_ptr
        return 1 if is_k else 0

    monkeypatch.setattr(_inputs, "_device_ordinal", ordinal)
    monkeypatch.setattr(_inputs, "_current_device", lambda: 0)
    with pytest.raises(ValueError, match=r"^k: on GPU 1 but flash_numba runs on GPU 0 .*select_device\(1\)"):
        call(fname, args)
    monkeypatch.undo()
    tiny_call_works()


@pytest.mark.gpu
def test_arrays_on_another_gpu_are_refused_on_a_real_second_gpu(rng):
    if len(cuda.gpus) < 2:
        pytest.skip("needs two GPUs")
    args = make_args(rng)
    with cuda.gpus[1]:
        k1 = cuda.to_device(args["k"])
    with cuda.gpus[0]:
        dev = inputs_tests.on_device(args)
        dev["k"] = k1
        with pytest.raises(ValueError, match=r"^k: on GPU 1 but flash_numba runs on GPU 0"):
            call("flash_attention_forward", dev)
        tiny_call_works()


# ----------------------------------------------------------------------------- numerics at the edges


def _plain_scale(dtype, d, scale):
    return dtype(1 / math.sqrt(d) if scale is None else scale)


def plain_forward(q, k, v, *, causal=False, dtype=np.float32, scale=None):
    """o and lse of attention done and rounded entirely in ``dtype``: the baseline of Dao-AILab's rule."""
    dtype = np.dtype(dtype).type
    q, k, v = (np.asarray(x).astype(dtype) for x in (q, k, v))
    S = reference.plain_matmul(q * _plain_scale(dtype, q.shape[-1], scale), k.swapaxes(-1, -2))  # (.., Nq, Nk)
    if causal:
        S = np.where(reference.causal_mask(q.shape[-2], k.shape[-2]), S, dtype(-np.inf))
    m = S.max(axis=-1, keepdims=True)
    P = np.exp(S - m)  # no row is fully masked in these tests
    l = P.sum(axis=-1, keepdims=True)
    return reference.plain_matmul(P / l, v), (m + np.log(l))[..., 0]


def plain_backward(q, k, v, do, *, causal=False, dtype=np.float32, scale=None):
    """dq, dk, dv done and rounded entirely in ``dtype`` (from P = softmax(S), as autograd keeps it)."""
    dtype = np.dtype(dtype).type
    q, k, v, do = (np.asarray(x).astype(dtype) for x in (q, k, v, do))
    s = _plain_scale(dtype, q.shape[-1], scale)
    S = reference.plain_matmul(q * s, k.swapaxes(-1, -2))  # (.., Nq, Nk)
    if causal:
        S = np.where(reference.causal_mask(q.shape[-2], k.shape[-2]), S, dtype(-np.inf))
    P = np.exp(S - S.max(axis=-1, keepdims=True))
    P = P / P.sum(axis=-1, keepdims=True)
    mm = reference.plain_matmul  # the BLAS's rounding depends on the machine; this one does not
    o = mm(P, v)
    dS = P * (mm(do, v.swapaxes(-1, -2)) - (do * o).sum(axis=-1, keepdims=True))  # (.., Nq, Nk)
    return mm(dS, k) * s, mm(dS.swapaxes(-1, -2), q) * s, mm(P.swapaxes(-1, -2), do)


def run_both(kernel, q, k, v, do, **kw):
    f = forward(kernel, q, k, v, **kw)
    return f, backward(kernel, q, k, v, f.o, f.lse, do, **kw)


#: Scores +-C + O(1): every row's scores are huge, their differences ordinary, so the softmax is
#: not one-hot and an implementation that exponentiates without subtracting the max overflows.
LARGE = {"float32": dict(C=1e4, causal=False, Nq=9, Nk=12), "float16": dict(C=1e3, causal=True, Nq=9, Nk=11)}


@functools.lru_cache(maxsize=None)
def _large_scores_forward(kernel, dtype):
    """Inputs with scores +-C + O(1) (rows alternate sign), v ~ 1000, and the kernel's forward result."""
    case, d = LARGE[dtype], 8
    q, k, v, do = qkv(np.random.default_rng(6), case["Nq"], case["Nk"], d, np.float64)
    a = math.sqrt(case["C"] * math.sqrt(d))  # scale * a^2 = C
    q[..., 0] = a * np.where(np.arange(case["Nq"]) % 2, 1, -1)
    k[..., 0] = a
    q, k, v, do = (x.astype(dtype) for x in (q, k, 1000 * v, 1e-3 * do))
    S = reference._scores(q, k, 1 / math.sqrt(d), False)
    assert 0.99 * case["C"] < np.abs(S).min() and np.abs(S).max() < 1.01 * case["C"]
    return (q, k, v, do), forward(kernel, q, k, v, causal=case["causal"])


@pytest.mark.parametrize("dtype", LARGE)
@pytest.mark.parametrize("kernel", KERNELS)
def test_large_scores_forward(kernel, dtype):
    """o and lse within 3x the error of attention done in ``dtype`` (Dao-AILab's rule); the
    FlashAttention kernels, which keep S in float32, also within 2 float16 ulps for float16."""
    (q, k, v, _), f = _large_scores_forward(kernel, dtype)
    causal = LARGE[dtype]["causal"]
    o_ref, lse_ref = reference.attention_forward(q, k, v, causal=causal)
    plain_o, plain_lse = plain_forward(q, k, v, causal=causal, dtype=dtype)
    assert f.o.dtype == np.dtype(dtype) and np.isfinite(f.o).all() and np.isfinite(f.lse).all()
    assert rel_err(f.o, o_ref) <= 3 * rel_err(plain_o, o_ref) + 1e-6
    assert rel_err(f.lse, lse_ref) <= 3 * rel_err(plain_lse, lse_ref) + 1e-7
    if dtype == "float16" and kernel != "standard":  # standard stores S and P in float16, as plain attention
        assert rel_err(f.o, o_ref) < 2 * 2.0**-11


def _backward_params():
    for kernel in KERNELS:
        for dtype in LARGE:
            yield pytest.param(kernel, dtype, id=f"{kernel}-{dtype}")


@pytest.mark.parametrize("kernel, dtype", list(_backward_params()))
def test_large_scores_backward(kernel, dtype):
    """dq, dk, dv within 3x the error of a backward done in ``dtype`` from the normalised P."""
    (q, k, v, do), f = _large_scores_forward(kernel, dtype)
    causal = LARGE[dtype]["causal"]
    b = backward(kernel, q, k, v, f.o, f.lse, do, causal=causal)
    o_ref, lse_ref = reference.attention_forward(q, k, v, causal=causal)
    grads = reference.attention_backward(q, k, v, o_ref, lse_ref, do, causal=causal)
    plain = plain_backward(q, k, v, do, causal=causal, dtype=dtype)
    for name, got, base, want in zip(("dq", "dk", "dv"), (b.dq, b.dk, b.dv), plain, grads):
        assert np.isfinite(got).all(), name
        assert rel_err(got, want) <= 3 * rel_err(base, want) + 1e-6, name


@pytest.mark.parametrize("kernel", KERNELS)
def test_causal_with_more_queries_than_keys(rng, kernel):
    """Nq = 9 > Nk = 4: rows 0..4 see no key (o = 0, lse = -inf, dq = 0, no NaN), rows 5..8 see 1..4."""
    q, k, v, do = qkv(rng, 9, 4, 6)
    f, b = run_both(kernel, q, k, v, do, causal=True)
    o_ref, lse_ref = reference.attention_forward(q, k, v, causal=True)
    blind = np.isneginf(lse_ref)
    assert blind[0].tolist() == [True] * 5 + [False] * 4
    assert np.all(f.o[blind] == 0) and np.array_equal(np.isneginf(f.lse), blind)
    assert rel_err(f.o, o_ref) < 1e-6 and rel_err(f.lse[~blind], lse_ref[~blind]) < 1e-6
    grads = reference.attention_backward(q, k, v, o_ref, lse_ref, do, causal=True)
    assert np.all(b.dq[blind] == 0)
    for got, want in zip((b.dq, b.dk, b.dv), grads):
        assert rel_err(got, want) < 1e-5


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_single_query_and_key(rng, kernel):
    """N = 1: softmax of one score is 1, so o = v, lse = s, dv = do and dq = dk = 0."""
    q, k, v, do = qkv(rng, 1, 1, 5)
    f, b = run_both(kernel, q, k, v, do, causal=True)
    s = float(q[0, 0] @ k[0, 0]) / math.sqrt(5)
    np.testing.assert_allclose(f.o, v, rtol=1e-6)
    np.testing.assert_allclose(f.lse, [[s]], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(b.dv, do, rtol=1e-6)
    assert np.abs(b.dq).max() < 1e-6 and np.abs(b.dk).max() < 1e-6


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_single_key(rng, kernel):
    """Nk = 1: every row of o is v[0], dv = the sum of the rows of do, and dq = dk = 0 up to rounding.

    With one key P = 1, so dS_i = P (dP_i - D_i) = do_i . v - do_i . o_i is 0 exactly only if the two
    dot products of d float32 terms round alike; a GPU sums them in different kernels, in different
    orders, with FMAs.  Each is within d u sum_c |do_ic v_c| of the exact value (u = 2^-24, o_i = v
    to 1 u), so |dS_i| <= e_i = (2 d + 2) u sum_c |do_ic v_c|, |dq_i| <= scale e_i |k| and
    |dk| <= scale sum_i e_i |q_i|, each plus its own rounding.  (The simulator happens to give 0.)
    """
    q, k, v, do = qkv(rng, 6, 1, 4)
    f, b = run_both(kernel, q, k, v, do)
    np.testing.assert_allclose(f.o, np.broadcast_to(v, f.o.shape), rtol=1e-6)
    o_ref, lse_ref = reference.attention_forward(q, k, v)
    _, _, dv_ref = reference.attention_backward(q, k, v, o_ref, lse_ref, do)
    assert rel_err(b.dv, dv_ref) < 1e-5
    d, u = q.shape[-1], 2.0**-24
    scale = 1 / math.sqrt(d)
    q64, k64, v64, do64 = (np.abs(x[0].astype(np.float64)) for x in (q, k, v, do))  # (N, d) each
    e = (2 * d + 2) * u * (do64 @ v64[0])  # (Nq,): the bound on |dS_i|
    assert np.all(np.abs(b.dq[0]) <= 1.01 * scale * e[:, None] * k64[0] + 1e-30)
    assert np.all(np.abs(b.dk[0]) <= 1.01 * scale * (e @ q64) + 1e-30)


@pytest.mark.parametrize("kernel", KERNELS)
def test_scale_zero_is_uniform_attention(rng, kernel):
    """scale = 0: row i attends uniformly to its visible keys: o_i = their mean, lse_i = log(count), dq = dk = 0."""
    Nq, Nk = 5, 7
    q, k, v, do = qkv(rng, Nq, Nk, 3)
    f, b = run_both(kernel, q, k, v, do, causal=True, scale=0.0)
    visible = reference.causal_mask(Nq, Nk)  # (Nq, Nk)
    count = visible.sum(axis=1)  # 3..7
    mean = (visible.astype(np.float64) @ v[0].astype(np.float64)) / count[:, None]
    np.testing.assert_allclose(f.o[0], mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(f.lse[0], np.log(count), rtol=1e-6)
    assert np.all(b.dq == 0) and np.all(b.dk == 0)
    np.testing.assert_allclose(b.dv[0], (visible / count[:, None]).T @ do[0].astype(np.float64), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------- NaN and Inf


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
    if request.param == "cuda-max":
        if ON_GPU:
            pytest.skip("on a GPU the kernels use fmax already")
        for name in KERNELS:
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
    max |got - want| / max(max |want|, size), with ``size`` at least 1 (as tests/test_standard.py
    measures) or the size of terms that cancel in ``want`` (tests/test_reference.py's grad_sizes)."""
    np.testing.assert_array_equal(classes(got), classes(want), err_msg=f"{what}: NaN/Inf pattern")
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    fin = np.isfinite(want)
    if fin.any():
        err = np.abs(got[fin] - want[fin]).max() / max(np.abs(want[fin]).max(), size, 1.0)
        assert err <= tol, f"{what}: error {err:.2e} > {tol:.2e}"


def check_like_reference(kernel, q, k, v, do, *, causal=False, lse_edit=None, backward_too=True):
    """Forward and backward of ``kernel`` held to the float64 reference, non-finite pattern included.

    The backward gets the kernel's own o and lse (``lse_edit`` may change lse first), the reference
    backward the same ones; flash2_fast's backward runs deterministic and atomic.  Tolerance from
    the arithmetic (tests/test_standard.py's ``_tol``).  Returns the forward result.
    """
    tol = standard_tests._tol(q.dtype, k.shape[-2], q.shape[-1])
    f = forward(kernel, q, k, v, causal=causal)
    o_ref, lse_ref = reference.attention_forward(q, k, v, causal=causal)
    assert_like_reference(f.o, o_ref, tol, "o")
    assert_like_reference(f.lse, lse_ref, tol, "lse")
    if backward_too:
        lse = np.array(f.lse)
        if lse_edit is not None:
            lse_edit(lse)
        want = reference.attention_backward(q, k, v, f.o, lse, do, causal=causal)
        for deterministic in (True, False) if kernel == "flash2_fast" else (True,):
            b = backward(kernel, q, k, v, f.o, lse, do, causal=causal, deterministic=deterministic)
            for name, got, ref in zip(("dq", "dk", "dv"), (b.dq, b.dk, b.dv), want):
                assert_like_reference(got, ref, tol, f"{name} (deterministic={deterministic})")
    return f


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("kernel", KERNELS)
def test_nan_and_inf_in_a_row_of_q(rng, kernel, max_semantics):
    """NaN in q row 3, +Inf in row 7 (scores of both signs), -Inf in row 9 against a positive column
    of k (every score of row 9 is -inf): those rows of o and lse are NaN, the others finite and right.

    The backward (with Python's max; it takes no max) gives NaN in dq rows 3, 7, 9 and in all of dk
    and dv, as PyTorch does; every position and value as the reference.
    """
    q, k, v, do = qkv(rng, 11, 9, 7)
    q[0, 3, 2], q[0, 7, 1], q[0, 9, 4] = np.nan, np.inf, -np.inf
    k[0, :, 4] = np.abs(k[0, :, 4]) + 0.5
    f = check_like_reference(kernel, q, k, v, do, backward_too=max_semantics == "python-max")
    assert _rows(np.isnan(f.o[0]).all(axis=1)) == [3, 7, 9] and _rows(np.isnan(f.lse[0])) == [3, 7, 9]
    assert np.isfinite(np.delete(f.o[0], [3, 7, 9], axis=0)).all()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("kernel", KERNELS)
def test_nan_in_k_and_inf_in_v(rng, kernel, max_semantics):
    """Causal, N = 9.  NaN in k row 6: o rows 6..8 (those that see key 6) are NaN.  +Inf in v[3, 0]:
    column 0 of o is +Inf on rows 3..8 (NaN where k made them NaN) and finite on rows 0..2, which
    do not see key 3 (a masked key adds nothing: no 0 * Inf).  Backward as the reference."""
    q, k, v, do = qkv(rng, 9, 9, 5)
    k[0, 6, 2] = np.nan
    v[0, 3, 0] = np.inf
    f = check_like_reference(kernel, q, k, v, do, causal=True, backward_too=max_semantics == "python-max")
    assert np.isnan(f.o[0, 6:]).all() and np.isposinf(f.o[0, 3:6, 0]).all()
    assert np.isfinite(f.o[0, :3]).all() and np.isfinite(f.o[0, :6, 1:]).all()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("kernel", KERNELS)
def test_rows_the_causal_mask_hides_stay_zero_whatever_the_inputs(rng, kernel, max_semantics):
    """Nq = 13 > Nk = 5, causal: rows 0..7 see no key.  NaN in q row 2 (hidden) and row 9, +Inf in
    v[4, 3] (seen by row 12 only): hidden rows get o = 0, lse = -inf, dq = 0 and add nothing to dk, dv;
    row 9 is NaN; everything else as the reference."""
    q, k, v, do = qkv(rng, 13, 5, 6)
    q[0, 2, 1], q[0, 9, 0] = np.nan, np.nan
    v[0, 4, 3] = np.inf
    f = check_like_reference(kernel, q, k, v, do, causal=True, backward_too=max_semantics == "python-max")
    assert np.all(f.o[0, :8] == 0) and np.isneginf(f.lse[0, :8]).all() and np.isnan(f.lse[0, 9])
    if max_semantics == "python-max":
        b = backward(kernel, q, k, v, f.o, f.lse, do, causal=True)
        assert np.all(b.dq[0, :8] == 0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", KERNELS)
def test_backward_given_an_lse_of_minus_inf_or_minus_1000(rng, kernel, causal):
    """The backward takes P = exp(S - L) with the L it is given, unclamped: for a row that sees keys,
    L = -inf or -1000 gives P = +Inf there and non-finite gradients where the reference has them (no
    clamp, no "row sees nothing" shortcut); rows the causal mask hides (Nq = 8 > Nk = 5) still add 0."""
    q, k, v, do = qkv(rng, 8, 5 if causal else 7, 4)

    def edit(lse):
        lse[0, 4], lse[0, 6] = -np.inf, -1000.0

    check_like_reference(kernel, q, k, v, do, causal=causal, lse_edit=edit)


def test_floating_point_atomics_only_behind_deterministic_false():
    """The int64 HBM counters aside, the one atomic is flash2_fast's dQ add, compiled in only for the atomic
    dK/dV/dQ kernel (``deterministic=False``, and the split deterministic backward, where each element of a
    dQ copy gets one addition per launch: test_flash2_fast's bitwise tests); deterministic is the default."""
    found = []
    folder = pathlib.Path(ROOT, "flash_numba", "kernels")
    for path in sorted(folder.rglob("*.py")):
        name = path.relative_to(folder).as_posix()
        found += [(name, op, arr) for op, arr in re.findall(r"cuda\.atomic\.(\w+)\(\s*(\w+)", path.read_text())]
    atomic_dq = "flash2_fast/backward.py"
    assert found and {(n, op, arr) for n, op, arr in found if arr != "counter"} == {(atomic_dq, "add", "dq")}
    src = (folder / atomic_dq).read_text()
    branch = src[src.index("if ATOMIC_DQ:"):]
    assert "cuda.atomic.add(dq" in branch.split("\n\n        for a in range(TM):")[0]  # inside the branch
    import inspect

    assert inspect.signature(flash_numba.flash_attention_backward).parameters["deterministic"].default is True


# --------------------------------------------------------------------- the simulator as a safety net


@pytest.mark.parametrize("count", (False, True), ids=("plain", "count"))
@pytest.mark.parametrize("kernel", KERNELS)
def test_every_kernel_at_sizes_that_fit_no_block(rng, kernel, count):
    """Nq = 13, Nk = 11, d = 7 (count: causal, Nq and Nk swapped): forward and backward, default blocks.

    An index past an array's end raises IndexError in the simulator; a forgotten element stays
    NaN (outputs are poisoned).  Counted bytes equal the IO model's.
    """
    Nq, Nk, causal = (11, 13, True) if count else (13, 11, False)
    q, k, v, do = qkv(rng, Nq, Nk, 7)
    f, b = run_both(kernel, q, k, v, do, causal=causal, count_hbm=count)
    o_ref, lse_ref = reference.attention_forward(q, k, v, causal=causal)
    assert rel_err(f.o, o_ref) < 1e-6 and rel_err(f.lse, lse_ref) < 1e-6
    for got, want in zip((b.dq, b.dk, b.dv), reference.attention_backward(q, k, v, o_ref, lse_ref, do, causal=causal)):
        assert rel_err(got, want) < 1e-5
    if count:
        assert f.hbm == iomodel.forward(kernel, 1, Nq, Nk, 7, np.dtype(np.float32), causal, f.block)
        assert b.hbm == iomodel.backward(kernel, 1, Nq, Nk, 7, np.dtype(np.float32), causal, b.block)
    else:
        assert f.hbm is None and b.hbm is None


# --------------------------------------------------------------------------------------- the scripts


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(ROOT, "benchmarks", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _script(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(ON_GPU, reason="checks what the scripts do without a GPU")
def test_scripts_without_a_gpu_say_so_list_their_work_and_exit_0(tmp_path):
    out = _script("benchmarks/sanitize.py", "--quick")
    assert out.returncode == 0, out.stderr
    assert "no CUDA GPU" in out.stdout
    quick = _load("sanitize").cases(quick=True)
    assert {c.kernel for c in quick} == set(KERNELS) | {"flash2_fast-atomic"}
    assert all(c.label in out.stdout for c in quick)

    out = _script("benchmarks/sanitize.py", "--matrix", str(tmp_path / "m"))
    assert out.returncode == 0, out.stderr
    assert "no CUDA GPU" in out.stdout and not (tmp_path / "m").exists()
    for tool in ("memcheck", "racecheck", "synccheck"):
        assert re.search(rf"--tool {tool} --error-exitcode 1 \S*python\S* \S*benchmarks/sanitize.py", out.stdout)

    for what in ("determinism", "leaks"):
        out = _script("benchmarks/reliability.py", what, str(tmp_path / what))
        assert out.returncode == 0 and "no CUDA GPU" in out.stdout, out.stderr
        assert not (tmp_path / what).exists()


def test_sanitize_cases_cover_every_size_flag_and_kernel():
    san = _load("sanitize")
    for quick in (False, True):
        todo = san.cases(quick)
        for kernel in KERNELS:
            mine = [c for c in todo if c.kernel == kernel]
            assert {c.Nq for c in mine} | {c.Nk for c in mine} == {17, 97, 1000}
            assert {c.d for c in mine} == {16, 80, 128}
            assert {(c.causal, c.count) for c in mine} == {(False, False), (False, True), (True, False), (True, True)}
            assert any(c.Nq > c.Nk for c in mine) and any(c.Nq < c.Nk for c in mine)
    assert len(san.cases(quick=True)) < len(san.cases()) / 5


def test_sanitize_workload_case_runs_and_checks_its_outputs():
    san = _load("sanitize")
    assert san.run_case(san.Case("flash1", "float32", 3, 2, 2, True, True)) == ""


def test_sanitize_driver_parses_logs_and_writes_the_summary(tmp_path):
    san = _load("sanitize")
    log = "ok [1/3] flash1 float32 Nq=17\nok [2/3] flash2 float32 Nq=17\nFAILED [3/3] flash2 x\n"
    log += "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
    log += "========= ERROR SUMMARY: 1,024 errors\n"
    assert san.parse_errors(log) == 1024 and san.parse_errors("no summary") is None
    assert san.parse_errors("========= ERROR SUMMARY: 1 error\n") == 1
    assert san.parse_covered(log) == {"flash1": 1, "flash2": 1}
    # run_tool on a stand-in for the sanitizer: streams, logs, returns the exit status
    fake = [
        sys.executable,
        "-c",
        "print('ok [1/1] standard float32 Nq=17'); print('========= ERROR SUMMARY: 0 errors')",
    ]
    text, rc, _ = san.run_tool(fake, str(tmp_path / "memcheck.log"), 60, "memcheck")
    assert rc == 0 and (tmp_path / "memcheck.log").read_text() == text
    clean = san.ToolResult(
        "memcheck", san.parse_covered(text), 1, san.parse_errors(text), rc, 1.0, "today", "GPU", "cmd"
    )
    _, rc_hung, _ = san.run_tool(
        [sys.executable, "-c", "import time; time.sleep(30)"], str(tmp_path / "x.log"), 0.5, "x"
    )
    assert rc_hung is None
    dirty = san.ToolResult("racecheck", san.parse_covered(log), 3, san.parse_errors(log), 1, 2.0, "today", "GPU", "cmd")
    assert clean.clean and not dirty.clean
    md, csv_path = san.write_summary([clean, dirty], str(tmp_path))
    table = pathlib.Path(md).read_text()
    assert "| memcheck | standard (1); 1/1 cases | 0 | 0 |" in table and "NOT clean" in table
    header = pathlib.Path(csv_path).read_text().splitlines()[0].split(",")
    assert header == [
        "tool",
        "kernels covered (cases ok)",
        "errors",
        "exit status",
        "wall time (s)",
        "date",
        "GPU",
        "command",
    ]


def test_sanitize_matrix_runs_every_tool_and_summarises(tmp_path, monkeypatch):
    """The driver's GPU path, with a stand-in compute-sanitizer that finds 2 errors with racecheck."""
    san = _load("sanitize")
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "tool = sys.argv[sys.argv.index('--tool') + 1]\n"
        "for i in range(1, 8):\n"
        "    print(f'ok [{i}/7] flash2 float32 Nq=17')\n"
        "n = 2 if tool == 'racecheck' else 0\n"
        "print(f'========= ERROR SUMMARY: {n} errors')\n"
        "sys.exit(1 if n else 0)\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(flash_numba.device, "SIMULATOR", False)
    monkeypatch.setattr(flash_numba.device, "info", lambda: types.SimpleNamespace(name="Fake GPU"))
    out = tmp_path / "out"
    assert san.matrix(str(out), True, list(san.TOOLS), ("flash2",), str(fake), 60, 3) == 1
    with open(out / "sanitize.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["tool"], r["errors"], r["exit status"]) for r in rows] == [
        ("memcheck", "0", "0"),
        ("racecheck", "2", "1"),
        ("synccheck", "0", "0"),
    ]
    assert all(r["kernels covered (cases ok)"] == "flash2 (7); 7/7 cases" and r["GPU"] == "Fake GPU" for r in rows)
    assert all((out / f"{tool}.log").exists() for tool in san.TOOLS)


def test_reliability_determinism_and_leak_tables(tmp_path, monkeypatch):
    rel = _load("reliability")
    rows = rel.determinism_rows(("flash1",), N=3, d=2, repeats=2, causals=(True,))
    assert [(r["pass"], r["identical"], r["distinct results"]) for r in rows] == [
        ("forward", True, 1),
        ("backward", True, 1),
    ]
    paths = rel.write(str(tmp_path), "determinism", "Determinism", [("results", "results", rows)])
    assert pathlib.Path(paths[1]).read_text().startswith("kernel,pass,causal,N,d,repeats,identical")
    assert rel._max_diff([(np.array([1.0, -np.inf, np.nan]),), (np.array([1.5, -np.inf, np.nan]),)]) == 0.5
    assert rel._max_diff([(np.array([np.nan]),), (np.array([0.0]),)]) == np.inf
    # the leak verdict, with the kernels and the memory query stubbed
    monkeypatch.setattr(rel, "_forward", lambda *a: types.SimpleNamespace(o=None, lse=None))
    monkeypatch.setattr(rel, "_backward", lambda *a: None)
    flat, shrinking, growing = (
        (lambda i: 1e9, lambda i: 5),
        (lambda i: 1e9 - i * 2**16, lambda i: 5),
        (lambda i: 1e9, lambda i: 5 + i),
    )
    for (free, live), verdict in ((flat, "flat"), (shrinking, "LEAK?"), (growing, "LEAK?")):
        records = ((free(i), live(i)) for i in range(0, 1001, 10))  # (free bytes, live allocations) at call i
        monkeypatch.setattr(rel, "_flush_and_free", lambda records=records: next(records))
        rows, summary = rel.leak_rows(calls=100, every=10, N=4, d=4, warmup=0)
        assert len(rows) == 11 and summary["verdict"] == verdict, (verdict, summary)


def test_sanitize_reads_the_racecheck_summary():
    san = _load("sanitize")
    line = "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
    assert san.parse_errors(line) == 0
    assert san.parse_errors("========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)") == 2


# ---------------------------------------------------------------- memory exhaustion


def test_an_allocation_that_cannot_fit_is_one_clear_error(monkeypatch):
    """Checked against the free memory before allocating (large buffers), and a failed allocation is explained."""
    from flash_numba import _inputs

    monkeypatch.setattr(_inputs, "SIMULATOR", False)  # the check itself is host code: run it here too
    monkeypatch.setattr(_inputs, "_free_bytes", lambda: (1000, 8000))
    made = []
    with pytest.raises(_inputs.DeviceMemoryError, match=r"needs 268,435,456 bytes, and 1,000 of the GPU's 8,000"):
        _inputs._allocate(lambda: made.append(1), (1 << 26,), np.float32)
    assert made == []  # refused before allocating

    class CudaAPIError(Exception):
        pass

    def fails():
        raise CudaAPIError("[2] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY")

    with pytest.raises(_inputs.DeviceMemoryError, match=r"a \(4, 8\) float16 buffer of this call needs 64 bytes"):
        _inputs._allocate(fails, (4, 8), np.float16)

    def bug():
        raise CudaAPIError("CUDA_ERROR_ILLEGAL_ADDRESS")

    with pytest.raises(CudaAPIError):  # not an allocation failure: not ours to explain
        _inputs._allocate(bug, (4, 8), np.float16)


@pytest.mark.gpu
def test_out_of_memory_on_the_gpu_then_the_next_call_runs():
    """standard's S and P at a size that cannot fit (Numba arrays and PyTorch tensors), and an output that cannot
    fit: a DeviceMemoryError naming the bytes, before any launch; then an ordinary call gives the right result."""
    from numba import cuda

    from flash_numba import DeviceMemoryError, device

    total = device.info().total_memory
    if total is None or total > 200 * 2**30:
        pytest.skip("sized for GPUs of at most 200 GiB")
    rng = np.random.default_rng(5)
    small = [rng.standard_normal((2, 64, 32)).astype(np.float32) for _ in range(3)]
    want = flash_numba.attention_forward(*small, kernel="flash2").o
    N = 1 << 16  # S and P: 2 * 64 * N^2 * 4 bytes = 2.2 TB
    big = cuda.device_array((64, N, 16), dtype=np.float32)
    with pytest.raises(DeviceMemoryError, match="bytes"):
        flash_numba.attention_forward(big, big, big, kernel="standard")
    np.testing.assert_array_equal(flash_numba.attention_forward(*small, kernel="flash2").o, want)
    del big
    try:
        import torch
    except ImportError:
        return
    rows = int(0.6 * total) // (2 * 128)  # q (= k = v) 60% of the GPU: o cannot fit beside it
    q = torch.empty((1, 1, rows, 128), dtype=torch.float16, device="cuda")
    with pytest.raises(DeviceMemoryError, match="free"):
        flash_numba.attention_forward(q, q, q, kernel="flash2")  # (flash2_fast refuses a head this long first)
    with pytest.raises(ValueError, match="over flash2_fast's limit"):  # refused before any copy of q
        flash_numba.attention_forward(q, q, q, kernel="flash2_fast")
    del q
    torch.cuda.empty_cache()
    np.testing.assert_array_equal(flash_numba.attention_forward(*small, kernel="flash2").o, want)
