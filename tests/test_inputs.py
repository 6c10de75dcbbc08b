"""Argument checking of the public functions.

Every bad argument of ``standard_attention_forward/backward`` and
``flash_attention_forward/backward`` raises TypeError (wrong kind or dtype) or
ValueError (wrong shape or value) with a message that starts with, or names,
the argument; an error leaves nothing behind that breaks the next call.
Non-contiguous and negatively strided NumPy inputs give the same results as
contiguous ones; device arrays stay on the device.
"""

import numpy as np
import pytest
from numba import cuda

import flash_numba
from flash_numba import blocks, kernels, reference
from flash_numba.device import SIMULATOR

FWD = ("standard_attention_forward", "flash_attention_forward")
BWD = ("standard_attention_backward", "flash_attention_backward")
ALL = FWD + BWD
FLASH = ("flash_attention_forward", "flash_attention_backward")

LEAD, NQ, NK, D = (2,), 5, 7, 4  # small and awkward: Nq != Nk, neither a multiple of a block


def make_args(rng, dtype=np.float32, lead=LEAD, Nq=NQ, Nk=NK, d=D):
    """Valid arguments for every public function: q, k, v and a consistent o, lse, do."""
    q, k, v = (rng.standard_normal(lead + (n, d)).astype(dtype) for n in (Nq, Nk, Nk))
    o, lse = reference.attention_forward(q, k, v)
    lse_dtype = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    do = rng.standard_normal(q.shape).astype(dtype)
    return {"q": q, "k": k, "v": v, "o": o.astype(dtype), "lse": lse.astype(lse_dtype), "do": do}


def call(fname, args, **kwargs):
    names = ("q", "k", "v", "o", "lse", "do") if fname in BWD else ("q", "k", "v")
    return getattr(flash_numba, fname)(*(args[n] for n in names), **kwargs)


def on_device(args):
    return {n: cuda.to_device(x) for n, x in args.items()}


# ------------------------------------------------------------------------ the cases
#
# Each case: (id, functions it applies to, exception, regex the message must match,
# changes).  A change maps an argument name to a function of the valid arguments
# (or to a constant); the special name "*" replaces the whole argument dict.


def _all3(f):
    return {"q": lambda a: f(a["q"]), "k": lambda a: f(a["k"]), "v": lambda a: f(a["v"])}


CASES = [
    # shapes
    ("q-rank-1", ALL, ValueError, r"^q: expected shape", {"q": lambda a: a["q"][0, 0]}),
    ("rank-5", ALL, ValueError, r"^q: expected shape", _all3(lambda x: x[None, None])),
    ("k-rank", ALL, ValueError, r"^k: has 2 dimensions", {"k": lambda a: a["k"][0]}),
    ("v-rank", ALL, ValueError, r"^v: has 4 dimensions", {"v": lambda a: a["v"][None]}),
    ("k-lead", ALL, ValueError, r"^k: leading", {"k": lambda a: np.concatenate([a["k"], a["k"][:1]])}),
    ("v-lead", ALL, ValueError, r"^v: leading", {"v": lambda a: a["v"][:1]}),
    ("k-head-dim", ALL, ValueError, r"^k: head dim", {"k": lambda a: a["k"][..., :-1]}),
    ("v-head-dim", ALL, ValueError, r"^v: head dim", {"v": lambda a: np.concatenate([a["v"], a["v"]], -1)}),
    ("v-length", ALL, ValueError, r"^v: sequence length", {"v": lambda a: a["v"][:, :-1]}),
    ("d-129", ALL, ValueError, r"^q: head dim d = 129", _all3(lambda x: np.zeros(x.shape[:-1] + (129,), x.dtype))),
    ("d-0", ALL, ValueError, r"^q: head dim d = 0", _all3(lambda x: x[..., :0])),
    ("empty-Nq", ALL, ValueError, r"^q: empty", {"q": lambda a: a["q"][:, :0]}),
    ("empty-Nk", ALL, ValueError, r"^k: empty", {"k": lambda a: a["k"][:, :0], "v": lambda a: a["v"][:, :0]}),
    ("zero-heads", ALL, ValueError, r"^q: a batch or head dim is zero", _all3(lambda x: x[:0])),
    # not arrays
    ("q-None", ALL, TypeError, r"^q: expected a NumPy array", {"q": None}),
    ("k-list", ALL, TypeError, r"^k: expected a NumPy array", {"k": lambda a: a["k"].tolist()}),
    ("v-str", ALL, TypeError, r"^v: expected a NumPy array", {"v": "v"}),
    # dtypes
    ("int32", ALL, TypeError, r"^q: dtype int32 is not supported", _all3(lambda x: x.astype(np.int32))),
    ("k-int64", ALL, TypeError, r"^k: dtype int64 is not supported", {"k": lambda a: a["k"].astype(np.int64)}),
    ("complex64", ALL, TypeError, r"^q: dtype complex64", _all3(lambda x: x.astype(np.complex64))),
    ("bool", ALL, TypeError, r"^q: dtype bool", _all3(lambda x: x > 0)),
    ("mixed-k", ALL, TypeError, r"^k: dtype float64 differs", {"k": lambda a: a["k"].astype(np.float64)}),
    ("mixed-v", ALL, TypeError, r"^v: dtype float16 differs", {"v": lambda a: a["v"].astype(np.float16)}),
    # scalars
    ("scale-nan", ALL, ValueError, r"^scale: must be finite", {"scale": float("nan")}),
    ("scale-inf", ALL, ValueError, r"^scale: must be finite", {"scale": np.float32(np.inf)}),
    ("scale--inf", ALL, ValueError, r"^scale: must be finite", {"scale": -float("inf")}),
    ("scale-str", ALL, TypeError, r"^scale:", {"scale": "0.5"}),
    ("scale-bool", ALL, TypeError, r"^scale:", {"scale": True}),
    ("scale-complex", ALL, TypeError, r"^scale:", {"scale": 0.5j}),
    ("scale-overflows-float32", ALL, ValueError, r"^scale: 1e\+39 overflows float32", {"scale": 1e39}),
    ("scale-log2e-overflows", ALL, ValueError, r"^scale: -2.4e\+38 overflows float32", {"scale": -2.4e38}),
    ("causal-1", ALL, TypeError, r"^causal:", {"causal": 1}),
    ("causal-None", ALL, TypeError, r"^causal:", {"causal": None}),
    ("causal-str", ALL, TypeError, r"^causal:", {"causal": "True"}),
    ("count-1", ALL, TypeError, r"^count_hbm:", {"count_hbm": 1}),
    ("count-None", ALL, TypeError, r"^count_hbm:", {"count_hbm": None}),
    ("count-str", ALL, TypeError, r"^count_hbm:", {"count_hbm": "yes"}),
    # host and device
    ("k-on-device", ALL, TypeError, r"but k on the device", {"k": lambda a: cuda.to_device(a["k"])}),
    ("q-on-device", ALL, TypeError, r"but q on the device", {"q": lambda a: cuda.to_device(a["q"])}),
    # backward: o, lse, do
    ("lse-Nk", BWD, ValueError, r"^lse: expected shape \(2, 5\)", {"lse": lambda a: np.zeros((2, NK), np.float32)}),
    ("lse-no-lead", BWD, ValueError, r"^lse: expected shape", {"lse": lambda a: a["lse"][0]}),
    ("lse-rank-3", BWD, ValueError, r"^lse: expected shape", {"lse": lambda a: a["lse"][..., None]}),
    ("lse-float64", BWD, TypeError, r"^lse: expected dtype float32", {"lse": lambda a: a["lse"].astype(np.float64)}),
    ("lse-float16", BWD, TypeError, r"^lse: expected dtype float32", {"lse": lambda a: a["lse"].astype(np.float16)}),
    (
        "lse-float32-for-float64",
        BWD,
        TypeError,
        r"^lse: expected dtype float64",
        {**{n: (lambda a, n=n: a[n].astype(np.float64)) for n in ("q", "k", "v", "o", "do")}},
    ),
    ("lse-None", BWD, TypeError, r"^lse: expected a NumPy array", {"lse": None}),
    ("lse-on-device", BWD, TypeError, r"but lse on the device", {"lse": lambda a: cuda.to_device(a["lse"])}),
    ("o-head-dim", BWD, ValueError, r"^o: shape", {"o": lambda a: a["o"][..., :-1]}),
    ("o-transposed", BWD, ValueError, r"^o: shape", {"o": lambda a: np.swapaxes(a["o"], -1, -2)}),
    ("do-length", BWD, ValueError, r"^do: shape", {"do": lambda a: a["do"][:, :-1]}),
    ("do-float64", BWD, TypeError, r"^do: dtype float64 differs", {"do": lambda a: a["do"].astype(np.float64)}),
    ("o-float16", BWD, TypeError, r"^o: dtype float16 differs", {"o": lambda a: a["o"].astype(np.float16)}),
    # FlashAttention: kernel and block
    ("kernel-unknown", FLASH, ValueError, r"^kernel: unknown kernel 'flash3'", {"kernel": "flash3"}),
    ("kernel-case", FLASH, ValueError, r"^kernel: unknown kernel", {"kernel": "FLASH2"}),
    ("kernel-int", FLASH, ValueError, r"^kernel: unknown kernel 2", {"kernel": 2}),  # (None: the default kernel)
    ("kernel-standard", FLASH, ValueError, r"^kernel: 'standard' is not a FlashAttention", {"kernel": "standard"}),
    ("block-int", FLASH, TypeError, r"^block: expected a pair", {"block": 8}),
    ("block-1", FLASH, TypeError, r"^block: expected a pair", {"block": (8,)}),
    ("block-3", FLASH, TypeError, r"^block: expected a pair", {"block": (8, 8, 8)}),
    ("block-Br-0", FLASH, ValueError, r"^block: Br must be a positive int", {"block": (0, 8)}),
    ("block-Bc-0", FLASH, ValueError, r"^block: Bc must be a positive int", {"block": (8, 0)}),
    ("block-negative", FLASH, ValueError, r"^block: Br must be a positive int", {"block": (-8, 8)}),
    ("block-float", FLASH, ValueError, r"^block: Br must be a positive int", {"block": (8.0, 8)}),
    ("block-bool", FLASH, ValueError, r"^block: Bc must be a positive int", {"block": (8, True)}),
    ("block-str", FLASH, ValueError, r"^block: Br must be a positive int", {"block": ("8", 8)}),
    ("block-over-limits", FLASH, ValueError, r"^block: .* exceeds this kernel's limits", {"block": (10**6, 8)}),
]

ARG_NAMES = ("q", "k", "v", "o", "lse", "do")


def apply(case_changes, args):
    """(arguments, keyword arguments) of a case, from the valid ``args``."""
    args = dict(args)
    if "*" in case_changes:
        args = case_changes["*"](args)
    kwargs = {}
    for name, change in case_changes.items():
        if name == "*":
            continue
        value = change(args) if callable(change) else change
        if name in ARG_NAMES:
            args[name] = value
        else:
            kwargs[name] = value
    return args, kwargs


def _params(fnames=ALL):
    return [
        pytest.param(fname, case, id=f"{fname}-{case[0]}") for case in CASES for fname in fnames if fname in case[1]
    ]


@pytest.mark.parametrize("fname, case", _params())
def test_bad_argument_raises_naming_it(rng, fname, case):
    _, _, exc, match, changes = case
    args, kwargs = apply(changes, make_args(rng))
    with pytest.raises(exc, match=match):
        call(fname, args, **kwargs)


def _assert_forward_matches_reference(args, res):
    o, lse = reference.attention_forward(args["q"], args["k"], args["v"])
    np.testing.assert_allclose(res.o, o, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(res.lse, lse, rtol=1e-5, atol=1e-5)


def _assert_backward_matches_reference(args, res):
    grads = reference.attention_backward(*(args[n] for n in ARG_NAMES))
    for got, want in zip((res.dq, res.dk, res.dv), grads):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fname", ALL)
def test_each_error_leaves_the_next_call_working(rng, fname):
    """Every error of ``fname`` in turn, each followed by a valid call that must be right.

    The call after each error is the cheapest real kernel path (flash1 with 1x1
    blocks on a 1 x 2 problem); ``fname`` itself runs once at the end.
    """
    tiny = make_args(rng, lead=(), Nq=1, Nk=2, d=1)
    cases = [c for c in CASES if fname in c[1]]
    assert len(cases) >= 30
    for _, _, exc, match, changes in cases:
        args, kwargs = apply(changes, make_args(rng))
        with pytest.raises(exc, match=match):
            call(fname, args, **kwargs)
        _assert_forward_matches_reference(tiny, call("flash_attention_forward", tiny, kernel="flash1", block=(1, 1)))
    args = make_args(rng)
    res = call(fname, args)
    if fname in FWD:
        _assert_forward_matches_reference(args, res)
    else:
        _assert_backward_matches_reference(args, res)


# ------------------------------------------------------------ blocks too big for shared memory


@pytest.mark.parametrize("pass_", ("forward", "backward"))
@pytest.mark.parametrize("kernel", ("flash1", "flash2"))
def test_block_too_big_for_shared_memory(rng, kernel, pass_):
    mod = kernels.get(kernel)
    d, dtype = 128, np.float64
    Br, Bc = mod.block_limits(d, dtype, pass_)  # the largest block the kernel's thread limits allow
    need, budget = mod.shared_bytes(Br, Bc, d, dtype, pass_), blocks.shared_budget()
    if need <= budget:
        pytest.skip(f"every block within {kernel}'s limits fits {budget} bytes at d = {d}")
    args = make_args(rng, dtype=dtype, Nq=3, Nk=3, d=d)
    fname = "flash_attention_forward" if pass_ == "forward" else "flash_attention_backward"
    with pytest.raises(ValueError, match=rf"^block: \(Br, Bc\) = \({Br}, {Bc}\) needs {need} bytes of shared memory"):
        call(fname, args, kernel=kernel, block=(Br, Bc))


def test_validate_and_choose_refuse_blocks_that_do_not_fit():
    def footprint(Br, Bc, d, dtype):
        return 4 * (Br * d + 2 * Bc * d + Br * Bc)

    assert blocks.validate((16, 32), 64, np.float32, footprint, max_Br=64, max_Bc=64, budget=48 * 1024) == (16, 32)
    with pytest.raises(ValueError, match=r"^block: \(Br, Bc\) = \(64, 64\) needs 65536 bytes"):
        blocks.validate((64, 64), 64, np.float32, footprint, max_Br=64, max_Bc=64, budget=48 * 1024)
    with pytest.raises(ValueError, match=r"no block size fits d = 64"):
        blocks.choose(64, np.float32, lambda *a: 10**9, max_Br=64, max_Bc=64, budget=48 * 1024)
    Br, Bc = blocks.choose(64, np.float32, footprint, max_Br=64, max_Bc=64, budget=48 * 1024)
    assert footprint(Br, Bc, 64, np.float32) <= 48 * 1024


# ------------------------------------------------------------------------ accepted inputs


def _non_contiguous(x, how):
    """The same values as ``x`` in an array that is not C-contiguous."""
    if how == "strided":  # every other element of a wider array
        wide = np.repeat(x, 2, axis=-1)
        y = wide[..., ::2]
    elif how == "reversed":  # negative stride along the sequence
        y = np.ascontiguousarray(x[..., ::-1, :] if x.ndim > 1 else x[::-1])
        y = y[..., ::-1, :] if x.ndim > 1 else y[::-1]
    else:  # Fortran order
        y = np.asfortranarray(x)
    assert not y.flags.c_contiguous and np.array_equal(y, x)
    return y


@pytest.mark.parametrize("fname", ALL)
def test_non_contiguous_host_inputs_give_the_contiguous_result(rng, fname):
    args = make_args(rng)
    hows = {"q": "strided", "k": "reversed", "v": "fortran", "o": "reversed", "lse": "strided", "do": "fortran"}
    odd = {n: _non_contiguous(x, hows[n]) for n, x in args.items()}
    want, got = call(fname, args), call(fname, odd)
    outs = ("o", "lse") if fname in FWD else ("dq", "dk", "dv")
    for name in outs:
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-6, atol=1e-7, err_msg=name)
    if fname in FWD:
        _assert_forward_matches_reference(args, got)
    else:
        _assert_backward_matches_reference(args, got)


@pytest.mark.parametrize("fname", ("flash_attention_forward", "flash_attention_backward"))
def test_device_inputs_give_device_results(rng, fname):
    args = make_args(rng)
    host, dev = call(fname, args), call(fname, on_device(args))
    outs = ("o", "lse") if fname in FWD else ("dq", "dk", "dv")
    for name in outs:
        d = getattr(dev, name)
        assert not isinstance(d, np.ndarray), f"{name} came back to the host"
        np.testing.assert_allclose(d.copy_to_host(), getattr(host, name), rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("lead", [(), (3,), (2, 1)], ids=["N,d", "H,N,d", "B,H,N,d"])
def test_accepted_ranks_and_the_largest_head_dim(rng, lead):
    for d in (1, 128):
        args = make_args(rng, lead=lead, Nq=2, Nk=3, d=d)
        res = call("flash_attention_forward", args, kernel="flash1", block=(1, 1))
        assert res.o.shape == lead + (2, d) and res.lse.shape == lead + (2,)
        _assert_forward_matches_reference(args, res)


# ------------------------------------------------------------------------ host overhead per call
#
# What ``_inputs`` does to keep the host time of a call small (one Numba array per input,
# the current GPU asked once, a torch buffer handed back as is).  The torch paths are
# exercised here with small stand-ins for CUDA tensors; the real thing is the gpu test below.

from flash_numba import _inputs, _views  # noqa: E402


class _FakeDevice:
    def __init__(self, index):
        self.type, self.index = "cuda", index


class _FakeCudaTensor:
    """Just enough of a CUDA torch tensor for ``_inputs``: shape, dtype, device, view, detach."""

    __module__ = "torch.fake"  # what torch_device_of looks at

    def __init__(self, x, index=0, requires_grad=False, contiguous=True):
        self.x, self.shape, self.is_cuda, self.layout = x, tuple(x.shape), True, "torch.strided"
        self.dtype = f"torch.{x.dtype.name}"  # str(torch.float32) == "torch.float32"
        self.device, self.requires_grad, self._contiguous = _FakeDevice(index), requires_grad, contiguous
        self.detached = False

    def detach(self):
        t = _FakeCudaTensor(self.x, self.device.index, False, self._contiguous)
        t.detached = True
        return t

    def is_contiguous(self):
        return self._contiguous

    def view(self, shape):
        return ("view", self, tuple(shape))


@pytest.fixture
def as_on_gpu(monkeypatch):
    """Let ``_inputs`` take its non-simulator paths for the fake tensors; count the device look-ups."""
    monkeypatch.setattr(_inputs, "SIMULATOR", False)
    asked = []
    monkeypatch.setattr(_inputs, "_current_device", lambda: asked.append(1) or 0)
    monkeypatch.setattr(_inputs, "_device_ordinal", lambda arr: pytest.fail("a driver query for a torch tensor"))
    return asked


def test_a_torch_tensor_is_checked_from_itself(as_on_gpu):
    x = np.zeros((2, 3, 5, 4), np.float16)
    a = _inputs._gather(_FakeCudaTensor(x, requires_grad=True), "q")
    assert a.torch and a.on_device and a.shape == (2, 3, 5, 4) and a.dtype == np.float16
    assert a.arr.detached  # a tensor that requires grad is detached before anything reads it
    assert _inputs._is_device_array(_FakeCudaTensor(x))  # without reading __cuda_array_interface__


def test_the_current_gpu_is_asked_once_and_only_for_device_arrays(as_on_gpu):
    x = np.zeros((5, 4), np.float32)
    args = {n: _inputs._gather(_FakeCudaTensor(x), n) for n in ("q", "k", "v")}
    _inputs._check_gpus(args)
    assert len(as_on_gpu) == 1
    _inputs._check_gpus({n: _inputs._gather(x, n) for n in ("q", "k", "v")})
    assert len(as_on_gpu) == 1  # NumPy arrays: no device to ask about
    args["v"] = _inputs._gather(_FakeCudaTensor(x, index=1), "v")
    with pytest.raises(ValueError, match=r"^v: on GPU 1 but flash_numba runs on GPU 0"):
        _inputs._check_gpus(args)


def test_a_torch_tensor_is_reshaped_on_the_torch_side(as_on_gpu, monkeypatch):
    from numba import cuda as numba_cuda

    monkeypatch.setattr(numba_cuda, "as_cuda_array", lambda t, sync=True: ("numba", t), raising=False)
    t = _FakeCudaTensor(np.zeros((2, 3, 5, 4), np.float32))
    assert _views._tensor_to_device(t, (6, 5, 4), "q") == ("numba", ("view", t, (6, 5, 4)))
    with pytest.raises(ValueError, match=r"^q: device array is not C-contiguous; make it contiguous first"):
        _views._tensor_to_device(_FakeCudaTensor(np.zeros((5, 4), np.float32), contiguous=False), (1, 5, 4), "q")


def test_finish_hands_back_the_buffer_tensor():
    class Buffer:  # a Numba array from _torch_buffer, remembering its tensor
        def reshape(self, shape):
            pytest.fail("converted back through Numba")

    buf, t = Buffer(), _FakeCudaTensor(np.zeros((6, 5, 4), np.float32))
    setattr(buf, _inputs._TENSOR_ATTR, t)
    prob = _inputs.Problem((2, 3), 6, 5, 7, 4, np.dtype(np.float32), True, 0.5, False, torch_device="cuda:0")
    assert _inputs.finish(prob, buf, (5, 4)) == ("view", t, (2, 3, 5, 4))


def test_device_arrays_are_viewed_in_place_as_four_dims(rng):
    """q, k, v reach the kernels as (B, H, N, d) views of the caller's memory (leading ones added); an
    output already in the caller's shape is handed back as it is."""
    args = on_device(make_args(rng, lead=(3,)))
    prob, ops = _inputs.prepare({n: args[n] for n in ("q", "k", "v")}, causal=False, scale=None)
    for n in ("q", "k", "v"):
        view = ops[n].dev
        assert tuple(view.shape) == (1,) + tuple(args[n].shape)
        assert np.shares_memory(view._ary, args[n]._ary) if SIMULATOR else (
            view.device_ctypes_pointer.value == args[n].device_ctypes_pointer.value)
    out = cuda.to_device(np.zeros((3, NQ, D), np.float32))
    assert _inputs.finish(prob, out, (NQ, D)) is out
    prob4, ops4 = _inputs.prepare(on_device(make_args(rng, lead=(1, 3))), causal=False, scale=None)
    assert tuple(ops4["q"].dev.shape) == (1, 3, NQ, D) and ops4["lse"].dev.shape == (3, NQ)


@pytest.mark.gpu
@pytest.mark.parametrize("lead", [(), (3,), (2, 3)], ids=["N,d", "H,N,d", "B,H,N,d"])
def test_torch_inputs_give_torch_results_in_the_callers_shape(rng, lead):
    torch = pytest.importorskip("torch")
    args = make_args(rng, lead=lead, Nq=64, Nk=48, d=64)
    dev = torch.device("cuda", cuda.get_current_device().id)
    t = {n: torch.as_tensor(x, device=dev) for n, x in args.items()}
    t["q"].requires_grad_(True)  # detached inside, as the caller's graph is not ours
    host = call("flash_attention_forward", args, kernel="flash2_fast")
    for _ in range(2):  # the second call reuses PyTorch's cached blocks
        res = call("flash_attention_forward", t, kernel="flash2_fast")
        for name in ("o", "lse"):
            got = getattr(res, name)
            assert isinstance(got, torch.Tensor) and got.device == dev, name
            assert tuple(got.shape) == getattr(host, name).shape, name
            np.testing.assert_allclose(got.cpu().numpy(), getattr(host, name), rtol=1e-5, atol=1e-5, err_msg=name)
    t["q"] = t["q"].detach()
    back, want = call("flash_attention_backward", t, kernel="flash2"), call("flash_attention_backward", args)
    for name in ("dq", "dk", "dv"):
        got = getattr(back, name)
        assert isinstance(got, torch.Tensor) and got.device == dev and tuple(got.shape) == getattr(want, name).shape
        np.testing.assert_allclose(got.cpu().numpy(), getattr(want, name), rtol=1e-4, atol=1e-5, err_msg=name)
    strided_last = dict(t, q=t["q"].transpose(-1, -2).contiguous().transpose(-1, -2))  # copied, then used
    res = call("flash_attention_forward", strided_last, kernel="flash2_fast")
    np.testing.assert_allclose(res.o.cpu().numpy(), host.o, rtol=1e-5, atol=1e-5)
