"""Check that moving text out of a README lost no measured figure.

Reads a markdown file as it was at a git revision (default: README.md at the revision given) and
looks for two things in the working tree's README.md, CONTRIBUTING.md and docs/**/*.md together:

- every table row that holds a digit, whitespace-normalised (a row of a moved table);
- every figure-like number of the old text (with a decimal point or thousands comma, or of three
  or more digits), so that figures moved inside rewrapped prose are found too.

Prints what is missing and exits 1 if anything is.

    python scripts/check_moved_figures.py e84e559            # README.md as of that commit
    python scripts/check_moved_figures.py e84e559 --file README.md
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)+|(?<![\w.,])\d{3,}(?![\w])")


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def table_rows(text: str) -> list[str]:
    """The rows of the markdown tables in `text` that hold a digit (separator rows excluded)."""
    rows = []
    for line in text.splitlines():
        row = line.strip()
        if row.startswith("|") and re.search(r"\d", row) and not re.fullmatch(r"[|\s:-]+", row):
            rows.append(normalise(row))
    return rows


def current_text() -> str:
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return "\n".join(p.read_text(encoding="utf-8") for p in files if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the git revision whose file held the figures")
    parser.add_argument("--file", default="README.md", help="the file at that revision (default README.md)")
    args = parser.parse_args(argv)
    old = subprocess.run(
        ["git", "show", f"{args.rev}:{args.file}"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if old.returncode != 0:
        print(f"error: cannot read {args.file} at {args.rev}: {old.stderr.strip()}", file=sys.stderr)
        return 2
    new = current_text()
    new_flat = normalise(new)
    missing_rows = [row for row in table_rows(old.stdout) if row not in new_flat]
    new_numbers = set(NUMBER.findall(new))
    missing_numbers = sorted(set(NUMBER.findall(old.stdout)) - new_numbers)
    for row in missing_rows:
        print(f"table row not found: {row}")
    if missing_numbers:
        print("numbers not found: " + ", ".join(missing_numbers))
    rows = len(table_rows(old.stdout))
    print(f"{rows - len(missing_rows)}/{rows} table rows and all but {len(missing_numbers)} numbers found")
    return 1 if missing_rows or missing_numbers else 0


if __name__ == "__main__":
    sys.exit(main())
