"""The protocol of a decode kernel: what a kernel module for one decoding step declares about itself.

A decode kernel is not a forward/backward pair over (Nq, Nk) blocks (:class:`~flash_numba.kernels._spec.KernelSpec`):
it runs one pass, ``"decode"``, over a KV cache (per-sequence lengths, optionally paged) for a few new query
tokens.  Its spec carries the facts the rest of the package asks of every kernel: storage dtypes and head dims
(with the sentence an error quotes), FLOPs per launch, the IO model, the launches' counter names, and the
compile tier (``compile_all``, ``compile_groups``), in the fields of the same names as ``KernelSpec``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

PASS = "decode"


@dataclass(frozen=True)
class DecodeSpec:
    """One decode kernel module as the package sees it.

    ``run(prob, ops, counters) -> (o, lse)`` launches the kernels of a call (``prob`` a
    :class:`flash_numba.decode.DecodeProblem`); ``launches(num_splits)`` their counter names;
    ``io_model(prob) -> HBMCount`` the bytes they move, by term; ``flops(prob) -> {launch: FLOPs}``.
    ``dtypes``, ``head_dims`` / ``head_dims_text`` say what runs (:meth:`supports`).
    ``compile_all(ccs, dtypes, ds)`` returns the compile tier's ``[Compiled]``, ``compile_groups`` the
    ``(dtypes, head dims)`` groups the tier adds for this module.
    """

    name: str
    run: Callable
    launches: Callable
    io_model: Callable
    flops: Callable
    compile_all: Callable
    dtypes: tuple[str, ...]
    head_dims: Callable[[int], bool]
    head_dims_text: str
    choose_splits: Callable
    compile_groups: tuple = ()
    max_registers: Mapping[str, int] = field(default_factory=dict)
    atomic_backward_launches: tuple = ()  # as KernelSpec's: launches with floating-point atomics (none here)
    doc: str = ""
    pass_: str = PASS

    def __post_init__(self):
        object.__setattr__(self, "max_registers", MappingProxyType(dict(self.max_registers)))
        if self.doc:
            object.__setattr__(self, "__doc__", self.doc)

    def supports(self, d: int, dtype_name: str) -> str | None:
        """None when head dim ``d`` and storage ``dtype_name`` run; else one sentence saying what does."""
        if dtype_name in self.dtypes and self.head_dims(d):
            return None
        dts = ", ".join(self.dtypes[:-1]) + " and " + self.dtypes[-1] if len(self.dtypes) > 1 else self.dtypes[0]
        return f"{self.name} runs {dts} with head dims {self.head_dims_text}"

    def check_supported(self, d: int, dtype_name: str) -> None:
        """TypeError (dtype) or ValueError (head dim) with :meth:`supports`' sentence."""
        why = self.supports(d, dtype_name)
        if why is None:
            return
        if dtype_name not in self.dtypes:
            raise TypeError(f"dtype: {dtype_name} is not supported; {why}")
        raise ValueError(f"d: head dim {d} is not supported; {why}")

    def register_cap(self, launch: str, cc, d: int, dtype, dynamic: bool = False, count: bool = False):
        """The register cap a launch ships with (none: the compile tier assembles uncapped)."""
        return self.max_registers.get(launch)
