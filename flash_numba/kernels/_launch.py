"""Every kernel launch of the package goes through :func:`launch`: on the call's stream, with its dynamic shared memory.

``launch(kernel, grid, block)(*args)`` is ``kernel[grid, block, stream, 0](*args)`` with ``stream`` the
call's (:func:`flash_numba._stream.current`: PyTorch's current stream for PyTorch tensors, the ``stream=``
argument or Numba's default stream otherwise).  A launch written ``kernel[grid, block](...)`` would run on
Numba's default stream whatever the caller's stream is, and could read its inputs before the caller's
stream has written them: do not launch any other way (tests/test_streams.py checks every launch of
every kernel).

``dynamic_bytes`` of dynamic shared memory (:mod:`flash_numba.kernels._smem`): above 48 KB a kernel must
first opt in to that many bytes per block (the driver's ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``;
up to 64 KB on a T4, 227 KB on an H100/H200); :func:`launch` does that once per compiled kernel and size.
"""

from __future__ import annotations

import functools

from .. import _stream
from ..device import SIMULATOR, STATIC_SHARED_LIMIT


def launch(kernel, grid, block, dynamic_bytes: int = 0, static_bytes: int = 0):
    """``kernel[grid, block]`` on the call's stream, with ``dynamic_bytes`` of dynamic shared memory; opted in
    where the block's dynamic and ``static_bytes`` of static shared memory together pass 48 KB."""
    config = kernel[grid, block, _stream.current(), dynamic_bytes]
    if not SIMULATOR and dynamic_bytes and dynamic_bytes + static_bytes > STATIC_SHARED_LIMIT:
        config.pre_launch_callbacks.append(functools.partial(_opt_in, nbytes=dynamic_bytes))
    return config


_OPTED_IN: dict = {}


def _opt_in(compiled, config, nbytes: int) -> None:
    """Let ``compiled`` (a Numba ``_Kernel``) launch with ``nbytes`` of dynamic shared memory on this device."""
    from numba.cuda.cudadrv.driver import binding, driver

    cufunc = compiled._codelibrary.get_cufunc()
    key = (id(cufunc), cufunc.device.id)
    if _OPTED_IN.get(key, 0) >= nbytes:
        return
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, nbytes, cufunc.handle, cufunc.device.id)
    _OPTED_IN[key] = nbytes
