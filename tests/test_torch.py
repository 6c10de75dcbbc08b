"""flash_numba.torch: SDPA's interface on our kernels, with autograd, against PyTorch's own SDPA.

CPU tensors run through the simulator here, so sizes are tiny (N <= 6, d <= 4) and the
gradchecks use ``fast_mode`` (a random projection of the Jacobian: four forward and four
backward calls instead of one per input and output element). The ``gpu`` tests use real sizes.

Tolerances (float64, unit roundoff u = 2^-53): a score s = scale q.k sums d products, so it is
off by at most about d u scale |q| |k|; exp turns that absolute error into a relative error
of P; normalising P and forming O = P V add about S u each; the backward adds sums of d, L
and S terms. Two float64 implementations (ours and SDPA's math) therefore differ by at most
~ u (d (1 + s_max) + L + S) times the size of the result, each; :func:`bound` takes 8x that.
A wrong mask, scale or gradient formula is off by 1e-3 or more at these sizes.
"""

import contextlib
import math
import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[dev]' brings torch==2.13.0)")

import torch.nn.functional as F  # noqa: E402
from torch.nn.attention.bias import causal_lower_right, causal_upper_left  # noqa: E402

import flash_numba.torch as fnt  # noqa: E402
from flash_numba import kernels  # noqa: E402
from conftest import FULL, skip_unless_runs  # noqa: E402

KERNELS = kernels.NAMES
U64 = 2.0**-53


def randn(rng, *shape, grad=True, device="cpu"):
    t = torch.from_numpy(rng.standard_normal(shape)).to(device)
    return t.requires_grad_(grad)


def bound(q, k, L, S):
    """8 u (d (1 + s_max) + L + S): the largest error of float64 attention relative to its result's size."""
    d = q.shape[-1]
    s_max = q.detach().norm(dim=-1).max().item() * k.detach().norm(dim=-1).max().item() / math.sqrt(d)
    return 8 * U64 * (d * (1 + s_max) + L + S)


def assert_close(ours, theirs, tol, what):
    scale = max(theirs.abs().max().item(), 1.0)  # absolute below 1: gradients that cancel to ~0
    err = (ours - theirs).abs().max().item() / scale
    assert err <= tol, f"{what}: error {err:.2e} > bound {tol:.2e}"


def values_and_grads(attend, q, k, v, do):
    o = attend(q, k, v)
    return (o, *torch.autograd.grad(o, (q, k, v), do))


def compare_with_sdpa(q, k, v, ours_kw, sdpa_kw, rng):
    """Our outputs and gradients against PyTorch's SDPA (float64, the math backend on the CPU)."""
    L, S = q.shape[-2], k.shape[-2]
    do = randn(rng, *q.shape[:-1], v.shape[-1], grad=False).to(q.device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # causal_lower_right warns about rows with no key (SDPA gives 0, as we do)
        theirs = values_and_grads(lambda *a: F.scaled_dot_product_attention(*a, **sdpa_kw), q, k, v, do)
    ours = values_and_grads(lambda *a: fnt.scaled_dot_product_attention(*a, **ours_kw), q, k, v, do)
    tol = bound(q, k, L, S)
    for name, a, b in zip(("O", "dQ", "dK", "dV"), ours, theirs):
        assert a.shape == b.shape and a.dtype == b.dtype and a.device == b.device, name
        assert_close(a, b, tol, name)
    return ours


# ----------------------------------------------------------------------------- gradcheck, every kernel


#: (kernel, causal): make test runs each kernel once, causal and not in turn; make test-all both for every kernel
GRADCHECK_CASES = [pytest.param(kernel, causal, id=f"{kernel}-{causal}", marks=() if causal == bool(i % 2) else FULL)
                   for i, kernel in enumerate(KERNELS) for causal in (False, True)]


@pytest.mark.parametrize("kernel, causal", GRADCHECK_CASES)
@pytest.mark.slow
def test_gradcheck(rng, kernel, causal):
    """torch.autograd.gradcheck on our backward, L != S: causal bottom-right (our kernels' own mask,
    L = 4 > S = 3: query row 0 sees no key) and not causal (L = 3 < S = 4).

    q, k and v are rows of one input tensor, so the finite differences cost two forward calls.
    Truncation error of the central difference (eps = 1e-6) is ~eps^2 = 1e-12, rounding ~u/eps = 1e-10:
    atol 1e-8, rtol 1e-6 sit 100x above both; dK off by a factor 1.001 fails (tried).
    """
    L, S, d = (4, 3, 2) if causal else (3, 4, 2)
    skip_unless_runs(kernel, d, "float64")  # gradcheck needs float64
    mask = causal_lower_right(L, S) if causal else None
    x = randn(rng, 1, L + 2 * S, d)  # (1, L + 2S, d): the rows of q, k and v

    def attend(x):
        q, k, v = x[:, :L], x[:, L : L + S], x[:, L + S :]
        return fnt.scaled_dot_product_attention(q, k, v, attn_mask=mask, kernel=kernel)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.autograd.gradcheck(attend, (x,), fast_mode=True, atol=1e-8, rtol=1e-6)


# ----------------------------------------------------------------------------- against PyTorch's SDPA


@pytest.mark.parametrize(
    "shape_q, shape_kv, causal, kernel",
    [
        ((1, 1, 5, 4), (1, 1, 5, 4), "is_causal", None),  # 4-D, L == S: both alignments agree; the default kernel
        ((1, 3, 4), (1, 6, 4), "is_causal", "flash1"),  # 3-D, L < S: top-left = our causal on the first L keys
        ((1, 1, 6, 3), (1, 1, 4, 3), "is_causal", "flash2"),  # L > S: rows >= S see every key (two calls)
        ((1, 1, 5, 3), (1, 1, 3, 3), "lower_right", "standard"),  # our own mask, PyTorch's causal_lower_right
        ((1, 2, 3, 4), (1, 2, 5, 4), None, "flash1"),
    ],
)
def test_values_and_grads_match_sdpa(rng, shape_q, shape_kv, causal, kernel):
    """Simulator cost: a flash1 call is the cheapest; each kernel appears once here, every one in the gradchecks."""
    q, k, v = randn(rng, *shape_q), randn(rng, *shape_kv), randn(rng, *shape_kv)
    L, S = shape_q[-2], shape_kv[-2]
    if causal == "lower_right":
        sdpa_kw = {"attn_mask": causal_lower_right(L, S)}
    else:
        sdpa_kw = {"is_causal": causal == "is_causal"}
    compare_with_sdpa(q, k, v, {**sdpa_kw, "kernel": kernel}, sdpa_kw, rng)


@pytest.mark.parametrize(
    "shape_q, shape_kv, is_causal, kernel",
    [
        pytest.param((2, 4, 5, 4), (2, 2, 5, 4), True, "flash2_fast", marks=FULL),  # G = 2, batch 2 (the costliest)
        ((1, 4, 3, 4), (1, 1, 5, 4), False, "flash1"),  # multi-query (G = Hq), L < S
        ((4, 4, 3), (2, 4, 3), True, "standard"),  # 3-D (H, N, E)
        ((1, 2, 5, 3), (1, 1, 4, 3), True, "flash2"),  # L > S: two calls, both grouped
    ],
)
@pytest.mark.slow
def test_grouped_query_attention_matches_sdpa(rng, shape_q, shape_kv, is_causal, kernel):
    """enable_gqa=True against PyTorch's SDPA with enable_gqa=True: O, and dK, dV summed over each group."""
    q, k, v = randn(rng, *shape_q), randn(rng, *shape_kv), randn(rng, *shape_kv)
    sdpa_kw = {"is_causal": is_causal, "enable_gqa": True}
    compare_with_sdpa(q, k, v, {**sdpa_kw, "kernel": kernel}, sdpa_kw, rng)


# GQA of every kernel: tests/test_gqa.py; flash1 costs the simulator least (flash2_fast: make test-all)
@pytest.mark.parametrize("kernel", ["flash1", pytest.param("flash2_fast", marks=FULL)])
@pytest.mark.slow
def test_grouped_query_gradcheck(rng, kernel):
    """gradcheck through the simulator with 2 query heads per key/value head (tolerances as in test_gradcheck).

    q (1, 4, 3, 2), k and v (1, 2, 4, 2) are slices of one input, as there.
    """
    x = randn(rng, 4 * 3 * 2 + 2 * 2 * 4 * 2)

    def attend(x):
        q, k, v = x[:24].view(1, 4, 3, 2), x[24:40].view(1, 2, 4, 2), x[40:].view(1, 2, 4, 2)
        return fnt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, kernel=kernel)

    assert torch.autograd.gradcheck(attend, (x,), fast_mode=True, atol=1e-8, rtol=1e-6)


def test_top_left_and_bottom_right_differ_when_l_ne_s(rng):
    """SDPA's is_causal (top-left) is not our kernels' causal (bottom-right) for L != S; both are offered."""
    q, k, v = randn(rng, 1, 3, 4, grad=False), randn(rng, 1, 5, 4, grad=False), randn(rng, 1, 5, 4, grad=False)
    top_left = fnt.scaled_dot_product_attention(q, k, v, is_causal=True, kernel="flash1")
    upper_left = fnt.scaled_dot_product_attention(q, k, v, attn_mask=causal_upper_left(3, 5), kernel="flash1")
    bottom_right = fnt.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(3, 5), kernel="flash1")
    assert torch.equal(top_left, upper_left)
    assert (top_left - bottom_right).abs().max() > 0.1  # row 0 sees key 0 only, or keys 0..2
    tol = bound(q, k, 3, 5)
    assert_close(top_left, F.scaled_dot_product_attention(q, k, v, is_causal=True), tol, "top-left")
    assert_close(bottom_right, F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(3, 5)), tol, "br")


def test_scale_and_float32(rng):
    """A given scale, and float32 (the kernels accumulate in float32: the float32 bound, u = 2^-24)."""
    q, k, v = (randn(rng, 2, 5, 4, grad=False).float() for _ in range(3))
    ours = fnt.scaled_dot_product_attention(q, k, v, scale=0.3, kernel="flash2")
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=0.3)
    assert ours.dtype == torch.float32
    assert_close(ours.double(), ref, bound(q, k, 5, 5) * 2.0**29, "O float32")  # u32 / u64 = 2^29


def test_permuted_views_of_a_fused_qkv(rng):
    """A model's q, k, v: views of one (B, N, 3, H, d) projection, permuted to (B, H, N, d)."""
    B, N, H, d = 1, 5, 2, 3
    qkv = randn(rng, B, N, 3 * H * d)
    q, k, v = qkv.view(B, N, 3, H, d).permute(2, 0, 3, 1, 4)  # each (B, H, N, d), not contiguous
    assert not q.is_contiguous()
    do = randn(rng, B, H, N, d, grad=False)
    ours = fnt.scaled_dot_product_attention(q, k, v, is_causal=True, kernel="flash1")
    (g_ours,) = torch.autograd.grad(ours, qkv, do)
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    (g_theirs,) = torch.autograd.grad(theirs, qkv, do)
    tol = bound(q, k, N, N)
    assert_close(ours, theirs, tol, "O")
    assert_close(g_ours, g_theirs, tol, "d qkv")


def test_views_reach_the_kernels_uncopied(rng, monkeypatch):
    """The (B, N, H, d) -> (B, H, N, d) transposed views of a projection, the tuned kernel: flash_numba.torch
    hands them on as they are (no .contiguous(), no reshape copy; the autograd node saves the views
    themselves), and O and the gradient match SDPA's."""
    B, N, H, d = 1, 5, 2, 4
    x = randn(rng, B, N, 3 * H * d)
    q, k, v = (t.view(B, N, H, d).transpose(1, 2) for t in x.split(H * d, dim=-1))
    calls = []
    contiguous = torch.Tensor.contiguous
    spy = lambda t, *a, **kw: calls.append(t.shape) or contiguous(t, *a, **kw)  # noqa: E731
    monkeypatch.setattr(torch.Tensor, "contiguous", spy)
    ours = fnt.scaled_dot_product_attention(q, k, v, is_causal=True, kernel="flash2_fast")
    assert calls == []
    node = ours.grad_fn.next_functions[0][0]  # ours.grad_fn is the view back to (..., L, E)
    for saved, view in zip(node.saved_tensors, (q, k, v)):
        assert saved.data_ptr() == view.data_ptr() and saved.stride() == view.stride()
    do = randn(rng, B, H, N, d, grad=False)
    (g_ours,) = torch.autograd.grad(ours, x, do)
    monkeypatch.undo()
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    (g_theirs,) = torch.autograd.grad(theirs, x, do)
    tol = bound(q, k, N, N)
    assert_close(ours, theirs, tol, "O")
    assert_close(g_ours, g_theirs, tol, "dx")


def test_gradients_only_where_asked(rng):
    q, k, v = randn(rng, 1, 4, 2), randn(rng, 1, 4, 2, grad=False), randn(rng, 1, 4, 2, grad=False)
    o = fnt.scaled_dot_product_attention(q, k, v, kernel="flash1")
    o.sum().backward()
    assert q.grad is not None and k.grad is None and v.grad is None
    (g,) = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v).sum(), q)
    assert_close(q.grad, g, bound(q, k, 4, 4), "dQ")
    with torch.no_grad():
        assert not fnt.scaled_dot_product_attention(q, k, v, kernel="flash1").requires_grad


def test_the_backward_uses_the_saved_o_and_lse_only(rng):
    """What the autograd graph keeps: Q, K, V, O and L (N numbers per row of q), no L x S matrix."""
    q, k, v = randn(rng, 1, 5, 2), randn(rng, 1, 6, 2), randn(rng, 1, 6, 2)
    o = fnt.scaled_dot_product_attention(q, k, v, kernel="flash1")
    node = o.grad_fn.next_functions[0][0]  # o.grad_fn is the view back to (..., L, E)
    assert type(node).__name__ == "FlashNumbaAttentionBackward"  # eager: our autograd.Function, not the op's node
    saved = [t.shape for t in fnt.saved_for_backward(o)]
    assert saved == [(1, 5, 2), (1, 6, 2), (1, 6, 2), (1, 5, 2), (1, 5)]


class _OpNames(torch.utils._python_dispatch.TorchDispatchMode):
    """A dispatch mode that notes the name of every op it sees and runs it."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_the_eager_path_equals_the_custom_ops(rng, dropout_p):
    """Eager calls on plain tensors run FlashNumbaAttention (no custom-op dispatch: host time); under a dispatch mode
    the custom ops run (what torch.compile and the modes see). Both give the same O and gradients bit for bit (with
    dropout: the same seed drawn from torch.manual_seed), keep the same tensors for the backward, and refuse a
    second derivative."""
    q, k, v = randn(rng, 2, 5, 4), randn(rng, 2, 7, 4), randn(rng, 2, 7, 4)
    do = randn(rng, 2, 5, 4, grad=False)
    runs = []
    for mode in (None, _OpNames()):
        torch.manual_seed(7)
        with mode or contextlib.nullcontext():
            o = fnt.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p, kernel="flash1")
            saved = [(t.shape, t.dtype) for t in fnt.saved_for_backward(o)]
            grads = torch.autograd.grad(o, (q, k, v), do)
        runs.append((o.detach(), *grads, saved))
        if mode is not None:
            assert "flash_numba.attn_fwd.default" in mode.names and "flash_numba.attn_bwd.default" in mode.names
        else:
            assert type(o.grad_fn.next_functions[0][0]).__name__ == "FlashNumbaAttentionBackward"
    (o1, *g1, s1), (o2, *g2, s2) = runs
    assert torch.equal(o1, o2) and all(torch.equal(a, b) for a, b in zip(g1, g2)) and s1 == s2
    o = fnt.scaled_dot_product_attention(q, k, v, kernel="flash1")
    (g,) = torch.autograd.grad(o.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="attn_bwd"):  # the backward op has no derivative
        g.sum().backward()


# ----------------------------------------------------------------------------- what we refuse


def _bad_calls():
    """(arguments, exception, the argument the message must start with)."""
    q = torch.zeros(1, 2, 4, 8, dtype=torch.float64)
    kv2 = torch.zeros(1, 1, 4, 8, dtype=torch.float64)
    kv3 = torch.zeros(1, 3, 4, 8, dtype=torch.float64)
    mask = torch.ones(4, 4, dtype=torch.bool)
    return [
        ((q, q, q), {"attn_mask": mask}, NotImplementedError, "attn_mask"),
        ((q, q, q), {"attn_mask": causal_lower_right(4, 4), "is_causal": True}, ValueError, "attn_mask"),
        ((q, q, q), {"attn_mask": causal_lower_right(3, 4)}, ValueError, "attn_mask"),
        ((q, q, q), {"dropout_p": 1.0}, ValueError, "dropout_p"),
        ((q, q, q), {"dropout_p": 1.5}, ValueError, "dropout_p"),
        ((q, kv2, kv2), {}, ValueError, "enable_gqa"),  # different head counts need enable_gqa=True, as in SDPA
        ((q, kv3, kv3), {"enable_gqa": True}, ValueError, "key"),  # 3 key/value heads do not divide 2
        ((q, kv2[0], kv2[0]), {"enable_gqa": True}, ValueError, "key"),  # ranks differ
        ((q, kv2, q), {"enable_gqa": True}, ValueError, "value"),  # key and value heads differ
        ((q.int(),) * 3, {}, TypeError, "query"),
        ((q, q.float(), q), {}, TypeError, "key"),
        ((q, q, q[..., :4]), {}, ValueError, "value"),
        ((torch.zeros(1, 4, 129, dtype=torch.float64),) * 3, {}, ValueError, "query"),
        ((q.numpy(), q, q), {}, TypeError, "query"),
        ((q, q, q), {"scale": float("nan")}, TypeError, "scale"),
        ((q, q, q), {"is_causal": 1}, TypeError, "is_causal"),
        ((q, q, q), {"kernel": "flash3"}, ValueError, "kernel"),
    ]


@pytest.mark.parametrize("args, kwargs, exc, name", _bad_calls())
def test_unsupported_arguments_raise_naming_the_argument(args, kwargs, exc, name):
    with pytest.raises(exc, match=f"^{name}:"):
        fnt.scaled_dot_product_attention(*args, **kwargs)


def test_module_refuses_need_weights_and_bad_heads():
    with pytest.raises(ValueError, match="^num_heads:"):
        fnt.MultiheadAttention(10, 3)
    mha = fnt.MultiheadAttention(8, 2)
    x = torch.zeros(1, 3, 8)
    with pytest.raises(ValueError, match="^need_weights:"):
        mha(x, x, x, need_weights=True)


# ----------------------------------------------------------------------------- the module


def test_module_matches_torch_multihead_attention(rng):
    """Same state dict, same output and parameter gradients as torch.nn.MultiheadAttention (causal)."""
    B, N, E, H = 1, 6, 8, 2
    torch.manual_seed(int(rng.integers(2**31)))
    theirs = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64)
    ours = fnt.MultiheadAttention(E, H, causal=True, kernel="flash1", dtype=torch.float64)
    ours.load_state_dict(theirs.state_dict())
    x = randn(rng, B, N, E, grad=False)
    mask = torch.ones(N, N, dtype=torch.bool).triu(1)  # True: not allowed (key after query)
    y_theirs, _ = theirs(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)
    y_ours, w = ours(x, x, x)
    assert w is None
    tol = 4 * bound(x, x, N, N) * E  # the projections add sums of E terms before and after
    assert_close(y_ours, y_theirs, tol, "output")
    y_theirs.square().sum().backward()
    y_ours.square().sum().backward()
    for (name, p_ours), p_theirs in zip(ours.named_parameters(), theirs.parameters()):
        assert_close(p_ours.grad, p_theirs.grad, tol, name)


def test_module_sequence_first_cross_attention(rng):
    """batch_first=False and L != S (no mask), forward only."""
    E, H = 8, 2
    theirs = torch.nn.MultiheadAttention(E, H, dtype=torch.float64)
    ours = fnt.MultiheadAttention(E, H, batch_first=False, kernel="flash1", dtype=torch.float64)
    ours.load_state_dict(theirs.state_dict())
    q, kv = randn(rng, 3, 1, E, grad=False), randn(rng, 5, 1, E, grad=False)  # (L, B, E), (S, B, E)
    with torch.no_grad():
        y_ours, _ = ours(q, kv, kv)
        y_theirs, _ = theirs(q, kv, kv, need_weights=False)
    assert_close(y_ours, y_theirs, 4 * bound(q, kv, 3, 5) * E, "output")


# ----------------------------------------------------------------------------- real sizes (GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
def test_gpu_gradcheck_cuda_tensors(rng, kernel):
    skip_unless_runs(kernel, 8, "float64")  # gradcheck needs float64
    x = randn(rng, 2, 7 + 2 * 9, 8, device="cuda")

    def attend(x):
        return fnt.scaled_dot_product_attention(x[:, :7], x[:, 7:16], x[:, 16:], is_causal=True, kernel=kernel)

    assert torch.autograd.gradcheck(attend, (x,), fast_mode=True, atol=1e-8, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
def test_gpu_fused_qkv_float32_real_size(rng, kernel):
    """B = 4, H = 8, N = 1024, d = 64, views of a fused projection, float32 against float64 SDPA.

    Bound 1e-5 relative, as the other GPU tests: the float32 kernels' error at these sizes is ~1e-6.
    """
    B, N, H, d = 4, 1024, 8, 64
    skip_unless_runs(kernel, d, "float32")
    qkv = randn(rng, B, N, 3 * H * d, device="cuda").float().detach().requires_grad_()
    q, k, v = qkv.view(B, N, 3, H, d).permute(2, 0, 3, 1, 4)  # (B, H, N, d) views
    do = randn(rng, B, H, N, d, grad=False, device="cuda").float()
    o = fnt.scaled_dot_product_attention(q, k, v, is_causal=True, kernel=kernel)
    assert o.is_cuda and o.dtype == torch.float32
    (g,) = torch.autograd.grad(o, qkv, do)
    qkv64 = qkv.detach().double().requires_grad_()
    q64, k64, v64 = qkv64.view(B, N, 3, H, d).permute(2, 0, 3, 1, 4)
    o64 = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
    (g64,) = torch.autograd.grad(o64, qkv64, do.double())
    assert_close(o.double(), o64, 1e-5, "O")
    assert_close(g.double(), g64, 1e-5, "d qkv")


@pytest.mark.gpu
def test_gpu_module_matches_torch(rng):
    E, H, N = 256, 4, 512
    theirs = torch.nn.MultiheadAttention(E, H, batch_first=True, device="cuda")
    ours = fnt.MultiheadAttention(E, H, causal=True, device="cuda")
    ours.load_state_dict(theirs.state_dict())
    x = randn(rng, 2, N, E, grad=False, device="cuda").float()
    mask = torch.ones(N, N, dtype=torch.bool, device="cuda").triu(1)
    with torch.no_grad():
        y_theirs, _ = theirs(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)
        y_ours, _ = ours(x, x, x)
    assert_close(y_ours, y_theirs, 1e-5, "output")



def test_lesson_10s_backend_table_on_cpu_tensors():
    """lessonkit.sdpa_backend_rows: every backend gives a row, measured or refused with PyTorch's reason;
    the MATH backend (which always runs) agrees with the float64 reference to float32 rounding."""
    import numpy as np

    from flash_numba import reference

    from flash_numba.course import lessonkit

    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 16, 8)).astype(np.float32) for _ in range(3))
    o_ref = reference.attention_forward(q[:1, :1], k[:1, :1], v[:1, :1])[0][0, 0]
    rows = lessonkit.sdpa_backend_rows(*(torch.from_numpy(x) for x in (q, k, v)), o_ref, lambda call: None,
                                       dtypes=(torch.float32,))
    assert {r[0] for r in rows} >= {"MATH"} and all(r[2] in ("-", "refused") for r in rows)
    math_row = next(r for r in rows if r[0] == "MATH")
    # 16 keys, d = 8, |o| <= max|v| ~ 3: float32 rounding stays far below 1e-5
    assert float(math_row[3]) < 1e-5


# ----------------------------------------------------------------------------- dropout


def test_gradcheck_with_dropout(rng):
    """gradcheck through the simulator with dropout p = 0.3 (flash2, causal top-left, L = S): the seed is
    drawn from torch's generator, reset before every call so that each call drops the same entries; the
    backward regenerates them from the seed saved in the context (tolerances as in test_gradcheck)."""
    L, d = 4, 2
    x = randn(rng, 1, 3 * L, d)

    def attend(x):
        torch.manual_seed(7)
        return fnt.scaled_dot_product_attention(x[:, :L], x[:, L : 2 * L], x[:, 2 * L :], dropout_p=0.3,
                                                is_causal=True, kernel="flash2")

    assert torch.autograd.gradcheck(attend, (x,), fast_mode=True, atol=1e-8, rtol=1e-6)
    assert not torch.equal(attend(x), fnt.scaled_dot_product_attention(x[:, :L], x[:, L : 2 * L], x[:, 2 * L :],
                                                                          is_causal=True, kernel="flash2"))


def test_dropout_seed_follows_torch_manual_seed_and_the_module_drops_only_in_training(rng):
    q, k, v = (randn(rng, 1, 1, 5, 4, grad=False) for _ in range(3))
    torch.manual_seed(3)
    a = fnt.scaled_dot_product_attention(q, k, v, dropout_p=0.5, kernel="flash2")
    torch.manual_seed(3)
    b = fnt.scaled_dot_product_attention(q, k, v, dropout_p=0.5, kernel="flash2")
    c = fnt.scaled_dot_product_attention(q, k, v, dropout_p=0.5, kernel="flash2")
    assert torch.equal(a, b) and not torch.equal(a, c)
    mha = fnt.MultiheadAttention(8, 2, kernel="flash2", dtype=torch.float64, dropout=0.5)
    x = randn(rng, 1, 5, 8, grad=False)
    mha.eval()
    assert torch.equal(mha(x, x, x)[0], mha(x, x, x)[0])
    mha.train()
    assert not torch.equal(mha(x, x, x)[0], mha(x, x, x)[0])
