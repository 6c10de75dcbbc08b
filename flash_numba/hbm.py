"""HBM byte counts: the record every counted call returns, and the in-kernel counters.

What is counted.  Every kernel has an instrumented variant, chosen by a
compile-time switch ``COUNT`` in its factory (the plain variant compiles the
counting code away and pays nothing).  In the instrumented variant each thread
adds, in registers, the bytes that *its own code* asks global memory for: every
element it loads from or stores to a global array, times that array's item size.
At the end each thread adds its two totals to a per-kernel ``int64[2]`` array
with one atomic each (``[bytes_read, bytes_written]``).

What is not counted.  These are bytes *requested by the code*, the quantity in
the FlashAttention paper's IO analysis.  The hardware may serve a re-read from
the L2 cache instead of HBM, fetch whole 32-byte sectors, or merge writes; only
a hardware profiler (Nsight Compute's ``dram__bytes_*``) sees that.
``flash_numba.iomodel`` predicts these counts exactly in closed form, and the
tests assert counted == predicted.

Bytes by term.  The counters count totals per kernel launch; they do not know
which array a byte belongs to.  The split of a call's bytes into terms
(compulsory, re-reads, S/P round trips; see :mod:`flash_numba.iomodel.terms`)
is attributed by the IO model: a counted result carries the model's split of
the same call (``HBMCount.terms``), and the tests assert that the counted
per-kernel bytes equal the model's, so the attribution adds up to exactly the
counted total.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import _launch_plan, _stream


@dataclass(frozen=True)
class KernelBytes:
    """Bytes one kernel launch (or a group of launches) read and wrote."""

    bytes_read: int
    bytes_written: int

    @property
    def total(self) -> int:
        return self.bytes_read + self.bytes_written


@dataclass(frozen=True)
class HBMCount:
    """Bytes read from and written to HBM by one call, with a per-kernel breakdown.

    ``per_kernel`` maps a kernel's name (``"S = scale*Q@K^T"``...) to its
    :class:`KernelBytes`, in launch order.  Two counts compare equal when every
    kernel's bytes agree, which is how the tests hold kernels to the IO model.
    ``terms`` (or None) maps the terms of :mod:`flash_numba.iomodel.terms`
    (``"compulsory"``, ``"re-reads"``, ``"S/P"``) to bytes, as the IO model
    attributes them; they add up to :attr:`total` when the counts match the model.
    It takes no part in comparisons.
    """

    per_kernel: dict[str, KernelBytes] = field(default_factory=dict)
    terms: dict[str, int] | None = field(default=None, compare=False)

    @property
    def bytes_read(self) -> int:
        return sum(k.bytes_read for k in self.per_kernel.values())

    @property
    def bytes_written(self) -> int:
        return sum(k.bytes_written for k in self.per_kernel.values())

    @property
    def total(self) -> int:
        return self.bytes_read + self.bytes_written

    def __add__(self, other: "HBMCount") -> "HBMCount":
        merged = dict(self.per_kernel)
        for name, kb in other.per_kernel.items():
            if name in merged:
                old = merged[name]
                kb = KernelBytes(old.bytes_read + kb.bytes_read, old.bytes_written + kb.bytes_written)
            merged[name] = kb
        terms = None
        if self.terms is not None and other.terms is not None:
            terms = {t: self.terms.get(t, 0) + other.terms.get(t, 0) for t in {**self.terms, **other.terms}}
        return HBMCount(merged, terms)

    def table(self, title: str | None = None) -> str:
        """A fixed-width table, one row per kernel and a total row."""
        w = max([len(n) for n in self.per_kernel] + [5])
        lines = [] if title is None else [title]
        lines.append(f"{'kernel':<{w}}  {'read':>14}  {'written':>14}  {'total':>14}")
        for name, kb in self.per_kernel.items():
            lines.append(f"{name:<{w}}  {kb.bytes_read:>14,}  {kb.bytes_written:>14,}  {kb.total:>14,}")
        lines.append(f"{'total':<{w}}  {self.bytes_read:>14,}  {self.bytes_written:>14,}  {self.total:>14,}")
        for term, nbytes in (self.terms or {}).items():
            lines.append(f"{'  term ' + term:<{w}}  {'':>14}  {'':>14}  {nbytes:>14,}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return (
            f"HBM: {self.bytes_read:,} B read + {self.bytes_written:,} B written "
            f"= {self.total:,} B ({len(self.per_kernel)} kernels)"
        )


_DUMMY = {}


def _dummy_counter():
    """One shared int64[2] per CUDA context for the plain kernels (which never touch it)."""
    from numba import cuda

    key = id(cuda.current_context()) if not _simulator() else 0
    if key not in _DUMMY:
        _DUMMY[key] = _launch_plan.persistent(cuda.to_device(np.zeros(2, dtype=np.int64)))
    return _DUMMY[key]


def _simulator() -> bool:
    from .device import SIMULATOR

    return SIMULATOR


class Counters:
    """Device-side counters for one API call: one ``int64[2]`` array per kernel.

    ``Counters(enabled=False)`` hands every kernel the same one-element dummy
    array; the plain kernels never touch it.
    """

    def __init__(self, enabled: bool) -> None:
        from numba import cuda

        self.enabled = enabled
        self._cuda = cuda
        self._arrays: dict[str, object] = {}
        self._dummy = None if enabled else _dummy_counter()
        self._call = None
        self._split = None

    def describe(self, kernel: str, prob, block, pass_: str, deterministic: bool = True, split=None) -> None:
        """Record what runs (kernel, problem, block, pass, which backward), so that :meth:`result` can attach the
        IO model's split of the bytes by term: ``split`` is :func:`flash_numba.iomodel.terms.split` (handed in:
        the counters sit below the IO models)."""
        self._call = (kernel, prob, block, pass_, deterministic)
        self._split = split

    def array(self, name: str):
        """The device array a kernel named ``name`` adds its bytes to."""
        if not self.enabled:
            return self._dummy
        if name not in self._arrays:
            self._arrays[name] = self._cuda.to_device(np.zeros(2, dtype=np.int64), stream=_stream.current())
        return self._arrays[name]

    def result(self) -> HBMCount | None:
        if not self.enabled:
            return None
        per = {}
        stream = _stream.current()  # the call's: its kernels added to the counters there
        counts = {name: arr.copy_to_host(stream=stream) for name, arr in self._arrays.items()}
        if stream:
            stream.synchronize()
        for name, (r, w) in counts.items():
            per[name] = KernelBytes(int(r), int(w))
        terms = None
        if self._call is not None and self._split is not None:
            kernel, prob, block, pass_, deterministic = self._call
            terms = self._split(
                kernel, pass_, prob.BH, prob.Nq, prob.Nk, prob.d, prob.dtype, prob.causal, block,
                deterministic=deterministic, G=prob.G,
            )
        return HBMCount(per, terms)
