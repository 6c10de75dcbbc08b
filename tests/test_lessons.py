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
from pathlib import Path

import pytest
from conftest import FULL

LESSONS = Path(__file__).resolve().parents[1] / "lessons"
LESSON_NOTEBOOKS = sorted(LESSONS.glob("[0-9][0-9]_*.ipynb"))
APPENDICES = sorted(LESSONS.glob("A[0-9]_*.ipynb"))
NOTEBOOKS = LESSON_NOTEBOOKS + APPENDICES
CELL_TIMEOUT_S = 300


def _load_builder():
    spec = importlib.util.spec_from_file_location("lessons_build", LESSONS / "_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_build = _load_builder()


def _ids(paths):
    return [p.stem for p in paths]


def _sources(path, kind=None) -> list[str]:
    """The cells' sources of a stored notebook (only code or markdown cells when ``kind`` says so)."""
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if kind in (None, c["cell_type"])]


def test_the_course_is_complete():
    """Lessons 00..14 and the appendices, one notebook per source, each listed in lessons/README.md."""
    numbers = [int(p.name[:2]) for p in LESSON_NOTEBOOKS]
    assert numbers == list(range(15)), [p.name for p in LESSON_NOTEBOOKS]
    assert [p.name for p in APPENDICES] == ["A1_how_flash2_fast_got_fast.ipynb"]
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
def test_colab_install_cell(path):
    """The first code cell installs the package on Colab only, as shell escapes the builder uncommented."""
    first = _sources(path, "code")[0]
    assert first.splitlines()[-2:] == [
        '    !pip install -q "numba-cuda[cu12]==0.30.4"',
        f'    !pip install -q --no-deps "git+{_build.REPO_URL}"',
    ], first
    assert 'if "google.colab" in sys.modules:' in first
    assert "source-only" not in "\n".join(_sources(path)) and "@REPO_URL@" not in "\n".join(_sources(path))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_lesson_shape(path):
    """Prints its mode, has a Your-turn exercise checked against the solution, ends with asserts."""
    code = _sources(path, "code")
    text = "\n".join(_sources(path))
    assert "device.describe()" in text
    assert "Your turn" in text
    checked = set(re.findall(r"ex\.check\(\"(\w+)\"", text))
    solved = set(re.findall(r"ex\.check_solution\(\"(\w+)\"", text))
    assert checked and checked <= solved, f"exercises {checked - solved} are not also run on the solution"
    assert "NotImplementedError" in text
    assert "assert" in code[-1] and "all checks passed" in code[-1], "the last cell must be the check cell"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_takeaways_a_prediction_and_a_figure(path):
    """Each lesson ends with "What to take away" (3-5 points), asks for a prediction, and draws a figure."""
    markdown = "\n".join(_sources(path, "markdown"))
    code = "\n".join(_sources(path, "code"))
    assert "## What to take away" in markdown
    points = markdown.split("## What to take away", 1)[1].split("\n## ", 1)[0]
    assert 3 <= sum(line.startswith("* ") for line in points.splitlines()) <= 5, points
    assert "Predict, then run" in markdown and "compare_prediction(" in code
    assert "lessonkit.show(" in code or "plt.show()" in code


def test_every_exercise_appears_in_a_lesson():
    from flash_numba.course import exercises

    text = "\n".join("\n".join(_sources(p, "code")) for p in NOTEBOOKS)
    for name in exercises.names():
        assert f'ex.check("{name}"' in text, f"exercise {name} is used by no lesson"


def _missing_modules(path) -> list[str]:
    nb = json.loads(path.read_text())
    return [m for m in nb["metadata"]["flash_numba"]["requires"] if importlib.util.find_spec(m) is None]


def _execute(path, monkeypatch, *, simulator: bool, timeout: int):
    """Run the notebook top to bottom in a fresh kernel; its last cell must print that its checks passed."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    missing = _missing_modules(path)
    if missing:
        pytest.skip(f"{path.name} needs {', '.join(missing)}, which does not exist yet")
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1" if simulator else "0")
    monkeypatch.delenv("FLASH_NUMBA_POISON", raising=False)
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(LESSONS)}}
    )
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails
    printed = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    assert "all checks passed" in printed
    return "".join(
        o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs
    )


#: The three longest runs (10-11 s each on 2 cores) run in make test-all only, to keep make test within 7 minutes:
#: lesson 10 and appendix A1 time nothing in the simulator that the other lessons do not, and lesson 12's drop-in
#: is tests/test_torch.py's subject; every other lesson runs in make test.
TEST_ALL_ONLY = ("10_in_practice", "12_swap_into_a_model", "A1_how_flash2_fast_got_fast")


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem, marks=FULL if p.stem in TEST_ALL_ONLY else ())
                                  for p in NOTEBOOKS])
@pytest.mark.slow
def test_lesson_runs_in_the_simulator(path, monkeypatch):
    out = _execute(path, monkeypatch, simulator=True, timeout=CELL_TIMEOUT_S)
    assert out.startswith("simulator") or "\nsimulator" in out  # the lesson said where it ran


@pytest.mark.gpu
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_lesson_runs_on_the_gpu(path, monkeypatch):
    """The GPU branches: real sizes, timings; the same final asserts."""
    out = _execute(path, monkeypatch, simulator=False, timeout=600)
    assert "gpu: " in out and "not timed" not in out


def test_lesson_0_lists_every_lesson():
    """Lesson 0's course table has a row per notebook (a new lesson adds its row)."""
    text = (LESSONS / "_src" / "00_setup_and_tour.py").read_text()
    table = text.split("# | notebook | what you build or measure |", 1)[1].split("\n#\n", 1)[0]
    listed = {line.split("|")[1].strip() for line in table.splitlines()[2:] if line.startswith("# |")}
    numbers = {str(int(p.name[:2])) if p.name[:2].isdigit() else p.name.split("_")[0]
               for p in LESSONS.glob("*.ipynb")}
    assert numbers - {"0"} <= listed, sorted(numbers - listed)


def test_every_path_and_module_a_lesson_names_exists():
    """`flash_numba/...` paths and `flash_numba.x.y` modules named in a lesson exist (no dead references)."""
    root = LESSONS.parent
    for src in sorted((LESSONS / "_src").glob("*.py")):
        text = src.read_text()
        for path in set(re.findall(r"`(flash_numba/[\w/]+(?:\.py)?)`", text)):
            assert (root / path).exists(), f"{src.name}: {path} does not exist"
        for mod in set(re.findall(r"(?<![\w/])(flash_numba(?:\.\w+)+)", text)):
            parts = mod.split(".")
            while parts and not ((root / Path(*parts)).with_suffix(".py").exists() or (root / Path(*parts)).is_dir()):
                parts = parts[:-1]  # an attribute of a module: the module must exist
            if len(parts) == 1 and mod != "flash_numba":  # an attribute of the package itself
                import flash_numba

                assert hasattr(flash_numba, mod.split(".")[1]), f"{src.name}: {mod} names no module"


WORK_LOG_TAG = re.compile(r"(?i)\bsessions? \d+|\bs\d+/[A-Z]\b|SESSION\d+")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_no_work_log_tags(path):
    """A learner cannot follow "session 14" or "s15/F": measurements are named by GPU, date, commit and file."""
    text = "\n".join(_sources(path))
    assert not WORK_LOG_TAG.search(text), WORK_LOG_TAG.search(text).group(0)


@pytest.mark.parametrize("path", LESSON_NOTEBOOKS, ids=_ids(LESSON_NOTEBOOKS))
def test_at_most_2000_words_of_prose(path):
    """Short lessons (the optional appendix aside): at most 2,000 words in the markdown cells."""
    words = len("\n".join(_sources(path, "markdown")).split())
    assert words <= 2000, f"{path.name}: {words} words of prose"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_one_heading_a_text_cell(path):
    """One idea a cell: a heading starts a text cell, and no text cell holds two headings."""
    for n, text in enumerate(_sources(path, "markdown")):
        headings = [line for line in text.splitlines() if re.match(r"#{1,3} ", line)]
        assert len(headings) <= 1, f"{path.name}, text cell {n}: {headings}"
        assert not headings or text.startswith(headings[0]), f"{path.name}, text cell {n}: {headings[0]} mid-cell"
