"""Write the API reference pages of the documentation site (docs/api/*.md) from the packages' `__all__`.

Each package of the distribution whose `__init__.py` sets `__all__` gets one page, with one
mkdocstrings block per exported name, pointed at the module that defines it (read from the
source with `ast`, nothing imported: lazy exports, re-exports and optional frameworks such as
trl and verl need not be installed). `--check` writes nothing and exits 1 when a page is missing
or differs, which `tests/test_docs_site.py` runs, so a name added to `__all__` reaches the site.

    python scripts/docs_api.py            # (re)write docs/api/
    python scripts/docs_api.py --check    # exit 1 if docs/api/ is out of date
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
API_DIR = ROOT / "docs" / "api"


def packages() -> list[str]:
    """The distribution's packages, as pyproject.toml's `[tool.setuptools] packages` lists them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return list(config["tool"]["setuptools"]["packages"])


def module_file(module: str) -> Path | None:
    """The source file of a dotted `pvpo.*` module in this checkout, or None when there is none."""
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _literal_strings(node: ast.expr) -> list[str] | None:
    if isinstance(node, (ast.List, ast.Tuple)) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return [e.value for e in node.elts]  # type: ignore[attr-defined]
    return None


def exports(package: str) -> dict[str, str] | None:
    """`{name: module that binds it}` for the names in `package.__all__`, or None without `__all__`."""
    source = module_file(package)
    if source is None:
        return None
    tree = ast.parse(source.read_text(encoding="utf-8"))
    bound: dict[str, str] = {}
    lazy: dict[str, str] = {}
    names: list[str] | None = None
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            base = node.module
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [node.module])
            for alias in node.names:
                bound[alias.asname or alias.name] = base
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target = node.targets[0].id
            if target == "_EXPORTS" and isinstance(node.value, ast.Dict):
                for key, value in zip(node.value.keys, node.value.values):
                    if isinstance(key, ast.Constant) and isinstance(value, ast.Constant):
                        lazy[key.value] = f"{package}.{value.value}"
            elif target == "__all__":
                names = _literal_strings(node.value)
                if names is None and isinstance(node.value, ast.Call):  # sorted(_EXPORTS)
                    names = sorted(lazy)
            else:
                bound.setdefault(target, package)
    if names is None:
        return None
    return {name: lazy.get(name) or bound.get(name, package) for name in names}


def defining_module(name: str, module: str, depth: int = 0) -> str:
    """Follow `from X import name` re-exports from `module` to the module that defines `name`."""
    source = module_file(module)
    if source is None or depth > 8:
        return module
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pvpo"):
            if any((alias.asname or alias.name) == name and alias.name == name for alias in node.names):
                return defining_module(name, node.module, depth + 1)
    return module


def page(package: str, names: dict[str, str]) -> str:
    """The markdown of one package's API page."""
    doc = ast.get_docstring(ast.parse(module_file(package).read_text(encoding="utf-8"))) or ""  # type: ignore[union-attr]
    summary = doc.split("\n\n")[0].replace("\n", " ").removeprefix(f"{package}: ")
    summary = summary[:1].upper() + summary[1:]
    lines = [
        f"# `{package}`",
        "",
        "<!-- written by scripts/docs_api.py from the package's __all__; rerun it after changing __all__ -->",
        "",
        summary,
        "",
        f"`from {package} import ...` takes each name below; the entries are read from the docstrings.",
        "",
    ]
    for name in sorted(names, key=str.lower):
        lines += [f"::: {defining_module(name, names[name])}.{name}", ""]
    return "\n".join(lines)


def pages() -> dict[Path, str]:
    """Every API page, by path."""
    out: dict[Path, str] = {}
    for package in packages():
        names = exports(package)
        if names:
            out[API_DIR / f"{package.removeprefix('pvpo.')}.md"] = page(package, names)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if docs/api/ is out of date")
    args = parser.parse_args(argv)
    wanted = pages()
    stale = sorted(p for p, text in wanted.items() if not p.is_file() or p.read_text(encoding="utf-8") != text)
    extra = sorted(p for p in API_DIR.glob("*.md") if p not in wanted) if API_DIR.is_dir() else []
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} is out of date: run python scripts/docs_api.py", file=sys.stderr)
        for path in extra:
            print(f"{path.relative_to(ROOT)} documents no package with __all__: remove it", file=sys.stderr)
        return 1 if stale or extra else 0
    API_DIR.mkdir(parents=True, exist_ok=True)
    for path in stale:
        path.write_text(wanted[path], encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    for path in extra:
        path.unlink()
        print(f"removed {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
