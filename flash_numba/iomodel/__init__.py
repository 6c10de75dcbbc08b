"""The IO model: HBM bytes predicted in closed form for every kernel.

One module per kernel (``standard``, ``flash1``, ``flash2``, ``flash2_fast``), each with::

    forward(BH, Nq, Nk, d, dtype, causal, block, G=1) -> HBMCount
    backward(BH, Nq, Nk, d, dtype, causal, block, G=1) -> HBMCount
    backward_atomic(...)      # kernels with an atomic backward (flash2_fast)

A kernel's :class:`~flash_numba.kernels.KernelSpec` names its model
(``io_forward``, ``io_backward``, ``io_backward_atomic``); the two functions here
pick it.  ``BH`` counts query heads; ``G`` is the number of query heads per key/value head
(grouped-query attention: K, V, dK and dV have BH / G heads).  The counts are exactly what
the instrumented kernels count (the tests assert equality): bytes the kernels' code
requests from global memory, per launch.
:func:`forward` and :func:`backward` here also attach the split by term
(compulsory, re-reads, S/P; :mod:`.terms`) as ``HBMCount.terms``.
"""

from .. import kernels
from ..hbm import HBMCount


def _check_group(BH, G) -> None:
    if isinstance(G, bool) or not isinstance(G, int) or G < 1 or BH % G:
        raise ValueError(f"G: expected a positive integer dividing BH = {BH} (query heads per key/value head), "
                         f"got {G!r}")


def forward(kernel: str, BH, Nq, Nk, d, dtype, causal=False, block=None, G=1) -> HBMCount:
    """Bytes of a forward call; ``block=None`` means the block the kernel would choose here."""
    from . import terms

    _check_group(BH, G)
    spec = kernels.get(kernel)
    block = spec.block(d, dtype, "forward") if block is None else block
    model = spec.io_forward(BH, Nq, Nk, d, dtype, causal, block, G=G)
    return HBMCount(model.per_kernel, terms.split(kernel, "forward", BH, Nq, Nk, d, dtype, causal, block, G=G))


def backward(kernel: str, BH, Nq, Nk, d, dtype, causal=False, block=None, deterministic=True, G=1) -> HBMCount:
    """Bytes of a backward call; ``block=None`` means the block the kernel would choose here.

    ``deterministic=False``: the call with that option (the atomic backward where the kernel has one).
    """
    from . import terms

    _check_group(BH, G)
    spec = kernels.get(kernel)
    block = spec.block(d, dtype, "backward", deterministic=deterministic) if block is None else block
    model = spec.io_model("backward", deterministic)(BH, Nq, Nk, d, dtype, causal, block, G=G)
    split = terms.split(kernel, "backward", BH, Nq, Nk, d, dtype, causal, block, deterministic, G)
    return HBMCount(model.per_kernel, split)
