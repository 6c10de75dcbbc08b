"""Streams: every launch of a call runs on the call's stream (flash_numba._stream).

The defect this guards against: PyTorch work on a side stream (``with torch.cuda.stream(s):``) writes q,
then calls our attention; a kernel on Numba's default stream read q before the side stream had written
it (5 of 5 calls wrong on an H200, max error 0.59).  In the simulator, every launch of every kernel is
checked to go to the call's stream (a launch written another way would not); on a GPU, a stream that
sleeps before it writes the input shows the race itself.
"""

import numpy as np
import pytest

from flash_numba import _stream, attention_backward, attention_forward, kernels
from flash_numba.device import SIMULATOR

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None


def _inputs(rng, shape=(2, 9, 16), dtype=np.float32):
    return tuple(rng.standard_normal(shape).astype(dtype) for _ in range(3))


# ---------------------------------------------------------------- simulator: where each launch goes


@pytest.fixture
def launched_streams(monkeypatch):
    """The stream of every kernel launch made while the test runs, in order."""
    if not SIMULATOR:
        pytest.skip("records the simulator's launch configurations")
    from numba.cuda.simulator import kernel as sim_kernel

    seen = []
    original = sim_kernel.FakeCUDAKernel.__getitem__

    def getitem(self, configuration):
        seen.append(configuration[2] if len(configuration) > 2 else 0)
        return original(self, configuration)

    monkeypatch.setattr(sim_kernel.FakeCUDAKernel, "__getitem__", getitem)
    return seen


@pytest.mark.parametrize("kernel", kernels.NAMES)
@pytest.mark.slow
def test_every_launch_of_every_kernel_runs_on_the_calls_stream(kernel, rng, launched_streams):
    from numba import cuda

    dtype = np.float32 if kernels.get(kernel).supports(16, "float32") is None else np.float16  # flash2_tc: half only
    q, k, v = (cuda.to_device(x) for x in _inputs(rng, dtype=dtype))
    stream = cuda.stream()
    fwd = attention_forward(q, k, v, kernel=kernel, causal=True, stream=stream)
    n_forward = len(launched_streams)
    do = cuda.to_device(rng.standard_normal(q.shape).astype(dtype))
    attention_backward(q, k, v, fwd.o, fwd.lse, do, kernel=kernel, causal=True, stream=stream)
    if kernels.get(kernel).supports_atomic:
        attention_backward(q, k, v, fwd.o, fwd.lse, do, kernel=kernel, causal=True, stream=stream,
                           deterministic=False)
    assert n_forward >= 1 and len(launched_streams) > n_forward
    assert all(s is stream for s in launched_streams), launched_streams


def test_without_a_stream_numba_arrays_launch_on_numbas_default_stream(rng, launched_streams):
    from numba import cuda

    q, k, v = (cuda.to_device(x) for x in _inputs(rng))
    attention_forward(q, k, v, kernel="flash2")
    assert launched_streams and all(s == 0 for s in launched_streams)
    assert _stream.current() == 0  # the call's stream does not outlive the call


def test_host_arrays_on_a_stream_give_the_same_result(rng):
    from numba import cuda

    q, k, v = _inputs(rng)
    plain = attention_forward(q, k, v, kernel="flash2", count_hbm=True)
    streamed = attention_forward(q, k, v, kernel="flash2", count_hbm=True, stream=cuda.stream())
    np.testing.assert_array_equal(plain.o, streamed.o)
    assert plain.hbm.per_kernel == streamed.hbm.per_kernel


@pytest.mark.parametrize("bad", ["0", 1.5, object(), True])
def test_a_stream_that_is_not_a_stream_is_refused_naming_the_argument(bad, rng):
    q, k, v = _inputs(rng)
    with pytest.raises(TypeError, match="^stream: expected a Numba CUDA stream"):
        attention_forward(q, k, v, stream=bad)


# ---------------------------------------------------------------- GPU: the race itself

# Long enough that a kernel launched on another stream would certainly start before the write.
SLEEP_CYCLES = 200_000_000  # ~0.1 s at ~2 GHz


def _torch_inputs(shape, dtype, gen):
    return [torch.randn(shape, dtype=dtype, device="cuda", generator=gen) for _ in range(4)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_api_on_a_pytorch_side_stream_waits_for_its_writes(dtype):
    """The case from the reliability issue: the side stream sleeps, then writes q, then calls us."""
    if torch is None or not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA")
    dt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(1)
    q_true, k, v, do = _torch_inputs((2, 8, 512, 64), dt, gen)
    want = attention_forward(q_true, k, v, causal=True)
    want_b = attention_backward(q_true, k, v, want.o, want.lse, do, causal=True)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    for trial in range(3):
        q = torch.zeros_like(q_true)
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES)
            q.copy_(q_true)
            got = attention_forward(q, k, v, causal=True)
            got_b = attention_backward(q, k, v, got.o, got.lse, do, causal=True)
        side.synchronize()
        assert torch.equal(got.o, want.o), f"trial {trial}: forward read q before the side stream wrote it"
        for name in ("dq", "dk", "dv"):
            assert torch.equal(getattr(got_b, name), getattr(want_b, name)), (trial, name)


@pytest.mark.gpu
def test_drop_in_on_a_pytorch_side_stream_forward_and_backward():
    if torch is None or not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA")
    from flash_numba.torch import scaled_dot_product_attention as sdpa

    gen = torch.Generator(device="cuda").manual_seed(2)
    q_true, k, v, do = _torch_inputs((2, 4, 384, 64), torch.float16, gen)
    leaf = q_true.clone().requires_grad_()
    sdpa(leaf, k, v, is_causal=True).backward(do)
    want_o, want_dq = sdpa(q_true, k, v, is_causal=True), leaf.grad
    side = torch.cuda.Stream()
    q = torch.zeros_like(q_true, requires_grad=True)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        with torch.no_grad():
            q.copy_(q_true)
        o = sdpa(q, k, v, is_causal=True)
        o.backward(do)
    side.synchronize()
    assert torch.equal(o, want_o)
    assert torch.equal(q.grad, want_dq)


@pytest.mark.gpu
def test_numba_arrays_on_a_numba_stream_wait_for_its_copies():
    from numba import cuda

    @cuda.jit
    def sleep(n):  # keeps the stream busy for about n ms (nanosleep sleeps at most 1 ms a call)
        for _ in range(n):
            cuda.nanosleep(1_000_000)

    rng = np.random.default_rng(3)
    q_host, k_host, v_host = (rng.standard_normal((4, 256, 64)).astype(np.float32) for _ in range(3))
    want = attention_forward(q_host, k_host, v_host)
    stream = cuda.stream()
    q = cuda.device_array_like(q_host)
    q.copy_to_device(np.zeros_like(q_host))
    k, v = cuda.to_device(k_host), cuda.to_device(v_host)
    cuda.synchronize()
    sleep[1, 1, stream](100)
    q.copy_to_device(q_host, stream=stream)
    got = attention_forward(q, k, v, stream=stream)
    o = got.o.copy_to_host(stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(o, want.o)


@pytest.mark.gpu
def test_cuda_graph_capture_replays_to_the_eager_result():
    """Capture is on a side stream: our launches must be captured there (the launch plan is keyed by it)."""
    if torch is None or not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA")
    gen = torch.Generator(device="cuda").manual_seed(4)
    q, k, v, _ = _torch_inputs((2, 4, 256, 64), torch.float16, gen)
    eager = attention_forward(q, k, v, causal=True).o.clone()
    static_q = q.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on the capture's kind of stream, as PyTorch asks
        for _ in range(2):
            attention_forward(static_q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention_forward(static_q, k, v, causal=True).o
    static_q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, attention_forward(static_q, k, v, causal=True).o)
    static_q.copy_(q)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_every_launch_of_a_decoding_step_runs_on_the_calls_stream(num_splits, rng, launched_streams):
    from numba import cuda

    from flash_numba import attention_decode

    q = cuda.to_device(rng.standard_normal((1, 2, 1, 16)).astype(np.float32))
    k, v = (cuda.to_device(rng.standard_normal((1, 1, 9, 16)).astype(np.float32)) for _ in range(2))
    stream = cuda.stream()
    attention_decode(q, k, v, num_splits=num_splits, stream=stream)
    from flash_numba.kernels import flash_decode as fd

    assert len(launched_streams) == len(fd.launches(num_splits))  # the combine fused into the split kernel, or not
    assert all(s is stream for s in launched_streams), launched_streams
