"""The README and the documentation site: every relative link of README.md, CONTRIBUTING.md and
docs/ reaches an existing file (and heading, for a `#anchor`), the README stays short, the API
pages list what the packages export, and no Python file narrates its history by issue number.
`make docs` (mkdocs build --strict) checks the site's own links again when it renders it."""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, ...


def slugify(text: str) -> str:
    """A heading's anchor as Python-Markdown's `toc` (mkdocs) writes it; markup is dropped first."""
    text = re.sub(r"`([^`]*)`", r"\1", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[*_]{1,2}([^*_]+)[*_]{1,2}", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((number, line))
    return out


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings (a repeated heading gets `_1`, `_2`, ... as in toc)
    and of its HTML anchors."""
    seen: set[str] = set()
    for _, line in _prose_lines(path):
        match = _HEADING.match(line)
        if match:
            slug = base = slugify(match.group(2))
            count = 0
            while slug in seen:
                count += 1
                slug = f"{base}_{count}"
            seen.add(slug)
        seen.update(re.findall(r'<a id="([\w-]+)"></a>', line))  # a record's anchor (scripts/records.py)
    return seen


def broken_links(path: Path) -> list[str]:
    """Each relative link of a markdown file whose file or anchor does not exist, as `file:line: target`."""
    problems = []
    for number, line in _prose_lines(path):
        for target in _LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if _EXTERNAL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{number}: {target}"
            if not dest.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where} (no heading with that anchor)")
    return problems


def markdown_files() -> list[Path]:
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_every_relative_link_of_the_readme_and_the_docs_reaches_a_file_and_its_heading() -> None:
    problems = [p for path in markdown_files() for p in broken_links(path)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_link_check_reports_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "guide.md").write_text("# The guide\n\n## Serving (`--port`)\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](guide.md#serving-port) [img](guide.md) [web](https://example.org/x.md)\n"
        "[gone](missing.md) [bad anchor](guide.md#nowhere) `[in code](missing.md)`\n"
        "```\n[fenced](missing.md)\n```\n",
        encoding="utf-8",
    )
    problems = broken_links(page)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "missing.md (no such file)",
        "guide.md#nowhere (no heading with that anchor)",
    ]


def test_the_readme_is_short_enough_to_read_in_ten_minutes() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines; move detail into docs/ (at most {README_MAX_LINES})"
    )


def test_the_api_pages_list_every_name_the_packages_export() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "docs_api.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_every_docs_page_is_in_the_site_navigation() -> None:
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    pages = [p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")]
    assert pages and [p for p in pages if p not in nav] == []


def test_no_python_file_names_an_issue_number_in_its_comments_or_docstrings() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.split()
    files = [REPO / f for f in tracked] or [p for p in REPO.rglob("*.py") if ".venv" not in p.parts]
    pattern = re.compile(r"\bissue[ -]?#?\d+", re.IGNORECASE)
    hits = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in files
        if path.is_file() and "fixtures" not in path.parts
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, "say why the code is as it is, not which issue changed it:\n" + "\n".join(hits)


def test_searchenvs_options_are_documented_in_its_api_entry() -> None:
    import inspect

    from pvpo.envs.search_env import SearchEnv, set_up_episodes

    doc = inspect.getdoc(SearchEnv.__init__) or ""
    section = doc.partition("Keyword Args:")[2]
    options = [n for n, p in inspect.signature(set_up_episodes).parameters.items() if p.kind is p.KEYWORD_ONLY]
    assert options and [n for n in options if not re.search(rf"^\s+{n} \(", section, re.M)] == []
    # the __init__ docstring is rendered under the class only when mkdocstrings merges it there
    assert re.search(r"^\s+merge_init_into_class: true", (REPO / "mkdocs.yml").read_text(encoding="utf-8"), re.M)


def test_the_site_wraps_long_lines_of_code_blocks() -> None:
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    sheets = re.findall(r"^extra_css:\n((?:\s+- .*\n)+)", config, re.M)
    paths = [REPO / "docs" / line.split("- ", 1)[1].split("#")[0].strip() for line in "".join(sheets).splitlines()]
    css = " ".join(p.read_text(encoding="utf-8") for p in paths if p.is_file())
    assert re.search(r"pre\s*>\s*code\s*\{[^}]*white-space:\s*pre-wrap", css), paths


def test_every_benchmark_page_leads_with_a_result_table() -> None:
    late = []
    for page in sorted((REPO / "docs" / "benchmarks").glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        heading = next((i for i, line in enumerate(lines[1:], 1) if line.startswith("#")), len(lines))
        table = next((i for i, line in enumerate(lines) if line.startswith("|")), len(lines))
        if table > min(heading, 12):
            late.append(f"{page.relative_to(REPO)}: first table at line {table + 1}")
    assert not late, "put a short result table first, the lab notes under it:\n" + "\n".join(late)


def test_the_sites_install_and_quick_start_pages_include_the_readmes_blocks() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for page, name in (("install.md", "install"), ("quickstart.md", "quickstart")):
        assert f'--8<-- "README.md:{name}"' in (REPO / "docs" / page).read_text(encoding="utf-8")
        assert f"--8<-- [start:{name}]" in readme and f"--8<-- [end:{name}]" in readme


def test_make_docs_serve_serves_the_site_over_http_for_its_search() -> None:
    dry = subprocess.run(["make", "-n", "docs-serve"], cwd=REPO, capture_output=True, text=True, check=False)
    assert dry.returncode == 0 and "mkdocs serve" in dry.stdout, dry.stderr
