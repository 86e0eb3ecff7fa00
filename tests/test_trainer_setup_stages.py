"""The base evaluation and the warm start run before the Trainer is built (`setup.prepare_run`),
not inside it: the Trainer trains the start it is given, and a run gives the numbers it gave when
the Trainer ran them itself."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_support import TINY, WORLD, OverlapSearcher

from pvpo.trainer.config.schema import load_config

# captured at commit b9537b1, when constructing a Trainer ran the base evaluation and the warm
# start, by `_record` below (one core, `run.threads=1`)
FIXTURE = Path(__file__).parent / "fixtures" / "trainer_start_before_split.json"

STAGED = [*TINY, "model.warm_start_steps=4", "run.eval_base=true", "run.steps=2", "run.threads=1"]
CASES = {
    # PVPO with Group Sampling: anchor, partition and GT rows after the warm start
    "pvpo_gs": [*STAGED, "algorithm.group_sampling.enabled=true", "data.max_eval_examples=4", "run.eval_every=1"],
    # LoRA adapters and a frozen reference (KL), built by the Trainer on the warm-started weights
    "lora_kl": [*STAGED, "algorithm.group_sampling.enabled=true", "model.lora.enabled=true", "optim.kl_coef=0.01"],
}


def _timing(key: str) -> bool:
    """Keys that measure time or memory (they differ run to run): the rest must be equal."""
    return key.startswith(("time/", "mem/")) or key.endswith(("_s", "_seconds", "_s_per_epoch"))


def _weights(folder: Path) -> str:
    """A digest of the weights a policy folder holds, tensor by tensor in name order."""
    from safetensors.torch import load_file

    tensors = load_file(folder / "model.safetensors")
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode() + tensors[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _record(case: str, run_dir: Path) -> dict[str, Any]:
    """A run of `case` by the library's `train()`: its non-timing metrics by step, its
    warm_start.json (but the SFT's seconds), its held-out points and the weights it started from
    (the saved initial policy) and ended with (the last checkpoint)."""
    from pvpo.trainer.loop import train

    cfg = load_config(None, CASES[case])
    result = train(cfg, run_dir, searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    warm = json.loads((run_dir / "warm_start.json").read_text())
    return {
        "metrics": [{k: v for k, v in row.items() if not _timing(k)} for row in result.metrics],
        "warm_start": {k: v for k, v in warm.items() if not _timing(k)},
        "eval_before": result.eval_before,
        "eval_after": result.eval_after,
        "initial_policy": _weights(run_dir / "initial_policy"),
        "last_checkpoint": _weights(run_dir / "checkpoints" / f"step_{result.steps_done:06d}" / "policy"),
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_with_a_base_evaluation_and_a_warm_start_gives_the_numbers_it_gave_when_the_trainer_ran_them(
    tmp_path: Path, case: str
) -> None:
    expected = json.loads(FIXTURE.read_text())[case]
    assert json.loads(json.dumps(_record(case, tmp_path / "run"))) == expected


def _refuse_the_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    import pvpo.trainer.model.warmstart as sft
    from pvpo.trainer import setup

    def ran(*args: object, **kwargs: object) -> None:
        raise AssertionError("the base evaluation or the warm start ran")

    for module, name in ((setup, "base_evaluation"), (setup, "warm_start"), (sft, "warm_start")):
        monkeypatch.setattr(module, name, ran)


def test_constructing_a_trainer_runs_no_base_evaluation_and_no_warm_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pvpo.trainer.data import load_data
    from pvpo.trainer.loop import Trainer
    from pvpo.trainer.setup import policy_at_start

    cfg = load_config(None, CASES["pvpo_gs"])
    run = tmp_path / "run"
    run.mkdir()
    data = load_data(cfg, run)
    start = policy_at_start(cfg, run, data)  # the config asks both stages; none is run here
    _refuse_the_stages(monkeypatch)
    with Trainer(cfg, run, data, OverlapSearcher(WORLD.passages), start, show_progress=False) as trainer:
        assert trainer.result.warm_start_losses == [] and trainer.result.eval_base == {}
    assert not (run / "warm_start.json").exists() and not (run / "initial_policy").exists()


def test_a_resumed_run_reloads_its_initial_policy_and_reads_its_warm_start_record_without_running_either_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pvpo.trainer.data import load_data
    from pvpo.trainer.setup import prepare_run

    cfg = load_config(None, [*CASES["pvpo_gs"], "run.steps=0"])
    run, searcher = tmp_path / "run", OverlapSearcher(WORLD.passages)
    run.mkdir()
    first = prepare_run(cfg, run, load_data(cfg, run), searcher, show_progress=False)
    assert first.fresh and len(first.warm_start_losses) == 4 and first.eval_base
    _refuse_the_stages(monkeypatch)
    again = prepare_run(cfg, run, load_data(cfg, run), searcher, resume=True, show_progress=False)
    assert not again.fresh and again.resume and again.checkpoint is None
    assert (again.warm_start_losses, again.eval_base, again.eval_base_em, again.eval_base_scores) == (
        first.warm_start_losses,
        first.eval_base,
        first.eval_base_em,
        first.eval_base_scores,
    )
    assert all(torch.equal(a, b) for a, b in zip(again.model.parameters(), first.model.parameters(), strict=True))
