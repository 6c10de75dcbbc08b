"""The kernel-module protocol: what a kernel module declares about itself.

Every kernel module ends with ``SPEC = KernelSpec(...)``; :func:`flash_numba.kernels.get`
returns it.  The API, the IO models, the compile tier and the tools read a kernel
through its spec only (no ``hasattr``), so adding a kernel means writing one module
(and its IO model) and adding its name to :data:`flash_numba.kernels.NAMES`.
docs/DEVELOPING.md ("The kernel-module protocol") walks through the fields.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from .. import blocks
from ..device import UnsupportedOnThisGPU

PASSES = ("forward", "backward")

#: The storage dtypes the package knows, by name, in the order errors list them.
DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")
#: What a call may ask of a kernel beyond a plain forward (:data:`CALL_FEATURES`), and the guarantees a kernel may
#: not give: ``masked_nonfinite``, a masked (query, key) entry adds nothing even against an Inf or NaN operand (no
#: 0 * Inf inside a product; flash2_tc's mma multiplies a masked P = 0 by V, K, Q or dO, as PyTorch and
#: FlashAttention-2 do, docs/RELIABILITY.md).  A spec's ``lacks`` names those it does not have (the API refuses a
#: call that asks for one, naming the argument; the test matrix runs every check a kernel does not lack).
CALL_FEATURES = ("backward", "causal", "dropout", "grouped_query", "count_hbm")
FEATURES = (*CALL_FEATURES, "masked_nonfinite")


def check_pass(pass_: str) -> None:
    if pass_ not in PASSES:
        raise ValueError(f"pass_: expected 'forward' or 'backward', got {pass_!r}")


def lazy(module: str, name: str) -> Callable:
    """``module.name``, imported at the first call.

    An IO model imports its kernel module's launch names, so a kernel module
    cannot import its IO model at import time; its spec names it this way.
    """

    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = f"{module}.{name}"
    return call


def dtype_name(dtype) -> str:
    """The name of a storage dtype: "float16", "bfloat16", "float32", "float64" (or whatever NumPy calls it)."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        return dtype
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def _words(items) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = list(items)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def visible_pairs(Nq: int, Nk: int, causal: bool) -> int:
    """(query row, key) pairs a head computes: Nq * Nk, or under the bottom-right causal mask (key j is visible to
    query i when j <= i + Nk - Nq) the visible ones only."""
    if not causal:
        return Nq * Nk
    return int(np.clip(np.arange(Nq, dtype=np.int64) + (Nk - Nq + 1), 0, Nk).sum())


def launch_flops(forward: Mapping[str, tuple], backward: Mapping[str, tuple],
                 atomic: Mapping[str, tuple] | None = None) -> Callable:
    """A spec's ``flops`` from the arithmetic of each launch, by its counter name.

    ``(a, b, c)`` means ``a*d + b`` FLOPs per computed score (query row x visible key) and ``c*d`` per query
    row: ``a`` is 2 per multiply-add of the matrix products over d, ``b`` counts the elementwise operations on
    a score (scale, max, subtract, exp, add, multiply: one each).  Terms of lower order (a rescale of O per
    block, flash1's D_i recomputed per key block) are left out; causal attention counts the visible scores
    only.  ``atomic``: the launches of the ``deterministic=False`` backward (None: the same as ``backward``).
    The result maps every launch the pass may run to its FLOPs; a pass that runs only some of them (a kernel
    that picks among backwards by block) is the sum over the launches that ran (the counter names of its
    :class:`~flash_numba.hbm.HBMCount`).
    """
    tables = {("forward", True): dict(forward), ("forward", False): dict(forward),
              ("backward", True): dict(backward), ("backward", False): dict(backward if atomic is None else atomic)}

    def flops(pass_, BH, Nq, Nk, d, causal=False, deterministic=True) -> dict[str, int]:
        check_pass(pass_)
        pairs = visible_pairs(Nq, Nk, causal)
        return {name: BH * (pairs * (a * d + b) + c * Nq * d)
                for name, (a, b, c) in tables[pass_, bool(deterministic)].items()}

    return flops


@dataclass(frozen=True)
class KernelSpec:
    """One kernel module, as the rest of the package sees it.

    Passes (device arrays in, device arrays out; ``prob`` a
    :class:`flash_numba._inputs.Problem`, ``ops`` name -> operand, ``counters`` a
    :class:`flash_numba.hbm.Counters`)::

        forward(prob, ops, block, counters) -> (o, lse)
        backward(prob, ops, block, counters) -> (dq, dk, dv)          # deterministic
        backward_atomic(prob, ops, block, counters) -> (dq, dk, dv)   # optional: dQ by atomics

    IO models (bytes in closed form, equal to what the instrumented launches count), by
    default ``forward``, ``backward`` and ``backward_atomic`` of ``flash_numba.iomodel.<name>``::

        io_forward(BH, Nq, Nk, d, dtype, causal, block, G=1) -> HBMCount   # G: query heads per kv head
        io_backward(...), io_backward_atomic(...)     # the latter iff backward_atomic

    Blocks (``uses_blocks=False``: fixed tiles, ``block`` is always None)::

        shared_bytes(Br, Bc, d, dtype, pass_) -> int   # shared memory of a block (static, or dynamic above 48 KB)
        block_limits(d, dtype, pass_) -> (max_Br, max_Bc)
        choose_block(d, dtype, budget, pass_) -> (Br, Bc)   # optional: else blocks.choose
        choose_atomic_block(d, dtype, budget) -> (Br, Bc)   # optional: the atomic backward's own choice
        check_block(block, d, dtype, pass_) -> None         # optional: shape rules of its own

    What it does: ``lacks`` names the :data:`FEATURES` it does not have (:meth:`has`, :meth:`check_call`).
    What it runs: ``dtypes`` (storage dtypes by name), ``head_dims`` (a test of d; None: 1 <= d <= 128) in the
    words of ``head_dims_text``, ``min_cc`` (dtype name -> the compute capability it needs);
    :meth:`supports` says it in a sentence, :meth:`check_supported` raises with it (the API calls it before
    launching, the test matrix runs each kernel at the dtypes it lists).  ``flops(pass_, BH, Nq, Nk, d,
    causal, deterministic=True)``: FLOPs of each launch of a pass (:func:`launch_flops` builds it from a table).

    ``compile_all(ccs, dtypes, ds)`` returns the compile tier's ``[(label, ptx, ...)]``; ``compile_groups``
    adds ``((dtypes, ds), ...)`` groups of its own to :data:`flash_numba.compile_check.GROUPS`.
    ``max_registers`` maps a launch name to its register cap; ``register_rule(launch, cc, d, dtype, dynamic, count)``,
    where given, says where the cap applies (:meth:`register_cap`).  ``dynamic_shared``: the kernel's
    blocks may exceed 48 KB (dynamic shared memory, :mod:`flash_numba.kernels._smem`).
    """

    name: str
    forward: Callable
    backward: Callable
    forward_launches: tuple[str, ...]
    backward_launches: tuple[str, ...]
    compile_all: Callable
    io_forward: Callable | None = None  # None: forward of flash_numba.iomodel.<name>
    io_backward: Callable | None = None  # None: backward of flash_numba.iomodel.<name>
    uses_blocks: bool = True
    shared_bytes: Callable | None = None
    block_limits: Callable | None = None
    choose_block: Callable | None = None
    choose_atomic_block: Callable | None = None  # deterministic=False's block, where it differs (None: choose_block's)
    check_block: Callable | None = None
    backward_atomic: Callable | None = None
    atomic_backward_launches: tuple[str, ...] = ()
    io_backward_atomic: Callable | None = None
    max_registers: Mapping[str, int] = field(default_factory=dict)
    register_rule: Callable | None = None
    dynamic_shared: bool = False  # its blocks may use dynamic shared memory: budget blocks.dynamic_budget()
    dtypes: tuple[str, ...] = ("float16", "float32", "float64")  # storage dtypes it runs, by name
    head_dims: Callable[[int], bool] | None = None  # None: 1 <= d <= 128
    head_dims_text: str = "1 to 128"  # the words the errors use for head_dims
    min_cc: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # dtype name -> minimum cc (absent: any)
    flops: Callable | None = None  # (pass_, BH, Nq, Nk, d, causal, deterministic=True) -> {launch: FLOPs}
    compile_groups: tuple = ()  # the compile tier's groups for this kernel beyond compile_check.GROUPS
    lacks: frozenset = frozenset()  # FEATURES it does not have (default: none)
    forward_only: tuple = ()  # storage dtypes it runs forward only (their backward is not built yet)
    doc: str = ""  # what the kernel is: its module's docstring (``spec.__doc__`` returns it)

    def __post_init__(self):
        io = f"flash_numba.iomodel.{self.name}"  # the IO model's module, by convention
        for field_name, function in (("io_forward", "forward"), ("io_backward", "backward")):
            if getattr(self, field_name) is None:
                object.__setattr__(self, field_name, lazy(io, function))
        if self.backward_atomic is not None and self.io_backward_atomic is None:
            object.__setattr__(self, "io_backward_atomic", lazy(io, "backward_atomic"))
        if self.uses_blocks and (self.shared_bytes is None or self.block_limits is None):
            raise TypeError(f"{self.name}: a kernel with blocks needs shared_bytes and block_limits")
        if (self.backward_atomic is None) != (self.io_backward_atomic is None) or (
            (self.backward_atomic is None) != (not self.atomic_backward_launches)
        ):
            raise TypeError(f"{self.name}: backward_atomic, its launches and its IO model go together")
        object.__setattr__(self, "max_registers", MappingProxyType(dict(self.max_registers)))
        object.__setattr__(self, "min_cc", MappingProxyType(dict(self.min_cc)))
        object.__setattr__(self, "lacks", frozenset(self.lacks))
        if not self.lacks <= set(FEATURES):
            raise TypeError(f"{self.name}: lacks must name some of {', '.join(FEATURES)}; got {sorted(self.lacks)}")
        unknown = [t for t in (*self.dtypes, *self.min_cc) if t not in DTYPE_NAMES]
        if unknown or not self.dtypes:
            raise TypeError(f"{self.name}: dtypes must name some of {', '.join(DTYPE_NAMES)}; got {unknown or '()'}")
        if self.doc:
            object.__setattr__(self, "__doc__", self.doc)

    def _runs_head_dim(self, d) -> bool:
        return 1 <= d <= 128 if self.head_dims is None else bool(self.head_dims(d))

    def supports(self, d: int, dtype, cc=None, gpu: str | None = None) -> str | None:
        """None when the kernel runs head dim ``d`` in storage ``dtype`` (a name or a NumPy dtype) on a GPU of
        compute capability ``cc`` (None: any, as in the simulator); else one sentence saying what it does run,
        e.g. "flash2 runs float16, float32 and float64 with head dims 1 to 128".  ``gpu``: the GPU's name, for
        that sentence."""
        name = dtype_name(dtype)
        if name not in self.dtypes or not self._runs_head_dim(d):
            return f"{self.name} runs {_words(self.dtypes)} with head dims {self.head_dims_text}"
        need = self.min_cc.get(name)
        if cc is not None and need is not None and tuple(cc) < tuple(need):
            this = f"this GPU ({gpu})" if gpu else "this GPU"
            return (f"{self.name} needs compute capability {need[0]}.{need[1]} for {name}; "
                    f"{this} is {cc[0]}.{cc[1]}")
        return None

    def check_supported(self, d: int, dtype, cc=None, gpu: str | None = None, arg: str | None = None) -> None:
        """:meth:`supports` as an error that names the argument (``arg``, e.g. "q" when d and dtype are q's;
        default "d" or "dtype"): TypeError for the dtype, ValueError for the head dim, and for the GPU
        :class:`~flash_numba.device.UnsupportedOnThisGPU` (a ValueError that the command line prints as one line)."""
        why = self.supports(d, dtype, cc, gpu)
        if why is None:
            return
        name = dtype_name(dtype)
        what = f"{arg}: dtype {name}" if arg else f"dtype: {name}"
        if name not in self.dtypes:
            raise TypeError(f"{what} is not supported by {self.name}; {why}")
        if not self._runs_head_dim(d):
            raise ValueError(f"{arg or 'd'}: head dim d = {d} is not supported by {self.name}; {why}")
        raise UnsupportedOnThisGPU(f"{what} is not supported on this GPU; {why}")  # a ValueError; the CLI: one line

    def has(self, feature: str, dtype=None) -> bool:
        """Whether the kernel does ``feature`` (one of :data:`FEATURES`), in storage ``dtype`` where given (a
        dtype of :attr:`forward_only` has no backward)."""
        if feature not in FEATURES:
            raise ValueError(f"feature: expected one of {', '.join(FEATURES)}, got {feature!r}")
        if feature == "backward" and dtype is not None and dtype_name(dtype) in self.forward_only:
            return False
        return feature not in self.lacks

    def check_call(self, pass_: str, causal: bool = False, dropout_p: float = 0.0, G: int = 1,
                   count_hbm: bool = False) -> None:
        """ValueError naming the argument when a call asks for a feature the kernel lacks."""
        asked = (("backward", pass_ == "backward", "kernel"), ("causal", causal, "causal"),
                 ("dropout", dropout_p > 0, "dropout_p"), ("grouped_query", G > 1, "k"),
                 ("count_hbm", count_hbm, "count_hbm"))
        for feature, wanted, arg in asked:
            if wanted and feature in self.lacks:
                does = ", ".join(f for f in CALL_FEATURES if f not in self.lacks) or "a plain forward only"
                raise ValueError(f"{arg}: {self.name} has no {feature.replace('_', '-')}; it does {does}")

    @property
    def supports_atomic(self) -> bool:
        """Whether ``deterministic=False`` runs a different (atomic) backward."""
        return self.backward_atomic is not None

    def launches(self, pass_: str, deterministic: bool = True) -> tuple[str, ...]:
        """Counter names of the launches of a pass (the keys of its :class:`~flash_numba.hbm.HBMCount`).

        A kernel may run fewer (flash2_fast falls back to flash2's backward for blocks
        that are not micro-tile shapes); the IO model says which for a given block.
        """
        check_pass(pass_)
        if pass_ == "forward":
            return self.forward_launches
        if not deterministic and self.supports_atomic:
            return self.atomic_backward_launches
        return self.backward_launches

    def block(self, d: int, dtype, pass_: str, block=None, budget: int | None = None, deterministic: bool = True):
        """The ``(Br, Bc)`` a call runs: ``block`` validated, or the kernel's choice for ``budget``
        bytes of shared memory (default: this device's); None for kernels with fixed tiles.  ``deterministic=False``:
        the backward of a call with that option (the atomic backward's own choice, where the kernel has one)."""
        check_pass(pass_)
        if not self.uses_blocks:
            if block is not None:
                raise ValueError(f"block: the {self.name} kernels use fixed tiles; pass block=None")
            return None
        max_Br, max_Bc = self.block_limits(d, dtype, pass_)
        if block is not None:  # type, sign and limits first, so a kernel's own rule sees two ints
            block = blocks.as_pair(block, max_Br=max_Br, max_Bc=max_Bc)
        if self.check_block is not None:
            self.check_block(block, d, dtype, pass_)

        def fp(Br, Bc, d_, dt):
            return self.shared_bytes(Br, Bc, d_, dt, pass_)

        if budget is None:
            budget = blocks.dynamic_budget() if self.dynamic_shared else blocks.shared_budget()
        if block is None:
            if pass_ == "backward" and not deterministic and self.supports_atomic and self.choose_atomic_block:
                return self.choose_atomic_block(d, dtype, budget)
            if self.choose_block is not None:
                return self.choose_block(d, dtype, budget, pass_)
            return blocks.choose(d, dtype, fp, max_Br=max_Br, max_Bc=max_Bc, budget=budget)
        return blocks.validate(block, d, dtype, fp, max_Br=max_Br, max_Bc=max_Bc, budget=budget)

    def register_cap(self, launch: str, cc, d: int, dtype, dynamic: bool = False, count: bool = False) -> int | None:
        """The register cap of ``launch`` at head dim ``d`` and storage ``dtype`` on a device of compute capability
        ``cc`` (None: none); ``dynamic``: tiles in dynamic shared memory; ``count``: the counting variant."""
        if self.register_rule is not None:
            return self.register_rule(launch, cc, d, dtype, dynamic, count)
        return self.max_registers.get(launch)

    def run_backward(self, deterministic: bool) -> Callable:
        """The backward pass a call with ``deterministic`` runs."""
        return self.backward if deterministic or not self.supports_atomic else self.backward_atomic

    def io_model(self, pass_: str, deterministic: bool = True) -> Callable:
        """The IO model of that pass."""
        check_pass(pass_)
        if pass_ == "forward":
            return self.io_forward
        return self.io_backward if deterministic or not self.supports_atomic else self.io_backward_atomic
