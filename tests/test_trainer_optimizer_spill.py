"""RL's optimizer state waits on disk while the policy is evaluated: empty during the evaluation,
bit-for-bit the same after it, the file gone, and a run's training unchanged by it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_trainer_reference_dataset_source import P_APA, P_JOURNAL, P_OTHER, _musique_rows, _passages
from test_trainer_validation import _cfg
from trainer_support import OverlapSearcher

from pvpo.trainer.model.optimizer_spill import optimizer_state_on_disk, remove_stale_spill, spillable, state_bytes


def _trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    for _ in range(3):
        _step(model, opt)
    return model, opt


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model(torch.linspace(-1, 1, 12).view(2, 6)).pow(2).sum().backward()
    opt.step()


def _state(opt: torch.optim.Optimizer) -> dict[int, dict[str, torch.Tensor]]:
    return {i: {k: v.clone() for k, v in s.items()} for i, s in enumerate(opt.state.values())}


def test_the_state_is_on_disk_inside_the_block_and_identical_after(tmp_path: Path) -> None:
    model, opt = _trained()
    before, path = _state(opt), tmp_path / "spill.pt"
    params = list(model.parameters())  # two float32 moments a weight, and a float32 step count a tensor
    assert state_bytes(opt) == 2 * 4 * sum(p.numel() for p in params) + 4 * len(params)
    with optimizer_state_on_disk(opt, path, distributed=False):
        assert not opt.state and path.is_file()
    assert not path.exists()
    after = _state(opt)
    assert before.keys() == after.keys()
    for i in before:
        assert before[i].keys() == after[i].keys()
        assert all(torch.equal(before[i][k], after[i][k]) for k in before[i])


def test_the_next_update_after_a_spill_equals_one_without(tmp_path: Path) -> None:
    spilled_model, spilled = _trained()
    kept_model, kept = _trained()
    with optimizer_state_on_disk(spilled, tmp_path / "spill.pt", distributed=False):
        pass
    _step(spilled_model, spilled)
    _step(kept_model, kept)
    for a, b in zip(spilled_model.parameters(), kept_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_an_error_inside_the_block_still_restores_the_state(tmp_path: Path) -> None:
    _, opt = _trained()
    before, path = _state(opt), tmp_path / "spill.pt"
    with pytest.raises(RuntimeError, match="evaluation failed"), optimizer_state_on_disk(opt, path, distributed=False):
        raise RuntimeError("evaluation failed")
    assert not path.exists()
    assert all(torch.equal(before[0][k], v) for k, v in next(iter(opt.state.values())).items())


def test_nothing_is_written_without_state_or_under_torchrun(tmp_path: Path) -> None:
    fresh = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())
    path = tmp_path / "spill.pt"
    with optimizer_state_on_disk(fresh, path, distributed=False):
        assert not path.exists()
    _, opt = _trained()
    with optimizer_state_on_disk(opt, path, distributed=True):
        assert opt.state and not path.exists()


def test_only_state_of_one_cpu_process_is_spilled() -> None:
    _, opt = _trained()
    assert spillable(opt, distributed=False)
    assert not spillable(opt, distributed=True)  # a sharded optimizer's state stays with its rank
    assert not spillable(torch.optim.AdamW(torch.nn.Linear(2, 2).parameters()), distributed=False)


def test_a_killed_runs_spill_file_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "optimizer_spill.pt"
    assert not remove_stale_spill(path)
    path.write_bytes(b"old state")
    assert remove_stale_spill(path) and not path.exists()


def test_evaluations_during_rl_run_without_the_optimizer_state_and_training_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pvpo.trainer import loop
    from pvpo.trainer.heldout import points
    from pvpo.trainer.model import optimizer_spill as spill

    source = tmp_path / "musique.json"
    source.write_text(json.dumps(_musique_rows(8)))
    seen: list[tuple[str, int, bool]] = []
    real, real_init = points.evaluate_current, loop.Trainer.__init__
    trainers: list[loop.Trainer] = []

    def recorded_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        trainers.append(self)

    def watched(policy, tag, *args, **kwargs):
        trainer = trainers[-1]
        seen.append((tag, len(trainer.optimizer.state), trainer.files.optimizer_spill.exists()))
        return real(policy, tag, *args, **kwargs)

    monkeypatch.setattr(loop.Trainer, "__init__", recorded_init)
    monkeypatch.setattr(loop, "evaluate_current", watched)

    def run(name: str) -> list[dict[str, float]]:
        searcher = OverlapSearcher(_passages(P_JOURNAL, P_APA, P_OTHER))
        result = loop.train(_cfg(source, "run.steps=2"), tmp_path / name, searcher=searcher, show_progress=False)
        assert not (tmp_path / name / "optimizer_spill.pt").exists()
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "mem/"))} for r in result.metrics]

    spilled = run("spilled")
    # before RL the optimizer has no state yet; every evaluation after an update ran with it on disk
    assert seen[0][:2] == ("before", 0)
    after_updates = [s for s in seen if s[0] not in ("before", "val_before")]
    assert after_updates and all(n == 0 and on_disk for _, n, on_disk in after_updates)
    monkeypatch.setattr(spill, "spillable", lambda *a, **k: False)
    assert run("kept") == spilled
