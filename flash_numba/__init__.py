"""flash_numba: FlashAttention from scratch as Numba CUDA kernels you can read, run and measure.

Import order matters: :mod:`flash_numba.device` decides between a GPU and the
CUDA simulator *before* numba is imported, and :mod:`flash_numba._compat`
patches numpy 2.5 for numba-cuda 0.30.4.
"""

from . import device  # noqa: F401  (first: picks GPU or simulator, applies the numpy shim)
from .api import (  # noqa: E402
    BackwardResult,
    ForwardResult,
    DEFAULT_KERNEL,
    attention,
    attention_backward,
    attention_forward,
    flash_attention_backward,
    flash_attention_forward,
    resolve_block,
    standard_attention_backward,
    standard_attention_forward,
)
from ._inputs import as_bfloat16  # noqa: E402
from ._memory import DeviceMemoryError  # noqa: E402
from .decode import DecodeResult, attention_decode  # noqa: E402
from .device import ConfigurationError, UnsupportedOnThisGPU  # noqa: E402
from .hbm import HBMCount, KernelBytes  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "BackwardResult",
    "ConfigurationError",
    "DeviceMemoryError",
    "DecodeResult",
    "ForwardResult",
    "HBMCount",
    "KernelBytes",
    "as_bfloat16",
    "DEFAULT_KERNEL",
    "attention",
    "attention_backward",
    "attention_decode",
    "attention_forward",
    "device",
    "flash_attention_backward",
    "flash_attention_forward",
    "resolve_block",
    "standard_attention_backward",
    "standard_attention_forward",
    "UnsupportedOnThisGPU",
]
