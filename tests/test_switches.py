"""The switches module (flash_numba/_switches.py): one place, read where the package uses it."""

import numpy as np

import flash_numba as fn
from flash_numba import _switches, device
from flash_numba.kernels import _smem
from flash_numba.kernels.flash2_fast import layout


def test_every_switch_has_a_documented_default():
    assert _switches.POISON_OUTPUTS  # every test runs poisoned (tests/conftest.py)
    assert _switches.values()[1:] == (device.STATIC_SHARED_LIMIT, None, None, None, None, True, None, None, None)
    for name in _switches.NAMES:
        assert f"``{name}``" in _switches.__doc__, name


def test_the_switches_take_effect(monkeypatch, rng):
    monkeypatch.setattr(_switches, "DYNAMIC_ABOVE", 0)
    assert _smem.is_dynamic(1)
    monkeypatch.setattr(_switches, "FORCE_DQ_COPIES", 3)
    assert layout.split_dq_copies(1, 1, 64, 64, 16, "float32", (16, 16)) == 3
    monkeypatch.setattr(_switches, "POISON_OUTPUTS", True)
    out = fn._inputs.empty((2, 3), np.dtype(np.float32))
    assert np.isnan(np.asarray(out.copy_to_host() if hasattr(out, "copy_to_host") else out)).all()
    with layout.dq_lanes(2):
        assert _switches.FORCE_DQ_LANE_GROUPS == 2 and layout.dq_lane_groups(8, 64) == 2
    assert _switches.FORCE_DQ_LANE_GROUPS is None
    with layout.p_ds_tiles(True):
        assert layout.geometry_kv(16, 2, 1, np.float32)["share_p_ds"]
    assert not layout.geometry_kv(16, 2, 1, np.float32)["share_p_ds"]
    from flash_numba.kernels.flash2_tc import layout as tc_layout

    monkeypatch.setattr(_switches, "TC_PATH", "sm75")
    assert tc_layout.path((9, 0)) == "sm75"
    from flash_numba.kernels import flash_decode as fd

    assert fd.choose_path(128, "float16", (9, 0)) == "tc" and fd.choose_path(128, "float16", (7, 5)) == "cuda"
    monkeypatch.setattr(_switches, "DECODE_PATH", "cuda")
    assert fd.choose_path(128, "float16", (9, 0)) == "cuda"
