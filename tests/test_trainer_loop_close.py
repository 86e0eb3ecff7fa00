"""A training run shuts its rollout engines down (vLLM: its engine process and
its temporary `pvpo-vllm-*` copy of the model), also when the run fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_support import TINY, WORLD, OverlapSearcher

from pvpo.trainer.config.schema import load_config
from pvpo.trainer.rollout.hf_engine import HFEngine
from pvpo.trainer.state.metrics_log import MetricsLogger


class Boom(RuntimeError):
    pass


def test_train_closes_its_engine_when_done_and_when_a_step_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pvpo.trainer.loop import train

    closed: list[HFEngine] = []
    monkeypatch.setattr(HFEngine, "close", lambda self: closed.append(self))
    cfg = load_config(None, TINY + ["run.steps=1", "run.checkpoint_every=0", "algorithm.estimator=grpo"])
    searcher = OverlapSearcher(WORLD.passages)
    train(cfg, tmp_path / "ok", searcher=searcher, show_progress=False)
    assert len(closed) == 1

    def fail(self, step, metrics):  # type: ignore[no-untyped-def]
        raise Boom("while logging step 1")

    monkeypatch.setattr(MetricsLogger, "log", fail)
    with pytest.raises(Boom):
        train(cfg, tmp_path / "failed", searcher=searcher, show_progress=False)
    assert len(closed) == 2
