"""The course package: its modules import one way (no circle), and its recorded data ships inside it."""

import ast
from pathlib import Path

import flash_numba

COURSE = Path(flash_numba.__file__).parent / "course"


def _imports(path: Path) -> set[str]:
    """The course modules ``path`` imports (``flash_numba.course.X`` as ``X``; exercises' submodules as exercises)."""
    pkg = path.relative_to(COURSE.parent.parent).with_suffix("").parts
    if pkg[-1] == "__init__":
        pkg = pkg[:-1]
    else:
        pkg = pkg[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(pkg[: len(pkg) - node.level + 1])
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for t in targets:
            parts = t.split(".")
            if parts[:2] == ["flash_numba", "course"] and len(parts) > 2:
                out.add(parts[2])
    return out


def _name(path: Path) -> str:
    rel = path.relative_to(COURSE).with_suffix("").parts
    return rel[0]


def test_the_course_imports_have_no_circle():
    graph: dict[str, set[str]] = {}
    for path in COURSE.rglob("*.py"):
        if path.parent == COURSE and path.stem == "__init__":
            continue
        me = _name(path)
        graph.setdefault(me, set()).update(_imports(path) - {me})
    assert graph["bugzoo"] and "flash_checks" in graph["exercises"], graph  # the parser sees imports at all

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    circles = [m for m in graph if m in reach(m)]
    assert circles == [], {m: sorted(graph[m]) for m in circles}


def test_no_library_module_imports_the_course():
    for path in Path(flash_numba.__file__).parent.rglob("*.py"):
        if COURSE in path.parents:
            continue
        assert "course" not in {p for node in ast.walk(ast.parse(path.read_text()))
                                if isinstance(node, ast.ImportFrom) and node.module
                                for p in node.module.split(".")}, path


def test_recorded_reads_only_data_inside_the_package():
    from flash_numba.course import recorded

    assert recorded.available()
    for value in vars(recorded).values():
        paths = value.values() if isinstance(value, dict) else value if isinstance(value, tuple) else [value]
        for p in paths:
            if isinstance(p, Path):
                assert recorded.DATA in p.parents or p == recorded.DATA, p
                assert p.exists(), p
                if p.is_file() and p.parent != recorded.DATA / "gpt-h200":
                    line = recorded.cite(p)  # every recorded file cites its GPU, date, commit, command and file
                    assert "H200" in line and "2026-" in line and "?" not in line, line
    assert recorded.provenance()["file"].startswith("benchmarks/results/")
    assert all(p.exists() for p in recorded.gpt_csvs(("sdpa", "flash_numba")))
    assert "H200" in recorded.gpt_provenance() and "benchmarks/results/gpt-h200" in recorded.gpt_provenance()


def test_pyproject_ships_the_data():
    text = (COURSE.parents[1] / "pyproject.toml").read_text()
    assert '"flash_numba.course" = [' in text and "data/**/*.csv" in text and "data/README.md" in text
    listed = (COURSE / "data" / "README.md").read_text()
    for path in (COURSE / "data").rglob("*.csv"):
        folder = path.relative_to(COURSE / "data").parts[0]
        assert folder in listed, f"{path} has no provenance row in data/README.md"
