"""Write the benchmark pages (docs/benchmarks/*.md) from their records (docs/benchmarks/records/*.json).

Each JSON file is one page: its `page` (the file it writes), its `title` (the page's first line) and
its `records` in page order. A record is one measurement, or a page's summary or notes:

- `id` (`<page>/<name>`, unique), `title`, `heading` (the markdown heading line that opens it on the
  page, or null where it continues the section above), `kind` (`measurement`, `summary`: a table
  derived from the page's records, or `notes`: method or guidance without a figure of its own);
- `status`: `current`, or `superseded` with `superseded_by` naming the record that replaces it;
- `date`, `commits`, `machine` (`cpu`, `flags`, `cores`, `memory`, `gpu`), `software`, `commands`:
  as the record's text states them; `recorded_in` (`commit`, `date`: the commit that last wrote the
  record's text, from `git blame` when it became data); `why_not`: for each of date, commits,
  machine and commands that a record leaves empty, why;
- `body`: the record's text as blocks, `{"md": [lines]}`, `{"code": "bash", "lines": [...]}` or
  `{"table": {"header": [...], "align": [...], "rows": [[cells]]}}` (the figures of a table as data;
  `superseded_rows` lists `[row, row that replaces it]` where a summary table keeps an older row).

The README's results table and headline.md come from docs/benchmarks/headline.json (the job of
scripts/headline_records.py, which this script runs too).

    python scripts/records.py           # rewrite every page that differs from its records
    python scripts/records.py --check   # exit 1 if any page differs from its records
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "docs" / "benchmarks"
RECORDS = PAGES / "records"
REQUIRED = ("date", "commits", "machine", "commands")
KINDS = ("measurement", "summary", "notes")


def load_all(folder: Path | None = None) -> list[dict[str, Any]]:
    """Every page's data (from `folder`, default docs/benchmarks/records), checked: ids unique, a
    superseded record names one that exists, each of date, commits, machine and commands present or
    its absence explained in `why_not`."""
    folder = folder or RECORDS
    pages = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))]
    records = [r for page in pages for r in page["records"]]
    ids = [r["id"] for r in records]
    problems = [f"record id {i!r} is used twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
    for r in records:
        problems += [f"{r['id']}: {p}" for p in record_problems(r, set(ids))]
    if problems:
        raise ValueError(
            f"{folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder}: " + "; ".join(problems)
        )
    return pages


def record_problems(record: dict[str, Any], ids: set[str]) -> list[str]:
    """What a record lacks: a known kind and status, a successor that exists, the required fields."""
    out = []
    if record.get("kind") not in KINDS:
        out.append(f"kind {record.get('kind')!r} is not one of {', '.join(KINDS)}")
    if record.get("status") == "superseded":
        if record.get("superseded_by") not in ids:
            out.append(f"superseded by {record.get('superseded_by')!r}, which is not a record")
    elif record.get("status") != "current":
        out.append(f"status {record.get('status')!r} is neither current nor superseded")
    why_not = record.get("why_not", {})
    for field in REQUIRED:
        if not record.get(field) and not why_not.get(field):
            out.append(f"no {field} and no why_not.{field} saying why")
    for block in record["body"]:
        table = block.get("table")
        for row, successor in (table or {}).get("superseded_rows", []):
            if not (0 <= row < len(table["rows"]) and 0 <= successor < len(table["rows"]) and row != successor):
                out.append(f"table row {row} is superseded by row {successor}, which is not another row")
    return out


def table_lines(table: dict[str, Any]) -> list[str]:
    """A markdown table: the header, the alignment row, a line per row."""

    def line(cells: list[str]) -> str:
        return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"

    return [line(table["header"]), "|" + "|".join(table["align"]) + "|"] + [line(row) for row in table["rows"]]


def block_lines(block: dict[str, Any]) -> list[str]:
    if "md" in block:
        return list(block["md"])
    if "code" in block:
        return ["```" + block["code"], *block["lines"], "```"]
    return table_lines(block["table"])


def render(page: dict[str, Any]) -> str:
    """The page's markdown: its title line, then each record's heading (if any) and blocks."""
    lines = [page["title"]]
    for record in page["records"]:
        if record.get("heading"):
            lines.append(record["heading"])
        for block in record["body"]:
            lines += block_lines(block)
    return "\n".join(lines) + "\n"


def headline_script() -> Any:
    spec = importlib.util.spec_from_file_location("headline_records", ROOT / "scripts" / "headline_records.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if any page differs from its records")
    args = parser.parse_args(argv)
    try:
        pages = load_all()
    except (ValueError, KeyError, json.JSONDecodeError) as e:
        print(f"records: {e}", file=sys.stderr)
        return 1
    stale = []
    for page in pages:
        path = PAGES / page["page"]
        text = render(page)
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path)
        if args.check:
            print(f"{path.relative_to(ROOT)} differs from its records: run python scripts/records.py")
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    headline = headline_script().main(["--check"] if args.check else [])
    return 1 if (args.check and stale) or headline else 0


if __name__ == "__main__":
    sys.exit(main())
