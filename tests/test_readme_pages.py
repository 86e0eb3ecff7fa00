"""The pages a user reads first read as a product's: README.md is short, its results table has one
line a cell, no commit id sits in README.md, docs/guides or docs/recipes (records keep theirs, on
the benchmark pages), and each term the glossary defines is linked there from its first use on
the front page."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
README_MAX_LINES = 120
CELL_MAX_CHARS = 160

# a commit id as git abbreviates it: 7 to 40 hex digits, at least one letter and one digit (so a
# plain number such as 1000000000 or a word such as "decade" is not one)
COMMIT_ID = re.compile(
    r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/-])"
    # one of digits alone, named as a commit or standing alone in parentheses
    r"|(?<=commit )[0-9]{7,40}\b|(?<=\()[0-9]{7,40}(?=\))"
)

# glossary headings the front page must link from the first use of their term
FRONT_PAGE_TERMS = {
    "anchor": "anchor",
    "Group Sampling": "group-sampling",
    "GT": "gt",
    "cover-EM": "cover-em",
    "warm start": "warm-start",
    "paired s.e.": "paired-se",
    "EM": "em",
    "held-out": "held-out",
    "episode": "episode",
}


def commit_ids(text: str) -> list[str]:
    return COMMIT_ID.findall(text)


def table_cells(text: str) -> list[str]:
    return [
        cell.strip()
        for line in text.splitlines()
        if line.startswith("|") and not re.fullmatch(r"[|\s:-]+", line)
        for cell in line.strip().strip("|").split("|")
    ]


def user_pages() -> list[Path]:
    return [
        README,
        *sorted((REPO / "docs" / "guides").rglob("*.md")),
        *sorted((REPO / "docs" / "recipes").rglob("*.md")),
    ]


def test_the_readme_fits_in_120_lines() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"


def test_every_cell_of_the_readmes_tables_is_one_short_line() -> None:
    long = [c for c in table_cells(README.read_text(encoding="utf-8")) if len(c) > CELL_MAX_CHARS]
    assert not long, f"cells over {CELL_MAX_CHARS} characters (the figures go to docs/benchmarks):\n" + "\n".join(long)


def test_no_commit_id_in_the_readme_the_guides_or_the_recipes() -> None:
    found = [
        f"{page.relative_to(REPO)}: {', '.join(ids)}"
        for page in user_pages()
        if (ids := commit_ids(page.read_text(encoding="utf-8")))
    ]
    assert not found, "commit ids belong in the records (docs/benchmarks), not here:\n" + "\n".join(found)


def test_the_commit_id_check_finds_ids_and_leaves_numbers_and_words() -> None:
    text = "measured on b75a798 and 6a1c6f3f2e; 1000000000 tokens, 47360165945165966, decade, facade, x86_64"
    assert commit_ids(text) == ["b75a798", "6a1c6f3f2e"]
    assert commit_ids("commit 1853501, and (1853501); 1853501 passages") == ["1853501", "1853501"]
    assert commit_ids("a sha256 " + "ab12" * 16) == []  # 64 hex digits are not a commit id


def test_the_front_page_links_each_glossary_term_at_its_first_use() -> None:
    glossary = (REPO / "docs" / "glossary.md").read_text(encoding="utf-8")
    headings = {
        re.sub(r"[^\w\s-]", "", h).strip().lower().replace(" ", "-") for h in re.findall(r"^#+ (.+)$", glossary, re.M)
    }
    prose = re.sub(r"```.*?```", "", README.read_text(encoding="utf-8"), flags=re.S)
    prose = re.sub(r"`[^`]*`", "", prose)
    unlinked = []
    for term, anchor in FRONT_PAGE_TERMS.items():
        assert anchor in headings, f"docs/glossary.md has no heading for {term!r}"
        first = re.search(rf"(?<![\w-]){re.escape(term)}(?![\w-])", prose, re.I)
        link = f"](docs/glossary.md#{anchor})"
        if first is None or prose.find(link, first.start()) - first.end() not in range(0, 2):
            unlinked.append(term)
    assert not unlinked, f"link these terms' first use to docs/glossary.md: {unlinked}"


def test_the_readmes_real_data_block_fetches_the_files_its_training_command_reads(tmp_path: Path) -> None:
    import json
    import shlex

    from typer.testing import CliRunner

    from pvpo.cli import app

    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    block = next(b for b in blocks if re.search(r"^pvpo data get ", b, re.M))
    gets = [shlex.split(line.split(" #")[0]) for line in block.splitlines() if line.startswith("pvpo data get")]
    assert gets, "the real-data block fetches its questions with `pvpo data get`"
    copy = tmp_path / "copy"  # a local copy of each fetched split, in the hub's layout
    questions = json.loads(
        (REPO / "tests/fixtures/quickstart/hotpotqa_mini/questions.json").read_text(encoding="utf-8")
    )
    for words in gets:
        split = words[words.index("--split") + 1] if "--split" in words else "dev"
        (copy / words[3]).mkdir(parents=True, exist_ok=True)
        (copy / words[3] / f"{split}.jsonl").write_text(
            "".join(json.dumps(q) + "\n" for q in questions), encoding="utf-8"
        )
        out = words[words.index("--out") + 1]
        args = [w if w != out else str(tmp_path / out) for w in words[1:]]
        result = CliRunner().invoke(app, [*args, "--from", str(copy)])
        assert result.exit_code == 0, result.output
    source = re.search(r"data\.source=\[([^\]]+)\]", block)
    assert source is not None
    read = [tmp_path / p.strip() for p in source.group(1).split(",")]
    assert read and [str(p) for p in read if not p.is_file()] == []
