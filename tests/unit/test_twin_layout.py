"""The twin package stays readable: no module over MAX_LINES, and no import cycle among its modules.

Every import counts, wherever it stands (in a function, under TYPE_CHECKING): a cycle hidden in a
function body is still two modules that cannot be read, or loaded, one without the other."""

import ast
from pathlib import Path

TWIN = Path(__file__).resolve().parents[2] / "gpuhost-twin" / "twin"
MAX_LINES = 400


def modules(package: Path) -> dict[str, Path]:
    """Dotted name -> file for every Python module of the package (a package by its __init__)."""
    found = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports: `import a.b`, `from a import b` (b a module or
    a name of a), relative imports at any level."""
    mods = modules(package)

    def owner(name: str) -> str | None:  # the module that defines a dotted name
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {owner(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                source = ".".join([*base, *([node.module] if node.module else [])])
                targets |= {owner(f"{source}.{alias.name}") for alias in node.names}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_twin_module_is_over_the_limit():
    long = {
        str(path.relative_to(TWIN.parent)): n
        for path in modules(TWIN).values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines (split by concern): {long}"


def test_the_twin_has_no_import_cycle():
    graph = import_graph(TWIN)
    assert "twin.pve.config" in graph["twin.pve.passthrough"]  # the graph sees relative imports
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(ring) for ring in found)


def test_a_cycle_through_any_kind_of_import_is_found(tmp_path: Path):
    """Each edge of this ring is a different spelling; dropping any one breaks the ring."""
    pkg = tmp_path / "ring"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from . import b\n",
        "b.py": "def late():\n    from .sub import c\n",
        "sub/__init__.py": "",
        "sub/c.py": "import ring.sub.d\n",
        "sub/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import x\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    assert cycles(import_graph(pkg)) == [["ring.a", "ring.b", "ring.sub.c", "ring.sub.d"]]
    (pkg / "b.py").write_text("def late():\n    pass\n")
    assert cycles(import_graph(pkg)) == []
