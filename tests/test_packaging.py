"""Packaging: pyproject.toml and environment.yml agree, and the numpy 2.5 shim works.

numba-cuda 0.30.4 (the last release with the CUDA simulator) cannot compile a
kernel on numpy 2.5, which removed ``numpy.row_stack`` (NVIDIA/numba-cuda#907).
The package pins ``numpy<2.5`` and, for environments that already have 2.5
(Colab), ``flash_numba._compat`` restores the alias.  The shim tests delete
``numpy.row_stack`` to play numpy 2.5, in a fresh process that compiles for real.
"""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

import flash_numba

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ("numba-cuda", "numpy", "numba", "matplotlib", "greenlet")


@pytest.fixture(scope="module")
def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def requirements(pyproject):
    """name -> Requirement of the runtime dependencies."""
    reqs = [Requirement(r) for r in pyproject["project"]["dependencies"]]
    return {r.name: r for r in reqs}


@pytest.fixture(scope="module")
def conda():
    """(name -> version spec of the conda dependencies, list of pip lines)."""
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    specs, pip = {}, []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip += dep["pip"]
            continue
        name, spec = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", dep).groups()
        specs[name] = spec.strip()
    assert env["channels"] == ["conda-forge"]
    return specs, pip


def test_runtime_dependencies_and_pins(requirements):
    assert set(requirements) == set(RUNTIME)
    assert str(requirements["numba-cuda"].specifier) == "==0.30.4"
    assert str(requirements["numpy"].specifier) == "<2.5"
    assert not requirements["numba"].specifier and not requirements["matplotlib"].specifier


def test_extras_pin_the_same_numba_cuda(pyproject):
    extras = {k: [Requirement(r) for r in v] for k, v in pyproject["project"]["optional-dependencies"].items()}
    for extra, cuda in (("dev", "cu13"), ("cu12", "cu12"), ("cu13", "cu13")):
        (nc,) = [r for r in extras[extra] if r.name == "numba-cuda"]
        assert nc.extras == {cuda} and str(nc.specifier) == "==0.30.4", extra
    dev = {r.name: r for r in extras["dev"]}
    assert {"pytest", "pytest-xdist", "hypothesis", "nbformat", "nbclient", "ipykernel", "ruff"} <= set(dev)
    assert str(dev["nvidia-cuda-nvcc"].specifier) == "==13.5.*"


def test_environment_yml_agrees_with_pyproject(requirements, conda):
    specs, pip = conda
    for name in RUNTIME:
        assert name in specs, f"{name} is a runtime dependency but not in environment.yml"
    assert specs["numba-cuda"] == str(requirements["numba-cuda"].specifier) == "==0.30.4"
    assert specs["numpy"] == str(requirements["numpy"].specifier) == "<2.5"
    assert specs["python"] == "=3.11"
    assert specs["cuda-version"] == "=12"
    assert pip == ["-e .[dev]"]


def test_package_metadata(pyproject):
    project = pyproject["project"]
    assert project["name"] == "flash-numba"
    assert project["requires-python"] == ">=3.10"
    assert project["scripts"] == {"flash-numba": "flash_numba.cli:main"}
    assert pyproject["tool"]["ruff"]["line-length"] == 120
    # every subpackage ships
    import setuptools

    found = set(setuptools.find_packages(str(ROOT), **pyproject["tool"]["setuptools"]["packages"]["find"]))
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "flash_numba").rglob("__init__.py")
    }
    assert on_disk <= found and {"flash_numba", "flash_numba.kernels", "flash_numba.iomodel"} <= found


def test_installed_version_is_the_package_version():
    from importlib import metadata

    try:
        installed = metadata.version("flash-numba")
    except metadata.PackageNotFoundError:
        pytest.skip("flash-numba is not installed (pip install -e .)")
    assert installed == flash_numba.__version__


# ---------------------------------------------------------------- the numpy 2.5 shim

KERNEL = """
from numba import cuda, types

def twice(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = 2 * x[i]

ptx, _ = cuda.compile_ptx(twice, (types.float32[::1],), cc=(7, 5))
print("compiled", len(ptx))
"""


def _run_as_numpy_25(prelude: str) -> subprocess.CompletedProcess:
    """Run ``prelude`` + KERNEL in a fresh process whose numpy has no ``row_stack``, as numpy 2.5."""
    script = textwrap.dedent(
        """
        import numpy
        if hasattr(numpy, "row_stack"):
            del numpy.row_stack
        """
    ) + textwrap.dedent(prelude) + KERNEL
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.compile
def test_numpy_25_shim_lets_numba_cuda_compile():
    proc = _run_as_numpy_25(
        """
        import flash_numba
        from flash_numba import _compat
        assert _compat.PATCHED, "the shim did not patch numpy"
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("compiled")


@pytest.mark.compile
def test_without_the_shim_numpy_25_breaks_compilation():
    proc = _run_as_numpy_25("")
    assert proc.returncode != 0
    assert "AttributeError: module 'numpy' has no attribute 'row_stack'" in proc.stderr


@pytest.mark.slow
def test_the_package_imports_and_runs_without_torch():
    """PyTorch is an optional extra: only flash_numba.torch needs it, and says how to install it."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # any `import torch` now raises ImportError
        import numpy as np
        import flash_numba
        o = flash_numba.attention(*(np.ones((1, 2, 2), np.float32),) * 3)
        assert np.allclose(o, 1.0)
        try:
            import flash_numba.torch
        except ImportError as exc:
            assert "pip install 'flash-numba[torch]'" in str(exc), exc
        else:
            raise AssertionError("flash_numba.torch imported without torch")
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr
