"""The first-agent block of docs/quickstart.md (between its `first-agent` markers) runs as written,
shortened: in a fresh clone, on the 3 shipped HotpotQA questions given to `pvpo data get` as a local
copy (`--from`, FlashRAG's layout), with one SFT step of the catalog's SmolLM2 on 1 question and 1
held out, and the server on a free port. It fetches, warm-starts, serves the run's index, evaluates
the warm start with `pvpo eval` (format and searches reported) and writes the episodes' page, all
under `runs/`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from clone_support import free_port, fresh_clone, outside_runs, run_block
from test_envs_data_get import local_copy
from test_readme_quickstart import commands

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "quickstart.md"


def first_agent_block() -> str:
    """The fenced block between the page's `first-agent` markers."""
    text = PAGE.read_text(encoding="utf-8")
    found = re.search(r"<!-- first-agent[^\n]*\n```bash\n(.*?)```\n<!-- end of first-agent -->", text, re.S)
    assert found is not None, "docs/quickstart.md has no first-agent block"
    return found.group(1)


def shortened(block: str, copy: Path, port: int) -> str:
    """The block with the sizes cut to one SFT step on 3 questions, the data from `copy`, the port
    free; each replaced text must be in the block."""
    data = "'data.source=[runs/data/hotpotqa/train.jsonl]'"
    cuts = {
        "--limit 100 --out runs/data": f"--limit 3 --out runs/data --from {copy}",
        data: f"{data} data.held_out_examples=1 data.max_eval_examples=1 data.warm_start_examples=1 "
        "model.warm_start_steps=1 model.warm_start_batch_size=1",
        "8000": str(port),
    }
    for old, new in cuts.items():
        assert old in block, f"the first-agent block no longer holds {old!r}, which this test cuts"
        block = block.replace(old, new)
    return block


def test_the_first_agent_block_warm_starts_evaluates_and_views_under_runs() -> None:
    lines = commands(first_agent_block())
    order = [next(i for i, line in enumerate(lines) if line.startswith(c)) for c in ("pvpo data get", "pvpo train")]
    assert order == sorted(order)
    train = next(line for line in lines if line.startswith("pvpo train"))
    assert "--config first_agent" in train
    serve = next(i for i, line in enumerate(lines) if "retriever serve" in line)
    evaluate = next(i for i, line in enumerate(lines) if line.startswith("pvpo eval"))
    assert any("/health" in line for line in lines[serve + 1 : evaluate]), "wait for /health before `pvpo eval`"
    assert "initial_policy" in lines[evaluate] and "held_out.jsonl" in lines[evaluate]
    assert any(line.startswith("pvpo view") for line in lines[evaluate:])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_first_agent_block_runs_as_written_shortened_in_a_fresh_clone(tmp_path: Path) -> None:
    clone = fresh_clone(tmp_path / "clone")
    local_copy(tmp_path / "copy", "hotpotqa/train.jsonl")
    body = shortened(first_agent_block(), tmp_path / "copy", free_port()) + "\nkill %1\nwait || true\n"
    rc, out = run_block(body, clone, tmp_path / "first_agent.log", timeout=560)
    assert rc == 0, out[-4000:]
    run = clone / "runs" / "first-agent"
    assert "done: the warm start alone (run.steps=0)" in out
    assert (run / "initial_policy").is_dir() and not (run / "checkpoints").exists()  # no RL step ran
    assert len(json.loads((run / "warm_start.json").read_text())["losses"]) == 1
    metrics = json.loads((run / "eval" / "held_out" / "metrics.json").read_text())
    assert metrics["n"] == 1 and metrics["model"] == str((run / "initial_policy").resolve())
    assert {"format_ok", "searches", "em"} <= set(metrics)
    assert (clone / "runs" / "first-agent.html").stat().st_size > 0
    assert "Traceback" not in out
    assert outside_runs(clone) == [], "the first-agent block wrote outside runs/"


def test_run_steps_0_without_a_warm_start_is_refused_in_one_line() -> None:
    from pvpo.trainer.config.presets import resolve_config
    from pvpo.trainer.config.schema import ConfigError, load_config

    cfg = load_config(resolve_config("first_agent"), ["data.source=[hotpotqa/train.jsonl]"])
    assert cfg.run.steps == 0 and cfg.model.warm_start_steps > 0
    with pytest.raises(ConfigError, match=r"run.steps=0 runs the warm start alone: set model.warm_start_steps"):
        load_config(resolve_config("first_agent"), ["data.source=[hotpotqa/train.jsonl]", "model.warm_start_steps=0"])
