"""The kernel-module protocol: every kernel's spec is complete and agrees with its IO model."""

import dataclasses

import numpy as np
import pytest

from flash_numba import kernels
from flash_numba.device import STATIC_SHARED_LIMIT
from flash_numba.kernels import KernelSpec


@pytest.mark.parametrize("name", kernels.NAMES)
def test_every_kernel_has_a_spec_named_after_it(name):
    spec = kernels.get(name)
    assert isinstance(spec, KernelSpec)
    assert spec.name == name
    assert kernels.get(name) is spec  # one object per kernel
    assert spec.__doc__ == kernels.module(name).__doc__  # what the kernel is


def test_an_unknown_kernel_is_refused_by_name():
    with pytest.raises(ValueError, match=r"^kernel: unknown kernel 'nope'; choose one of standard, flash1"):
        kernels.get("nope")


@pytest.mark.parametrize("name", kernels.NAMES)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("dtype", ("float16", "float32"))
def test_launches_are_the_io_models_kernels(name, causal, dtype):
    """The counter names a spec lists are those its IO model predicts (a launch missing from one is a bug)."""
    spec = kernels.get(name)
    BH, Nq, Nk, d = 2, 40, 33, 16
    for pass_, deterministic in (("forward", True), ("backward", True), ("backward", False)):
        block = spec.block(d, dtype, pass_, budget=STATIC_SHARED_LIMIT)
        model = spec.io_model(pass_, deterministic)(BH, Nq, Nk, d, dtype, causal, block)
        launches = spec.launches(pass_, deterministic)
        assert set(model.per_kernel) <= set(launches), (pass_, deterministic)
        # every launch but flash2_fast's float16-only cast runs at these sizes; its deterministic backward
        # runs one of two sets (two-pass or split dQ, kernels.flash2_fast.layout.split_dq_copies picks)
        optional = {"flash2_fast dQ to storage dtype"} if dtype == "float32" else set()
        if name == "flash2_fast" and pass_ == "backward" and deterministic:
            two_pass = {"flash2_fast dQ", "flash2_fast dK, dV"}  # the dQ kernel computes D itself
            split = set(launches) - two_pass
            assert set(model.per_kernel) in (two_pass, split), model.per_kernel
            continue
        assert set(launches) - set(model.per_kernel) <= optional, (pass_, deterministic)


@pytest.mark.parametrize("name", kernels.NAMES)
def test_register_caps_name_launches(name):
    spec = kernels.get(name)
    launches = set(spec.forward_launches) | set(spec.backward_launches) | set(spec.atomic_backward_launches)
    assert set(spec.max_registers) <= launches
    assert all(isinstance(cap, int) and 32 <= cap <= 255 for cap in spec.max_registers.values())


def test_only_flash2_fast_has_an_atomic_backward():
    assert [n for n in kernels.NAMES if kernels.get(n).supports_atomic] == ["flash2_fast"]
    flash2 = kernels.get("flash2")
    assert flash2.run_backward(False) is flash2.backward  # deterministic=False is deterministic there
    assert flash2.launches("backward", False) == flash2.backward_launches


@pytest.mark.parametrize("name", kernels.NAMES)
def test_block_rule(name):
    spec = kernels.get(name)
    for pass_ in ("forward", "backward"):
        block = spec.block(64, np.float32, pass_, budget=STATIC_SHARED_LIMIT)
        if not spec.uses_blocks:
            assert block is None
            with pytest.raises(ValueError, match=r"^block: the standard kernels use fixed tiles"):
                spec.block(64, np.float32, pass_, (16, 16))
            continue
        Br, Bc = block
        assert spec.shared_bytes(Br, Bc, 64, np.float32, pass_) <= STATIC_SHARED_LIMIT
        assert spec.block(64, np.float32, pass_, block) == block  # a chosen block validates


def test_a_spec_refuses_half_an_atomic_path():
    flash2 = kernels.get("flash2")
    with pytest.raises(TypeError, match="backward_atomic, its launches and its IO model go together"):
        dataclasses.replace(flash2, backward_atomic=flash2.backward)
    with pytest.raises(ValueError, match="^pass_: expected 'forward' or 'backward'"):
        flash2.launches("sideways")
