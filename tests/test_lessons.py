"""The lesson notebooks: stored clean, built from their sources, and run top to bottom in the simulator.

Each notebook runs in a fresh Jupyter kernel with ``NUMBA_ENABLE_CUDASIM=1``
(about a minute at most each, sizes chosen by the lessons themselves from
``flash_numba.device.SIMULATOR``); its last cell asserts what the lesson showed,
so a wrong number fails the run, not only an exception.  A lesson that needs a
package module which does not exist yet (``# requires:`` in its source) is
skipped, naming the module.
"""

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

LESSONS = Path(__file__).resolve().parents[1] / "lessons"
sys.path.insert(0, str(LESSONS))
import _build  # noqa: E402  (lessons/_build.py)

NOTEBOOKS = sorted(LESSONS.glob("[0-9][0-9]_*.ipynb"))
CELL_TIMEOUT_S = 300


def _ids(paths):
    return [p.stem for p in paths]


def test_the_course_is_complete():
    """Lessons 00..10, one notebook per source, each listed in lessons/README.md."""
    numbers = [int(p.name[:2]) for p in NOTEBOOKS]
    assert numbers == list(range(11)), [p.name for p in NOTEBOOKS]
    assert [p.stem for p in NOTEBOOKS] == [s.stem for s in _build.sources()]
    readme = (LESSONS / "README.md").read_text()
    for p in NOTEBOOKS:
        assert p.name in readme, f"{p.name} is not listed in lessons/README.md"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_stored_without_outputs(path):
    nb = json.loads(path.read_text())
    for n, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"{path.name} cell {n} has stored outputs"
            assert cell["execution_count"] is None, f"{path.name} cell {n} has an execution count"


def test_notebooks_match_their_sources():
    assert _build.stale() == [], "run `python lessons/_build.py` after editing lessons/_src"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_lesson_shape(path):
    """Prints its mode, has a Your-turn exercise checked against the solution, ends with asserts."""
    nb = json.loads(path.read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    text = "\n".join("".join(c["source"]) for c in nb["cells"])
    assert "device.describe()" in text
    assert "Your turn" in text
    checked = set(re.findall(r"ex\.check\(\"(\w+)\"", text))
    solved = set(re.findall(r"ex\.check_solution\(\"(\w+)\"", text))
    assert checked and checked <= solved, f"exercises {checked - solved} are not also run on the solution"
    assert "NotImplementedError" in text
    assert "assert" in code[-1] and "all checks passed" in code[-1], "the last cell must be the check cell"


def test_every_exercise_appears_in_a_lesson():
    from flash_numba import exercises

    text = "\n".join(p.read_text() for p in NOTEBOOKS)
    for name in exercises.names():
        assert f'ex.check(\\"{name}\\"' in text, f"exercise {name} is used by no lesson"


def _missing_modules(path) -> list[str]:
    nb = json.loads(path.read_text())
    return [m for m in nb["metadata"]["flash_numba"]["requires"] if importlib.util.find_spec(m) is None]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_lesson_runs_in_the_simulator(path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    missing = _missing_modules(path)
    if missing:
        pytest.skip(f"{path.name} needs {', '.join(missing)}, which does not exist yet")
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    monkeypatch.delenv("FLASH_NUMBA_POISON", raising=False)
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(LESSONS)}}
    )
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails
    last = nb.cells[-1]
    printed = "".join(o.get("text", "") for o in last.outputs if o.output_type == "stream")
    assert "all checks passed" in printed
