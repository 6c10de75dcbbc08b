"""The IO model: HBM bytes predicted in closed form for every kernel.

One module per kernel (``standard``, ``flash1``, ``flash2``, ``flash2_fast``), each with::

    forward(BH, Nq, Nk, d, dtype, causal, block) -> HBMCount
    backward(BH, Nq, Nk, d, dtype, causal, block) -> HBMCount
    backward_atomic(...)      # kernels with an atomic backward (flash2_fast)

A kernel's :class:`~flash_numba.kernels.KernelSpec` names its model
(``io_forward``, ``io_backward``, ``io_backward_atomic``); the two functions here
pick it.  The counts are exactly what the instrumented kernels count (the tests
assert equality): bytes the kernels' code requests from global memory, per launch.
:func:`forward` and :func:`backward` here also attach the split by term
(compulsory, re-reads, S/P; :mod:`.terms`) as ``HBMCount.terms``.
"""

from .. import kernels
from ..hbm import HBMCount


def forward(kernel: str, BH, Nq, Nk, d, dtype, causal=False, block=None) -> HBMCount:
    """Bytes of a forward call; ``block=None`` means the block the kernel would choose here."""
    from . import terms

    spec = kernels.get(kernel)
    block = spec.block(d, dtype, "forward") if block is None else block
    model = spec.io_forward(BH, Nq, Nk, d, dtype, causal, block)
    return HBMCount(model.per_kernel, terms.split(kernel, "forward", BH, Nq, Nk, d, dtype, causal, block))


def backward(kernel: str, BH, Nq, Nk, d, dtype, causal=False, block=None, deterministic=True) -> HBMCount:
    """Bytes of a backward call; ``block=None`` means the block the kernel would choose here.

    ``deterministic=False``: the call with that option (the atomic backward where the kernel has one).
    """
    from . import terms

    spec = kernels.get(kernel)
    block = spec.block(d, dtype, "backward") if block is None else block
    model = spec.io_model("backward", deterministic)(BH, Nq, Nk, d, dtype, causal, block)
    split = terms.split(kernel, "backward", BH, Nq, Nk, d, dtype, causal, block, deterministic)
    return HBMCount(model.per_kernel, split)
