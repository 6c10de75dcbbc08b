"""The package's import graph has no circles: a module never imports, at any depth and however lazily
(inside a function too), a module that imports it."""

import ast
import pathlib

import flash_numba

PACKAGE = pathlib.Path(flash_numba.__file__).parent

#: The course's circle (the bug zoo and the kernel exercises import each other); it goes when the course moves
#: into its own package (issue 32, item 4).
KNOWN = {frozenset({"flash_numba.bugzoo", "flash_numba.exercise_kernels"})}


def modules() -> dict:
    """Dotted name -> (path, the package its relative imports start from)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
            package = parts
        else:
            package = parts[:-1]
        out[".".join(parts)] = (path, package)
    return out


def import_graph() -> dict:
    """Module -> the package modules it imports.  ``from pkg import sub`` is an edge to ``pkg.sub`` (a submodule),
    not to ``pkg`` (whose ``__init__`` Python runs first whatever a module does)."""
    mods = modules()

    def owner(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph = {m: set() for m in mods}
    for m, (path, package) in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else node.module or ""
                subs = [f"{base}.{a.name}" for a in node.names]
                names = [s for s in subs if s in mods] + ([base] if any(s not in mods for s in subs) else [])
            else:
                continue
            graph[m] |= {owner(n) for n in names if n.startswith("flash_numba") and owner(n) not in ("", m)}
    return graph


def circles(graph) -> list:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_circles():
    found = set(circles(import_graph())) - KNOWN
    assert not found, f"import circles: {[sorted(c) for c in found]}"


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    graph = import_graph()
    assert "flash_numba.hbm" in graph["flash_numba.api"] and "flash_numba.kernels._spec" in graph[
        "flash_numba.kernels"]
    assert "flash_numba" not in graph["flash_numba.blocks"]  # `from . import device` is an edge to device
