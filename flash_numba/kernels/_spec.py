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

from .. import blocks

PASSES = ("forward", "backward")


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

    ``compile_all(ccs, dtypes, ds)`` returns the compile tier's ``[(label, ptx, ...)]``.
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
        if self.doc:
            object.__setattr__(self, "__doc__", self.doc)

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
