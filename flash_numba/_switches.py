"""The switches that tests, lessons and measurements flip in the package, in one place.

Production code reads them here (``_switches.POISON_OUTPUTS``, never a copy taken at import), so setting
one here takes effect at the next call; tests set them with ``monkeypatch.setattr(_switches, NAME, value)``.
The API keys its launch plans by :func:`values` (a plan recorded under one setting is not replayed
under another).  Nothing here imports anything: any module may read it.

``POISON_OUTPUTS``
    Every output buffer starts filled with NaN, so an element a kernel forgets to write fails a
    comparison instead of passing by luck on zeros.  On in every test (tests/conftest.py) and with
    ``FLASH_NUMBA_POISON=1`` in the environment.
``DYNAMIC_ABOVE``
    Kernel tiles of more bytes than this live in dynamic shared memory
    (:mod:`flash_numba.kernels._smem`); 48 KB, the static limit of a block.  0 sends every block to
    dynamic shared memory, to run that path at small sizes (in the simulator too; lesson 10).
``FORCE_DQ_COPIES``
    flash2_fast's split deterministic backward: the number of dQ copies to run (0: the two-pass
    backward) whatever the device; None: ``layout.split_dq_copies`` chooses.
``FORCE_SPLIT_S_DP``
    flash2_fast's dK/dV kernel computes S^T and dP^T in separate warps (True) or both in every thread
    (False); None: ``layout.split_s_dp``'s rule.  Set it with ``layout.s_dp_split(...)``, which drops
    the kernels built under the other setting.
``FORCE_DQ_LANE_GROUPS``
    flash2_fast's dQ += dS K in 1 or 2 lane groups; None: ``layout.dq_lane_groups``'s rule
    (``layout.dq_lanes(...)``).
``SHARE_P_DS``
    flash2_fast's dK/dV kernel keeps P and dS in one shared tile (True) or two (False) at every head
    dim; None: from ``layout.SHARE_P_DS_MIN_TD`` on (``layout.p_ds_tiles(...)``, lesson 10).
``SPLIT_DV_DK``
    flash2_fast's split dK/dV kernel also splits dV and dK across warps where it can (False only to
    measure it).
``TC_PATH``
    The tensor-core kernels' instruction path, "sm75" (a T4's mma.m16n8k8, no cp.async) or "sm80"
    (m16n8k16), whatever the GPU, so that an H200 runs what a T4 runs; None: the environment's
    ``FLASH_NUMBA_TC_PATH``, else the GPU's compute capability (``kernels/flash2_tc/layout.path``).
``DECODE_PATH``
    flash_decode's split kernel: "tc" (tensor cores fed by a cp.async pipeline; sm_80+, float16 and
    bfloat16, d a multiple of 16) or "cuda" (CUDA cores, every GPU); None: the environment's
    ``FLASH_NUMBA_DECODE_PATH``, else "tc" where it runs (``kernels/flash_decode.choose_path``).
``DECODE_FUSED``
    flash_decode with more than one split: True merges the partials in the split kernel's last block of each
    group (one launch), False in a combine kernel launched after it; None: ``kernels/flash_decode.FUSE_COMBINE``.
"""

from __future__ import annotations

import os as _os

POISON_OUTPUTS: bool = _os.environ.get("FLASH_NUMBA_POISON", "") == "1"
DYNAMIC_ABOVE: int = 48 * 1024  # flash_numba.device.STATIC_SHARED_LIMIT (tests/test_smem.py checks they agree)
FORCE_DQ_COPIES: int | None = None
FORCE_SPLIT_S_DP: bool | None = None
FORCE_DQ_LANE_GROUPS: int | None = None
SHARE_P_DS: bool | None = None
SPLIT_DV_DK: bool = True
TC_PATH: str | None = None
DECODE_PATH: str | None = None
DECODE_FUSED: bool | None = None

NAMES = ("POISON_OUTPUTS", "DYNAMIC_ABOVE", "FORCE_DQ_COPIES", "FORCE_SPLIT_S_DP", "FORCE_DQ_LANE_GROUPS",
         "SHARE_P_DS", "SPLIT_DV_DK", "TC_PATH", "DECODE_PATH",
         "DECODE_FUSED")


def values() -> tuple:
    """The switches' current values, in the order of :data:`NAMES`."""
    g = globals()
    return tuple(g[name] for name in NAMES)
