"""The benchmark pages (docs/benchmarks/*.md) are written from their records
(docs/benchmarks/records/*.json) by scripts/records.py: every page regenerates byte for byte, every
record carries its date, commits, machine and commands or says why not, and a superseded record or
table row names a successor that exists."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "records.py"
BENCHMARKS = REPO / "docs" / "benchmarks"


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("records", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def records() -> list[dict[str, Any]]:
    return [r for page in script().load_all() for r in page["records"]]


def copy_of_records(tmp_path: Path) -> Path:
    folder = tmp_path / "records"
    folder.mkdir()
    for p in (BENCHMARKS / "records").glob("*.json"):
        (folder / p.name).write_bytes(p.read_bytes())
    return folder


def edit(folder: Path, name: str, change: Any) -> None:
    path = folder / name
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def test_every_benchmark_page_regenerates_byte_for_byte_from_its_records() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    rec = script()
    pages = rec.load_all()
    for page in pages:
        assert (BENCHMARKS / page["page"]).read_text(encoding="utf-8") == rec.render(page, pages), page["page"]


def test_every_benchmark_page_but_the_headline_page_has_a_records_file() -> None:
    written = {page["page"] for page in script().load_all()}
    assert {p.name for p in BENCHMARKS.glob("*.md")} == written | {"headline.md"}


def test_every_record_has_date_commits_machine_and_commands_or_says_why_not() -> None:
    missing = [
        f"{r['id']}: {field}"
        for r in records()
        for field in ("date", "commits", "machine", "commands")
        if not r[field] and not r.get("why_not", {}).get(field)
    ]
    assert not missing, missing


def test_what_a_record_states_in_its_fields_is_in_its_text() -> None:
    rec = script()
    for r in records():
        text = "\n".join(line for block in r["body"] for line in rec.block_lines(block))
        stated = r["date"] + r["commits"] + r["software"] + [v for vs in r["machine"].values() for v in vs]
        stated += [c for c in r["commands"] if "\n" not in c]
        assert [s for s in stated if s not in text] == [], r["id"]


def test_each_superseded_record_and_row_names_a_successor_that_exists() -> None:
    everything = records()
    by_id = {r["id"]: r for r in everything}
    superseded = [r for r in everything if r["status"] == "superseded"]
    assert superseded, "the pages keep older records beside the current ones"
    for r in superseded:
        assert r["superseded_by"] in by_id and r["superseded_by"] != r["id"], r["id"]
    rows = [b["table"] for r in everything for b in r["body"] if b.get("table", {}).get("superseded_rows")]
    assert rows, "the real-data recipe's summary table keeps older rows beside the current ones"
    for table in rows:
        for row, successor in table["superseded_rows"]:
            assert successor != row and successor < len(table["rows"])


def test_a_record_superseded_by_one_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    folder = copy_of_records(tmp_path)
    edit(folder, "demo.json", lambda d: d["records"][2].update(status="superseded", superseded_by="demo/nowhere"))
    with pytest.raises(ValueError, match="superseded by 'demo/nowhere', which is not a record"):
        script().load_all(folder)


def test_a_record_without_a_date_or_a_reason_is_refused(tmp_path: Path) -> None:
    folder = copy_of_records(tmp_path)
    rid = json.loads((folder / "demo.json").read_text(encoding="utf-8"))["records"][1]["id"]
    edit(folder, "demo.json", lambda d: d["records"][1].update(date=[], why_not={}))
    with pytest.raises(ValueError, match=re.escape(f"{rid}: no date and no why_not.date saying why")):
        script().load_all(folder)


def test_a_table_row_superseded_by_a_row_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    folder = copy_of_records(tmp_path)

    def bad_row(data: dict[str, Any]) -> None:
        table = next(b["table"] for b in data["records"][0]["body"] if "table" in b)
        table["superseded_rows"] = [[0, 99]]

    edit(folder, "real-recipe.json", bad_row)
    with pytest.raises(ValueError, match="table row 0 is superseded by row 99"):
        script().load_all(folder)


def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, Path, Path]:
    """The script working on copies of the records and the pages (the headline job left out)."""
    rec = script()
    folder = copy_of_records(tmp_path)
    pages = tmp_path / "pages"
    pages.mkdir()
    for p in BENCHMARKS.glob("*.md"):
        (pages / p.name).write_bytes(p.read_bytes())
    monkeypatch.setattr(rec, "RECORDS", folder)
    monkeypatch.setattr(rec, "PAGES", pages)
    monkeypatch.setattr(rec, "ROOT", tmp_path)
    monkeypatch.setattr(rec, "headline_script", lambda: type("H", (), {"main": staticmethod(lambda argv: 0)}))
    return rec, folder, pages


def test_a_changed_figure_changes_its_page_and_check_fails_until_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rec, folder, pages = sandbox(tmp_path, monkeypatch)

    def change_a_cell(data: dict[str, Any]) -> None:
        table = next(b["table"] for b in data["records"][0]["body"] if "table" in b)
        table["rows"][0][1] = "EM 0.999"

    edit(folder, "demo.json", change_a_cell)
    assert rec.main(["--check"]) == 1
    assert "demo.md differs from its records" in capsys.readouterr().out
    assert rec.main([]) == 0
    assert "| EM 0.999 |" in (pages / "demo.md").read_text(encoding="utf-8")
    assert rec.main(["--check"]) == 0


def test_a_table_renders_back_to_the_markdown_it_was_read_from() -> None:
    table = {"header": ["a", "b"], "align": ["---", "---:"], "rows": [["1", ""], ["`x | y`", "2"]]}
    assert script().table_lines(copy.deepcopy(table)) == ["| a | b |", "|---|---:|", "| 1 | |", "| `x | y` | 2 |"]


def test_a_block_a_bench_wrote_into_its_page_is_taken_into_the_records_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec, folder, pages = sandbox(tmp_path, monkeypatch)
    page = pages / "algorithms.md"
    old = "- results: bench/results/algorithms (40 sweep + 80 final runs)"
    page.write_text(
        page.read_text(encoding="utf-8").replace(old, old.replace("40 sweep", "41 sweep")), encoding="utf-8"
    )
    assert rec.main(["--check"]) == 1
    assert rec.main([]) == 0
    assert "(41 sweep + 80 final runs)" in page.read_text(encoding="utf-8")
    assert "(41 sweep + 80 final runs)" in (folder / "algorithms.json").read_text(encoding="utf-8")
    assert rec.main(["--check"]) == 0


def test_a_superseded_record_is_marked_on_its_page_with_a_link_to_its_successor() -> None:
    rec = script()
    pages = rec.load_all()
    where = rec.places(pages)
    by_id = {r["id"]: r for page in pages for r in page["records"]}
    for page in pages:
        text = (BENCHMARKS / page["page"]).read_text(encoding="utf-8")
        for r in page["records"]:
            if r["status"] == "superseded":
                target, anchor = where[r["superseded_by"]]
                link = (target if target != page["page"] else "") + f"#{anchor}"
                assert f"*Superseded by [{by_id[r['superseded_by']]['title']}]({link})" in text, r["id"]


def test_a_summary_tables_superseded_rows_leave_it_for_a_table_of_replaced_rows() -> None:
    rec = script()
    page = next(p for p in rec.load_all() if p["page"] == "real-recipe.md")
    table = next(b["table"] for b in page["records"][0]["body"] if "table" in b)
    text = (BENCHMARKS / "real-recipe.md").read_text(encoding="utf-8")
    current, _, replaced = text.partition("Rows a later row replaced")
    for row, successor in table["superseded_rows"]:
        line = rec.table_lines({**table, "rows": [table["rows"][row]]})[-1]
        assert line not in current and line[:-1] + f"| {table['rows'][successor][-1]} |" in replaced


def test_a_record_without_a_heading_has_an_anchor_a_page_can_link() -> None:
    rec = script()
    for page in rec.load_all():
        text = (BENCHMARKS / page["page"]).read_text(encoding="utf-8")
        for r in page["records"][1:]:
            if not r["heading"]:
                assert f'<a id="record-{r["id"].rpartition("/")[2]}"></a>' in text, r["id"]


def test_a_records_file_writes_the_page_of_its_name(tmp_path: Path) -> None:
    folder = copy_of_records(tmp_path)
    (folder / "demo.json").rename(folder / "demos.json")
    with pytest.raises(ValueError, match="demos.json writes demo.md, not demos.md"):
        script().load_all(folder)
