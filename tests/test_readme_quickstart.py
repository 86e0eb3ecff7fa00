"""The README's quick start works as written: its code block (between the `quickstart` snippet
markers, which the documentation site's quick start page includes too) runs in bash, on the 3
questions it ships in `tests/fixtures/quickstart`, in a fresh clone of the checkout, with the
venv's `bin` first on PATH as `source .venv/bin/activate` puts it, and leaves nothing in the clone
outside `runs/` (git status, ignored files included). The one substitution is the server's port
(8000 may be taken on the machine running the suite)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from clone_support import free_port, fresh_clone, outside_runs, run_block

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def snippet(name: str, text: str | None = None) -> str:
    """The code of the fenced block between README's `--8<-- [start:name]` and `[end:name]` markers."""
    text = README.read_text(encoding="utf-8") if text is None else text
    found = re.search(rf"--8<-- \[start:{name}\][^\n]*\n(.*?)\n[^\n]*--8<-- \[end:{name}\]", text, re.S)
    if found is None:
        raise AssertionError(f"README.md has no `{name}` section (`--8<-- [start:{name}]` ... `[end:{name}]`)")
    block = re.search(r"```[a-z]*\n(.*?)```", found.group(1), re.S)
    if block is None:
        raise AssertionError(f"README.md's `{name}` section holds no fenced code block")
    return block.group(1)


def commands(script: str) -> list[str]:
    """The script's commands: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", script)
    return [
        " ".join(line.split(" #")[0].split())
        for line in joined.splitlines()
        if line.strip() and not line.startswith("#")
    ]


def test_the_quick_start_waits_for_the_server_writes_under_runs_and_its_limit_fits_its_data() -> None:
    script = snippet("quickstart")
    lines = commands(script)
    serve = next(i for i, line in enumerate(lines) if "retriever serve" in line)
    first_eval = next(i for i, line in enumerate(lines) if line.startswith("pvpo eval"))
    assert any("/health" in line for line in lines[serve + 1 : first_eval]), "wait for /health before `pvpo eval`"
    for flag in ("--out", "--corpus", "--index"):
        for value in re.findall(rf"{flag}[ =](\S+)", script):
            assert value.startswith(("$R", "runs/")), f"{flag} {value}: write under runs/"
    limit = int(re.search(r"--limit (\d+)", script).group(1))  # type: ignore[union-attr]
    questions = re.search(r"^Q=(\S+)", script, re.M).group(1)  # type: ignore[union-attr]
    assert limit <= len(json.loads((REPO / questions).read_text(encoding="utf-8")))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_quick_start_runs_as_written_in_a_fresh_clone_and_writes_only_under_runs(tmp_path: Path) -> None:
    script = snippet("quickstart")
    assert "8000" in script
    port = str(free_port())
    clone = fresh_clone(tmp_path / "clone")
    assert outside_runs(clone) == []
    body = script.replace("8000", port) + "\nkill %1\nwait || true\n"
    rc, out = run_block(body, clone, tmp_path / "quickstart.log", timeout=360, env={"PVPO_PROGRESS_EVERY_S": "5"})
    assert rc == 0, out[-4000:]
    runs = list((clone / "runs" / "quickstart" / "eval").glob("*/metrics.json"))
    assert len(runs) == 1, out[-4000:]
    metrics = json.loads(runs[0].read_text())
    assert metrics["n"] == 3 and metrics["settings"]["repetition_stop"] > 0
    assert (clone / "runs" / "quickstart" / "episodes.html").stat().st_size > 0
    assert re.search(r"torch: \d+ CPU thread", out)  # chosen for the machine, and said so
    assert "ModuleNotFoundError" not in out and "Traceback" not in out
    assert outside_runs(clone) == [], "the quick start wrote outside runs/"
