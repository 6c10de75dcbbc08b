"""Launch plans (flash_numba._launch_plan): a replayed call computes what the normal path computes.

On a GPU with PyTorch: the second call of a signature replays the first one's launches
with new pointers.  Each test runs the normal path (plans off) and the replay on the
same fresh inputs: the deterministic kernels must agree bitwise, the atomic backward
within float32 rounding of its sums.  In the simulator plans are off; one test checks that.
"""

import numpy as np
import pytest

from flash_numba import _launch_plan, _switches, api
from flash_numba.device import SIMULATOR

torch = pytest.importorskip("torch")

gpu = pytest.mark.gpu


def test_plans_are_off_in_the_simulator():
    assert _launch_plan.ENABLED is (not SIMULATOR)
    if SIMULATOR:
        assert _launch_plan.key("forward", "flash2_fast", (), ()) is None


def _tensors(rng, shapes, dtype=torch.float32):
    return [torch.tensor(rng.standard_normal(s), dtype=dtype, device="cuda") for s in shapes]


def _normal(monkeypatch, fn, *args, **kw):
    with monkeypatch.context() as m:
        m.setattr(_launch_plan, "ENABLED", False)
        return fn(*args, **kw)


def _same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
    assert torch.equal(a, b) or torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(
        torch.nan_to_num(a), torch.nan_to_num(b))


def _forward_backward(kernel, q, k, v, do, causal, deterministic=True):
    f = api.attention_forward(q, k, v, kernel=kernel, causal=causal)
    b = api.attention_backward(q, k, v, f.o, f.lse, do, kernel=kernel, causal=causal, deterministic=deterministic)
    return f, b


@gpu
@pytest.mark.parametrize("kernel", ["flash2_fast", "flash2", "flash1", "standard"])
@pytest.mark.parametrize("causal", [False, True])
def test_replay_equals_the_normal_path(rng, monkeypatch, kernel, causal):
    shapes = [(2, 4, 97, 64), (2, 4, 83, 64), (2, 4, 83, 64), (2, 4, 97, 64)]
    _forward_backward(kernel, *_tensors(rng, shapes), causal)  # records (or finds) the plans
    q, k, v, do = _tensors(rng, shapes)  # new inputs: new pointers, new values
    f, b = _forward_backward(kernel, q, k, v, do, causal)
    key = api._plan_key("forward", kernel, (q, k, v), 0, False, 0.0, None, causal, None, None)
    assert isinstance(_launch_plan.lookup(key), _launch_plan.Plan), "the forward was not replayable"
    f0, b0 = _normal(monkeypatch, _forward_backward, kernel, q, k, v, do, causal)
    for got, want in ((f.o, f0.o), (f.lse, f0.lse), (b.dq, b0.dq), (b.dk, b0.dk), (b.dv, b0.dv)):
        _same(got, want)
    assert (f.kernel, f.block, b.block) == (f0.kernel, f0.block, b0.block)


def _dq_sum_of_magnitudes(q, k, v, o, lse, do, causal):
    """scale * sum_j |dS_ij| |K_j| in float64: the size of the terms each entry of dq adds up."""
    G = q.shape[1] // k.shape[1]
    q, k, v, o, lse, do = (t.double() for t in (q, k, v, o, lse, do))
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    scale = q.shape[-1] ** -0.5
    p = torch.exp(scale * q @ k.transpose(-1, -2) - lse[..., None])
    if causal:  # bottom-right aligned; here Nq == Nk
        n = q.shape[2]
        p = p.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), 0.0)
    ds = p * (do @ v.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
    return scale * ds.abs() @ k.abs()


@gpu
def test_replay_of_the_atomic_backward_and_grouped_query_heads(rng, monkeypatch):
    shapes = [(1, 8, 130, 64), (1, 2, 130, 64), (1, 2, 130, 64), (1, 8, 130, 64)]
    _forward_backward("flash2_fast", *_tensors(rng, shapes), True, deterministic=False)
    q, k, v, do = _tensors(rng, shapes)
    f, b = _forward_backward("flash2_fast", q, k, v, do, True, deterministic=False)
    f0, b0 = _normal(monkeypatch, _forward_backward, "flash2_fast", q, k, v, do, True, deterministic=False)
    for got, want in ((f.o, f0.o), (f.lse, f0.lse), (b.dk, b0.dk), (b.dv, b0.dv)):
        _same(got, want)  # one block writes each, in a fixed order
    # dq: float32 atomic adds in another order; two such sums of n terms differ by at most
    # 2 n u sum|terms| (u = 2^-24), n = 130 keys (plus the rounding of each term, inside the bound)
    terms = _dq_sum_of_magnitudes(q, k, v, f0.o, f0.lse, do, True)
    bound = 2 * 131 * 2.0**-24 * terms
    assert torch.all((b.dq.double() - b0.dq.double()).abs() <= bound)


@gpu
def test_packed_qkv_and_aliased_inputs_keep_their_pointers(rng, monkeypatch):
    """q, k, v as slices of one (B, N, 3, H, d) tensor, then q is k: each replay reads the right rows."""
    for _ in range(2):  # record, then replay with a new buffer
        qkv = _tensors(rng, [(2, 65, 3, 4, 32)])[0]
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        got = api.attention_forward(q, k, v, kernel="flash2_fast").o
        _same(got, _normal(monkeypatch, api.attention_forward, q, k, v, kernel="flash2_fast").o)
    for _ in range(2):
        x, v = _tensors(rng, [(2, 4, 33, 16), (2, 4, 33, 16)])
        got = api.attention_forward(x, x, v, kernel="flash2_fast").o
        _same(got, _normal(monkeypatch, api.attention_forward, x, x, v, kernel="flash2_fast").o)
    # the same shapes with q and k apart: another key (the pattern of shared pointers is part of it)
    q, k, v = _tensors(rng, [(2, 4, 33, 16)] * 3)
    _same(api.attention_forward(q, k, v, kernel="flash2_fast").o,
          _normal(monkeypatch, api.attention_forward, q, k, v, kernel="flash2_fast").o)


@gpu
def test_a_misaligned_view_gets_its_own_plan(rng, monkeypatch):
    """k and v 4 bytes into a buffer, with the shape and strides of a contiguous tensor: rows not on 16 bytes, so the
    forward must not replay the 16-byte loads recorded for aligned tensors (a misaligned load faults)."""
    shape = (2, 4, 64, 64)
    n = int(np.prod(shape))
    for _ in range(2):  # records, then replays, the aligned plan
        api.attention_forward(*_tensors(rng, [shape] * 3), kernel="flash2_fast")
    q = _tensors(rng, [shape])[0]
    k, v = (buf[1:1 + n].view(shape) for buf in _tensors(rng, [(n + 1,)] * 2))
    assert k.stride() == q.stride() and k.data_ptr() % 16 == 4
    key = api._plan_key("forward", "flash2_fast", (q, k, v), 0, False, 0.0, None, False, None, None)
    assert _launch_plan.lookup(key) is None  # not the aligned call's plan
    _same(api.attention_forward(q, k, v, kernel="flash2_fast").o,
          _normal(monkeypatch, api.attention_forward, q, k, v, kernel="flash2_fast").o)


@gpu
def test_a_call_that_copies_is_not_replayed(rng):
    """A last dim with stride 2 is copied inside the call: that copy is not a buffer a plan knows, so no plan."""
    q, k, v = (t[..., ::2] for t in _tensors(rng, [(1, 2, 40, 32)] * 3))
    for _ in range(2):
        o = api.attention_forward(q, k, v, kernel="flash2_fast").o
    key = api._plan_key("forward", "flash2_fast", (q, k, v), 0, False, 0.0, None, False, None, None)
    assert _launch_plan.lookup(key) is False
    ref = api.attention_forward(q.contiguous(), k.contiguous(), v.contiguous(), kernel="flash2_fast").o
    _same(o, ref)


@gpu
def test_bad_arguments_are_refused_the_same_after_a_plan_exists(rng):
    q, k, v = _tensors(rng, [(1, 2, 40, 16)] * 3)
    for _ in range(2):
        api.attention_forward(q, k, v, kernel="flash2_fast", causal=True)
    with pytest.raises(TypeError, match="causal"):
        api.attention_forward(q, k, v, kernel="flash2_fast", causal=1)
    with pytest.raises(ValueError, match="scale"):
        api.attention_forward(q, k, v, kernel="flash2_fast", causal=True, scale=float("inf"))


@gpu
def test_the_torch_drop_in_replays_forward_and_backward(rng, monkeypatch):
    import flash_numba.torch as fnt

    def step(q, k, v):
        o = fnt.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.square().sum().backward()
        return o.detach(), q.grad, k.grad, v.grad

    def inputs():
        return [t.requires_grad_() for t in _tensors(rng, [(2, 4, 64, 64)] * 3)]

    step(*inputs())
    q, k, v = inputs()
    got = step(q, k, v)
    want = _normal(monkeypatch, step, *(t.detach().clone().requires_grad_() for t in (q, k, v)))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.cpu().numpy(), b.cpu().numpy())


class _Function:
    """Stands in for a compiled function in a recorded launch (only its handle is read)."""

    handle = 0


def _recorded(buffers, returned, stream=0, streams=None):
    """A recorder of one launch (or one per stream of ``streams``) whose parameters are the data pointers of an
    input and of ``buffers`` ((tensor, fill) pairs; CPU tensors: only their pointers and sizes are read), the
    buffers' 8 bytes in; the plan _build makes of it, with ``returned`` (indices into buffers) as the call's
    results."""
    import ctypes

    q = torch.zeros(4)
    rec = _launch_plan._Recorder()
    for t, fill in buffers:
        rec.buffers.append((tuple(t.shape), t.dtype, fill, t))
    ptrs = [q.data_ptr()] + [t.data_ptr() + 8 for t, _ in buffers]
    params = [ctypes.c_void_p(p) for p in ptrs]
    for s in (stream,) if streams is None else streams:
        rec.launches.append((_Function(), 4, 128, 0, s, params, list(enumerate(ptrs))))
    return _launch_plan._build(rec, (q,), [buffers[i][0] for i in returned]), q, ptrs


def test_a_plan_keeps_small_scratch_and_allocates_the_rest():
    """A buffer the call neither returns nor fills is kept, up to SCRATCH_BYTES in all; its pointer stays in the
    launch; every other buffer is allocated per replay and written into its slot."""
    small, big = torch.empty(16), torch.empty(_launch_plan.SCRATCH_BYTES // 4)  # 64 B; 1 MiB: over, with small
    filled, out = torch.zeros(8), torch.empty(2, 3)
    plan, q, ptrs = _recorded([(small, None), (big, None), (filled, 0.0), (out, None)], returned=[3])
    assert [t is small for t in plan.kept] == [True]
    assert [b[0] for b in plan.buffers] == [tuple(big.shape), (8,), (2, 3)]  # allocated per replay, in order
    assert plan.results == [2]
    (launch,) = plan.launches
    slots = [(src, off) for _, src, off in launch.slots]
    assert slots == [(0, 0), (~0, 8), (~1, 8), (~2, 8)]  # q, big, filled, out: small is not a slot
    launched = []
    launch._launch = lambda *args: launched.append(args) or (launch._ok,)  # no GPU here: note the call
    launch.run([1000], [2000, 3000, 4000])  # what a replay writes
    assert [v.value for v in launch._values] == [1000, ptrs[1], 2008, 3008, 4008]
    assert launched == [launch.args] and launch.args[1:7] == (4, 1, 1, 128, 1, 1)


def test_scratch_is_kept_only_where_the_launches_share_one_stream(monkeypatch):
    """A plan's key holds its stream, so replays on one stream run one after the other and may share scratch;
    launches on two streams, or on Numba's stream 0 with per-thread default streams (another stream in each
    thread), could overlap: nothing is kept."""
    from numba.core import config

    scratch = [(torch.empty(16), None), (torch.empty(4), None)]
    plan = _recorded(scratch, returned=[1])[0]
    assert plan.context == 0  # a recorder that saw no context (no GPU here): replays leave the thread's as it is
    assert len(_recorded(scratch, returned=[1])[0].kept) == 1
    assert len(_recorded(scratch, returned=[1], stream=7)[0].kept) == 1
    assert _recorded(scratch, returned=[1], streams=(0, 7))[0].kept == []
    monkeypatch.setattr(config, "CUDA_PER_THREAD_DEFAULT_STREAM", 1, raising=False)
    assert _recorded(scratch, returned=[1])[0].kept == []
    monkeypatch.setattr(config, "CUDA_PER_THREAD_DEFAULT_STREAM", 0, raising=False)
    monkeypatch.setattr(_launch_plan, "SCRATCH_BYTES", 63)  # 64 bytes do not fit
    assert _recorded(scratch, returned=[1])[0].kept == []


@gpu
def test_replays_back_to_back_and_from_threads_share_the_kept_scratch(rng, monkeypatch):
    """The backward's plan keeps D (scratch it reuses): replays launched one after the other with no wait, and
    from four threads at once, each give what the normal path gives, bit for bit.  (Unpoisoned outputs: a
    NaN-filled buffer is a filled one, which a plan does not keep.)"""
    from concurrent.futures import ThreadPoolExecutor


    monkeypatch.setattr(_switches, "POISON_OUTPUTS", False)

    shapes = [(1, 4, 130, 64)] * 4
    calls = []
    for _ in range(9):
        q, k, v, do = _tensors(rng, shapes)
        f = api.attention_forward(q, k, v, kernel="flash2_fast")
        calls.append((q, k, v, f.o, f.lse, do))
    backward = api.attention_backward
    backward(*calls[0], kernel="flash2_fast")  # records the plan
    key = api._plan_key("backward", "flash2_fast", calls[0], 0, False, 0.0, None, False, None, None, True)
    plan = _launch_plan.lookup(key)
    assert isinstance(plan, _launch_plan.Plan) and len(plan.kept) == 1  # D
    got = [backward(*c, kernel="flash2_fast") for c in calls[1:5]]  # back to back
    with ThreadPoolExecutor(4) as pool:
        got += list(pool.map(lambda c: backward(*c, kernel="flash2_fast"), calls[5:]))
    for c, b in zip(calls[1:], got):
        b0 = _normal(monkeypatch, backward, *c, kernel="flash2_fast")
        for x, y in ((b.dq, b0.dq), (b.dk, b0.dk), (b.dv, b0.dv)):
            _same(x, y)


def test_launches_in_two_contexts_make_no_plan():
    rec = _launch_plan._Recorder(context=-1)
    assert _launch_plan._build(rec, (torch.zeros(1),), []) is None


def test_a_replay_makes_the_recorded_context_current_and_restores(monkeypatch):
    """_current pushes the plan's context where the thread has none or another, pops it after (also when a launch
    raises), and touches nothing where it is already current (driver calls faked: no GPU here)."""
    from cuda.bindings import driver

    calls, current = [], [0]
    ok = driver.CUresult.CUDA_SUCCESS
    monkeypatch.setattr(driver, "cuCtxGetCurrent", lambda: (ok, driver.CUcontext(current[0])))
    monkeypatch.setattr(driver, "cuCtxPushCurrent", lambda ctx: calls.append(("push", int(ctx))) or (ok,))
    monkeypatch.setattr(driver, "cuCtxPopCurrent", lambda: calls.append(("pop",)) or (ok, driver.CUcontext(0)))
    with _launch_plan._current(77):  # no context current: pushed, then popped
        assert calls == [("push", 77)]
    assert calls == [("push", 77), ("pop",)]
    calls.clear()
    current[0] = 77
    with _launch_plan._current(77):  # already current: left alone
        pass
    current[0] = 5
    with pytest.raises(ValueError), _launch_plan._current(77):  # another device's context: swapped for the block
        raise ValueError
    assert calls == [("push", 77), ("pop",)]
    calls.clear()
    with _launch_plan._current(0):  # a plan that saw no context (recorded off the GPU): nothing asked
        pass
    assert calls == []
