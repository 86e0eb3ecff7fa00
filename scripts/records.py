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
import re
import sys
import unicodedata
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
    files = sorted(folder.glob("*.json"))
    pages = [json.loads(p.read_text(encoding="utf-8")) for p in files]
    records = [r for page in pages for r in page["records"]]
    ids = [r["id"] for r in records]
    problems = [f"record id {i!r} is used twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
    for r in records:
        problems += [f"{r['id']}: {p}" for p in record_problems(r, set(ids))]
    problems += [
        f"{f.name} writes {p['page']}, not {f.stem}.md" for f, p in zip(files, pages) if p["page"] != f"{f.stem}.md"
    ]
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
    """A markdown table as its data holds it: the header, the alignment row, a line per row."""
    return [_row(table["header"]), "|" + "|".join(table["align"]) + "|"] + [_row(row) for row in table["rows"]]


def _row(cells: list[str]) -> str:
    return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"


def block_lines(block: dict[str, Any]) -> list[str]:
    """A block's markdown lines, every row of a table included."""
    if "md" in block:
        return list(block["md"])
    if "code" in block:
        return ["```" + block["code"], *block["lines"], "```"]
    return table_lines(block["table"])


def shown_lines(block: dict[str, Any]) -> list[str]:
    """A block as the page shows it: a table's superseded rows move out of it into a table of their
    own under it, each beside the last cell of the row that replaced it (one current row a claim)."""
    table = block.get("table")
    if not table or not table.get("superseded_rows"):
        return block_lines(block)
    replaced = dict(table["superseded_rows"])
    current = {**table, "rows": [r for i, r in enumerate(table["rows"]) if i not in replaced]}
    old = [[*r, table["rows"][replaced[i]][-1]] for i, r in enumerate(table["rows"]) if i in replaced]
    lines = table_lines(current) + ["", "Rows a later row replaced (the last column names it):", ""]
    return lines + table_lines(
        {"header": [*table["header"], "replaced by"], "align": [*table["align"], "---"], "rows": old}
    )


def slug(heading: str) -> str:
    """The anchor mkdocs gives a heading (Python-Markdown's toc slugify on its text, markup dropped)."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.lstrip("#").strip())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[*_]{1,2}([^*_]+)[*_]{1,2}", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def places(pages: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Each record's page and anchor: its heading's; `record-<name>` for a record without a heading
    (an HTML anchor on its first line); "" for a page's first record (the page's top)."""
    out = {}
    for page in pages:
        for i, record in enumerate(page["records"]):
            anchor = slug(record["heading"]) if record.get("heading") else record_anchor(record) if i else ""
            out[record["id"]] = (page["page"], anchor)
    return out


def record_anchor(record: dict[str, Any]) -> str:
    return "record-" + record["id"].rpartition("/")[2]


def status_line(record: dict[str, Any], page: str, where: dict[str, tuple[str, str]], titles: dict[str, str]) -> str:
    """The line that marks a superseded record, linking the record that replaced it."""
    successor = record["superseded_by"]
    target, anchor = where[successor]
    link = (target if target != page else "") + (f"#{anchor}" if anchor else "")
    note = f"; {record['note']}" if record.get("note") else ""
    return f"*Superseded by [{titles[successor]}]({link or target}){note}.*"


def render(page: dict[str, Any], pages: list[dict[str, Any]] | None = None) -> str:
    """The page's markdown: its title line, then each record's heading (or, without one, an anchor
    on its first line), the line marking it superseded (if it is), and its blocks. `pages`: every
    page, where a successor may be."""
    everything = pages or [page]
    where = places(everything)
    titles = {r["id"]: r["title"] for p in everything for r in p["records"]}
    lines = [page["title"]]
    for i, record in enumerate(page["records"]):
        body = [line for block in record["body"] for line in shown_lines(block)]
        anchor = f'<a id="{record_anchor(record)}"></a>' if i and not record.get("heading") else ""
        if record.get("heading"):
            lines.append(record["heading"])
        if record["status"] == "superseded":
            mark = status_line(record, page["page"], where, titles)
            lines += ["", mark] if record.get("heading") else [anchor + mark, ""]
        elif anchor and body and body[0] and not body[0].startswith(("- ", "|", "#", "```", "<")):
            body[0] = anchor + body[0]
        elif anchor:
            lines += [anchor, ""]
        lines += body
    return "\n".join(lines) + "\n"


GENERATED = "<!-- generated by "
GENERATED_END = "<!-- end of the block generated"


def blocks_of(lines: list[str]) -> list[dict[str, Any]]:
    """Markdown lines as blocks: fenced code, tables (where they render back to the same lines), the
    rest as md lines. The inverse of block_lines."""
    blocks: list[dict[str, Any]] = []
    md: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if re.fullmatch(r"```\w+", line) and "```" in lines[i + 1 :]:
            end = lines.index("```", i + 1)
            blocks += [{"md": md}] if md else []
            blocks.append({"code": line[3:], "lines": lines[i + 1 : end]})
            md, i = [], end + 1
            continue
        end = i
        while end < len(lines) and lines[end].startswith("|") and lines[end].endswith("|"):
            end += 1
        table = table_of(lines[i:end]) if end > i + 1 else None
        if table is None:
            md.append(line)
            i += 1
            continue
        blocks += [{"md": md}] if md else []
        blocks.append({"table": table})
        md, i = [], end
    return blocks + ([{"md": md}] if md else [])


def table_of(rows: list[str]) -> dict[str, Any] | None:
    """A markdown table's data, or None where its lines would not render back the same."""
    if not re.fullmatch(r"\|(:?-+:?\|)+", rows[1]):
        return None
    cells = [_cells(r) for r in [rows[0], *rows[2:]]]
    if any(c is None or len(c) != len(cells[0] or []) for c in cells):
        return None
    table = {"header": cells[0], "align": rows[1][1:-1].split("|"), "rows": cells[1:]}
    return table if table_lines(table) == rows else None


def _cells(line: str) -> list[str] | None:
    """A table line's cells: split at the pipes outside code spans, one space each side dropped."""
    cells = re.findall(r"((?:[^|`\\]|\\.|`[^`]*`)*)\|", line[1:])
    if any(not (c == " " or (len(c) >= 2 and c[0] == c[-1] == " ")) for c in cells):
        return None
    return [c[1:-1] if c != " " else "" for c in cells]


def take_generated(page: dict[str, Any], on_disk: str) -> bool:
    """Take into `page` each block that a bench wrote into the page file between its markers
    (`<!-- generated by ...` to `<!-- end of the block generated ...`, e.g. `bench/algorithms/
    algorithms.py --readme`), so that writing the page keeps it; True if the data changed."""
    disk = on_disk.split("\n")
    changed = False
    for record in page["records"]:
        spans: list[tuple[int, int]] = []
        lines: list[str] = []
        for block in record["body"]:
            spans.append((len(lines), len(lines) + len(block_lines(block))))
            lines += block_lines(block)
        start = next((i for i, line in enumerate(lines) if line.startswith(GENERATED) and line in disk), None)
        if start is None:
            continue
        end = next(i for i in range(start, len(lines)) if lines[i].startswith(GENERATED_END))
        d_start = disk.index(lines[start])
        d_end = next((i for i in range(d_start, len(disk)) if disk[i].startswith(GENERATED_END)), None)
        if d_end is None or disk[d_start : d_end + 1] == lines[start : end + 1]:
            continue
        first = next(k for k, (a, b) in enumerate(spans) if a <= start < b)
        last = next(k for k, (a, b) in enumerate(spans) if a <= end < b)
        new = lines[spans[first][0] : start] + disk[d_start : d_end + 1] + lines[end + 1 : spans[last][1]]
        record["body"][first : last + 1] = blocks_of(new)
        changed = True
    return changed


def dump(page: dict[str, Any]) -> str:
    """A page's data as its JSON file holds it."""
    return json.dumps(page, indent=1, ensure_ascii=False) + "\n"


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
        if not args.check and path.is_file() and take_generated(page, path.read_text(encoding="utf-8")):
            source = RECORDS / f"{path.stem}.json"
            source.write_text(dump(page), encoding="utf-8")
            print(f"took {path.relative_to(ROOT)}'s generated block into {source.relative_to(ROOT)}")
        text = render(page, pages)
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
