"""The attention kernels, one module per numbered version.

=================  =====================================================================
``standard``       the paper's baseline: S, P = softmax(S) and O = P V as separate
                   kernels that write S and P (N x N) to HBM; backward reads them back.
``flash1``         FlashAttention as the paper's Algorithms 1 and 4: K/V blocks outer,
                   Q blocks inner, O, l, m read and written in HBM every outer step.
``flash2``         FlashAttention-2 loop order: a thread block owns a block of query
                   rows, keeps O, m, l on chip, writes O and L once; backward in two
                   deterministic passes (dK/dV per key block, dQ per query block).
``flash2_fast``    flash2's algorithm register-tiled for speed (micro-tiles, transposed
                   shared tiles, 16-byte loads, base-2 softmax); backward also with
                   atomic dQ (``deterministic=False``).  Package ``flash2_fast/``.
``flash2_tc``      FlashAttention-2's forward on tensor cores (mma.sync, float16 and
                   bfloat16): P stays in registers between S = Q K^T and P V.
=================  =====================================================================

Each module describes itself with a :class:`~flash_numba.kernels._spec.KernelSpec`
(its passes, launches, block rule, optional atomic backward, IO model, compile tier
and register caps); :func:`get` returns it.  Adding a kernel: write its module with
a ``SPEC`` and its IO model, and add its name to :data:`NAMES` (docs/DEVELOPING.md,
"The kernel-module protocol").

Shared pieces: :mod:`.causal` (which key blocks a query block sees), :mod:`._tile_ops`
(tile loads and block products as device functions), :mod:`._rowsum` (D = rowsum(dO * O)).
"""

from __future__ import annotations

import importlib

from ._spec import KernelSpec

NAMES = ("standard", "flash1", "flash2", "flash2_fast", "flash2_tc")

__all__ = ["NAMES", "KernelSpec", "get", "module"]


def module(name: str):
    """The Python module of kernel ``name`` (its kernel factories, for tools that compile or probe them)."""
    if name not in NAMES:
        raise ValueError(f"kernel: unknown kernel {name!r}; choose one of {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{name}")


def get(name: str) -> KernelSpec:
    """The :class:`KernelSpec` of kernel ``name``; ValueError naming the choices otherwise."""
    return module(name).SPEC
