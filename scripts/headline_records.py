"""Write the README's results table and docs/benchmarks/headline.md from docs/benchmarks/headline.json.

The JSON file holds one record a claim: its one-line claim and result for the README, the command,
the machine, the code and the date, and the full figures; a record that a newer one replaced keeps
its place with `status: superseded by <id>`. The README shows the current records only (between
its `results` markers); the page shows every record, the current ones first.

    python scripts/headline_records.py           # rewrite both from the JSON file
    python scripts/headline_records.py --check   # exit 1 if either differs from what the JSON gives
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "benchmarks" / "headline.json"
PAGE = ROOT / "docs" / "benchmarks" / "headline.md"
README = ROOT / "README.md"
START = "<!-- results: written by scripts/headline_records.py from docs/benchmarks/headline.json -->"
END = "<!-- end of results -->"


def load(path: Path = DATA) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))["records"]
    ids = [r["id"] for r in records]
    for r in records:
        replaced = r["status"].removeprefix("superseded by ").strip()
        if r["status"] != "current" and replaced not in ids:
            raise ValueError(f"{path}: record {r['id']!r} is superseded by {replaced!r}, which is not a record")
    return records


def readme_table(records: list[dict[str, Any]]) -> str:
    """The README's table: a row per current record, its page linked."""
    rows = ["| what | result | record |", "|---|---|---|"]
    for r in records:
        if r["status"] == "current":
            rows.append(f"| {r['claim']} | {r['result']} | [{r['label']}](docs/benchmarks/{r['page']}) |")
    return "\n".join(rows) + "\n"


def _page_links(text: str) -> str:
    """A README-relative link made relative to docs/benchmarks/."""
    return text.replace("](docs/benchmarks/", "](").replace("](docs/", "](../")


def page(records: list[dict[str, Any]]) -> str:
    """docs/benchmarks/headline.md: every record, the current ones first."""
    ordered = [r for r in records if r["status"] == "current"] + [r for r in records if r["status"] != "current"]
    out = [
        "# Headline records",
        "",
        "| record | result | status | command | machine | code | date |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in ordered:
        fields = [
            f"[{r['id']}]({r['page']})",
            _page_links(r["result"]),
            r["status"],
            r["command"],
            r["machine"] or "in the record",
            r["code"] or "in the record",
            r["date"] or "in the record",
        ]
        out.append("| " + " | ".join(fields) + " |")
    out += [
        "",
        "Written by `python scripts/headline_records.py` from `docs/benchmarks/headline.json` (edit that",
        "file, then run the script; `tests/test_headline_records.py` fails when this page or the README's",
        "results table differs from it). The README shows the current records; each record's page holds",
        "its lab notes. The figures in full:",
        "",
        "| record | what | result |",
        "|---|---|---|",
    ]
    for r in ordered:
        out.append(f"| {r['id']} | {r['full_claim']} | {r['full_result']} |")
    return "\n".join(out) + "\n"


def readme_with_table(readme: str, records: list[dict[str, Any]]) -> str:
    found = re.search(rf"{re.escape(START)}\n(.*?){re.escape(END)}", readme, re.S)
    if found is None:
        raise ValueError(f"README.md has no results markers ({START} ... {END})")
    return readme[: found.start(1)] + readme_table(records) + readme[found.end(1) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md or the page differ from the JSON")
    args = parser.parse_args(argv)
    records = load()
    wanted = {README: readme_with_table(README.read_text(encoding="utf-8"), records), PAGE: page(records)}
    stale = [p for p, text in wanted.items() if not p.is_file() or p.read_text(encoding="utf-8") != text]
    if args.check:
        for p in stale:
            print(
                f"{p.relative_to(ROOT)} differs from {DATA.relative_to(ROOT)}: run python scripts/headline_records.py"
            )
        return 1 if stale else 0
    for p in stale:
        p.write_text(wanted[p], encoding="utf-8")
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
