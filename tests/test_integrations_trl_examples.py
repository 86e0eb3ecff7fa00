"""The TRL examples of docs/guides/integrations.md run as written with the catalog's SmolLM2: each
Python block of the page's TRL section is executed, in a folder holding a 2-question
`world/train.jsonl`, against the tiny retriever served on loopback. Only the sizes are cut (one
step, short completions) and the server's port given; a substitution the page no longer allows
fails the test, so the page cannot drift from what runs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

trl = pytest.importorskip("trl", reason="trl is in the dev extra (Python >= 3.11): pip install -e '.[dev]'")

from retriever_support import CountingRetriever  # noqa: E402

from pvpo.retriever.server import BackgroundServer  # noqa: E402
from pvpo.reward import get_reward  # noqa: E402

PAGE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "integrations.md"
QUESTIONS = [("What is the capital of Germany?", "Berlin"), ("Who discovered penicillin?", "Alexander Fleming")]


def trl_blocks() -> list[str]:
    """The Python blocks of the page's TRL section, in order."""
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index("## TRL") : text.index("## verl")]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


# SmolLM2 on 2 busy CPU cores (load average 8-11): the uncut tool-calling step took 849 s, this cut one 710 s
CUTS = {
    "max_steps=200": "max_steps=1",
    "max_completion_length=1024": "max_completion_length=48",
    "max_completion_length=2048": "max_completion_length=48",
    "per_device_train_batch_size=8": "per_device_train_batch_size=2",
    "num_generations=4": "num_generations=2",
    "anchor_rollouts=4": "anchor_rollouts=2",
    "max_tool_calling_iterations=6": "max_tool_calling_iterations=2",
}
SERVER = "http://127.0.0.1:8000"


def as_run_here(block: str, url: str) -> str:
    """`block` with the sizes cut to one short step of one prompt (`CUTS`) and the server's URL."""
    for old, new in {**CUTS, SERVER: url}.items():
        block = block.replace(old, new)
    assert "max_steps=1" in block and url in block, "the page's example no longer has the sizes this test cuts"
    return block


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    (tmp_path / "world").mkdir()
    rows = [{"id": f"q{i}", "question": q, "golden_answers": [a]} for i, (q, a) in enumerate(QUESTIONS)]
    (tmp_path / "world" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_the_page_has_a_tag_protocol_and_a_tool_calling_example_with_the_catalogs_smollm2() -> None:
    blocks = trl_blocks()
    assert len(blocks) == 2
    for block in blocks:
        assert 'resolve_model_path("smollm2-135m-instruct")' in block and "trainer.train()" in block
        assert SERVER in block and "max_steps=200" in block
    for old in CUTS:  # each size the slow tests cut is on the page, so none runs uncut unnoticed
        assert any(old in block for block in blocks), old


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_tag_protocol_example_trains_pvpo_on_smollm2_as_written(world: Path, tiny: Any) -> None:
    with BackgroundServer(CountingRetriever(tiny)) as server:
        scope: dict[str, Any] = {}
        exec(compile(as_run_here(trl_blocks()[0], server.url), str(PAGE), "exec"), scope)
    trainer, rollout = scope["trainer"], scope["rollout"]
    assert type(trainer).__name__ == "PVPOGRPOTrainer" and trainer.state.global_step == 1
    # 2 prompts x 2 anchor rollouts, then 1 prompt x 2 generations, each scored by our pvpo reward
    assert len(rollout.finished) == 6
    for ep in rollout.finished:
        assert ep["reward"] == pytest.approx(get_reward("pvpo")(ep["judged_response"], ep["golden_answers"]).total)
    assert (world / "runs" / "trl" / "anchor.json").is_file()
    rollout.close()


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_tool_calling_example_trains_grpo_on_smollm2_as_written(world: Path, tiny: Any) -> None:
    with BackgroundServer(CountingRetriever(tiny)) as server:
        scope: dict[str, Any] = {}
        exec(compile(as_run_here(trl_blocks()[1], server.url), str(PAGE), "exec"), scope)
    trainer, env = scope["trainer"], scope["env"]
    assert type(trainer).__name__ == "GRPOTrainer" and trainer.state.global_step == 1
    assert len(env.finished) == 2  # 1 prompt x 2 generations, one episode of our environment each
    for ep in env.finished:
        assert ep["reward"] == pytest.approx(get_reward("pvpo")(ep["judged_response"], ep["golden_answers"]).total)
    env.close()
