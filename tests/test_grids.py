"""Any batch size: every launch's grid stays inside CUDA's limits, and every kernel runs at B*H = 70,000.

CUDA caps grid axes y and z at 65,535 blocks; the attention kernels put B*H on
axis x (limit 2^31 - 1), alone or folded with the blocks of a head.  The simulator test
checks the grids the launchers use (each module's ``grids``), the ``gpu`` test runs
the kernels at a B*H above 65,535 against the float64 reference.
"""

import numpy as np
import pytest

import flash_numba as fn
from flash_numba import _inputs, kernels, reference
from flash_numba.device import STATIC_SHARED_LIMIT
from flash_numba.kernels import _rowsum, matmul16
from flash_numba.kernels._common import GRID_LIMITS, head_grid, head_grid_2d

BIG_BH = 70_000  # above the 65,535 of grid axes y and z


def problem(BH, N, d, dtype=np.float32, causal=False):
    return _inputs.Problem(lead=(BH,), BH=BH, Nq=N, Nk=N, d=d, dtype=np.dtype(dtype), on_device=False,
                           scale=d ** -0.5, causal=causal)


def as_tuple(grid):
    return grid if isinstance(grid, tuple) else (grid,)


@pytest.mark.parametrize("name", kernels.NAMES)
@pytest.mark.parametrize("N", [1, 8, 97])
def test_every_launch_grid_fits_cuda_limits_at_70000_heads(name, N):
    spec = kernels.get(name)
    grids_of = kernels.module(name).grids
    prob = problem(BIG_BH, N, 16)
    launches = set(spec.launches("forward")) | set(spec.launches("backward"))
    if spec.supports_atomic:
        launches |= set(spec.launches("backward", deterministic=False))
    for pass_ in ("forward", "backward"):
        block = spec.block(16, np.float32, pass_, budget=STATIC_SHARED_LIMIT)
        grids = grids_of(prob, block)
        assert launches <= set(grids), f"launches without a grid: {launches - set(grids)}"
        for launch, grid in grids.items():
            grid = as_tuple(grid)
            assert all(1 <= g <= limit for g, limit in zip(grid, GRID_LIMITS)), (launch, grid)


def test_rowsum_grid_covers_every_row_of_every_head():
    assert _rowsum.grid(problem(BIG_BH, 17, 16)) == (BIG_BH, -(-17 // _rowsum.TY), 1)
    long = problem(3, _rowsum.TY * GRID_LIMITS[1] + 1, 16)  # more row blocks than axis y holds
    assert _rowsum.grid(long) == (3, GRID_LIMITS[1], 2)


def test_rowsum_covers_rows_past_axis_y_with_axis_z(rng):
    """Row block blockIdx.z * gridDim.y + blockIdx.y: a grid (B*H, 2, 3) covers 6 row blocks of 8 rows (as a
    long sequence's grid (B*H, 65535, Z) does), the last one partial."""
    from numba import cuda

    from flash_numba.hbm import Counters

    B, H, Nq, d = 1, 2, 45, 16
    o, do = (rng.standard_normal((B, H, Nq, d)).astype(np.float32) for _ in range(2))
    D = cuda.to_device(np.full((B * H, Nq), np.nan, dtype=np.float32))
    kernel = _rowsum.rowsum_kernel(d, np.dtype(np.float32), False)
    kernel[(B * H, 2, 3), _rowsum.NT](cuda.to_device(o), cuda.to_device(do), D, Counters(False).array(_rowsum.NAME),
                                      Nq)
    want = np.einsum("bhnd,bhnd->bhn", o.astype(np.float64), do.astype(np.float64)).reshape(B * H, Nq)
    # a float32 sum of d products (each rounded, then d additions): at most (d + 1) u sum |o do| off, u = 2^-24
    bound = (d + 1) * 2.0**-24 * np.einsum("bhnd->bhn", np.abs(o.astype(np.float64) * do)).reshape(B * H, Nq)
    assert np.all(np.abs(D.copy_to_host() - want) <= bound)


def test_head_grid_refuses_more_blocks_than_axis_x_holds():
    assert head_grid(2**15, 2**16 - 1) <= GRID_LIMITS[0]
    with pytest.raises(ValueError, match="^BH: "):
        head_grid(2**15, 2**16)


def test_matmul16_refuses_more_than_65535_matrices():
    assert matmul16.grid(GRID_LIMITS[2], 17, 33) == (3, 2, GRID_LIMITS[2])
    with pytest.raises(ValueError, match="^BH: .*65535"):
        matmul16.grid(GRID_LIMITS[2] + 1, 16, 16)


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return np.max(np.abs(x - ref)) / max(np.max(np.abs(ref)), 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", kernels.NAMES)
@pytest.mark.parametrize("causal", [False, True])
def test_every_kernel_runs_70000_heads_against_the_reference(name, causal):
    N, d = 8, 16
    rng = np.random.default_rng()
    q, k, v, do = (rng.standard_normal((BIG_BH, N, d)).astype(np.float32) for _ in range(4))
    o_ref, lse_ref = reference.attention_forward(q, k, v, causal=causal)
    grads_ref = reference.attention_backward(q, k, v, o_ref, lse_ref, do, causal=causal)
    fwd = fn.attention_forward(q, k, v, kernel=name, causal=causal)
    # float32, as tests/test_flash2.py: d = 16 and 8 keys give a few float32 roundings (6e-8) per entry
    assert rel_err(fwd.o, o_ref) < 1e-5
    assert rel_err(fwd.lse, lse_ref) < 1e-5
    bwd = fn.attention_backward(q, k, v, fwd.o, fwd.lse, do, kernel=name, causal=causal)
    for got, want in zip((bwd.dq, bwd.dk, bwd.dv), grads_ref):
        assert rel_err(got, want) < 1e-5


def test_head_grid_2d_puts_heads_on_x_and_refuses_more_blocks_per_head_than_axis_y_holds():
    assert head_grid_2d(GRID_LIMITS[1], GRID_LIMITS[0]) == (GRID_LIMITS[0], GRID_LIMITS[1])
    with pytest.raises(ValueError, match="^N: "):
        head_grid_2d(GRID_LIMITS[1] + 1, 1)
    with pytest.raises(ValueError, match="^BH: "):
        head_grid_2d(1, GRID_LIMITS[0] + 1)
