"""The kernel-module protocol: every kernel's spec is complete and agrees with its IO model."""

import dataclasses

import numpy as np
import pytest

from flash_numba import kernels
from flash_numba.device import STATIC_SHARED_LIMIT
from flash_numba.kernels import KernelSpec
from flash_numba.kernels._spec import CALL_FEATURES, DTYPE_NAMES, FEATURES


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
        if name == "standard" and pass_ == "backward":  # P and dS from S or recomputing it (backward_names(dtype))
            from flash_numba.kernels.standard import BACKWARD_NAMES, BACKWARD_TC_NAMES, backward_names
            assert tuple(model.per_kernel) == backward_names(dtype)
            optional = set(BACKWARD_NAMES + BACKWARD_TC_NAMES) - set(backward_names(dtype))
        if name == "flash2_fast" and pass_ == "backward" and deterministic:
            two_pass = {"flash2_fast dQ", "flash2_fast dK, dV"}  # the dQ kernel computes D itself
            split = set(launches) - two_pass
            assert set(model.per_kernel) in (two_pass, split), model.per_kernel
            continue
        if name == "flash2_tc" and pass_ == "backward" and deterministic:  # dQ and dK/dV in one launch or two
            from flash_numba.kernels.flash2_tc import _bwd as tc_bwd

            one, two = {tc_bwd.D_NAME, tc_bwd.BACKWARD_NAME}, {tc_bwd.BACKWARD_Q_NAME, tc_bwd.BACKWARD_KV_NAME}
            assert set(launches) == one | two
            assert set(model.per_kernel) == (one if tc_bwd.one_launch(d, causal) else two), model.per_kernel
            continue
        assert set(launches) - set(model.per_kernel) <= optional, (pass_, deterministic)


@pytest.mark.parametrize("name", kernels.NAMES)
def test_register_caps_name_launches(name):
    spec = kernels.get(name)
    launches = set(spec.forward_launches) | set(spec.backward_launches) | set(spec.atomic_backward_launches)
    assert set(spec.max_registers) <= launches
    assert all(isinstance(cap, int) and 32 <= cap <= 255 for cap in spec.max_registers.values())


def test_only_flash2_fast_and_flash2_tc_have_an_atomic_backward():
    assert [n for n in kernels.NAMES if kernels.get(n).supports_atomic] == ["flash2_fast", "flash2_tc"]
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


@pytest.mark.parametrize("name", kernels.NAMES)
def test_a_spec_says_what_it_runs(name):
    spec = kernels.get(name)
    assert spec.dtypes and set(spec.dtypes) <= set(DTYPE_NAMES) and set(spec.min_cc) <= set(spec.dtypes)
    for dtype in spec.dtypes:
        assert spec.supports(64, dtype) is None
    assert spec.supports(129, spec.dtypes[0]) == spec.supports(64, "int32")
    assert spec.supports(129, spec.dtypes[0]).startswith(f"{name} runs ")
    assert spec.head_dims_text in spec.supports(129, spec.dtypes[0])


def test_the_kernels_of_today_run_three_dtypes_at_every_head_dim_on_every_gpu():
    for name in ("standard", "flash1", "flash2", "flash2_fast"):
        spec = kernels.get(name)
        if name == "standard":  # and bfloat16's forward from cc 8.0 (its products on tensor cores)
            assert spec.dtypes == ("float16", "bfloat16", "float32", "float64")
            assert spec.min_cc == {"bfloat16": (8, 0)}
        else:
            assert spec.dtypes == ("float16", "float32", "float64") and not spec.min_cc
        assert all(spec.supports(d, "float16", (5, 0)) is None for d in range(1, 129))
        runs = "float16, bfloat16, float32 and float64" if name == "standard" else "float16, float32 and float64"
        assert spec.supports(0, "float32") == spec.supports(129, "float32") == (
            f"{name} runs {runs} with head dims 1 to 128")


NARROW = dict(dtypes=("float32",), head_dims=lambda d: d % 16 == 0 and 16 <= d <= 128,
              head_dims_text="16 to 128, a multiple of 16", min_cc={"float32": (8, 0)})


def test_check_supported_names_the_argument_and_says_what_runs():
    spec = dataclasses.replace(kernels.get("flash2"), **NARROW)
    runs = "flash2 runs float32 with head dims 16 to 128, a multiple of 16"
    assert spec.supports(32, "float32") is None and spec.supports(32, "float32", (9, 0)) is None
    assert spec.supports(24, "float32") == spec.supports(32, "float16") == runs
    with pytest.raises(TypeError, match=rf"^dtype: float16 is not supported by flash2; {runs}$"):
        spec.check_supported(32, np.float16)
    with pytest.raises(ValueError, match=rf"^d: head dim d = 24 is not supported by flash2; {runs}$"):
        spec.check_supported(24, "float32")
    gpu = r"flash2 needs compute capability 8\.0 for float32; this GPU \(Tesla T4\) is 7\.5"
    with pytest.raises(ValueError, match=rf"^q: dtype float32 is not supported on this GPU; {gpu}$"):
        spec.check_supported(32, "float32", (7, 5), "Tesla T4", arg="q")
    with pytest.raises(TypeError, match="dtypes must name some of float16, bfloat16"):
        dataclasses.replace(spec, dtypes=("int8",))


@pytest.fixture
def narrow_flash2(monkeypatch):
    """flash2 described as running float32 at multiples of 16 only, from cc 8.0."""
    spec = dataclasses.replace(kernels.get("flash2"), **NARROW)
    monkeypatch.setattr(kernels.module("flash2"), "SPEC", spec)
    return spec


def test_the_api_refuses_what_a_spec_does_not_run_in_its_words(narrow_flash2, rng):
    import flash_numba as fn
    from flash_numba import api, device

    runs = "flash2 runs float32 with head dims 16 to 128, a multiple of 16"
    q = rng.standard_normal((1, 4, 24)).astype(np.float32)
    with pytest.raises(ValueError, match=rf"^q: head dim d = 24 is not supported by flash2; {runs}$"):
        fn.attention_forward(q, q, q, kernel="flash2")
    with pytest.raises(ValueError, match=rf"^q: head dim d = 24 is not supported by flash2; {runs}$"):
        fn.attention_backward(q, q, q, q, q[..., 0], q, kernel="flash2")
    h = rng.standard_normal((1, 4, 16)).astype(np.float16)
    with pytest.raises(TypeError, match=rf"^q: dtype float16 is not supported by flash2; {runs}$"):
        fn.attention_forward(h, h, h, kernel="flash2")
    with pytest.raises(TypeError, match=rf"^dtype: float16 is not supported by flash2; {runs}$"):
        fn.resolve_block("flash2", 16, np.float16)
    with pytest.raises(ValueError, match=rf"^d: head dim d = 8 is not supported by flash2; {runs}$"):
        fn.resolve_block("flash2", 8, np.float32)
    assert fn.resolve_block("flash2", 16, np.float32) == kernels.get("flash2").block(16, np.float32, "forward")

    class T4:
        name, compute_capability = "Tesla T4", (7, 5)

    q16 = rng.standard_normal((1, 4, 16)).astype(np.float32)
    with pytest.MonkeyPatch.context() as mp:  # a GPU below the spec's cc (the simulator stands in for every cc)
        mp.setattr(device, "SIMULATOR", False)
        mp.setattr(device, "info", lambda: T4)
        with pytest.raises(ValueError, match=r"^q: dtype float32 is not supported on this GPU; flash2 needs "
                                             r"compute capability 8\.0 for float32; this GPU \(Tesla T4\) is 7\.5$"):
            api._check_supported(narrow_flash2, fn._inputs.prepare({"q": q16, "k": q16, "v": q16}, causal=False,
                                                                   scale=None)[0], "forward", False)


@pytest.mark.parametrize("name", kernels.NAMES)
def test_flops_cover_every_launch(name):
    spec = kernels.get(name)
    BH, Nq, Nk, d = 2, 40, 33, 16
    for pass_, deterministic in (("forward", True), ("backward", True), ("backward", False)):
        full = spec.flops(pass_, BH, Nq, Nk, d, False, deterministic)
        causal = spec.flops(pass_, BH, Nq, Nk, d, True, deterministic)
        assert set(spec.launches(pass_, deterministic)) <= set(full) == set(causal)
        assert all(isinstance(f, int) and f >= 0 for f in full.values())
        assert 0 < sum(causal.values()) < sum(full.values())


def test_visible_pairs_under_the_bottom_right_mask():
    from flash_numba.kernels._spec import visible_pairs

    for Nq, Nk in ((1, 1), (17, 5), (5, 17), (40, 33), (97, 97)):
        mask = np.arange(Nk)[None, :] <= np.arange(Nq)[:, None] + (Nk - Nq)
        assert visible_pairs(Nq, Nk, True) == mask.sum() and visible_pairs(Nq, Nk, False) == Nq * Nk


def test_a_spec_that_lacks_a_feature_refuses_calls_that_ask_for_it(monkeypatch, rng):
    import flash_numba as fn

    # today's kernels do every call's feature; flash2_tc alone lets a masked P = 0 meet an Inf or NaN in its mma
    assert all(kernels.get(n).has(f) for n in kernels.NAMES for f in CALL_FEATURES)
    assert [n for n in kernels.NAMES if not kernels.get(n).has("masked_nonfinite")] == ["flash2_tc"]
    assert set(FEATURES) == {*CALL_FEATURES, "masked_nonfinite"}
    spec = dataclasses.replace(kernels.get("flash2"), lacks={"backward", "dropout", "causal", "count_hbm",
                                                              "grouped_query"})
    monkeypatch.setattr(kernels.module("flash2"), "SPEC", spec)
    q = rng.standard_normal((2, 5, 4)).astype(np.float32)
    assert fn.attention_forward(q, q, q, kernel="flash2").kernel == "flash2"  # a plain forward runs
    for kw, arg in ((dict(causal=True), "causal"), (dict(dropout_p=0.5), "dropout_p"),
                    (dict(count_hbm=True), "count_hbm")):
        with pytest.raises(ValueError, match=rf"^{arg}: flash2 has no [a-z_-]+; it does a plain forward only$"):
            fn.attention_forward(q, q, q, kernel="flash2", **kw)
    with pytest.raises(ValueError, match=r"^k: flash2 has no grouped-query"):
        fn.attention_forward(q, q[:1], q[:1], kernel="flash2")
    with pytest.raises(ValueError, match=r"^kernel: flash2 has no backward"):
        fn.attention_backward(q, q, q, q, q[..., 0], q, kernel="flash2")
    with pytest.raises(TypeError, match="lacks must name some of backward"):
        dataclasses.replace(spec, lacks={"flying"})
    with pytest.raises(ValueError, match="^feature: expected one of"):
        spec.has("flying")
