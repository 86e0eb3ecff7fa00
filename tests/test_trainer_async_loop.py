"""Rollouts beside the update (`rollout.max_staleness`, `trainer/steps/pipelined.py`) on tiny synthetic
runs: the pipelined steps at eta = 0 reproduce the synchronous loop figure for figure, a resumed
run at eta = 0 equals an unbroken one, at eta = 1 a run trains on episodes one version old and
resumes, regenerating the episodes its checkpoint left in flight, and its updates weigh each token
by the decoupled objective's pi_prox / pi_behav, checked against a hand recomputation."""

from __future__ import annotations

import pytest
from test_trainer_loop import Crash, crash_after_logging
from trainer_support import TINY, WORLD, OverlapSearcher

from pvpo.trainer.config.schema import load_config


def _figures(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(("time/", "mem/"))}


def _pipelined_at_eta_0(cfg, run_dir, searcher):
    """`Trainer.run` with the pipelined steps forced on at eta = 0."""
    from pvpo.trainer import loop
    from pvpo.trainer.steps.pipelined import PipelinedSteps

    class Pipelined(loop.Trainer):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.steps = PipelinedSteps(self)

    run_dir.mkdir(parents=True)
    data = loop.load_data(cfg, run_dir)
    start = loop.prepare_run(cfg, run_dir, data, searcher, show_progress=False)
    with Pipelined(cfg, run_dir, data, searcher, start, show_progress=False) as trainer:
        return trainer.run()


@pytest.mark.parametrize(
    "estimator",
    [
        ["algorithm.estimator=pvpo", "algorithm.group_sampling.enabled=true"],  # episodes stream in, GT rows per prompt
        ["algorithm.estimator=grpo"],  # whole groups
    ],
    ids=["pvpo-streamed", "grpo-groups"],
)
def test_pipelined_steps_at_eta_0_reproduce_every_figure_of_the_synchronous_loop(tmp_path, estimator):
    from pvpo.trainer.loop import train

    cfg = load_config(None, TINY + estimator + ["run.steps=3", "rollout.temperature=1.0"])
    searcher = OverlapSearcher(WORLD.passages)
    sync = train(cfg, tmp_path / "sync", searcher=searcher, show_progress=False)
    piped = _pipelined_at_eta_0(cfg, tmp_path / "piped", searcher)
    assert [m["step"] for m in piped.metrics] == [1, 2, 3]
    for a, b in zip(sync.metrics, piped.metrics, strict=True):
        figures = _figures(a)
        assert figures == {k: b[k] for k in figures}, a["step"]
        assert b["stale/lag_0"] == 1.0  # every token sampled by the policy being updated
    assert sync.eval_after == piped.eval_after


def test_a_resumed_run_at_eta_0_equals_an_unbroken_one_figure_for_figure(tmp_path, monkeypatch):
    from pvpo.trainer.loop import train

    cfg = load_config(None, TINY + ["run.steps=3", "run.checkpoint_every=1", "rollout.max_staleness=0"])
    searcher = OverlapSearcher(WORLD.passages)
    with monkeypatch.context() as m, pytest.raises(Crash):
        crash_after_logging(m, 2)
        train(cfg, tmp_path / "run", searcher=searcher, show_progress=False)
    resumed = train(cfg, tmp_path / "run", resume=True, searcher=searcher, show_progress=False)
    straight = train(cfg, tmp_path / "straight", searcher=searcher, show_progress=False)
    assert [m["step"] for m in resumed.metrics] == [1, 2, 3]
    assert [_figures(m) for m in resumed.metrics] == [_figures(m) for m in straight.metrics]


def test_eta_1_trains_on_episodes_one_version_old_and_resumes_regenerating_those_in_flight(tmp_path, monkeypatch):
    from pvpo.trainer.loop import train

    cfg = load_config(None, TINY + ["run.steps=3", "run.checkpoint_every=1", "rollout.max_staleness=1"])
    searcher = OverlapSearcher(WORLD.passages)
    straight = train(cfg, tmp_path / "straight", searcher=searcher, show_progress=False)
    rows = straight.metrics
    assert [m["step"] for m in rows] == [1, 2, 3]
    assert rows[0]["stale/lag_0"] == 1.0  # step 1's episodes: all sampled by the initial policy
    # later steps' episodes started while the update before them ran: one version old
    assert all(r["stale/lag_1"] > 0 and r["stale/max"] <= 2 for r in rows[1:])  # eta + 1: a straggler's first turns
    assert all(0 <= r["stale/late_frac"] <= 1 for r in rows) and rows[0]["stale/late_frac"] == 0
    assert all(0 <= r["time/engine_idle_frac"] <= 1 and r["time/update_wait_s"] >= 0 for r in rows)

    with monkeypatch.context() as m, pytest.raises(Crash):
        crash_after_logging(m, 2)
        train(cfg, tmp_path / "run", searcher=searcher, show_progress=False)
    resumed = train(cfg, tmp_path / "run", resume=True, searcher=searcher, show_progress=False)
    assert [m["step"] for m in resumed.metrics] == [1, 2, 3]
    # step 1's checkpoint left step 2's (and 3's) episodes in flight: sampled again, and counted
    assert resumed.metrics[1]["pipeline/regenerated_episodes"] > 0
    assert "pipeline/regenerated_episodes" not in resumed.metrics[2]
    # resumed at version 1, the episodes of step 2 are sampled by the policy they train
    assert resumed.metrics[1]["stale/lag_0"] == 1.0


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("rollout.max_staleness=true", "rollout.max_staleness"),  # YAML's true / on: not 1
        ("rollout.max_staleness=on", "rollout.max_staleness"),
        ("rollout.max_staleness=100000", "rollout.max_staleness"),  # wrote 100,076 keys a metrics row
        ("rollout.max_staleness=1000000000000", "rollout.max_staleness"),  # planned forever, no step
        ("algorithm.estimator=v05", "rollout.max_staleness=1: algorithm.estimator=v05"),  # refused after setup before
    ],
)
def test_a_staleness_that_cannot_run_is_refused_at_config_load_in_one_line_before_any_file(tmp_path, override, named):
    from typer.testing import CliRunner

    from pvpo.cli import app

    overrides = [override] if "max_staleness" in override else [override, "rollout.max_staleness=1"]
    res = CliRunner().invoke(app, ["train", "--run-dir", str(tmp_path / "run"), *overrides])
    assert res.exit_code == 2, res.output
    assert named in res.output and "Traceback" not in res.output
    assert [line for line in res.output.splitlines() if named in line], res.output
    assert not (tmp_path / "run").exists()  # refused before anything was written


def _varied_reward() -> str:
    """A reward that differs between a group's rollouts (a random tiny policy never answers, so
    every built-in reward would be 0 and no update would train)."""
    from pvpo.reward.rewards import REWARDS, RewardResult, register_reward

    name = "test_length_mod_7"
    if name not in REWARDS.names():

        @register_reward(name)
        def _length(response, golds, protocol):
            return RewardResult(total=(len(response) % 7) / 6)

    return name


def test_at_eta_1_the_update_trains_with_the_decoupled_weights_pi_prox_over_pi_behav_of_each_token(
    tmp_path, monkeypatch
):
    """A run at eta 1 whose updates train (non-zero gradient): every sampled token's weight in the
    update is min(pi_prox / pi_behav, cap), both recomputed here by hand from the weights of the
    versions involved (pi_behav: the version that sampled the token; pi_prox: the update's start)."""
    import copy
    import math

    import torch

    from pvpo.trainer import loop
    from pvpo.trainer.model import update

    cfg = load_config(
        None,
        TINY
        + ["algorithm.estimator=grpo", f"algorithm.reward={_varied_reward()}", "rollout.max_staleness=1"]
        + ["run.steps=3", "optim.lr=0.02", "optim.epochs=2", "rollout.temperature=1.0"],
    )
    seen: list[dict] = []
    learn, denominator = loop.Trainer.learn, update.importance_denominator

    def recording_learn(self, step, trajs, *args, **kwargs):
        seen.append({"step": step, "trajs": copy.deepcopy(trajs), "weights": copy.deepcopy(self.model.state_dict())})
        seen[-1]["model"] = self.model
        return learn(self, step, trajs, *args, **kwargs)

    def recording_denominator(lp, batch, correction):
        old, w = denominator(lp, batch, correction)
        if "used" not in seen[-1]:  # the whole batch's, before the first optimizer step (epochs=2)
            seen[-1]["used"] = w.detach().clone()
        return old, w

    monkeypatch.setattr(loop.Trainer, "learn", recording_learn)
    monkeypatch.setattr(update, "importance_denominator", recording_denominator)
    rows = loop.train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False).metrics
    assert all(r["grad_norm"] > 0 for r in rows), [r["grad_norm"] for r in rows]
    cap = cfg.rollout.importance_correction.cap

    def logprobs(weights, traj) -> list[float]:
        model = copy.deepcopy(seen[0]["model"])
        model.load_state_dict(weights)
        ids = torch.tensor([traj.prompt_ids + traj.response_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(traj.prompt_ids) - 1 : -1].float()
        lp = torch.log_softmax(logits / cfg.rollout.temperature, dim=-1)
        return lp.gather(-1, torch.tensor(traj.response_ids)[:, None]).squeeze(-1).tolist()

    version_weights = {s["step"] - 1: s["weights"] for s in seen}
    stale_moved = 0
    for s in seen[1:]:
        assert len(s["used"]) == len(s["trajs"])
        for i, traj in enumerate(s["trajs"]):
            prox = logprobs(s["weights"], traj)
            behav = {v: logprobs(version_weights[v], traj) for v in set(traj.versions) if v >= 0}
            for p, (m, v) in enumerate(zip(traj.loss_mask, traj.versions, strict=True)):
                if not m:
                    assert float(s["used"][i, p]) == 0.0
                    continue
                assert abs(traj.old_logprobs[p] - behav[v][p]) < 1e-4  # the sampler's pi_behav is version v's
                hand = min(math.exp(prox[p] - behav[v][p]), cap)
                assert abs(float(s["used"][i, p]) - hand) < 1e-3 * max(1.0, hand), (s["step"], i, p, v)
                stale_moved += v < s["step"] - 1 and abs(hand - 1) > 1e-2
    assert stale_moved, "no stale token's weight differed from 1: the correction was never exercised"


def test_rollout_decoupled_false_trains_naive_ppo_ahead_of_the_update_for_the_ablation():
    from pvpo.trainer.model.update import importance_for

    def enabled(*overrides: str) -> bool:
        return importance_for(load_config(None, list(overrides)).rollout).enabled

    assert enabled("rollout.max_staleness=2")  # the decoupled objective: the behaviour weight forced on
    assert not enabled("rollout.max_staleness=2", "rollout.decoupled=false")  # ratio against pi_behav, no weight
    assert enabled("rollout.max_staleness=2", "rollout.decoupled=false", "rollout.importance_correction.enabled=true")
    assert not enabled("rollout.max_staleness=0")  # the synchronous loop: as the section says
