"""The public functions: standard attention and FlashAttention, forward and backward."""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass

import numpy as np

from . import _inputs, _launch_plan, _stream, _switches, device, kernels
from .hbm import Counters, HBMCount
from .iomodel import terms
from .kernels import _dropout

# Numba's CUDA simulator runs one kernel at a time per process (its threads keep the
# launch's state in module globals): calls from several Python threads take turns.
# On a GPU calls run concurrently; each allocates its own outputs.
_SIMULATOR_LOCK = threading.Lock()


def _one_launch_at_a_time():
    return _SIMULATOR_LOCK if device.SIMULATOR else contextlib.nullcontext()


@dataclass
class ForwardResult:
    """``o``: the output, shaped like q; ``lse``: L = m + log(l) per query row,
    shape ``lead + (Nq,)`` (-inf for a row with no visible key, whose o is 0);
    ``hbm``: an :class:`~flash_numba.hbm.HBMCount` when ``count_hbm=True``, else None;
    ``kernel`` and ``block`` say what ran; ``dropout_seed``: the seed of the keep mask
    when ``dropout_p > 0`` (pass it to the backward), else None."""

    o: object
    lse: object
    hbm: HBMCount | None
    kernel: str
    block: tuple[int, int] | None
    dropout_seed: int | None = None


@dataclass
class BackwardResult:
    """``dq``, ``dk``, ``dv``: gradients shaped like q, k, v; ``hbm`` as in :class:`ForwardResult`."""

    dq: object
    dk: object
    dv: object
    hbm: HBMCount | None
    kernel: str
    block: tuple[int, int] | None


def resolve_block(kernel: str, d: int, dtype, block=None, pass_: str = "forward", deterministic: bool = True):
    """The ``(Br, Bc)`` a call would use (``None`` for kernels with fixed tiles); ``deterministic``: that option of
    the backward call (the atomic backward may choose its own block).

    Its arguments are checked as the attention functions check theirs: ``d`` an integer (NumPy integers
    accepted) and ``dtype`` a dtype that the kernel runs (its spec's ``check_supported``: 1..128 and float16,
    float32 or float64 for today's kernels).
    """
    spec = kernels.get(kernel)
    if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
        raise TypeError(f"d: expected an integer head dim, got {d!r}")
    bf16 = isinstance(dtype, str) and dtype == "bfloat16"
    try:
        dt = _inputs.BF16_STORAGE if bf16 else np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype: {dtype!r} is not a dtype; use float16, bfloat16, float32 or float64") from None
    spec.check_supported(int(d), "bfloat16" if bf16 else dt)  # the kernel's own dtypes and head dims, in its words
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"deterministic: expected True or False, got {deterministic!r}")
    return spec.block(int(d), dt, pass_, block, deterministic=bool(deterministic))


def _check_supported(spec, prob, pass_, count_hbm) -> None:
    """Refuse, in the spec's words, a head dim, dtype or GPU the kernel does not run (the simulator: any cc),
    or a feature it lacks."""
    gpu = None if device.SIMULATOR else device.info()
    spec.check_supported(prob.d, getattr(prob, "dtype_name", prob.dtype.name), gpu and gpu.compute_capability,
                         gpu and gpu.name, arg="q")
    spec.check_call(pass_, prob.causal, prob.dropout_p, prob.G, count_hbm)


def _check_count(count_hbm) -> bool:
    if not isinstance(count_hbm, (bool, np.bool_)):
        raise TypeError(f"count_hbm: expected True or False, got {count_hbm!r}")
    return bool(count_hbm)


def _set_dropout(prob, dropout_p, dropout_seed, draw: bool):
    """Check dropout's arguments and put them in ``prob``; the seed used (a fresh one when ``draw``), or None."""
    p = _dropout.check_p(dropout_p)
    seed = _dropout.check_seed(dropout_seed, required=p > 0 and not draw)
    if p == 0:
        return None
    prob.dropout_p, prob.dropout_seed = p, (_dropout.draw_seed() if seed is None else seed)
    return prob.dropout_seed


def _plan_key(pass_, kernel, tensors, stream, count_hbm, dropout_p, dropout_seed, *options):
    """The launch-plan key of a call (None: the call takes the normal path; see flash_numba._launch_plan).

    A plan replays its launches on the stream it was recorded on (and keeps scratch that only that
    stream's order protects), so the stream is part of the key."""
    if not _launch_plan.ENABLED or count_hbm is not False or dropout_seed is not None or type(dropout_p) is not float \
            or dropout_p != 0.0:
        return None
    return _launch_plan.key(pass_, kernel, tensors, (*options, _stream.handle(stream), *_switches.values(),
                                                     os.environ.get("FLASH_NUMBA_TC_PATH")))


def _forward(kernel, q, k, v, causal, scale, block, count_hbm, dropout_p=0.0, dropout_seed=None,
             stream=None) -> ForwardResult:
    kernel = _pick_kernel(kernel, q)
    stream = _stream.for_call(q, stream)  # PyTorch's current stream for torch tensors (flash_numba._stream)
    plan_key = _plan_key("forward", kernel, (q, k, v), stream, count_hbm, dropout_p, dropout_seed, causal, scale,
                         block)
    plan = _launch_plan.lookup(plan_key)
    if plan:
        o, lse = plan.replay((q, k, v))
        return ForwardResult(o, lse, None, kernel, plan.block)
    with _stream.using(stream), _launch_plan.recording(plan_key if plan is None else None, (q, k, v)) as recording:
        result = _forward_normal(kernel, q, k, v, causal, scale, block, count_hbm, dropout_p, dropout_seed)
        recording.finish((result.o, result.lse), result.block)
    return result


def _forward_normal(kernel, q, k, v, causal, scale, block, count_hbm, dropout_p, dropout_seed) -> ForwardResult:
    spec = kernels.get(kernel)
    count_hbm = _check_count(count_hbm)
    prob, ops = _inputs.prepare({"q": q, "k": k, "v": v}, causal=causal, scale=scale)
    seed = _set_dropout(prob, dropout_p, dropout_seed, draw=True)
    _check_supported(spec, prob, "forward", count_hbm)
    blk = spec.block(prob.d, prob.dtype, "forward", block)
    counters = Counters(count_hbm)
    counters.describe(kernel, prob, blk, "forward", split=terms.split)  # the IO model splits the counted bytes by term
    with _one_launch_at_a_time(), _inputs.allocate_like(prob):
        o, lse = spec.forward(prob, ops, blk, counters)
    return ForwardResult(
        _inputs.finish(prob, o, (prob.Nq, prob.d)),
        _inputs.finish(prob, lse, (prob.Nq,)),
        counters.result(),
        kernel,
        blk,
        seed,
    )


def _backward(kernel, q, k, v, o, lse, do, causal, scale, block, count_hbm, deterministic=True, dropout_p=0.0,
              dropout_seed=None, stream=None) -> BackwardResult:
    kernel = _pick_kernel(kernel, q)
    tensors = (q, k, v, o, lse, do)
    stream = _stream.for_call(q, stream)
    plan_key = _plan_key("backward", kernel, tensors, stream, count_hbm, dropout_p, dropout_seed, causal, scale,
                         block, deterministic)
    plan = _launch_plan.lookup(plan_key)
    if plan:
        dq, dk, dv = plan.replay(tensors)
        return BackwardResult(dq, dk, dv, None, kernel, plan.block)
    with _stream.using(stream), _launch_plan.recording(plan_key if plan is None else None, tensors) as recording:
        result = _backward_normal(kernel, q, k, v, o, lse, do, causal, scale, block, count_hbm, deterministic,
                                  dropout_p, dropout_seed)
        recording.finish((result.dq, result.dk, result.dv), result.block)
    return result


def _backward_normal(kernel, q, k, v, o, lse, do, causal, scale, block, count_hbm, deterministic, dropout_p,
                     dropout_seed) -> BackwardResult:
    spec = kernels.get(kernel)
    count_hbm = _check_count(count_hbm)
    if not isinstance(deterministic, (bool, np.bool_)):
        raise TypeError(f"deterministic: expected True or False, got {deterministic!r}")
    prob, ops = _inputs.prepare(
        {"q": q, "k": k, "v": v}, causal=causal, scale=scale, extra={"o": o, "lse": lse, "do": do}
    )
    _set_dropout(prob, dropout_p, dropout_seed, draw=False)
    _check_supported(spec, prob, "backward", count_hbm)
    blk = spec.block(prob.d, prob.dtype, "backward", block, deterministic=bool(deterministic))
    run = spec.run_backward(bool(deterministic))  # the atomic backward where the kernel has one
    counters = Counters(count_hbm)
    counters.describe(kernel, prob, blk, "backward", bool(deterministic) or not spec.supports_atomic, terms.split)
    with _one_launch_at_a_time(), _inputs.allocate_like(prob):
        dq, dk, dv = run(prob, ops, blk, counters)
    return BackwardResult(
        _inputs.finish(prob, dq, (prob.Nq, prob.d)),
        _inputs.finish(prob, dk, (prob.Nk, prob.d), prob.kv_lead),
        _inputs.finish(prob, dv, (prob.Nk, prob.d), prob.kv_lead),
        counters.result(),
        getattr(run, "kernel_name", kernel),  # the kernel whose backward ran (a pass may name another's)
        blk,
    )


#: The kernel a call runs when none is named and the tensor-core kernel does not run it: the fastest
#: FlashAttention kernel on CUDA cores (the lessons name the readable ones, flash1 and flash2, explicitly).
DEFAULT_KERNEL = "flash2_fast"
#: The default for float16 and bfloat16 wherever it runs (:func:`default_kernel`).
TENSOR_CORE_KERNEL = "flash2_tc"


def default_kernel(dtype_name: str, d: int, cc=None, gpu: str | None = None) -> str:
    """The kernel a call with ``kernel=None`` runs: flash2_tc for float16 and bfloat16 where it runs (its spec:
    head dims 16..128 in multiples of 16, cc >= 7.5 for float16, >= 8.0 for bfloat16; ``cc=None``: the
    simulator, which stands in for every GPU), else flash2_fast; bfloat16 where flash2_tc cannot run it is an
    error that says why (flash2_fast has no bfloat16)."""
    tc = kernels.get(TENSOR_CORE_KERNEL)
    if dtype_name in tc.dtypes:
        why = tc.supports(d, dtype_name, cc, gpu)
        if why is None:
            return TENSOR_CORE_KERNEL
        if dtype_name not in kernels.get(DEFAULT_KERNEL).dtypes:
            tc.check_supported(d, dtype_name, cc, gpu, arg="q")
    return DEFAULT_KERNEL


def _pick_kernel(kernel, q) -> str:
    """``kernel``, or for None the default for q's dtype and head dim on this device (:func:`default_kernel`)."""
    if kernel is not None:
        return kernel
    name, shape = _inputs.dtype_name_of(q), tuple(int(s) for s in getattr(q, "shape", ()))
    if name is None or not shape:
        return DEFAULT_KERNEL  # not an array: the checks of the call say what is wrong
    gpu = None if device.SIMULATOR else device.info()
    args = (name, shape[-1], gpu and gpu.compute_capability, gpu and gpu.name)
    picked = _DEFAULTS.get(args)
    if picked is None:  # default_kernel reads only its arguments: its answer is kept (host time of every call)
        picked = _DEFAULTS[args] = default_kernel(*args)
    return picked


_DEFAULTS: dict = {}  # default_kernel's answers, by its arguments


def default_kernels_text(cc=None, gpu: str | None = None) -> list[str]:
    """One line per dtype: the kernel ``kernel=None`` runs it with here (``flash-numba info``)."""
    tc = kernels.get(TENSOR_CORE_KERNEL)
    lines = []
    for name in ("float16", "bfloat16", "float32", "float64"):
        if name in tc.dtypes and tc.supports(64, name, cc, gpu) is None:
            fallback = DEFAULT_KERNEL if name in kernels.get(DEFAULT_KERNEL).dtypes else "refused"
            lines.append(f"  {name:<9} {TENSOR_CORE_KERNEL} (head dims {tc.head_dims_text}; other head dims: "
                         f"{fallback})")
        elif name in tc.dtypes and name not in kernels.get(DEFAULT_KERNEL).dtypes:
            lines.append(f"  {name:<9} refused: {tc.supports(64, name, cc, gpu)}")
        else:
            lines.append(f"  {name:<9} {DEFAULT_KERNEL}")
    return lines

def attention_forward(
    q, k, v, *, kernel=None, causal=False, scale=None, block=None, count_hbm=False, dropout_p=0.0,
    dropout_seed=None, stream=None,
) -> ForwardResult:
    """softmax(scale q k^T) v, and L = logsumexp of each row, with the kernel named ``kernel``.

    q: (..., Nq, d); k, v: (..., Nk, d) with leading dims (), (H,) or (B, H).
    Grouped-query (and multi-query) attention: k and v may have fewer heads, Hkv,
    than q's Hq when Hkv divides Hq (q (B, Hq, Nq, d), k and v (B, Hkv, Nk, d));
    query head h then attends with key/value head h // (Hq // Hkv).
    ``kernel=None`` picks :func:`default_kernel` (flash2_tc for float16 and bfloat16 where it runs, else
    flash2_fast; ``result.kernel`` names what ran).
    ``kernel`` is one of :data:`flash_numba.kernels.NAMES`: ``"standard"`` (S and P
    through HBM, the paper's baseline) or a FlashAttention kernel.  ``causal``
    masks key j for query i when j > i + (Nk - Nq) (bottom-right aligned, as
    FlashAttention >= 2.1 and PyTorch's ``causal_lower_right``; PyTorch's
    ``is_causal=True`` is top-left aligned, the same only when Nq == Nk).
    ``scale`` defaults to 1/sqrt(d).  ``block=(Br, Bc)`` overrides the block sizes
    chosen from the device's shared memory (validated against the device's limits;
    kernels with fixed tiles take only None).  ``count_hbm=True`` counts the bytes
    every launch reads and writes in HBM.

    ``dropout_p`` in [0, 1): attention dropout as in the FlashAttention paper
    (Algorithm 2): O = (Z * P / (1 - p)) V, each probability kept (Z = 1) with
    probability 1 - p, L from the undropped scores.  The keep mask is a hash of
    (``dropout_seed``, query head, row, column) (:mod:`flash_numba.kernels._dropout`):
    nothing is stored, the backward regenerates it from the seed.
    ``dropout_seed``: an int in [0, 2**32), or None to draw one from NumPy's default
    generator; the seed used is ``result.dropout_seed``.  ``dropout_p=0`` runs the
    kernels without dropout code.

    ``stream``: where the kernels run (:mod:`flash_numba._stream`).  PyTorch CUDA tensors always
    run on ``torch.cuda.current_stream()``, as PyTorch's own operations do (choose it with
    ``with torch.cuda.stream(s):``; passing ``stream=`` with them is an error).  Numba device
    arrays run on ``stream`` (a ``numba.cuda.stream()``), by default Numba's default stream;
    outputs are queued there and are ready when that stream is.  Returns a :class:`ForwardResult`.
    """
    return _forward(kernel, q, k, v, causal, scale, block, count_hbm, dropout_p, dropout_seed, stream)


def attention_backward(
    q, k, v, o, lse, do, *, kernel=None, causal=False, scale=None, block=None, count_hbm=False,
    deterministic=True, dropout_p=0.0, dropout_seed=None, stream=None,
) -> BackwardResult:
    """dq, dk, dv of :func:`attention_forward`, given its ``o``, ``lse`` and the output gradient ``do``.

    The arguments are those of :func:`attention_forward`; dk and dv are shaped like
    k and v (with grouped-query attention, each sums over the Hq // Hkv query heads
    that share its key/value head).  The FlashAttention
    kernels recompute P blockwise from q, k and lse; ``standard`` recomputes S and
    P into HBM (the paper's Algorithm 3).  ``deterministic=False`` lets a kernel
    with an atomic path use it: ``flash2_fast`` then computes dK, dV and dQ in one
    pass over the key blocks and adds dQ with atomics, as FlashAttention-2 does
    (faster; the order of the additions, so the last bits of dq, vary between
    runs).  Every other call is deterministic: bitwise equal results for equal
    inputs.  With dropout, pass the forward's ``dropout_p`` and its
    ``result.dropout_seed`` (required when ``dropout_p > 0``): the kernels regenerate
    the keep mask Z and, with Zs = Z / (1 - p), compute dV = (Zs * P)^T dO and
    dS = P * (Zs * dP - D) (the paper's Algorithm 4).  ``stream`` as in :func:`attention_forward`.
    Returns a :class:`BackwardResult`.
    """
    return _backward(kernel, q, k, v, o, lse, do, causal, scale, block, count_hbm, deterministic, dropout_p,
                     dropout_seed, stream)


# The names of earlier releases: thin aliases of the two functions above.


def standard_attention_forward(q, k, v, *, causal=False, scale=None, count_hbm=False) -> ForwardResult:
    """``attention_forward(q, k, v, kernel="standard", ...)``: S and P materialised in HBM."""
    return attention_forward(q, k, v, kernel="standard", causal=causal, scale=scale, count_hbm=count_hbm)


def standard_attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None, count_hbm=False) -> BackwardResult:
    """``attention_backward(..., kernel="standard")``: S, P, dP and dS go through HBM."""
    return attention_backward(q, k, v, o, lse, do, kernel="standard", causal=causal, scale=scale, count_hbm=count_hbm)


def _flash_only(kernel):
    if kernel == "standard":
        raise ValueError("kernel: 'standard' is not a FlashAttention kernel; use attention_forward(kernel='standard')")


def flash_attention_forward(
    q, k, v, *, causal=False, scale=None, kernel=None, block=None, count_hbm=False
) -> ForwardResult:
    """:func:`attention_forward` restricted to the FlashAttention kernels (S and P never stored)."""
    _flash_only(kernel)
    return attention_forward(q, k, v, kernel=kernel, causal=causal, scale=scale, block=block, count_hbm=count_hbm)


def flash_attention_backward(
    q, k, v, o, lse, do, *, causal=False, scale=None, kernel=None, block=None, count_hbm=False,
    deterministic=True,
) -> BackwardResult:
    """:func:`attention_backward` restricted to the FlashAttention kernels."""
    _flash_only(kernel)
    return attention_backward(q, k, v, o, lse, do, kernel=kernel, causal=causal, scale=scale, block=block,
                              count_hbm=count_hbm, deterministic=deterministic)


def attention(q, k, v, *, causal=False, scale=None, kernel=None, stream=None):
    """softmax(scale * q k^T) v; returns O only (see :func:`attention_forward`)."""
    return attention_forward(q, k, v, kernel=kernel, causal=causal, scale=scale, stream=stream).o
