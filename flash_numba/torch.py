"""flash_numba inside PyTorch: ``scaled_dot_product_attention`` with autograd, and an attention module.

Three lines swap our kernels into a model that calls PyTorch's SDPA::

    from flash_numba.torch import scaled_dot_product_attention
    y = scaled_dot_product_attention(q, k, v, is_causal=True)   # q, k, v: (B, H, N, d) tensors
    y.sum().backward()                                           # dq, dk, dv from our backward

The function takes ``torch.nn.functional.scaled_dot_product_attention``'s arguments, shapes and
meaning, and runs flash_numba's kernels, forward and backward, as two PyTorch custom ops,
``flash_numba::attn_fwd`` and ``flash_numba::attn_bwd`` (:func:`attn_fwd`, :func:`attn_bwd`): autograd
saves O and the log-sum-exp L (never P) for the backward, which recomputes P blockwise, and
``torch.compile`` sees each call as one node, with no graph break (docs/TORCH_COMPILE.md).
In eager mode on plain tensors (no ``torch.compile``, no ``torch.func`` transform, no dispatch or function mode
in effect) the same two functions run under one ``torch.autograd.Function``, :class:`FlashNumbaAttention`,
instead: the custom ops' dispatch (schema, redispatch below autograd, the aliasing check, Dynamo's
disable wrappers, a second op inside the backward) cost more host time than our call itself (H200 host,
2026-12-02: about 0.45 ms of a GPT-shaped forward + backward that took 1.2 ms, against 0.11 ms for the
two calls of the package).
CUDA tensors stay on the GPU (read in place through ``__cuda_array_interface__``); CPU tensors go
through NumPy, so without a GPU they run in Numba's CUDA simulator (tiny sizes only).

What SDPA can do and we cannot is refused with an error that names the argument, never quietly
handed to another implementation: an ``attn_mask`` tensor, dtypes other than float16, bfloat16
(kernels that run it: flash2_tc, the default for it), float32 and float64, a value head dim different from
the query's, head dims above 128.

Attention dropout (``dropout_p > 0``) is the paper's (:mod:`flash_numba.kernels._dropout`): each call
draws a 32-bit seed from PyTorch's default CPU generator (so ``torch.manual_seed`` makes it
reproducible), the forward drops entries of P by a hash of (seed, head, row, column), and the
backward, given the seed saved in the autograd context, regenerates the same mask. Its masks are
not PyTorch's (another generator): the same p, not the same dropped entries. The seed is drawn outside
the op, as a tensor, so that a compiled model draws it as the eager one does; a CUDA-graph capture
refuses dropout (every replay would reuse the captured seed).

Grouped-query and multi-query attention as in SDPA: with ``enable_gqa=True`` key and value may have
Hkv heads where query has Hq, Hkv dividing Hq; query head h attends with key/value head
h // (Hq / Hkv) (SDPA's ``repeat_interleave``), and the kernels read K and V of the Hkv heads
without repeating them in memory; dK and dV, summed over each group, have key's shape. Without
``enable_gqa`` different head counts are an error, as in SDPA.

Causal masks: SDPA's ``is_causal=True`` is TOP-LEFT aligned (query i sees keys ``j <= i``), our
kernels' ``causal`` BOTTOM-RIGHT aligned (``j <= i + S - L``). They agree when ``L == S``. For
``L != S`` this module computes SDPA's top-left mask exactly with our kernels: when ``L < S`` no
query sees a key past ``L - 1``, so it is our causal attention on the first ``L`` keys; when
``L > S`` the first ``S`` query rows are our (square) causal attention and the rows from ``S`` on
see every key, a non-causal call. The bottom-right mask is available as in PyTorch, by passing
``attn_mask=torch.nn.attention.bias.causal_lower_right(L, S)``; rows that see no key give 0, as
SDPA does.
"""

from __future__ import annotations

import math
import numbers

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "flash_numba.torch needs PyTorch: pip install 'flash-numba[torch]' (or pip install torch)"
    ) from exc
from torch import nn

from . import api, kernels
from ._inputs import MAX_HEAD_DIM

__all__ = ["DEFAULT_KERNEL", "FlashNumbaAttention", "MultiheadAttention", "attn_bwd", "attn_fwd",
           "saved_for_backward", "scaled_dot_product_attention"]

#: The kernel ``kernel=None`` picks where the tensor-core kernel does not run (float32, float64, other head dims).
DEFAULT_KERNEL = api.DEFAULT_KERNEL

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _to_numpy(t):
    """A CPU tensor as NumPy; bfloat16 as its 16-bit words (flash_numba._inputs.as_bfloat16)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        from ._inputs import as_bfloat16

        return as_bfloat16(t.view(torch.int16).numpy().view("uint16"))
    return t.numpy()


def _to_tensor(x, device, bf16: bool):
    """A result back as a tensor on ``device``; uint16 words of a bfloat16 call as torch.bfloat16."""
    if type(x) is torch.Tensor:  # a call on CUDA tensors: the package's result is already one, on their device
        return x
    if bf16 and not isinstance(x, torch.Tensor) and str(getattr(x, "dtype", "")) == "uint16":
        return torch.from_numpy(x.view("int16")).view(torch.bfloat16).to(device)
    return torch.as_tensor(x, device=device)


def _run_forward(kernel, q, k, v, causal, scale, dropout_p=0.0, dropout_seed=None):
    """Our forward on (..., N, d) tensors: (o, lse) as tensors on q's device."""
    if q.is_cuda:  # read in place; the package returns torch tensors for torch inputs
        args = (q, k, v)
    else:  # CPU: through NumPy (the package copies it to the GPU, or runs the simulator)
        args = tuple(_to_numpy(t) for t in (q, k, v))
    res = api.attention_forward(*args, kernel=kernel, causal=causal, scale=scale, dropout_p=dropout_p,
                                dropout_seed=dropout_seed)
    bf16 = q.dtype == torch.bfloat16
    return _to_tensor(res.o, q.device, bf16), _to_tensor(res.lse, q.device, bf16)


def _run_backward(kernel, q, k, v, o, lse, do, causal, scale, dropout_p=0.0, dropout_seed=None):
    """Our backward from the saved O and L: (dq, dk, dv) as tensors on q's device."""
    args = (q, k, v, o, lse, do)
    if not q.is_cuda:
        args = tuple(_to_numpy(t) for t in args)
    res = api.attention_backward(*args, kernel=kernel, causal=causal, scale=scale, dropout_p=dropout_p,
                                 dropout_seed=dropout_seed)
    return tuple(_to_tensor(g, q.device, q.dtype == torch.bfloat16) for g in (res.dq, res.dk, res.dv))


# ----------------------------------------------------------------------------- the custom ops
#
# The forward and the backward are PyTorch custom ops (torch.library.custom_op), so that torch.compile
# sees each call as one node it does not trace into (the checks, views and launch plans of the package
# are Python Dynamo cannot follow), and CUDA-graph capture records their launches like any other op's.
# Each op is deterministic given its arguments: dropout's seed is an argument, a tensor drawn by the
# caller (:func:`_attend`) with torch.randint, so that a compiled model draws it as the eager one does.


def _seed(dropout_seed) -> int | None:
    """The seed of a (1,) int64 CPU tensor as a Python int (None without dropout)."""
    return None if dropout_seed is None else int(dropout_seed.reshape(()).item())


def _refuse_capture(q, dropout_p: float) -> None:
    """Refuse what a CUDA graph cannot replay correctly, before anything is launched."""
    # is_initialized(), not is_available(): a flag, where is_available() reads the environment every call (host time);
    # no stream can be capturing before PyTorch has initialised CUDA
    if not torch.cuda.is_initialized() or not torch.cuda.is_current_stream_capturing():
        return
    if not q.is_cuda:
        raise RuntimeError("query: a CUDA graph is being captured, but CPU tensors go through NumPy and "
                           "copies that a CUDA graph cannot capture; give CUDA tensors")
    if dropout_p > 0:
        raise RuntimeError("dropout_p: attention dropout cannot be captured in a CUDA graph: its seed is "
                           "read on the host, so every replay would drop the same entries; pass "
                           "dropout_p=0 inside the graph, or run the step without CUDA graphs")


def _lse_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.library.custom_op("flash_numba::attn_fwd", mutates_args=())
def attn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, kernel: str | None,
             dropout_p: float, dropout_seed: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """O and L of :func:`flash_numba.attention_forward` on (..., N, d) tensors of up to 4 dims, causal
    bottom-right aligned; k, v may have Hq / G heads (grouped-query attention); ``dropout_seed`` a (1,) int64
    CPU tensor when ``dropout_p > 0``, else None. Returns o (contiguous, q's shape) and lse (q's shape
    without the last dim; float32, float64 for float64 inputs)."""
    _refuse_capture(q, dropout_p)
    return _run_forward(kernel, q, k, v, causal, scale, dropout_p, _seed(dropout_seed))


@attn_fwd.register_fake
def _attn_fwd_fake(q, k, v, causal, scale, kernel, dropout_p, dropout_seed):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=_lse_dtype(q.dtype))  # (..., L, d), (..., L)


@torch.library.custom_op("flash_numba::attn_bwd", mutates_args=())
def attn_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
             lse: torch.Tensor, causal: bool, scale: float, kernel: str | None, dropout_p: float,
             dropout_seed: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of :func:`attn_fwd` from its o and lse and the output gradient ``do`` (any strides), by
    :func:`flash_numba.attention_backward` (recomputing P blockwise; with dropout, regenerating the mask
    from the same seed). Contiguous, shaped like q, k, v."""
    _refuse_capture(q, dropout_p)
    return _run_backward(kernel, q, k, v, o, lse, do, causal, scale, dropout_p, _seed(dropout_seed))


@attn_bwd.register_fake
def _attn_bwd_fake(do, q, k, v, o, lse, causal, scale, kernel, dropout_p, dropout_seed):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    """What autograd keeps for the backward: Q, K, V, O and L (one number per query row), and dropout's
    seed; never P."""
    q, k, v, causal, scale, kernel, dropout_p, dropout_seed = inputs
    o, lse = output
    ctx.mark_non_differentiable(lse)  # L is the backward's input, not something we differentiate
    ctx.save_for_backward(q, k, v, o, lse, *(() if dropout_seed is None else (dropout_seed,)))
    ctx.causal, ctx.scale, ctx.kernel, ctx.dropout_p = causal, scale, kernel, dropout_p


def _attn_fwd_backward(ctx, do, _dlse):
    q, k, v, o, lse, *seed = ctx.saved_tensors
    grads = attn_bwd(do, q, k, v, o, lse, ctx.causal, ctx.scale, ctx.kernel, ctx.dropout_p,
                     seed[0] if seed else None)  # (dq, dk, dv)
    # None for an input that needs no gradient; nothing for causal, scale, kernel and dropout's
    return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad)) + (None,) * 5


attn_fwd.register_autograd(_attn_fwd_backward, setup_context=_setup_context)


class FlashNumbaAttention(torch.autograd.Function):
    """The eager path of :func:`attn_fwd` and its backward: the same functions, the same saved tensors and the same
    checks, without the custom ops' dispatch (see the module docstring); arguments as :func:`attn_fwd`'s, outputs
    (o, lse).  :func:`_attend` takes it only where nothing needs to see the ops (:func:`_eager`)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, kernel, dropout_p, dropout_seed):
        _refuse_capture(q, dropout_p)
        o, lse = _run_forward(kernel, q, k, v, causal, scale, dropout_p, _seed(dropout_seed))
        _setup_context(ctx, (q, k, v, causal, scale, kernel, dropout_p, dropout_seed), (o, lse))
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        if torch.is_grad_enabled():  # create_graph=True: the op, so that a second derivative is refused as before
            return _attn_fwd_backward(ctx, do, _dlse)
        q, k, v, o, lse, *seed = ctx.saved_tensors
        _refuse_capture(q, ctx.dropout_p)
        grads = _run_backward(ctx.kernel, q, k, v, o, lse, do, ctx.causal, ctx.scale, ctx.dropout_p,
                              _seed(seed[0] if seed else None))  # (dq, dk, dv)
        return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad)) + (None,) * 5


def _eager(q, k, v) -> bool:
    """Whether a call may run :class:`FlashNumbaAttention` instead of the custom ops: eager mode, plain tensors, and no
    ``torch.func`` transform, dispatch mode (FakeTensorMode, selective checkpointing, FlopCounterMode), function
    mode or ``torch.jit.trace`` that expects to see the op.  ``torch.compile`` evaluates the first test to False
    when it traces."""
    return (not torch.compiler.is_compiling() and type(q) is torch.Tensor and type(k) is torch.Tensor
            and type(v) is torch.Tensor and not torch._C._are_functorch_transforms_active()
            and torch._C._len_torch_dispatch_stack() == 0 and not torch._C._is_torch_function_mode_enabled()
            and torch._C._get_tracing_state() is None)


#: The names of our backward nodes: the custom op's (GeneratedBackwardFor_flash_numba_attn_fwd_default) and the eager
#: path's (FlashNumbaAttentionBackward).
_OUR_NODES = ("GeneratedBackwardFor_flash_numba_attn_fwd", "FlashNumbaAttentionBackward")


def saved_for_backward(o) -> tuple:
    """The tensors that the autograd graph of ``o`` (an output of :func:`scaled_dot_product_attention`)
    keeps for our backward: Q, K, V, O and L (and dropout's seed), found past the views around our op."""
    node = o.grad_fn
    while node is not None and not type(node).__name__.startswith(_OUR_NODES):
        node = next((n for n, _ in node.next_functions if n is not None), None)
    if node is None:
        raise ValueError("o: no flash_numba attention in its autograd graph")
    return node.saved_tensors


def _check_tensors(query, key, value) -> None:
    """SDPA's shape and dtype rules that we share, with errors that name the argument."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"{name}: expected shape (..., N, E) with at least 2 dims, got {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}: dtype {t.dtype} is not supported by flash_numba; "
                            "use float16, bfloat16, float32 or float64")
        if t.layout != torch.strided:
            raise TypeError(f"{name}: layout {t.layout} is not supported; give a dense (strided) tensor")
    for name, t in (("key", key), ("value", value)):
        if t.dtype != query.dtype:
            raise TypeError(f"{name}: dtype {t.dtype} differs from query's {query.dtype}")
        if t.device != query.device:
            raise ValueError(f"{name}: on {t.device} but query is on {query.device}")
        if t.dim() != query.dim():
            raise ValueError(f"{name}: has {t.dim()} dims but query has {query.dim()}")
    L, E = query.shape[-2:]
    S = key.shape[-2]
    if key.shape[-1] != E:
        raise ValueError(f"key: head dim {key.shape[-1]} differs from query's {E}")
    if value.shape[-2] != S:
        raise ValueError(f"value: sequence length {value.shape[-2]} differs from key's {S}")
    if value.shape[-1] != E:
        raise ValueError(f"value: head dim Ev = {value.shape[-1]} differs from query's E = {E}; "
                         "flash_numba needs equal head dims")
    if not 1 <= E <= MAX_HEAD_DIM:
        raise ValueError(f"query: head dim E = {E} is not supported; use 1 <= E <= {MAX_HEAD_DIM}")
    if L == 0 or S == 0:
        raise ValueError(f"{'query' if L == 0 else 'key'}: empty sequence (L = {L}, S = {S})")
    if key.shape[:-2] != value.shape[:-2]:
        raise ValueError(f"value: leading dims {tuple(value.shape[:-2])} differ from key's {tuple(key.shape[:-2])}")


def _causal_variant(attn_mask, L: int, S: int) -> str | None:
    """"upper_left" or "lower_right" for a PyTorch CausalBias; NotImplementedError for any other mask."""
    from torch.nn.attention.bias import CausalBias, CausalVariant

    if not isinstance(attn_mask, CausalBias):
        raise NotImplementedError(
            "attn_mask: flash_numba supports no explicit mask tensor (it never forms the L x S matrix); "
            "use is_causal=True or torch.nn.attention.bias.causal_lower_right / causal_upper_left"
        )
    if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (L, S):
        raise ValueError(
            f"attn_mask: a causal bias for (L, S) = ({attn_mask.seq_len_q}, {attn_mask.seq_len_kv}) "
            f"but query and key give ({L}, {S})"
        )
    return "lower_right" if attn_mask.variant == CausalVariant.LOWER_RIGHT else "upper_left"


def _at_most_4d(t):
    """``t`` (..., N, E) with at most 4 dims, the leading ones merged into one (a view where the strides
    allow it, else a copy); tensors of up to 4 dims are passed as they are."""
    return t if t.dim() <= 4 else t.reshape(-1, *t.shape[-3:])


def _attend(q, k, v, causal: bool, scale: float, kernel: str | None, dropout_p: float = 0.0):
    """Our attention on (..., N, E) tensors of up to 4 dims (k, v: Hq / G heads for grouped-query attention),
    causal bottom-right aligned; with ``dropout_p > 0`` a fresh seed from PyTorch's default CPU generator
    for this call's mask."""
    # Any strides whose last dim is contiguous: a permuted view such as
    # qkv.view(B, N, 3, H, E).permute(2, 0, 3, 1, 4)[0] is read in place on the GPU (the kernels
    # take strides, flash_numba._inputs); CPU tensors go through NumPy, which copies them to the device.
    # The seed is a tensor drawn here, outside the op: torch.compile puts the draw in its graph, so a
    # compiled model consumes the generator as the eager one does (see docs/TORCH_COMPILE.md).
    seed = torch.randint(0, 2**32, (1,), dtype=torch.int64) if dropout_p > 0 else None
    if _eager(q, k, v):
        return FlashNumbaAttention.apply(q, k, v, causal, scale, kernel, dropout_p, seed)[0]
    return attn_fwd(q, k, v, causal, scale, kernel, dropout_p, seed)[0]


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, *, kernel=None
):
    """``torch.nn.functional.scaled_dot_product_attention`` computed by flash_numba's kernels.

    query: (..., L, E); key: (..., S, E); value: (..., S, E), the same leading dims (3-D
    ``(B*H, N, E)`` and 4-D ``(B, H, N, E)`` as in SDPA), except that with ``enable_gqa=True``
    key and value may have Hkv heads (dim -3) where query has Hq, Hkv dividing Hq (grouped-query
    attention); returns (..., L, E), differentiable in query, key and value. ``is_causal`` is
    SDPA's top-left mask (see the module docstring for L != S); ``attn_mask`` may be a
    ``torch.nn.attention.bias`` causal bias (``causal_lower_right`` is our kernels' native mask),
    nothing else. ``dropout_p`` in [0, 1): attention dropout as in the FlashAttention paper (see
    the module docstring; pass 0 in evaluation). ``scale`` defaults to 1/sqrt(E). ``kernel`` picks
    ``"standard"``, ``"flash1"``, ``"flash2"``, ``"flash2_fast"`` or ``"flash2_tc"``; None means the package's
    default for the dtype and head dim (:func:`flash_numba.api.default_kernel`: flash2_tc for float16 and
    bfloat16 where it runs, else :data:`DEFAULT_KERNEL`). Unsupported arguments raise (TypeError, ValueError or
    NotImplementedError, the message starting with the argument's name).
    """
    if kernel is not None and kernel not in kernels.NAMES:  # None: the package's default for the dtype and d
        raise ValueError(f"kernel: unknown kernel {kernel!r}; choose one of {', '.join(kernels.NAMES)} or None")
    _check_tensors(query, key, value)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p: expected a drop rate in [0, 1), got {dropout_p!r}")
    dropout_p = float(dropout_p)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal: expected True or False, got {is_causal!r}")
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa: expected True or False, got {enable_gqa!r}")
    L, E = query.shape[-2:]
    S = key.shape[-2]
    if query.shape[:-2] != key.shape[:-2]:
        hq, hkv = query.shape[-3] if query.dim() > 2 else 1, key.shape[-3] if key.dim() > 2 else 1
        if query.dim() > 2 and query.shape[:-3] == key.shape[:-3] and 0 < hkv < hq and hq % hkv == 0:
            if not enable_gqa:
                raise ValueError(f"enable_gqa: key and value have {hkv} heads but query has {hq}; pass "
                                 "enable_gqa=True for grouped-query attention (as SDPA)")
        else:
            raise ValueError(f"key: leading dims {tuple(key.shape[:-2])} differ from query's {tuple(query.shape[:-2])}"
                             + (f"; grouped-query attention needs key's heads ({hkv}) to divide query's ({hq})"
                                if enable_gqa else ""))
    variant = "upper_left" if is_causal else None
    if attn_mask is not None:
        if is_causal:
            raise ValueError("attn_mask: give either attn_mask or is_causal=True, not both (as SDPA)")
        variant = _causal_variant(attn_mask, L, S)
    if scale is None:
        scale = 1.0 / math.sqrt(int(E))  # int(): a head dim that torch.compile traces as a symbol becomes a constant
    elif isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale: expected a finite real number or None, got {scale!r}")
    elif not torch.compiler.is_compiling():  # compiled, a float argument may be traced as a symbol: the op
        if not math.isfinite(scale):  # checks its value when it runs (a ValueError naming scale)
            raise TypeError(f"scale: expected a finite real number or None, got {scale!r}")
        scale = float(scale)

    lead = query.shape[:-2]
    q, k, v = (_at_most_4d(t) for t in (query, key, value))  # (B, H, L, E), (B, Hkv, S, E): views
    if variant == "upper_left" and L < S:  # no query sees a key past L - 1
        o = _attend(q, k[..., :L, :], v[..., :L, :], True, scale, kernel, dropout_p)
    elif variant == "upper_left" and L > S:  # rows 0..S-1: square causal; rows S..L-1: every key
        o = torch.cat([_attend(q[..., :S, :], k, v, True, scale, kernel, dropout_p),  # (two calls, two seeds)
                       _attend(q[..., S:, :], k, v, False, scale, kernel, dropout_p)], dim=-2)
    else:  # no mask, lower_right (our kernels' own), or upper_left with L == S (the same mask)
        o = _attend(q, k, v, variant is not None, scale, kernel, dropout_p)
    return o.view(*lead, L, E)  # (..., L, E)


class MultiheadAttention(nn.Module):
    """``torch.nn.MultiheadAttention`` (the parts we support) with flash_numba's attention inside.

    The same parameters under the same names (``in_proj_weight``, ``in_proj_bias``,
    ``out_proj``), so a state dict moves between the two. ``causal=True`` applies SDPA's
    top-left causal mask. ``forward(query, key, value)`` returns ``(output, None)`` like
    PyTorch's module with ``need_weights=False``: the attention weights P are the matrix
    FlashAttention never forms, so ``need_weights=True`` is refused. ``dropout``: attention
    dropout's p while training (``module.train()``), none in evaluation, as PyTorch's.
    """

    def __init__(self, embed_dim, num_heads, bias=True, batch_first=True, causal=False, kernel=None,
                 device=None, dtype=None, dropout=0.0):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"num_heads: {num_heads} does not divide embed_dim = {embed_dim}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.batch_first, self.causal, self.kernel, self.dropout = batch_first, causal, kernel, dropout
        factory = {"device": device, "dtype": dtype}
        self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim, **factory))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * embed_dim, **factory)) if bias else None
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        nn.init.xavier_uniform_(self.in_proj_weight)  # PyTorch's initialisation
        if bias:
            nn.init.zeros_(self.out_proj.bias)

    def forward(self, query, key, value, need_weights=False):
        if need_weights:
            raise ValueError("need_weights: FlashAttention never forms the attention weights; pass need_weights=False")
        if not self.batch_first:  # (N, B, E) -> (B, N, E)
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        B, L, _ = query.shape
        S = key.shape[1]
        w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        b_q, b_k, b_v = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None,) * 3
        H, d = self.num_heads, self.head_dim
        q = nn.functional.linear(query, w_q, b_q).view(B, L, H, d).transpose(1, 2)  # (B, H, L, d)
        k = nn.functional.linear(key, w_k, b_k).view(B, S, H, d).transpose(1, 2)  # (B, H, S, d)
        v = nn.functional.linear(value, w_v, b_v).view(B, S, H, d).transpose(1, 2)  # (B, H, S, d)
        y = scaled_dot_product_attention(q, k, v, is_causal=self.causal, kernel=self.kernel,
                                         dropout_p=self.dropout if self.training else 0.0)  # (B, H, L, d)
        y = self.out_proj(y.transpose(1, 2).reshape(B, L, self.embed_dim))  # (B, L, E)
        return (y if self.batch_first else y.transpose(0, 1)), None
