"""The FlashAttention kernel exercises: packaged solutions pass, stubs are "not done", mistakes are named.

The kernels run in the simulator (or on the GPU where there is one) at Br = Bc = d = 4;
the bug zoo's exhibits are the wrong answers (see tests/test_bugzoo.py for all of them).
"""

import numpy as np
import pytest
from numba import cuda

from flash_numba import iomodel

from flash_numba.course import bugzoo, flash_checks as kx
from flash_numba.course import exercises as ex
from flash_numba.device import SIMULATOR

KERNEL_EXERCISES = ["flash1_block", "dkdv_block", "causal_tiles", "flash2_loop"]


@pytest.mark.parametrize("name", KERNEL_EXERCISES)
def test_the_packaged_solution_passes(name, capsys):
    assert ex.check_solution(name)
    assert "passed" in capsys.readouterr().out


@pytest.mark.parametrize("name", KERNEL_EXERCISES)
def test_other_tile_sizes(name):
    """The solutions read Br, Bc and d from their arguments: any tiles compile (Br != Bc here)."""
    assert ex.check_solution(name, Br=2, Bc=8, d=3)


@cuda.jit(device=True)
def _stub(*args):
    raise NotImplementedError("write the heart")


@pytest.mark.parametrize("name", KERNEL_EXERCISES)
def test_a_stub_is_not_done(name, capsys):
    assert not ex.check(name, _stub)
    assert "not done yet" in capsys.readouterr().out
    with pytest.raises(ex.ExerciseFailed):
        ex.check(name, _stub, raise_on_fail=True)


def test_every_kernel_exercise_is_registered_in_course_order():
    names = ex.names()
    assert set(KERNEL_EXERCISES) <= set(names)
    from flash_numba.course.checking import _course_order

    lessons = [_course_order(ex._get(n).lesson) for n in names]
    assert lessons == sorted(lessons)


def test_the_solution_prints(capsys):
    ex.solution("flash2_loop")
    out = capsys.readouterr().out
    assert "def flash2_rows" in out and "math.exp(m_i - m_new)" in out


@pytest.mark.parametrize("name", KERNEL_EXERCISES)
def test_frame_source(name):
    assert "@cuda.jit" in kx.frame_source(name)


@pytest.mark.parametrize(
    "Nq, Nk, Br, Bc, causal", [(13, 13, 4, 4, False), (5, 11, 4, 2, False), (6, 14, 4, 4, True), (14, 6, 2, 4, True)]
)
def test_per_array_models_add_up_to_the_io_model(Nq, Nk, Br, Bc, causal):
    """The checkers' array-by-array counts are the package's IO models, split by array."""
    d = 3
    model, per_array = kx._flash2_model(Br, Bc, d, causal)
    arrays = per_array(Nq, Nk)
    assert (4 * sum(r for r, _ in arrays.values()), 4 * sum(w for _, w in arrays.values())) == model(Nq, Nk)
    rows = kx._pairs_rows(Nq, Nk, Br, Bc, causal)
    want = kx._bytes_of(iomodel.flash2.backward(1, Nq, Nk, d, np.float32, causal, (Br, Bc)), 1)
    assert want == (4 * (2 * Nk * d + rows * (2 * d + 2)), 4 * 2 * Nk * d)


def test_visited_pairs_match_the_tile_bound():
    for Nq, Nk in kx.CAUSAL_SHAPES:
        visited = kx._visited(Nq, Nk, 4, 4)
        for i in range(-(-Nq // 4)):
            n = kx._tiles_spec(i, 4, 4, Nq, Nk)
            assert visited[i * 4].reshape(-1)[: n * 4].all() and not visited[i * 4, n * 4:].any()


def test_stale_max_emulation_is_wrong_only_when_the_max_moves():
    rng = np.random.default_rng(0)
    q, k, v = kx._qkv(rng, 6, 8, 4, late_max=True)
    S = kx._scores(q, k, np.ones((6, 8), bool), 0.5)
    assert np.allclose(kx._stale_max_o(S, v.astype(np.float64), 8), kx._softmax_v(S, v))  # one tile: no rescale
    assert not np.allclose(kx._stale_max_o(S, v.astype(np.float64), 2), kx._softmax_v(S, v))


@pytest.mark.skipif(not SIMULATOR, reason="the access trace exists only in the simulator")
def test_an_uncounted_load_is_seen_by_the_trace(capsys):
    assert not ex.check("flash2_loop", bugzoo.build("uncounted_load"))
    out = capsys.readouterr().out
    assert "your counter" in out and "watched by the simulator" in out and "k: 80 element reads" in out


@pytest.mark.compile
def test_the_frames_solutions_and_exhibits_compile_for_a_gpu():
    """The simulator never type-checks: compile every frame with its solution and each exhibit (NVVM, no GPU)."""
    import os
    import subprocess
    import sys

    code = "from flash_numba.course import flash_checks as kx; print(len(kx.compile_all()), 'compiled')"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    whole = 2 * len(kx.WHOLE_KERNELS)  # each whole kernel, causal or not
    assert f"{4 + len(bugzoo.names()) + whole} compiled" in proc.stdout


@pytest.mark.parametrize("name", KERNEL_EXERCISES)
def test_every_kernel_exercise_has_hints(name, capsys):
    kx.hints(name, upto=1)
    assert capsys.readouterr().out.startswith(f"hint 1 of {len(kx.HINTS[name])}: ")
    kx.hints(name)
    assert len(capsys.readouterr().out.splitlines()) == len(kx.HINTS[name]) >= 3
    with pytest.raises(ValueError, match="^name: no hints"):
        kx.hints("axpy")
