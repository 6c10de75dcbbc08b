"""Where the kernels run: a real NVIDIA GPU, or Numba's CUDA simulator.

Everything in flash_numba that depends on the machine goes through this module:

* :func:`mode` says ``"gpu"`` or ``"simulator"`` and :func:`describe` says it in
  one line, with the device's name, compute capability, SM count and shared
  memory.
* :func:`info` returns those numbers as a :class:`DeviceInfo`.  The simulator has
  no device attributes, so there it returns documented stand-ins (a T4-like
  budget of 48 KB shared memory per block, 64 KB per SM, 1 SM), clearly marked
  ``simulated=True``.
* :func:`jit` wraps ``numba.cuda.jit`` and drops the options that the simulator
  rejects (``max_registers``, ``lineinfo``, ``launch_bounds``), so one kernel
  definition serves both.
* :class:`CudaTimer` times with CUDA events on a GPU.  The simulator's events
  report -1 ms; there the timer reports ``None`` and says why instead of
  printing a meaningless number.

Choosing the mode.  ``NUMBA_ENABLE_CUDASIM=1`` must be set before numba is
imported.  When flash_numba is imported before numba, the variable is unset and
no NVIDIA driver can be loaded, :mod:`flash_numba` sets it for you (a laptop
"just works" in the simulator).  Set ``NUMBA_ENABLE_CUDASIM=0`` to forbid that.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass

#: Why the simulator was chosen, when flash_numba chose it (None otherwise).
AUTO_SIMULATOR_REASON: str | None = None


def _driver_loadable() -> bool:
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


def _choose_mode_before_numba_import() -> None:
    """Turn the simulator on when there is no GPU driver and nobody decided."""
    global AUTO_SIMULATOR_REASON
    if "numba" in sys.modules or "NUMBA_ENABLE_CUDASIM" in os.environ:
        return
    if not _driver_loadable():
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        AUTO_SIMULATOR_REASON = "no NVIDIA driver found"


_choose_mode_before_numba_import()

from . import _compat  # noqa: E402,F401  (must precede numba.cuda)
import numba  # noqa: E402
from numba import cuda  # noqa: E402

#: True when kernels run in Numba's CUDA simulator (Python code on the CPU).
SIMULATOR: bool = bool(numba.config.ENABLE_CUDASIM)

if SIMULATOR:  # the simulator lacks warp shuffles; add them (flash_numba.sim.warps)
    from .sim import warps as _simwarp

    _simwarp.install()

#: Static shared memory a kernel may declare, on every GPU we target (T4 .. H200).
STATIC_SHARED_LIMIT = 48 * 1024
#: Shared memory one block may use with dynamic shared memory, opted in, by compute capability
#: (the CUDA C++ Programming Guide's table; the device reports its own as
#: ``MAX_SHARED_MEMORY_PER_BLOCK_OPTIN``): the compile tier builds each cc's blocks with it.
SHARED_OPTIN_BY_CC = {(7, 5): 64 * 1024, (8, 0): 163 * 1024, (8, 6): 99 * 1024, (8, 9): 99 * 1024,
                      (9, 0): 227 * 1024}
#: Kernels that can use dynamic shared memory use it from this compute capability up, where it was measured
#: to pay (an H200: docs/PERFORMANCE.md, "Design decisions"); below, their blocks stay within 48 KB of static memory.
DYNAMIC_SHARED_FROM_CC = (9, 0)


def dynamic_shared_limit(cc, optin: int | None = None) -> int:
    """Bytes of shared memory a block of a kernel that can use dynamic shared memory gets on compute capability
    ``cc`` (``optin``: the device's opt-in limit; default :data:`SHARED_OPTIN_BY_CC`)."""
    if tuple(cc) < DYNAMIC_SHARED_FROM_CC:
        return STATIC_SHARED_LIMIT
    return SHARED_OPTIN_BY_CC.get(tuple(cc), STATIC_SHARED_LIMIT) if optin is None else optin


@dataclass(frozen=True)
class DeviceInfo:
    """What the kernels need to know about the device.

    In the simulator the numbers are stand-ins (``simulated=True``): a 48 KB
    shared-memory budget per block, as on every real GPU we target, so block
    sizes chosen there are the ones a T4 would get.
    """

    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    shared_mem_per_block: int  # bytes a block may use (static limit applied)
    shared_mem_per_sm: int  # bytes per multiprocessor
    shared_mem_per_block_optin: int  # bytes a block may use with dynamic shared memory, opted in
    total_memory: int | None  # bytes of device memory (HBM / GDDR); None if unknown
    warp_size: int
    simulated: bool

    @property
    def mode(self) -> str:
        return "simulator" if self.simulated else "gpu"


class ConfigurationError(RuntimeError):
    """This machine cannot run what was asked, whatever the arguments: no GPU while the simulator is off, a
    driver too old for the CUDA toolkit, a GPU without what a dtype needs.  The command line prints it as one
    line and exits with status 2 (:func:`configuration_message`)."""


class UnsupportedOnThisGPU(ConfigurationError, ValueError):
    """A kernel or dtype that this GPU cannot run (bfloat16 below compute capability 8.0, say); a ValueError too,
    so that callers checking arguments catch it as they catch the other refusals."""


#: CUDA driver errors that mean "this driver is older than the toolkit that compiled the code".
_DRIVER_TOO_OLD = ("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "CUDA_ERROR_INSUFFICIENT_DRIVER",
                   "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE")


def configuration_message(exc: BaseException) -> str | None:
    """One line saying what this machine lacks, when ``exc`` says that (None for any other error)."""
    from numba.cuda.cudadrv import error  # (in the simulator, its stand-in: no NVVM errors there)

    if isinstance(exc, ConfigurationError):
        return str(exc)
    missing = tuple(getattr(error, name) for name in ("CudaSupportError", "NvvmSupportError") if hasattr(error, name))
    if isinstance(exc, missing):
        text = " ".join(str(exc).split())
        return (f"no usable CUDA driver or toolkit ({text}); on a machine without a GPU, run in the simulator: "
                "unset NUMBA_ENABLE_CUDASIM, or set it to 1")
    from numba.cuda.cudadrv.driver import CudaAPIError

    if isinstance(exc, CudaAPIError) and any(name in str(exc) for name in _DRIVER_TOO_OLD):
        return (f"the NVIDIA driver is too old for the CUDA toolkit Numba uses ({' '.join(str(exc).split())}); "
                "update the driver, or install the toolkit that matches it: pip install 'flash-numba[cu12]'")
    return None


def mode() -> str:
    """``"simulator"`` or ``"gpu"``; raises :class:`ConfigurationError` if neither is available."""
    if SIMULATOR:
        return "simulator"
    if not cuda.is_available():
        raise ConfigurationError(
            "No CUDA GPU is available to Numba and the simulator is off. "
            "Set NUMBA_ENABLE_CUDASIM=1 before importing numba (or import flash_numba "
            "first, which does it when no NVIDIA driver is found)."
        )
    return "gpu"


_INFO: DeviceInfo | None = None


def info() -> DeviceInfo:
    """The current device's name, compute capability, SMs and shared memory."""
    global _INFO
    if _INFO is not None:
        return _INFO
    if mode() == "simulator":  # raises ConfigurationError where there is neither
        _INFO = DeviceInfo(
            name="Numba CUDA simulator",
            compute_capability=(7, 5),
            sm_count=1,
            shared_mem_per_block=STATIC_SHARED_LIMIT,
            shared_mem_per_sm=64 * 1024,
            shared_mem_per_block_optin=STATIC_SHARED_LIMIT,  # block choices as with static memory
            total_memory=None,
            warp_size=32,
            simulated=True,
        )
        return _INFO
    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    try:
        total = cuda.current_context().get_memory_info()[1]
    except Exception:  # pragma: no cover - depends on the driver
        total = None
    _INFO = DeviceInfo(
        name=name,
        compute_capability=tuple(dev.compute_capability),
        sm_count=int(dev.MULTIPROCESSOR_COUNT),
        shared_mem_per_block=min(int(dev.MAX_SHARED_MEMORY_PER_BLOCK), STATIC_SHARED_LIMIT),
        shared_mem_per_sm=int(dev.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
        shared_mem_per_block_optin=int(dev.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        total_memory=total,
        warp_size=int(dev.WARP_SIZE),
        simulated=False,
    )
    return _INFO


def describe() -> str:
    """One line: where the kernels run, and the numbers that matter."""
    d = info()
    if d.simulated:
        why = f" ({AUTO_SIMULATOR_REASON})" if AUTO_SIMULATOR_REASON else ""
        return (
            f"simulator{why}: kernels run as Python code on the CPU; use tiny sizes, "
            f"times are not measured; stand-in budget {d.shared_mem_per_block // 1024} KB "
            f"shared memory per block"
        )
    mem = f", {d.total_memory / 2**30:.0f} GiB" if d.total_memory else ""
    return (
        f"gpu: {d.name} (sm_{d.compute_capability[0]}{d.compute_capability[1]}), "
        f"{d.sm_count} SMs{mem}, shared memory {d.shared_mem_per_block // 1024} KB per block "
        f"(static), {d.shared_mem_per_block_optin // 1024} KB (dynamic, opted in), "
        f"{d.shared_mem_per_sm // 1024} KB per SM"
    )


_SIM_REJECTS = ("max_registers", "lineinfo", "launch_bounds", "forceinline")


def jit(*args, **options):
    """``numba.cuda.jit`` that also works in the simulator.

    The simulator raises on ``max_registers``, ``lineinfo``, ``launch_bounds`` and
    ``forceinline``; they only tune code generation, so they are dropped there.
    """
    if SIMULATOR:
        for key in _SIM_REJECTS:
            options.pop(key, None)
    return cuda.jit(*args, **options)


class CudaTimer:
    """Time a region of device work with CUDA events.

    >>> with CudaTimer() as t:          # doctest: +SKIP
    ...     kernel[grid, block](...)
    >>> t.ms                            # doctest: +SKIP

    In the simulator events report -1; there ``ms`` is ``None`` and
    :attr:`note` explains why.
    """

    note = "the simulator has no clock for kernels (its CUDA events report -1 ms)"

    def __init__(self) -> None:
        self.ms: float | None = None

    def __enter__(self) -> "CudaTimer":
        if not SIMULATOR:
            self._start = cuda.event(timing=True)
            self._stop = cuda.event(timing=True)
            self._start.record()
        return self

    def __exit__(self, *exc) -> None:
        if SIMULATOR:
            self.ms = None
            return
        self._stop.record()
        self._stop.synchronize()
        self.ms = cuda.event_elapsed_time(self._start, self._stop)


def time_ms(fn, *, warmup: int = 3, repeats: int = 10) -> list[float] | None:
    """Run ``fn()`` ``warmup`` times, then time ``repeats`` calls with CUDA events.

    Returns the list of times in milliseconds (take the median), or ``None`` in
    the simulator, which cannot time kernels.
    """
    if SIMULATOR:
        return None
    for _ in range(warmup):
        fn()
    cuda.synchronize()
    out = []
    for _ in range(repeats):
        with CudaTimer() as t:
            fn()
        out.append(t.ms)
    return out


def synchronize() -> None:
    cuda.synchronize()


def numba_device_bytes() -> int | None:
    """Device bytes this process holds through Numba: live allocations plus those queued for freeing.

    Read from Numba's own memory manager (its ``allocations`` table and the
    byte total of its pending-free queue), so other processes on the same GPU
    do not disturb it, as they do a difference of ``cuMemGetInfo``'s free
    memory.  Inside ``cuda.defer_cleanup()`` nothing leaves the queue, so the
    difference of two readings is every byte allocated in between.  ``None``
    in the simulator or with an external memory manager (EMM plugin) that
    keeps no such table.
    """
    if SIMULATOR:
        return None
    mm = getattr(cuda.current_context(), "memory_manager", None)
    live = getattr(mm, "allocations", None)
    pending = getattr(getattr(mm, "deallocations", None), "_size", None)
    if live is None or not isinstance(pending, int):
        return None
    return sum(int(m.size) for m in list(live.values())) + pending
