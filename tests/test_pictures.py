"""The lessons' pictures draw without a GPU and show the numbers they claim to."""

import numpy as np
import pytest
from matplotlib.figure import Figure

from flash_numba import iomodel

from flash_numba.course import flash_checks as kx, pictures, recorded
from flash_numba.device import SIMULATOR


def test_memory_hierarchy_from_the_recorded_gpu():
    fig = pictures.memory_hierarchy(recorded.hierarchy_levels(), "H200")
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    widths = [p.get_width() for p in fig.axes[1].patches]
    assert widths == [recorded.hierarchy()["shared_gbs"] * 1e9, recorded.hierarchy()["hbm_gbs"] * 1e9]


def test_tiling_steps_draws_one_panel_per_step():
    fig = pictures.tiling_steps(N=12, Br=4, Bc=6, steps=((0, 0), (1, 2)))
    assert len(fig.axes) == 2
    assert "inner i = 2" in fig.axes[1].get_title()


def test_online_softmax_picture_ends_at_the_true_statistics():
    row = np.array([0.1, -1.0, 3.0, 0.5, 7.0])
    fig = pictures.online_softmax_late_max(row, block=2)
    line_l = fig.axes[2].lines[0]  # the running sum, on the twin axis
    assert line_l.get_ydata()[-1] == pytest.approx(np.exp(row - row.max()).sum())
    assert fig.axes[1].lines[0].get_ydata()[-1] == row.max()


def test_hbm_bytes_by_term_stacks_the_io_model():
    fig = pictures.hbm_bytes_by_term(kernels=("standard", "flash2"), Ns=(1024,), blocks={"flash2": (64, 64)})
    heights = [p.get_height() for p in fig.axes[0].patches]
    std = iomodel.forward("standard", 1, 1024, 1024, 64, np.float32)
    f2 = iomodel.forward("flash2", 1, 1024, 1024, 64, np.float32, False, (64, 64))
    assert sum(heights) == pytest.approx((std.total + f2.total) / 1e6)


@pytest.mark.skipif(not SIMULATOR, reason="the access trace exists only in the simulator")
def test_access_map_and_read_counts_from_a_trace():
    log = kx.measure_forward("flash2_loop", kx.flash2_rows, 4, 4)["log"]
    fig = pictures.access_map(log, "q", "r", (4, 4))
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels == [str(r) for r in range(4) for _ in range(4)]  # thread r reads row r of Q
    fig = pictures.read_counts({"a": log}, "k", (4, 4))
    assert "16 reads of k" in fig.axes[0].get_title()


def test_causal_tiles_counts_the_skipped_tiles():
    fig = pictures.causal_tiles(8, 8, 4, 4)
    assert "1 of 4 skipped" in fig.axes[0].get_title()
    fig = pictures.causal_tiles(6, 14, 4, 4)  # Nq < Nk: the diagonal starts at key Nk - Nq = 8
    r, c = np.arange(6)[:, None], np.arange(14)[None, :]
    visible = c <= r + 8
    skipped = sum(not visible[i:i + 4, j:j + 4].any() for i in range(0, 6, 4) for j in range(0, 14, 4))
    assert f"{skipped} of 8 skipped" in fig.axes[0].get_title()


def test_recorded_times_draws_a_bar_per_row():
    rows = recorded.bench_rows(["standard", "flash2_fast"], "fwd", 4096)
    fig = pictures.recorded_times(rows, "recorded")
    assert [p.get_width() for p in fig.axes[0].patches] == [float(r["ms"]) for r in rows]


def test_backward_bytes_by_term():
    fig = pictures.hbm_bytes_by_term(kernels=("flash2",), Ns=(1024,), blocks={"flash2": (64, 64)}, pass_="backward")
    total = iomodel.backward("flash2", 1, 1024, 1024, 64, np.float32, False, (64, 64)).total
    assert sum(p.get_height() for p in fig.axes[0].patches) == pytest.approx(total / 1e6)


def test_counted_beside_model_refuses_counts_that_differ_from_the_model():
    from flash_numba.course import lessonkit

    model = iomodel.forward("standard", 1, 32, 32, 16, np.float32)
    table = lessonkit.counted_beside_model(model, "standard", 1, 32, 16, np.float32, Ns=(1024, 16384))
    assert "P = softmax(S)" in table and "N = 16,384" in table
    wrong = iomodel.forward("standard", 1, 33, 33, 16, np.float32)
    with pytest.raises(ValueError, match="^counted: "):
        lessonkit.counted_beside_model(wrong, "standard", 1, 32, 16, np.float32)


def test_saved_for_backward_adds_P():
    fig = pictures.saved_for_backward(H=2, d=4, Ns=(8,), itemsize=4)
    flash, standard = (p.get_height() for p in fig.axes[0].patches)
    assert flash == pytest.approx(2 * (4 * 8 * 4 + 8) * 4 / 2**20)
    assert standard - flash == pytest.approx(2 * 8 * 8 * 4 / 2**20)


def test_kernel_accesses_labels_each_element_with_its_thread():
    """The whole-kernel exercises' GPU-Puzzles picture: block 0 of the packaged forward at Nq = Nk = 8."""
    run = kx.measure_kernel("flash2_kernel", kx.flash2_forward_kernel, 8, 8, causal=True)
    shapes = {"q": ((8, 4), "r"), "k": ((8, 4), "r"), "O": ((8, 4), "w")}
    fig = pictures.kernel_accesses(run["log"], shapes)
    axes = fig.get_axes()
    assert [a.get_title() for a in axes] == ["q (read)", "k (read)", "O (written)"]
    q_labels = [t.get_text() for t in axes[0].texts]
    assert q_labels[:4] == ["0"] * 4 and q_labels[4:8] == ["1"] * 4 and q_labels[16:] == ["."] * 16  # rows 0-3 only
    k_labels = [t.get_text() for t in axes[1].texts]
    assert "." not in k_labels[:16] and set(k_labels[16:]) == {"."}  # causal: block 0 loads key tile 0 only
