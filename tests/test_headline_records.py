"""The README's results table and docs/benchmarks/headline.md are written from one data file,
docs/benchmarks/headline.json: both regenerate byte for byte from it, the README shows the current
records only, and a record marked superseded names a record that exists."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "headline_records.py"


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("headline_records", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_table_and_the_page_regenerate_byte_for_byte_from_the_json_file() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    records = script().load()
    assert (REPO / "docs" / "benchmarks" / "headline.md").read_text(encoding="utf-8") == script().page(records)


def test_the_readme_shows_one_current_row_per_record_and_the_page_every_record() -> None:
    hr = script()
    records = hr.load()
    current = [r for r in records if r["status"] == "current"]
    table = hr.readme_table(records)
    assert len(table.splitlines()) == 2 + len(current)
    assert all(r["result"] in table for r in current)
    assert not any(r["result"] in table for r in records if r["status"] != "current")
    page = hr.page(records)
    assert all(f"| [{r['id']}](" in page for r in records)
    for field in ("command", "machine", "code", "date"):
        assert all(field in r for r in records), field


def test_a_changed_record_changes_the_readme_table_and_check_fails_until_written(tmp_path: Path) -> None:
    hr = script()
    records = hr.load()
    records[0] = {**records[0], "result": "EM 0.999"}
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    changed = hr.readme_with_table(readme, records)
    assert "EM 0.999" in changed and changed != readme
    assert hr.readme_with_table(readme, hr.load()) == readme


def test_a_record_superseded_by_one_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    data = json.loads((REPO / "docs" / "benchmarks" / "headline.json").read_text(encoding="utf-8"))
    data["records"][0]["status"] = "superseded by nowhere"
    path = tmp_path / "headline.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match="superseded by 'nowhere', which is not a record"):
        script().load(path)
