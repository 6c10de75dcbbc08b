"""flash_numba.torch under torch.compile and CUDA graphs: the custom ops, their fake tensors, no graph breaks.

The drop-in calls two PyTorch custom ops, ``flash_numba::attn_fwd`` and ``flash_numba::attn_bwd``
(:mod:`flash_numba.torch`): torch.compile sees each call as one node and never traces our Python.
CPU tensors run through the simulator here, so sizes are tiny (N <= 8, d = 16, B * H <= 4) and
each call takes about a second; compiled and eager runs call the same kernels on the same numbers, so
values and gradients are compared bit for bit. The ``gpu`` tests capture CUDA graphs and compile with
Inductor (``mode="reduce-overhead"`` uses CUDA graphs) at real sizes.
"""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[dev]' brings torch==2.13.0)")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.nn.attention.bias import causal_lower_right, causal_upper_left  # noqa: E402

import flash_numba.torch as fnt  # noqa: E402
from conftest import FULL  # noqa: E402
from flash_numba import api  # noqa: E402

D = 16


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch: Dynamo's cache of one function's graphs (at most 8) is not shared."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def randn(rng, *shape, dtype=torch.float64, device="cpu", grad=True):
    t = torch.from_numpy(rng.standard_normal(shape)).to(device=device, dtype=dtype)
    return t.requires_grad_(grad)


def sdpa(**kw):
    """The drop-in with keyword arguments fixed (a causal bias among them is built outside the compiled
    function: Dynamo cannot construct that tensor subclass, for PyTorch's SDPA as for ours)."""
    return lambda q, k, v: fnt.scaled_dot_product_attention(q, k, v, **kw)


#: (id, keyword arguments, q's shape, k's and v's shape): every argument of the drop-in, each branch of its
#: causal handling (top-left with L < S and L > S, the latter two calls), and both kinds of leading dims.
CASES = [
    ("plain", dict(kernel="standard"), (1, 2, 5, D), (1, 2, 5, D)),
    ("causal_L<S", dict(is_causal=True, kernel="flash2"), (1, 2, 3, D), (1, 2, 6, D)),
    ("causal_L>S_dropout", dict(is_causal=True, dropout_p=0.3, kernel="flash2"), (1, 2, 6, D), (1, 2, 4, D)),
    ("lower_right", dict(attn_mask=causal_lower_right(3, 6), kernel="flash1"), (1, 2, 3, D), (1, 2, 6, D)),
    ("upper_left", dict(attn_mask=causal_upper_left(3, 6), kernel="flash2_fast"), (1, 2, 3, D), (1, 2, 6, D)),
    ("gqa_scale", dict(enable_gqa=True, scale=0.3, kernel="flash2"), (1, 4, 5, D), (1, 2, 5, D)),
    ("3d_dropout", dict(dropout_p=0.5, kernel="flash2"), (2, 5, D), (2, 7, D)),
    ("5d_default_kernel", dict(is_causal=True), (1, 1, 2, 4, D), (1, 1, 2, 4, D)),
]
IDS = [c[0] for c in CASES]


def run(attend, q, k, v, do, seed=5):
    """Output and gradients of one call; torch.manual_seed first, so that dropout draws the same seed."""
    torch.manual_seed(seed)
    o = attend(q, k, v)
    return (o, *torch.autograd.grad(o, (q, k, v), do))


# ----------------------------------------------------------------------------- the ops


def test_schemas():
    assert str(torch.ops.flash_numba.attn_fwd.default._schema) == (
        "flash_numba::attn_fwd(Tensor q, Tensor k, Tensor v, bool causal, float scale, str? kernel, "
        "float dropout_p, Tensor? dropout_seed) -> (Tensor, Tensor)")
    assert str(torch.ops.flash_numba.attn_bwd.default._schema) == (
        "flash_numba::attn_bwd(Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, bool causal, "
        "float scale, str? kernel, float dropout_p, Tensor? dropout_seed) -> (Tensor, Tensor, Tensor)")


def _op_args(rng, dtype, gqa=False, dropout=False):
    q = randn(rng, 1, 2, 4, D, dtype=dtype)
    k, v = (randn(rng, 1, 1 if gqa else 2, 6, D, dtype=dtype) for _ in range(2))
    seed = torch.tensor([123456789], dtype=torch.int64) if dropout else None
    return q, k, v, 0.3 if dropout else 0.0, seed


@pytest.mark.parametrize("dtype, gqa, dropout, causal", [(torch.float32, False, False, True),
                                                         (torch.float64, True, True, False)])
@pytest.mark.slow
def test_opcheck(rng, dtype, gqa, dropout, causal):
    """torch.library.opcheck: schema, autograd registration, fake tensors against real ones (shapes,
    dtypes, strides), and AOT dispatch with dynamic shapes; forward and backward op."""
    q, k, v, p, seed = _op_args(rng, dtype, gqa, dropout)
    fwd = (q, k, v, causal, 0.25, "flash2", p, seed)
    o, lse = fnt.attn_fwd(*fwd)
    do = torch.from_numpy(rng.standard_normal(o.shape)).to(dtype)
    bwd = (do, q.detach(), k.detach(), v.detach(), o.detach(), lse, causal, 0.25, "flash2", p, seed)
    for op, args in ((fnt.attn_fwd, fwd), (fnt.attn_bwd, bwd)):
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, result


def test_fake_tensors_give_shapes_without_running_a_kernel(rng, monkeypatch):
    """Under a FakeTensorMode (what torch.compile traces with) the drop-in and its backward run the ops' fake
    functions: the shapes and dtypes of the real call, no kernel launched."""
    def no_kernels(*args, **kwargs):
        raise AssertionError("a kernel ran on fake tensors")

    monkeypatch.setattr(api, "attention_forward", no_kernels)
    monkeypatch.setattr(api, "attention_backward", no_kernels)
    with FakeTensorMode():
        q = torch.empty(2, 4, 6, D, dtype=torch.float16, requires_grad=True)
        k = torch.empty(2, 2, 9, D, dtype=torch.float16, requires_grad=True)
        v = torch.empty(2, 2, 9, D, dtype=torch.float16, requires_grad=True)
        o = fnt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, dropout_p=0.1)
        assert o.shape == q.shape and o.dtype == torch.float16
        dq, dk, dv = torch.autograd.grad(o.sum(), (q, k, v))
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
        o, lse = fnt.attn_fwd(q.double(), k.double(), v.double(), False, 0.25, "flash2", 0.0, None)
        assert lse.shape == (2, 4, 6) and lse.dtype == torch.float64 and o.is_contiguous()
        _, lse = fnt.attn_fwd(q, k, v, False, 0.25, "flash2", 0.0, None)
        assert lse.dtype == torch.float32


def test_the_lse_output_is_not_differentiable(rng):
    """lse is what the backward reads, not something it differentiates: autograd refuses a gradient through it
    rather than return a wrong one; and the backward op itself has no derivative (double backward refused)."""
    q, k, v, _, _ = _op_args(rng, torch.float64)
    o, lse = fnt.attn_fwd(q, k, v, False, 0.25, "flash2", 0.0, None)
    assert not lse.requires_grad and o.requires_grad
    (g,) = torch.autograd.grad(o.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="attn_bwd"):
        g.sum().backward()


# ----------------------------------------------------------------------------- torch.compile, in the simulator


@pytest.mark.parametrize("name, kw, q_shape, kv_shape", CASES, ids=IDS)
def test_no_graph_breaks(rng, name, kw, q_shape, kv_shape):
    """torch._dynamo.explain: one graph, no break, our forward op in it (with dropout, its seed drawn in the
    graph by torch.randint, before the op), the graph's inputs the function's own (a graph after a break would
    start from the broken frame's stack; fullgraph=True in the next test is the stricter check)."""
    q, k, v = randn(rng, *q_shape), randn(rng, *kv_shape), randn(rng, *kv_shape)
    explained = torch._dynamo.explain(sdpa(**kw))(q, k, v)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    code = explained.graphs[0].code
    assert code.count("torch.ops.flash_numba.attn_fwd") == (2 if name.startswith("causal_L>S") else 1)
    assert ("torch.randint" in code) == ("dropout_p" in kw)
    assert "L_q_" in code and "L_stack" not in code


#: (backend, case): every case with aot_eager (Dynamo and AOTAutograd, which traces the backward op too), the first
#: with eager (Dynamo alone); eager's other cases in make test-all
BACKEND_CASES = [pytest.param(backend, *case, id=f"{case[0]}-{backend}",
                              marks=FULL if backend == "eager" and case is not CASES[0] else ())
                 for case in CASES for backend in ("eager", "aot_eager")]


@pytest.mark.parametrize("backend, name, kw, q_shape, kv_shape", BACKEND_CASES)
@pytest.mark.slow
def test_compiled_values_and_gradients_equal_eager(rng, backend, name, kw, q_shape, kv_shape):
    """fullgraph=True (a graph break would raise); the same kernels on the same numbers: equal bit for bit,
    dropout included (torch.manual_seed before each run: the compiled graph draws the seed as eager does)."""
    q, k, v = randn(rng, *q_shape), randn(rng, *kv_shape), randn(rng, *kv_shape)
    do = randn(rng, *q_shape, grad=False)
    attend = sdpa(**kw)
    eager = run(attend, q, k, v, do)
    compiled = run(torch.compile(attend, backend=backend, fullgraph=True), q, k, v, do)
    for what, a, b in zip(("O", "dQ", "dK", "dV"), eager, compiled):
        assert torch.equal(a, b), what


@pytest.mark.slow
def test_dynamic_shapes(rng):
    """dynamic=True: sequence lengths and head dims traced as symbols (the default scale uses the head dim as
    an integer), and a float scale passed in as an argument; each length pair equal to eager bit for bit."""
    def attend(q, k, v, scale):
        return fnt.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, dropout_p=0.2, kernel="flash2")

    compiled = torch.compile(attend, backend="aot_eager", dynamic=True, fullgraph=True)
    for L, S, scale in ((5, 3, None), (4, 7, 0.3), (6, 6, 0.2)):
        q, k, v = randn(rng, 1, 2, L, D), randn(rng, 1, 2, S, D), randn(rng, 1, 2, S, D)
        do = randn(rng, 1, 2, L, D, grad=False)
        eager = run(lambda *a: attend(*a, scale), q, k, v, do)
        ours = run(lambda *a: compiled(*a, scale), q, k, v, do)
        assert all(torch.equal(a, b) for a, b in zip(eager, ours)), (L, S, scale)


def test_bad_arguments_raise_the_same_errors_compiled(rng):
    q = randn(rng, 1, 2, 4, D)
    attend = torch.compile(lambda q, kernel: fnt.scaled_dot_product_attention(q, q, q, kernel=kernel),
                           backend="eager")
    with pytest.raises(ValueError, match="^kernel:"):
        attend(q, "flash3")
    bad_scale = torch.compile(lambda q: fnt.scaled_dot_product_attention(q, q, q, scale=float("inf")),
                              backend="eager")
    with pytest.raises((TypeError, ValueError), match="^scale:"):  # compiled, the op checks a float's value
        bad_scale(q)


# ----------------------------------------------------------------------------- CUDA graphs and Inductor (GPU)


class AttentionBlock(torch.nn.Module):
    """x -> qkv projection -> our causal attention -> output projection (B, N, C), as in the example GPT."""

    def __init__(self, C=256, H=4, kernel=None, dropout=0.0):
        super().__init__()
        self.H, self.kernel, self.dropout = H, kernel, dropout
        self.c_attn, self.c_proj = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.c_attn(x).view(B, N, 3, self.H, C // self.H).permute(2, 0, 3, 1, 4)  # each (B, H, N, d)
        y = fnt.scaled_dot_product_attention(q, k, v, is_causal=True, kernel=self.kernel, dropout_p=self.dropout)
        return self.c_proj(y.transpose(1, 2).reshape(B, N, C))  # (B, N, C)


def _step(block, x):
    """One forward and backward; the output, and the gradients of x and of every parameter."""
    for p in block.parameters():
        p.grad = None
    x.grad = None
    y = block(x)
    (y.float().square().mean()).backward()
    return [y, x.grad] + [p.grad for p in block.parameters()]


GPU_CASES = [("flash2_fast", torch.float16), ("flash2_fast", torch.float32), ("standard", torch.float16),
             ("flash2", torch.float32)]


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, dtype", GPU_CASES, ids=[f"{k}-{str(d)[6:]}" for k, d in GPU_CASES])
def test_gpu_cuda_graph_of_forward_and_backward_replays_to_the_eager_result(kernel, dtype):
    """Capture a block's forward and backward (PyTorch's whole-network recipe: warm-up on a side stream, then
    torch.cuda.graph); replay with new inputs written into the static one: output and every gradient equal
    to an eager step on the same input, bit for bit (our kernels are deterministic; the block's matrix
    products are the same cuBLAS calls). Three replays with different inputs: no stale memory."""
    torch.manual_seed(0)
    block = AttentionBlock(kernel=kernel).to(device="cuda", dtype=dtype)
    static_x = torch.randn(4, 256, 256, device="cuda", dtype=dtype, requires_grad=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            _step(block, static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    for p in block.parameters():
        p.grad = None
    static_x.grad = None
    with torch.cuda.graph(graph):
        y = block(static_x)
        y.float().square().mean().backward()
    captured = [y, static_x.grad] + [p.grad for p in block.parameters()]
    for i in range(3):
        x = torch.randn_like(static_x)
        with torch.no_grad():
            static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        want = _step(block, x.detach().requires_grad_())
        for j, (a, b) in enumerate(zip(captured, want)):
            assert torch.equal(a, b), f"replay {i}, tensor {j}: max error {(a - b).abs().max().item():.3g}"


@pytest.mark.gpu
def test_gpu_capture_refuses_dropout_and_cpu_tensors_then_works():
    """What a graph cannot replay correctly is refused before anything is launched, naming the argument; the
    capture ends cleanly and the next call works."""
    q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16)
    fnt.scaled_dot_product_attention(q, q, q)  # compiled before the capture
    torch.cuda.synchronize()
    for kw, args, name in ((dict(dropout_p=0.1), (q, q, q), "dropout_p"),
                           ({}, (q.cpu(), q.cpu(), q.cpu()), "query")):
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match=f"^{name}:"):
            with torch.cuda.graph(graph):
                fnt.scaled_dot_product_attention(*args, **kw)
    o = fnt.scaled_dot_product_attention(q, q, q)
    torch.cuda.synchronize()
    assert torch.isfinite(o).all()


@pytest.mark.gpu
def test_gpu_compile_reduce_overhead_and_default_agree(monkeypatch):
    """Inductor with and without CUDA graphs (reduce-overhead vs default): the same generated code and our same
    kernels, so equal bit for bit over several steps with new inputs; close to eager (Inductor fuses the
    block's other operations differently); no graph break, and CUDA graphs were not skipped."""
    from torch._dynamo.utils import counters

    counters.clear()
    torch.manual_seed(0)
    block = AttentionBlock().to(device="cuda", dtype=torch.float16)
    default = torch.compile(block, fullgraph=True)
    graphed = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    for i in range(4):
        x = torch.randn(4, 256, 256, device="cuda", dtype=torch.float16, requires_grad=True)
        torch.compiler.cudagraph_mark_step_begin()
        got = [t.clone() for t in _step(graphed, x)]
        want = _step(default, x)
        eager = _step(block, x)
        for j, (a, b, c) in enumerate(zip(got, want, eager)):
            assert torch.equal(a, b), f"step {i}, tensor {j}"
            assert (a.float() - c.float()).abs().max().item() <= 2e-2 * max(c.float().abs().max().item(), 1e-3)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


@pytest.mark.gpu
def test_gpu_inductor_dropout_draws_the_eager_seed(monkeypatch):
    """Inductor with fallback_random=True draws random numbers as eager does: our dropout's seed then equals
    eager's, and the saved seed reaches the backward (Inductor's partitioner must not draw a second one).
    mode="reduce-overhead": the seed's draw on the CPU makes Inductor run this graph without CUDA graphs
    (a capture would refuse dropout)."""
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    counters.clear()

    monkeypatch.setattr(inductor_config, "fallback_random", True)
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(2, 4, 200, 64, device="cuda", generator=gen, requires_grad=True) for _ in range(3))
    do = torch.randn(2, 4, 200, 64, device="cuda", generator=gen)
    attend = sdpa(is_causal=True, dropout_p=0.2)
    eager = run(attend, q, k, v, do)
    compiled = torch.compile(attend, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # cudagraph trees would warm up, then record
        got = run(compiled, q, k, v, do)
    for what, a, b in zip(("O", "dQ", "dK", "dV"), eager, got):
        assert torch.equal(a, b), what
    assert counters["inductor"]["cudagraph_skips"] >= 1
