"""No import circle among the package's modules, counting every import in the source: at module
level, inside a function (a lazy import) and under `if TYPE_CHECKING:` alike. A circle hidden
behind a lazy import still ties two modules into one unit that neither can be read, tested or
moved without (DESIGN.md: "No import circle, lazy or TYPE_CHECKING imports included")."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMPONENTS = ("reward", "retriever", "envs", "trainer", "evaluation", "configs", "integrations", "viewer", "recipes")


def _module_name(path: Path) -> str:
    parts = (
        ["pvpo", path.stem] if path.parent == REPO / "pvpo" else ["pvpo", *path.relative_to(REPO).with_suffix("").parts]
    )
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    files = sorted((REPO / "pvpo").glob("*.py")) + [p for c in COMPONENTS for p in sorted((REPO / c).rglob("*.py"))]
    return {_module_name(p): p for p in files}


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of the package's modules: `import a.b`, `from a import b` (a.b when b
    is a module, else a), relative imports resolved; anywhere in the file (`ast.walk`)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([node.module] if node.module else []))
                for a in node.names:
                    if f"{base}.{a.name}" in modules:
                        out.add(f"{base}.{a.name}")
                    elif base in modules:
                        out.add(base)
        out.discard(name)
        graph[name] = out
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_of_the_package_is_in_an_import_circle_lazy_or_type_checking_imports_included() -> None:
    assert cycles(import_graph(_modules())) == []


def test_the_check_sees_a_circle_closed_by_a_function_level_import_or_a_type_checking_one(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def f():\n    from pvpo.b import g\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pvpo.a import f\n")
    (tmp_path / "c.py").write_text("from pvpo import a\n")
    modules = {f"pvpo.{n}": tmp_path / f"{n}.py" for n in "abc"}
    assert cycles(import_graph(modules)) == [["pvpo.a", "pvpo.b"]]
