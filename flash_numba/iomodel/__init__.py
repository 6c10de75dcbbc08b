"""The IO model: HBM bytes predicted in closed form for every kernel.

One module per kernel module (``standard``, ``flash1``, ``flash2``), each with::

    forward(BH, Nq, Nk, d, dtype, causal, block) -> HBMCount
    backward(BH, Nq, Nk, d, dtype, causal, block) -> HBMCount

The counts are exactly what the instrumented kernels count (the tests assert
equality): bytes the kernels' code requests from global memory, per kernel.
"""

import importlib

from ..hbm import HBMCount


def forward(kernel: str, BH, Nq, Nk, d, dtype, causal=False, block=None) -> HBMCount:
    return importlib.import_module(f"{__name__}.{kernel}").forward(BH, Nq, Nk, d, dtype, causal, block)


def backward(kernel: str, BH, Nq, Nk, d, dtype, causal=False, block=None) -> HBMCount:
    return importlib.import_module(f"{__name__}.{kernel}").backward(BH, Nq, Nk, d, dtype, causal, block)
