"""Files written through pvpo.atomic get the mode a plain `open(path, "w")` gives them: 0666 less
the umask for a new file, an existing file's own mode when it is replaced (not mkstemp's 0600)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pvpo.atomic import atomic_write_json, atomic_write_jsonl, atomic_write_text


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077, 0o027])
def test_new_result_file_has_the_mode_open_would_give(tmp_path: Path, umask: None, mask: int) -> None:
    os.umask(mask)
    plain = tmp_path / "plain.json"
    with open(plain, "w") as f:
        f.write("{}")
    for name, write in (
        ("metrics.json", lambda p: atomic_write_json(p, {"em": 1.0}, indent=1)),
        ("predictions.jsonl", lambda p: atomic_write_jsonl(p, [{"id": "q1"}])),
        ("summary.md", lambda p: atomic_write_text(p, "# summary\n")),
    ):
        path = tmp_path / name
        write(path)
        assert _mode(path) == _mode(plain) == 0o666 & ~mask, name


def test_replaced_file_keeps_its_own_mode(tmp_path: Path, umask: None) -> None:
    path = tmp_path / "metrics.json"
    path.write_text("{}")
    path.chmod(0o640)
    atomic_write_json(path, {"em": 0.5})
    assert _mode(path) == 0o640
    assert path.read_text() == '{"em": 0.5}'


def test_no_temporary_file_is_left_beside_the_result(tmp_path: Path, umask: None) -> None:
    atomic_write_text(tmp_path / "a.txt", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
