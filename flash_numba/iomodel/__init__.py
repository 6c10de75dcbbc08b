"""The IO model: HBM bytes predicted in closed form for every kernel.

One module per kernel module (``standard``, ``flash1``, ``flash2``), each with::

    forward(BH, Nq, Nk, d, dtype, causal, block) -> HBMCount
    backward(BH, Nq, Nk, d, dtype, causal, block) -> HBMCount

The counts are exactly what the instrumented kernels count (the tests assert
equality): bytes the kernels' code requests from global memory, per kernel.
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
    block = _block(kernel, d, dtype, block, "forward")
    return importlib.import_module(f"{__name__}.{kernel}").forward(BH, Nq, Nk, d, dtype, causal, block)


def backward(kernel: str, BH, Nq, Nk, d, dtype, causal=False, block=None, deterministic=True) -> HBMCount:
    """Bytes of a backward call; ``block=None`` means the block the kernel would choose here.

    ``deterministic=False``: the call with that option (only flash2_fast's model differs).
    """
    block = _block(kernel, d, dtype, block, "backward")
    mod = importlib.import_module(f"{__name__}.{kernel}")
    if not deterministic and "deterministic" in inspect.signature(mod.backward).parameters:
        return mod.backward(BH, Nq, Nk, d, dtype, causal, block, deterministic=False)
    return mod.backward(BH, Nq, Nk, d, dtype, causal, block)
