"""`episodes.jsonl`: the episodes a training step sampled, kept for `pvpo view` (whole groups, GT
rows with their pi_gt, every row's advantage), and its reading after a resume."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from trainer_support import TINY, WORLD, OverlapSearcher

from pvpo.atomic import append_jsonl
from pvpo.envs.data import QAExample
from pvpo.trainer.config.schema import RunConfig, load_config
from pvpo.trainer.rollout.trajectory import Trajectory
from pvpo.trainer.state.episode_log import kept_rows, log_step_episodes, read_episode_log, row_advantages


class CharTokenizer:
    """Decodes ids as characters: enough for a GT row's text."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


def _traj(uid: str, reward: float, *, gt: bool = False, text: str = "") -> Trajectory:
    t = Trajectory(uid, [1, 2])
    ids = [ord(c) for c in (text or "<answer> x </answer>")]
    if gt:
        t.append_model(ids[:5], [-0.5] * 5, "reference")
        t.append_env(ids[5:8])
        t.append_model(ids[8:], [-0.25] * len(ids[8:]), "reference")
        t.is_gt, t.gt_logprobs, t.finish_reason = True, list(t.old_logprobs), "gt"
    else:
        t.append_model(ids, [-1.0] * len(ids))
        t.response_text = text or "<answer> x </answer>"
        t.finish_reason = "answer"
    t.reward, t.accuracy, t.prediction = reward, reward, "x" if reward else "y"
    t.reward_components = {"format": 1.0, "r_acc": reward}
    return t


def test_kept_rows_are_whole_groups_in_a_seeded_order_until_k_are_kept() -> None:
    uids = ["a", "a", "b", "b", "c", "c", "a"]  # a's GT row comes after the other groups' rows
    rows = kept_rows(uids, 3, seed=0, step=1)
    groups = [uids[i] for i in rows]
    assert len(rows) >= 3 and len(set(groups)) == 2  # the group that reaches k is kept whole
    for g in set(groups):
        assert sorted(i for i in rows if uids[i] == g) == [i for i, u in enumerate(uids) if u == g]
    assert rows == kept_rows(uids, 3, seed=0, step=1)
    orders = {tuple(uids[i] for i in kept_rows(uids, 1, seed=0, step=s)) for s in range(1, 30)}
    assert len(orders) == 3  # every group is drawn first at some step
    assert kept_rows(uids, 0, seed=0, step=1) == []


def test_token_level_advantages_are_averaged_over_model_tokens_only() -> None:
    adv = torch.tensor([[1.0, 3.0, 100.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert row_advantages(adv, mask) == [2.0, 2.0]
    assert row_advantages(torch.tensor([0.5, -0.5]), mask) == [0.5, -0.5]


def test_a_steps_line_holds_every_rows_advantage_and_the_kept_episodes_with_gt_pi(tmp_path: Path) -> None:
    trajs = [_traj("ds/q1", 1.0), _traj("ds/q1", 0.0), _traj("ds/q2", 0.0), _traj("ds/q2", 0.0)]
    trajs.append(_traj("ds/q2", 1.0, gt=True, text="<search> who </search><answer> x </answer>"))
    adv = torch.tensor([0.5, -0.5, 0.0, 0.0, 1.0])
    examples = [QAExample("ds/q1", "First?", ("x",)), QAExample("ds/q2", "Second?", ("x",))]
    path = tmp_path / "episodes.jsonl"
    run = RunConfig(keep_episodes=10, seed=3)
    log_step_episodes(path, 7, trajs, adv, torch.ones(5, 40), examples, CharTokenizer(), run)
    [line] = [json.loads(x) for x in path.read_text().splitlines()]
    assert line["step"] == 7
    assert [(r["uid"], r["advantage"], r["is_gt"]) for r in line["rows"]] == [
        ("ds/q1", 0.5, False),
        ("ds/q1", -0.5, False),
        ("ds/q2", 0.0, False),
        ("ds/q2", 0.0, False),
        ("ds/q2", 1.0, True),
    ]
    episodes = {(e["uid"], e["is_gt"], e["advantage"]): e for e in line["episodes"]}
    assert len(line["episodes"]) == 5
    gt = episodes[("ds/q2", True, 1.0)]
    assert gt["question"] == "Second?" and gt["golden_answers"] == ["x"]
    assert gt["response"] == "<search> who </search><answer> x </answer>"  # decoded: a GT row has no text
    assert gt["pi_gt"]["source"] == "reference"
    n_model = len("<search> who </search><answer> x </answer>") - 3
    assert gt["pi_gt"]["tokens"] == n_model
    assert gt["pi_gt"]["logprob"] == -0.5 * 5 - 0.25 * (n_model - 5)  # model tokens only, not the env's 3
    assert gt["format_ok"] and gt["em"] == 1.0 and gt["stop_reason"] == "gt"
    policy = episodes[("ds/q1", False, 0.5)]
    assert "pi_gt" not in policy and policy["em"] == 1.0 and policy["reward_components"]["r_acc"] == 1.0


def test_nothing_is_written_when_no_episode_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "episodes.jsonl"
    trajs = [_traj("ds/q1", 1.0)]
    log_step_episodes(
        path, 1, trajs, torch.zeros(1), torch.ones(1, 40), [], CharTokenizer(), RunConfig(keep_episodes=0)
    )
    assert not path.exists()


def test_reading_keeps_the_line_written_last_for_a_step_and_drops_steps_a_resume_has_not_redone(
    tmp_path: Path,
) -> None:
    path = tmp_path / "episodes.jsonl"
    # steps 1-3 logged, a crash, a resume from step 1's checkpoint redoes step 2 and is stopped again
    append_jsonl(path, [{"step": s, "rows": [], "episodes": [], "run": "first"} for s in (1, 2, 3)])
    append_jsonl(path, [{"step": 2, "rows": [], "episodes": [], "run": "resumed"}])
    assert [(r["step"], r["run"]) for r in read_episode_log(path)] == [(1, "first"), (2, "resumed")]
    assert read_episode_log(tmp_path / "absent.jsonl") == []


def test_a_training_run_writes_each_steps_episodes_gt_rows_included(tmp_path: Path) -> None:
    from pvpo.trainer.loop import train

    overrides = [
        "run.steps=2",
        "run.checkpoint_every=0",
        "run.keep_episodes=100",
        "algorithm.group_sampling.enabled=true",
        "algorithm.group_sampling.drop_threshold=1.0",
        "algorithm.group_sampling.gt_threshold=0.0",
        "algorithm.gt.source=oracle",
        "algorithm.gt.replace_per_group=1",
    ]
    cfg = load_config(None, TINY + overrides)
    train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    steps = read_episode_log(tmp_path / "run" / "episodes.jsonl")
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert len(s["rows"]) == cfg.data.prompts_per_step * cfg.rollout.n  # a GT row replaces a sample
        assert len(s["episodes"]) == len(s["rows"])  # keep_episodes above the step's rows: all kept
        questions = {q.uid: q.question for q in WORLD.questions("train")}
        assert all(e["question"] == questions[e["uid"]] for e in s["episodes"])
        gts = [e for e in s["episodes"] if e["is_gt"]]
        assert gts and all(e["pi_gt"]["source"] == "script" and e["pi_gt"]["logprob"] == 0.0 for e in gts)
        assert all("<answer>" in e["response"] for e in gts)  # the oracle's answer, decoded from its ids
        sampled = [e for e in s["episodes"] if not e["is_gt"]]
        assert all(len(p) == 2 for e in sampled for p in e["passages"])  # topk 2 per search, with ids and scores
