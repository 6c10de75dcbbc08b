"""The IO model: HBM bytes predicted in closed form for every kernel.

One module per kernel module (``standard``, ``flash1``, ``flash2``, ``flash2_fast``), each with::

    forward(BH, Nq, Nk, d, dtype, causal, block) -> HBMCount
    backward(BH, Nq, Nk, d, dtype, causal, block) -> HBMCount

The counts are exactly what the instrumented kernels count (the tests assert
equality): bytes the kernels' code requests from global memory, per kernel.
:func:`forward` and :func:`backward` here also attach the split by term
(compulsory, re-reads, S/P; :mod:`.terms`) as ``HBMCount.terms``.
"""

import importlib
import inspect

from ..hbm import HBMCount


def _block(kernel, d, dtype, block, pass_):
    """``block`` as given, or the one the kernel would choose on this device (None: fixed tiles)."""
    if block is not None:
        return block
    from ..api import resolve_block

    return resolve_block(kernel, d, dtype, None, pass_)


def forward(kernel: str, BH, Nq, Nk, d, dtype, causal=False, block=None) -> HBMCount:
    """Bytes of a forward call; ``block=None`` means the block the kernel would choose here."""
    from . import terms

    block = _block(kernel, d, dtype, block, "forward")
    model = importlib.import_module(f"{__name__}.{kernel}").forward(BH, Nq, Nk, d, dtype, causal, block)
    return HBMCount(model.per_kernel, terms.split(kernel, "forward", BH, Nq, Nk, d, dtype, causal, block))


def backward(kernel: str, BH, Nq, Nk, d, dtype, causal=False, block=None, deterministic=True) -> HBMCount:
    """Bytes of a backward call; ``block=None`` means the block the kernel would choose here.

    ``deterministic=False``: the call with that option (only flash2_fast's model differs).
    """
    from . import terms

    block = _block(kernel, d, dtype, block, "backward")
    mod = importlib.import_module(f"{__name__}.{kernel}")
    if not deterministic and "deterministic" in inspect.signature(mod.backward).parameters:
        model = mod.backward(BH, Nq, Nk, d, dtype, causal, block, deterministic=False)
    else:
        model = mod.backward(BH, Nq, Nk, d, dtype, causal, block)
    split = terms.split(kernel, "backward", BH, Nq, Nk, d, dtype, causal, block, deterministic)
    return HBMCount(model.per_kernel, split)
