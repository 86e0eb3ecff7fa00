"""bench/'s layout: every bench lives in a folder named by its subject, no file is named by the review
round that asked for it, and no bench imports another's private (underscore) names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _bench_files() -> list[Path]:
    return sorted(p for p in BENCH.rglob("*.py") if ".mypy_cache" not in p.parts)


def test_bench_has_no_flat_script_and_no_file_named_by_a_review_round() -> None:
    flat = [p.name for p in BENCH.glob("*.py") if p.name != "__init__.py"]
    assert not flat, f"bench/ holds scripts outside a subject folder: {flat}"
    by_round = [str(p.relative_to(BENCH)) for p in _bench_files() if re.search(r"round_?\d", p.stem)]
    assert not by_round, f"bench files named by review round, not by what they probe: {by_round}"


def test_no_bench_imports_another_files_private_names() -> None:
    private = []
    for path in _bench_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bench"):
                private += [
                    f"{path.relative_to(BENCH)}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")
                ]
            elif isinstance(node, ast.Import):
                private += [
                    f"{path.relative_to(BENCH)}: {a.name}"
                    for a in node.names
                    if a.name.startswith("bench") and any(part.startswith("_") for part in a.name.split("."))
                ]
    assert not private, f"private names imported across bench files: {private}"


def test_every_bench_import_names_a_file_that_exists() -> None:
    missing = []
    for path in _bench_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            if module is not None and module.startswith("bench."):
                target = BENCH.parent / Path(*module.split("."))
                if not (target.with_suffix(".py").exists() or (target / "__init__.py").exists()):
                    missing.append(f"{path.relative_to(BENCH)}: {module}")
    assert not missing, missing
