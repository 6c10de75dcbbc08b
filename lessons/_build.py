"""Write the lesson notebooks from their plain-Python sources.

Each lesson is written as ``lessons/_src/NN_name.py`` in the "percent" format
that Jupytext, VS Code and Spyder understand, and this script turns it into
``lessons/NN_name.ipynb`` (no outputs, stable cell ids), so that a lesson is
reviewed and diffed as Python while learners get a notebook::

    # %% [markdown]
    # # 3. The online softmax
    # Prose, one ``# `` per line.

    # %%
    x = np.arange(4)        # a code cell
    # !pip install ...      # a shell escape, written as a comment ("# !") so the source stays Python
    pass  # source-only     # a line ending in "# source-only" is left out of the notebook

Lines before the first ``# %%`` are the source file's own header (docstring,
ruff settings) and do not go into the notebook; a header line
``# requires: flash_numba.tools.microbench, ...`` lists package modules the lesson
needs, which the tests use to skip a lesson whose module has not landed yet.

    python lessons/_build.py            # rewrite every notebook
    python lessons/_build.py --check    # exit 1 if a notebook differs from its source
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import nbformat

LESSONS = Path(__file__).resolve().parent
SOURCES = LESSONS / "_src"

#: Where Colab installs the package from (the install cell of every lesson).
REPO_URL = "https://github.com/OWNER/flash_numba"  # the one place to set the repository address (not known yet)

_MARKER = re.compile(r"^# %%(?P<md> \[markdown\])?\s*$")
_MAGIC = re.compile(r"^(?P<indent>\s*)# (?P<cmd>[!%].*)$")
_REQUIRES = re.compile(r"^# requires:\s*(?P<mods>.+)$")
_SOURCE_ONLY = "# source-only"


def sources() -> list[Path]:
    """The lesson sources, in course order: the numbered lessons, then the appendices (``A1_...``)."""
    return sorted(SOURCES.glob("[0-9][0-9]_*.py")) + sorted(SOURCES.glob("A[0-9]_*.py"))


def notebook_path(src: Path) -> Path:
    return LESSONS / (src.stem + ".ipynb")


def _trim(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def _markdown(lines: list[str], where: str) -> str:
    out = []
    for n, line in enumerate(lines):
        if line == "#":
            out.append("")
        elif line.startswith("# "):
            out.append(line[2:])
        elif line.strip():
            raise ValueError(f"{where}: markdown line {n + 1} does not start with '# ': {line!r}")
        else:
            out.append("")
    return "\n".join(_trim(out))


def _code(lines: list[str]) -> str:
    kept = [_MAGIC.sub(r"\g<indent>\g<cmd>", line) for line in lines if not line.rstrip().endswith(_SOURCE_ONLY)]
    return "\n".join(_trim(kept)).replace("@REPO_URL@", REPO_URL)


def build(src: Path) -> nbformat.NotebookNode:
    """The notebook for one source file."""
    requires: list[str] = []
    cells: list[tuple[str, list[str]]] = []
    for line in src.read_text().splitlines():
        m = _MARKER.match(line)
        if m:
            cells.append(("markdown" if m.group("md") else "code", []))
        elif cells:
            cells[-1][1].append(line)
        else:
            r = _REQUIRES.match(line)
            if r:
                requires += [x.strip() for x in r.group("mods").split(",") if x.strip()]
    nb = nbformat.v4.new_notebook()
    for n, (kind, lines) in enumerate(cells):
        if kind == "markdown":
            cell = nbformat.v4.new_markdown_cell(_markdown(lines, f"{src.name}, cell {n + 1}"))
        else:
            cell = nbformat.v4.new_code_cell(_code(lines))
        cell["id"] = f"{src.stem[:2]}-{n:02d}"  # stable ids: a rebuild changes nothing
        nb.cells.append(cell)
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "accelerator": "GPU",  # Colab opens the notebook on a GPU runtime
        "colab": {"provenance": []},
        "flash_numba": {"source": f"lessons/_src/{src.name}", "requires": requires},
    }
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def stale() -> list[Path]:
    """Notebooks that differ from what their sources build (or are missing)."""
    out = []
    for src in sources():
        path = notebook_path(src)
        if not path.exists() or path.read_text() != render(build(src)):
            out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build lessons/NN_name.ipynb from lessons/_src/NN_name.py.")
    parser.add_argument("--check", action="store_true", help="only report notebooks that differ from their sources")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        for path in bad:
            print(f"out of date: {path.relative_to(LESSONS.parent)} (run python lessons/_build.py)")
        return 1 if bad else 0
    for src in sources():
        path = notebook_path(src)
        path.write_text(render(build(src)))
        n = len(json.loads(path.read_text())["cells"])
        print(f"wrote {path.relative_to(LESSONS.parent)} ({n} cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
