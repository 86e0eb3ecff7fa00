"""The multi-hop recipe's page runs from `pvpo` commands alone: every command of its shell blocks is
a `pvpo` command (no `python bench/...` script on a user's path), and each `pvpo recipe` line names a
command and options that command has."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import typer

from pvpo.recipes.multihop.cli import recipe_app

PAGE = Path(__file__).resolve().parents[1] / "docs" / "recipes" / "real-smollm2-multihop.md"
# shell lines that run nothing of their own: a comment, a variable, a loop's head and end
NOT_COMMANDS = re.compile(r"^(#|[A-Za-z_]\w*=|for .*; do$|done$)")


def _closed(text: str) -> bool:
    """Whether `text` closes every quote it opens (a quoted argument may span lines)."""
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return False
    return True


def commands(page: str) -> list[str]:
    """The shell commands of `page`'s bash blocks, continuation lines and lines inside a quoted
    argument joined; comments and variables, loop heads and ends left out."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", page, flags=re.S):
        pending = ""
        for line in block.replace("\\\n", " ").splitlines():
            pending = f"{pending} {line.strip()}".strip()
            if pending and _closed(pending):
                if not NOT_COMMANDS.match(pending):
                    found.append(pending)
                pending = ""
    return found


def test_every_command_of_the_recipe_page_is_a_pvpo_command() -> None:
    found = commands(PAGE.read_text(encoding="utf-8"))
    assert any(c.startswith("pvpo recipe table") for c in found)  # the held-out table is made by pvpo
    assert [c for c in found if not c.startswith("pvpo ")] == []
    assert [c for c in found if "bench/" in c or "python" in c] == []


def unknown_options(line: str) -> list[str]:
    """The `--options` of a `pvpo recipe <command> ...` line that command does not have (a trailing
    `  # comment` left out); KeyError for a command the group lacks."""
    words = shlex.split(line.split("  #")[0])
    command = typer.main.get_command(recipe_app).commands[words[2]]  # type: ignore[attr-defined]
    options = {o for p in command.params for o in p.opts}
    return sorted({w.split("=", 1)[0] for w in words[3:] if w.startswith("--")} - options)


def test_each_pvpo_recipe_line_of_the_page_names_a_command_and_options_it_has() -> None:
    lines = [c for c in commands(PAGE.read_text(encoding="utf-8")) if c.startswith("pvpo recipe ")]
    assert {shlex.split(c)[2] for c in lines} >= {"seeds", "sft-arm", "table"}
    assert {line: unknown_options(line) for line in lines} == {line: [] for line in lines}


def test_the_page_check_catches_a_bench_script_and_an_option_no_command_has() -> None:
    page = "```bash\nDATA=x\n# a note\npython bench/recipe/x.py --a \\\n  b\npvpo recipe table --nope=1 --rl a\n```\n"
    found = commands(page)
    assert found == ["python bench/recipe/x.py --a    b", "pvpo recipe table --nope=1 --rl a"]
    assert unknown_options(found[1]) == ["--nope"]
