"""The CUDA stream a call runs on.

Work on a GPU is ordered per stream: a kernel on stream A may start before work queued
earlier on stream B has finished.  PyTorch queues its work on ``torch.cuda.current_stream()``,
which inside ``with torch.cuda.stream(s):`` (overlapped data loading, DDP's communication
overlap, CUDA-graph capture) is a side stream that does not wait for Numba's default stream,
nor it for it.  A kernel launched on Numba's default stream could then read q before the side
stream has written it: a silent wrong answer.  So every launch, copy and allocation of a call
goes to one stream, chosen here:

* PyTorch CUDA tensors: PyTorch's current stream of their device, as PyTorch's own operations
  do (Numba launches there through ``cuda.external_stream`` of its handle).  Buffers come from
  PyTorch's caching allocator on that same stream (:func:`flash_numba._inputs.empty`), so the
  allocator never hands their memory to another stream before our kernels are done with it.
* Numba device arrays and NumPy arrays: the call's ``stream=`` (a Numba stream, e.g.
  ``cuda.stream()``), else Numba's default stream (``0``), Numba's own convention.

:func:`using` sets the stream for the duration of a call (a context variable, so concurrent
calls from several Python threads each keep their own); :func:`current` is what every launch
(:func:`flash_numba.kernels._launch.launch`) and every buffer of the call reads.
"""

from __future__ import annotations

import contextlib
import contextvars

from .device import SIMULATOR

_CURRENT = contextvars.ContextVar("flash_numba_stream", default=0)

#: Numba stream objects wrapping PyTorch's streams, by (device, handle): building one per call costs host time.
_EXTERNAL: dict = {}


def current():
    """The stream the running call launches on (0: Numba's default stream)."""
    return _CURRENT.get()


@contextlib.contextmanager
def using(stream):
    """``with using(stream):`` every launch and buffer of the block goes to ``stream``."""
    token = _CURRENT.set(stream)
    try:
        yield stream
    finally:
        _CURRENT.reset(token)


def handle(stream) -> int:
    """The driver's handle of a stream (0 for Numba's default stream): of a Numba stream, or of the
    ``cuda.core`` stream that Numba's launch configuration turns it into."""
    if isinstance(stream, int):
        return stream
    h = getattr(stream, "handle", stream)  # a cuda.bindings CUstream, or a ctypes handle
    h = getattr(h, "value", h)
    return int(h or 0)


def _torch_stream(t):
    """Numba's view of PyTorch's current stream on the device of CUDA tensor ``t``."""
    import torch

    index = t.get_device()
    try:  # the raw handle without building a torch.cuda.Stream object (host time per call)
        raw = int(torch._C._cuda_getCurrentRawStream(index))
    except AttributeError:  # pragma: no cover - other PyTorch versions
        raw = int(torch.cuda.current_stream(index).cuda_stream)
    if raw == 0 and not _per_thread_default():
        return 0  # the legacy default stream: Numba's default stream is the same one
    key = (index, raw)
    stream = _EXTERNAL.get(key)
    if stream is None:
        from numba import cuda

        if len(_EXTERNAL) > 1024:  # streams come and go in some programs: keep the table small
            _EXTERNAL.clear()
        stream = _EXTERNAL[key] = cuda.external_stream(raw)
    return stream


def _per_thread_default() -> bool:
    from numba.core import config

    return bool(getattr(config, "CUDA_PER_THREAD_DEFAULT_STREAM", 0))


def for_call(q, stream):
    """The stream of a call whose first input is ``q``, given its ``stream=`` argument (checked).

    PyTorch CUDA tensors run on PyTorch's current stream and refuse ``stream=``: select their stream the
    PyTorch way (``with torch.cuda.stream(s):``), so that our buffers and PyTorch's allocator agree on it.
    """
    torch_cuda = type(q).__module__.split(".")[0] == "torch" and getattr(q, "is_cuda", False)
    if torch_cuda:
        if stream is not None:
            raise ValueError("stream: PyTorch tensors run on torch.cuda.current_stream(); choose it with "
                             "`with torch.cuda.stream(s):` instead of passing stream=")
        return _torch_stream(q)
    if stream is None or (isinstance(stream, int) and not isinstance(stream, bool) and stream == 0):
        return 0
    if SIMULATOR:
        from numba.cuda.simulator.api import stream as fake_stream

        if isinstance(stream, fake_stream):
            return stream
    else:
        from numba.cuda.cudadrv.driver import Stream

        if isinstance(stream, Stream):
            return stream
    raise TypeError(f"stream: expected a Numba CUDA stream (numba.cuda.stream()) or None, "
                    f"got {type(stream).__name__}")


def synchronize(stream) -> None:
    """Wait for ``stream`` (the whole device for Numba's default stream)."""
    if stream:
        stream.synchronize()
    else:
        from numba import cuda

        cuda.synchronize()
