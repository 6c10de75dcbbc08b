"""Device memory of a call: every buffer is checked against the GPU's free memory before it is allocated.

A call whose outputs or workspace cannot fit (standard attention's S and P at large N, an output beside a huge
input) gets :class:`DeviceMemoryError`, naming the bytes it needs and the bytes free, before the buffer is
allocated when it is :data:`CHECK_FREE_FROM` bytes or more, or when the allocation itself fails.  Buffers are
allocated before the launches that use them, so nothing ran with it; the CUDA context stays usable.
"""

from __future__ import annotations

import numpy as np

from .device import SIMULATOR


class DeviceMemoryError(MemoryError):
    """A buffer of the call does not fit in the GPU's free memory (the message names the bytes needed and free).
    Nothing was launched with it, the CUDA context stays usable, and the next call that fits runs."""


#: Buffers of at least this many bytes are checked against the GPU's free memory before they are allocated (a
#: query of the driver, ~microseconds, against an allocation of that size; smaller ones only if they fail).
CHECK_FREE_FROM = 1 << 26


def free_bytes(torch_device=None) -> tuple[int, int]:
    """(free, total) bytes of the current GPU; for a call on PyTorch tensors (``torch_device``), memory that
    PyTorch's caching allocator holds unused counts as free."""
    if torch_device is not None:
        import torch

        free, total = torch.cuda.mem_get_info(torch_device)
        return free + torch.cuda.memory_reserved(torch_device) - torch.cuda.memory_allocated(torch_device), total
    from numba import cuda

    free, total = cuda.current_context().get_memory_info()
    return int(free), int(total)


def out_of_memory(shape, dtype, nbytes: int, free: int, total: int) -> DeviceMemoryError:
    return DeviceMemoryError(
        f"out of GPU memory: a {tuple(int(s) for s in shape)} {np.dtype(dtype).name} buffer of this call needs "
        f"{nbytes:,} bytes, and {free:,} of the GPU's {total:,} bytes are free; use a smaller batch or sequence "
        f"length (standard attention also stores S and P, B*H*Nq*Nk elements each)")


def is_out_of_memory(exc) -> bool:
    """PyTorch's OutOfMemoryError, or a CUDA_ERROR_OUT_OF_MEMORY from Numba's allocator."""
    return type(exc).__name__ == "OutOfMemoryError" or "CUDA_ERROR_OUT_OF_MEMORY" in str(exc)


def allocate(make, shape, dtype, torch_device=None):
    """``make()``, a device buffer of ``shape`` and ``dtype``: checked against the free memory first when large,
    and a failed allocation turned into :class:`DeviceMemoryError`."""
    if SIMULATOR:
        return make()
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if nbytes >= CHECK_FREE_FROM:
        free, total = free_bytes(torch_device)
        if nbytes > free:
            raise out_of_memory(shape, dtype, nbytes, free, total)
    try:
        return make()
    except Exception as exc:  # only an allocation that failed for want of memory is ours to explain
        if not is_out_of_memory(exc):
            raise
        raise out_of_memory(shape, dtype, nbytes, *free_bytes(torch_device)) from exc
