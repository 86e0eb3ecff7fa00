"""run.eval_every with a validation split: validation EM by step in the metrics, the held-out set
evaluated only at the end, and the checkpoint with the best validation EM kept beside the newest
through pruning and a resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_trainer_reference_dataset_source import P_APA, P_JOURNAL, P_OTHER, _musique_rows, _passages
from trainer_support import TINY, OverlapSearcher

from pvpo.trainer.config.schema import load_config


def _cfg(source: Path, *extra: str):
    return load_config(
        None,
        [
            *TINY,
            f"data.source={source}",
            "data.held_out_examples=2",
            "data.validation_examples=2",
            "data.max_train_examples=3",
            "data.shuffle_seed=0",
            "rollout.max_turns=2",
            "run.eval_every=1",
            "run.checkpoint_every=1",
            *extra,
        ],
    )


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "musique.json"
    path.write_text(json.dumps(_musique_rows(8)))
    return path


def scripted_validation(monkeypatch: pytest.MonkeyPatch, ems: dict[str, float]) -> list[str]:
    """Make each validation evaluation (tag `val_before`, `val_step<k>`) report EM `ems[tag]`; the
    tags asked, in order."""
    from pvpo.trainer import loop

    asked: list[str] = []
    real = loop.Trainer.evaluate

    def evaluate(self, tag, examples=None, *args):
        out = real(self, tag, examples, *args)
        if examples is not None:  # the validation split
            asked.append(tag)
            out = {**out, "eval/accuracy": ems[tag]}
        return out

    monkeypatch.setattr(loop.Trainer, "evaluate", evaluate)
    return asked


def test_validation_is_watched_every_k_steps_and_the_held_out_set_only_at_the_end(source, tmp_path) -> None:
    from pvpo.trainer.loop import train

    searcher = OverlapSearcher(_passages(P_JOURNAL, P_APA, P_OTHER))
    result = train(_cfg(source, "run.steps=2"), tmp_path / "run", searcher=searcher, show_progress=False)
    rows = result.metrics
    assert all("val/accuracy" in r and r["val/n"] == 2 for r in rows)
    # the held-out set: before RL and after the last step, never in between
    assert ["eval/accuracy" in r for r in rows] == [False, True]
    assert set(result.eval_em) == {"before", "after"}
    curve = json.loads((tmp_path / "run" / "checkpoints" / "best.json").read_text())
    assert [p["step"] for p in curve["points"]] == [0, 1, 2]
    # each point keeps every validation question's EM, in the order the curve names them: steps pair up
    assert len(curve["questions"]) == 2 and all(len(p["em"]) == 2 for p in curve["points"])
    assert result.validation == curve


def test_the_best_validation_checkpoint_survives_pruning_and_a_resume(source, tmp_path, monkeypatch) -> None:
    from test_trainer_loop import Crash, crash_after_logging

    from pvpo.trainer.loop import train

    ems = {"val_before": 0.2, "val_step1": 0.5, "val_step2": 0.3, "val_step3": 0.5, "val_step4": 0.1, "val_step5": 0.7}
    asked = scripted_validation(monkeypatch, ems)
    searcher = OverlapSearcher(_passages(P_JOURNAL, P_APA, P_OTHER))
    run = tmp_path / "run"
    cfg = _cfg(source, "run.steps=5")
    with monkeypatch.context() as m, pytest.raises(Crash):
        crash_after_logging(m, 4)
        train(cfg, run, searcher=searcher, show_progress=False)
    ckpts = run / "checkpoints"
    # the newest two (2, 3) and step 1, the best; a tie (step 3: 0.5) keeps the earlier one
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_000001", "step_000002", "step_000003"]
    assert json.loads((ckpts / "best.json").read_text())["best"] == {
        "step": 1,
        "accuracy": 0.5,
        "checkpoint": "step_000001",
    }
    result = train(cfg, run, resume=True, searcher=searcher, show_progress=False)
    assert asked == ["val_before", "val_step1", "val_step2", "val_step3", "val_step4", "val_step4", "val_step5"]
    assert [p["step"] for p in result.validation["points"]] == [0, 1, 2, 3, 4, 5]
    assert result.validation["best"] == {"step": 5, "accuracy": 0.7, "checkpoint": "step_000005"}
    # step 1 was the best until step 5: pruned once it no longer was
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_000004", "step_000005"]


def test_a_damaged_best_record_keeps_every_checkpoint_instead_of_pruning_blind(tmp_path: Path) -> None:
    from pvpo.trainer.state.checkpoint import note_checkpoint, prune_checkpoints

    for s in (1, 2, 3):
        note_checkpoint(tmp_path, f"step_{s:06d}")  # named in the manifest, as save_checkpoint does
        (tmp_path / f"step_{s:06d}").mkdir()
    (tmp_path / "best.json").write_text("{not json")
    prune_checkpoints(tmp_path, keep=1)
    assert len(list(tmp_path.glob("step_*"))) == 3
    (tmp_path / "best.json").write_text(
        json.dumps({"best": {"step": 1, "accuracy": 0.3, "checkpoint": "step_000001"}, "points": []})
    )
    prune_checkpoints(tmp_path, keep=1)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000001", "step_000003"]
