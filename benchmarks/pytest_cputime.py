"""A pytest plugin: the CPU seconds of each test, for finding where the suite's time goes.

``--durations`` reports wall time, which on a shared or loaded machine says more about the neighbours than about a
test.  This plugin records each test's CPU time (its process and the child processes it waited for: the compile
tier's ``compile_check``, the lessons' Jupyter kernels) and its wall time, one file per xdist worker::

    PYTHONPATH=benchmarks CPUTIME_OUT=/tmp/cpu python -m pytest -n 2 -p pytest_cputime ...
    cat /tmp/cpu.* | sort -rn | head -40        # cpu_s, wall_s, test id (tab-separated)

Nothing is recorded without ``CPUTIME_OUT``.
"""

import os
import resource
import time

import pytest

_rows: list[tuple[str, float, float]] = []


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = _cpu_seconds(), time.perf_counter()
    yield
    _rows.append((item.nodeid, _cpu_seconds() - cpu, time.perf_counter() - wall))


def pytest_sessionfinish(session):
    out = os.environ.get("CPUTIME_OUT")
    if out and _rows:
        with open(f"{out}.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}", "w") as f:
            f.writelines(f"{cpu:.3f}\t{wall:.3f}\t{nodeid}\n" for nodeid, cpu, wall in _rows)
