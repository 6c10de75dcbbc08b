"""Shared test set-up.

* Without a GPU the kernels run in Numba's CUDA simulator: importing
  flash_numba first turns it on when no NVIDIA driver is found (it must be set
  before numba is imported).  Sizes in simulator tests stay tiny.
* Tests marked ``gpu`` run real sizes and only where a GPU is present.
* Every test runs with poisoned outputs: output buffers start as NaN, so an
  element a kernel forgets to write fails the comparison.
"""

import os

import numpy as np
import pytest

import flash_numba  # noqa: F401  (chooses GPU or simulator before numba is imported)
from flash_numba import _switches
from flash_numba.device import SIMULATOR

ON_GPU = not SIMULATOR


def pytest_addoption(parser):
    parser.addoption(
        "--tier", "--compile-tier", dest="tier", choices=("representative", "all"),
        default=os.environ.get("FLASH_NUMBA_TIER", os.environ.get("FLASH_NUMBA_COMPILE_TIER", "representative")),
        help="representative (make test): the compile tier builds each kernel's launches once per cc, float32 at "
             "d = 64, and tests marked `full` are skipped; all (make test-all): every specialisation, and the `full` "
             "tests. Default: $FLASH_NUMBA_TIER, $FLASH_NUMBA_COMPILE_TIER or representative",
    )


@pytest.fixture
def compile_tier(request) -> str:
    """``representative`` or ``all`` (the ``--tier`` option)."""
    return request.config.getoption("tier")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a real CUDA GPU (real sizes)")
    config.addinivalue_line("markers", "compile: compiles kernels to PTX/SASS for cc 7.5 and 9.0 (no GPU needed)")
    config.addinivalue_line("markers", "slow: long-running under the simulator (5 s and more): scheduled first")
    config.addinivalue_line(
        "markers", "full: a further case of a check that make test runs in a representative case (another dtype, "
                   "size or variant): runs in the full tier only (make test-all, --tier=all)")


#: The full tier's marker: ``pytest.param(..., marks=FULL)`` for a case that only make test-all runs.
FULL = pytest.mark.full


def pytest_collection_modifyitems(config, items):
    """Skip ``gpu`` tests in the simulator and ``full`` ones outside the full tier; run the ``compile`` tier first,
    then the ``slow`` tests.

    The compile tier's tests (one per kernel module, 10-40 s of CPU each in make test's tier, 1-5 minutes in
    make test-all's) are the suite's longest, then the ``slow`` ones (5-20 s: lessons, torch.compile,
    gradchecks, bit-for-bit comparisons); the rest are seconds.  Longest first is the schedule that ends
    soonest: ``make test`` runs ``-n 2 --dist load --maxschedchunk 1``, which hands
    each worker the next two tests of the queue and then one test per test done, so
    the two workers share the long tests as they go (``worksteal`` would hand all of them to
    the first worker, whose half of the queue they start) and end on short ones together.
    """
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (running in the simulator)")
    skip_full = pytest.mark.skip(reason="a further case of a check make test runs: make test-all (--tier=all)")
    full_tier = config.getoption("tier") == "all"
    for item in items:
        if "gpu" in item.keywords and not ON_GPU:
            item.add_marker(skip_gpu)
        elif "full" in item.keywords and not full_tier:
            item.add_marker(skip_full)
    # stable: the compile tests first, then the slow ones, each in order
    items.sort(key=lambda item: ("compile" not in item.keywords, "slow" not in item.keywords))


def skip_unless_runs(kernel: str, d: int, dtype) -> None:
    """Skip a test written for every kernel where ``kernel`` does not run its head dim or dtype (its spec says
    so: the tensor-core kernel runs float16 and bfloat16 at multiples of 16): that kernel's own test file
    checks the same properties in its own dtypes and head dims (tests/test_<kernel>.py)."""
    from flash_numba import kernels

    why = kernels.get(kernel).supports(d, dtype)
    if why is not None:
        pytest.skip(f"{why}; tests/test_{kernel}.py covers it")


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    monkeypatch.setattr(_switches, "POISON_OUTPUTS", True)
    yield


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test's name so a failure reproduces."""
    import zlib

    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
