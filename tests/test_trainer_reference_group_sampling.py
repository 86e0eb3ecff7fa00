"""PVPO's second half: Group Sampling's partition, GT trajectories (sources, retries, cache, pi_gt
ratio, injection into groups), rollout-cost accounting, and the state a resume must see."""

from __future__ import annotations

import json

import pytest
import torch
from trainer_support import TINY, WORLD, OverlapSearcher

from pvpo.trainer.config.schema import ConfigError, load_config
from pvpo.trainer.model.update import gt_ratio_stats
from pvpo.trainer.reference.anchor import AnchorStat
from pvpo.trainer.reference.group_sampling import correctness, load_partition, partition, save_partition, savings
from pvpo.trainer.reference.gt_cache import GTCache, fetch_gt
from pvpo.trainer.rollout.trajectory import Trajectory, collate
from pvpo.trainer.state.cost import CostCounter


def _stat(acc: float) -> AnchorStat:
    return AnchorStat(mean_reward=acc, accuracy=acc, n=4)


# ---- partition ---------------------------------------------------------------------------------
def test_partition_drops_always_solved_keeps_mixed_and_marks_never_solved_for_gt():
    stats = {"a": _stat(1.0), "b": _stat(0.5), "c": _stat(0.0), "d": _stat(0.25)}
    part = partition(["a", "b", "c", "d", "a"], stats)
    assert (part.dropped, part.kept, part.gt) == (["a"], ["b", "d"], ["c"])
    assert part.pool == {"b", "c", "d"}
    assert part.fractions() == {"gs/dropped_frac": 0.25, "gs/kept_frac": 0.5, "gs/gt_frac": 0.25}


def test_partition_thresholds_are_configurable_and_a_missing_stat_is_named():
    stats = {"a": _stat(0.75), "b": _stat(0.25), "c": _stat(0.5)}
    part = partition(["a", "b", "c"], stats, drop_threshold=0.75, gt_threshold=0.25)
    assert (part.dropped, part.kept, part.gt) == (["a"], ["c"], ["b"])
    with pytest.raises(KeyError, match="'zz'"):
        partition(["a", "zz"], stats)
    with pytest.raises(ValueError, match="gt_threshold"):
        partition(["a"], stats, drop_threshold=0.5, gt_threshold=0.5)


def test_partition_survives_a_save_and_load_and_savings_count_the_dropped_groups(tmp_path):
    part = partition(["a", "b", "c"], {"a": _stat(1.0), "b": _stat(1.0), "c": _stat(0.0)}, computed_at_step=3)
    assert savings(part, rollouts_per_prompt=5, seconds_per_rollout=0.5) == {
        "gs/saved_rollouts_per_epoch": 10.0,
        "gs/saved_s_per_epoch": 5.0,
    }
    save_partition(part, tmp_path / "gs.json")
    back = load_partition(tmp_path / "gs.json")
    assert back is not None and (back.computed_at_step, back.dropped, back.gt) == (3, ["a", "b"], ["c"])
    assert load_partition(tmp_path / "absent.json") is None


# ---- GT sources and cache ----------------------------------------------------------------------
class ScriptedSource:
    """A GT source whose attempt k succeeds for the uids listed in `wins[k]`."""

    deterministic = False

    def __init__(self, wins: list[set[str]]) -> None:
        self.wins, self.calls = wins, []

    def generate(self, examples, *, attempt):
        self.calls.append([ex.uid for ex in examples])
        out = []
        for ex in examples:
            t = Trajectory(ex.uid, [1, 2], num_tool_calls=1)
            t.append_model([5], [-0.5])  # two model turns around an observation token
            t.append_env([6])
            t.append_model([7], [-0.25])
            t.reward = 1.0 if ex.uid in self.wins[attempt] else 0.1
            out.append(t)
        return out

    def close(self):
        pass


def test_fetch_gt_retries_up_to_attempts_keeps_only_correct_ones_and_remembers_failures(tmp_path):
    exs = WORLD.questions("train")[:3]
    a, b, c = (ex.uid for ex in exs)
    src = ScriptedSource([{a}, {b}, set()])
    cache = GTCache(tmp_path / "gt.json")
    seen = []
    counts = fetch_gt(exs, src, cache, attempts=3, min_reward=1.0, on_generated=seen.extend)
    assert src.calls == [[a, b, c], [b, c], [c]]
    assert len(seen) == 6
    assert counts == {
        "gt/asked": 3.0,
        "gt/generated": 2.0,
        "gt/failed": 1.0,
        "gt/attempts": 6.0,
        "gt/cached": 2.0,
        "gt/logprobs_endpoint": 0.0,
        "gt/logprobs_reference": 0.0,
        "gt/turns_endpoint": 0.0,
        "gt/turns_reference": 0.0,
        "gt/turns_sampler": 4.0,  # the 2 kept trajectories' own log-probs (no reference asked for)
        "gt/turns_script": 0.0,
    }
    again = GTCache(tmp_path / "gt.json")  # a resumed run: nothing recomputed
    assert a in again and b in again and c not in again and again.failed == {c: 3}
    src2 = ScriptedSource([{c}])
    assert fetch_gt(exs, src2, again, attempts=1, min_reward=1.0)["gt/asked"] == 0.0 and src2.calls == []


def test_a_deterministic_source_is_asked_once_per_prompt(tmp_path):
    exs = WORLD.questions("train")[:2]
    src = ScriptedSource([set(), set(), set()])
    src.deterministic = True
    fetch_gt(exs, src, GTCache(), attempts=3, min_reward=1.0)
    assert len(src.calls) == 1


def test_cached_gt_trajectory_is_injected_with_pi_gt_as_its_ratio_denominator(tmp_path):
    exs = WORLD.questions("train")[:1]
    cache = GTCache(tmp_path / "gt.json")
    fetch_gt(exs, ScriptedSource([{exs[0].uid}]), cache, attempts=1, min_reward=1.0)
    t = GTCache(tmp_path / "gt.json").records[exs[0].uid].trajectory(exs[0].uid)
    assert t.is_gt and t.old_logprobs == t.gt_logprobs == [-0.5, 0.0, -0.25]
    batch = collate([t, Trajectory("x", [1], [5], [1], [-1.0])], pad_id=0)
    logp = batch.old_logprobs.clone()
    logp[0, 0] += 0.5  # pi_theta / pi_gt = e^0.5 on the first GT token, 1 on the other model token
    stats = gt_ratio_stats(logp, batch)
    assert stats["gt/ratio_mean"] == pytest.approx((torch.e**0.5 + 1) / 2)
    assert stats["gt/ratio_max"] == pytest.approx(torch.e**0.5)
    assert "gt/above_clip_frac" not in stats  # no clip given
    # e^0.5 = 1.65 is past 1 + 0.28, the other token's 1.0 is not: half the GT tokens; past 1 + 1.0, none
    assert gt_ratio_stats(logp, batch, clip_high=0.28)["gt/above_clip_frac"] == pytest.approx(0.5)
    assert gt_ratio_stats(logp, batch, clip_high=1.0)["gt/above_clip_frac"] == 0.0
    assert gt_ratio_stats(logp[1:], collate([Trajectory("x", [1], [5], [1], [-1.0])], pad_id=0)) == {}


def test_oracle_source_writes_correct_trajectories_ending_at_the_answer_stop_string():
    from pvpo.envs.episode import EpisodeConfig
    from pvpo.trainer.model.policy import policy_from_config
    from pvpo.trainer.reference.gt_registry import GTContext, build_gt_source
    from pvpo.trainer.rollout.agent_loop import LoopConfig

    cfg = load_config(None, TINY)
    policy = policy_from_config(
        cfg.model,
        corpus_texts=[p.contents for p in WORLD.passages],
        tags=("think", "search", "information", "answer"),
        seed=0,
    )
    tok = policy.tokenizer
    ctx = GTContext(tok, OverlapSearcher(WORLD.passages), EpisodeConfig(max_turns=4, topk=2), LoopConfig(), WORLD)
    src = build_gt_source("oracle", cfg.algorithm.gt, ctx)
    exs = WORLD.questions("train")[:4]
    trajs = src.generate(exs, attempt=0)
    assert all(t is not None and t.reward == 1.0 and t.accuracy == 1.0 for t in trajs)
    assert all(t.old_logprobs == [0.0] * len(t.response_ids) for t in trajs)  # the oracle is deterministic
    assert all(
        tok.decode(t.response_ids).endswith("</answer>") and tok.eos_token_id not in t.response_ids for t in trajs
    )
    assert [t.num_tool_calls for t in trajs] == [ex.metadata["hops"] for ex in exs]


def test_an_endpoint_reply_gets_back_the_stop_string_the_server_stripped():
    from pvpo.reward import SEARCH_R1
    from pvpo.trainer.rollout.openai_client import restore_stop

    def close_open_block(text: str, protocol) -> str:  # what EndpointSource does with a "stop" reply
        return restore_stop(text, "stop", None, protocol)[0]

    assert close_open_block("<think>x</think>\n<search>who", SEARCH_R1) == "<think>x</think>\n<search>who</search>"
    assert close_open_block("<answer>Kelmo", SEARCH_R1) == "<answer>Kelmo</answer>"
    assert close_open_block("<search>a</search>", SEARCH_R1) == "<search>a</search>"


def test_model_source_needs_a_model_and_endpoint_needs_reference_logprobs():
    from pvpo.trainer.config.schema import ConfigError

    with pytest.raises(ConfigError, match="gt.model.path or gt.model.base_url"):
        load_config(None, ["algorithm.group_sampling.enabled=true", "algorithm.gt.source=model"])
    with pytest.raises(ConfigError, match="unknown GT source 'bogus'"):
        load_config(None, ["algorithm.gt.source=bogus"])


# ---- accuracy by the reward in use, and never-solved prompts without GT ----------------
def test_correctness_reads_the_rewards_own_correctness_or_the_metric_asked_for():
    golds = ["Paris"]
    # PVPO's reward: r_acc is cover-EM here ("in Paris" covers "Paris"), exact match is 0
    pvpo = {"format": 1.0, "r_acc": 1.0}
    assert correctness(1.0, pvpo, "in Paris", golds, "reward") == 1.0
    assert correctness(1.0, pvpo, "in Paris", golds, "em") == 0.0
    assert correctness(1.0, pvpo, "in Paris", golds, "cem") == 1.0
    assert correctness(1.0, pvpo, "in Paris", golds, "f1") == pytest.approx(2 / 3)
    # a format-only reward (0.1 floor) is not correctness: r_acc 0
    assert correctness(0.1, {"format": 1.0, "r_acc": 0.0}, "Rome", golds, "reward") == 0.0
    # Search-R1's format reward: 0.2 for a wrong, well-formed answer, its correctness is em
    assert correctness(0.2, {"em": 0.0, "format": 1.0}, "Rome", golds, "reward") == 0.0
    assert correctness(0.6, {"f1": 0.6, "format": 1.0}, "x", golds, "reward") == 0.6  # ReSearch: f1
    assert correctness(0.7, {}, None, golds, "reward") == 0.7  # no correctness component: the reward
    assert correctness(1.0, pvpo, None, golds, "em") == 0.0  # no answer: 0 on every metric
    with pytest.raises(ValueError, match="known: reward, em, cem, f1"):
        correctness(1.0, pvpo, "Paris", golds, "bleu")


def test_a_prompt_the_reference_solves_every_time_by_the_reward_is_dropped_even_at_em_zero(tmp_path):
    from types import SimpleNamespace

    from pvpo.trainer.reference.machinery import Reference

    exs = WORLD.questions("train")[:2]
    solved_by_cem, never = exs[0].uid, exs[1].uid
    gold = exs[0].golden_answers[0]

    def rollout(batch, seed, engine, temperature):
        out = []
        for ex in batch:
            ok = ex.uid == solved_by_cem  # "the answer: <gold>": cover-EM 1, exact match 0
            pred = f"the answer: {gold}" if ok else "nothing"
            out.append(
                Trajectory(
                    ex.uid, [1], [2], [1], [0.0], 1.0 if ok else 0.1, {"format": 1.0, "r_acc": float(ok)}, 0.0, pred
                )
            )
        return out

    engine = SimpleNamespace(wake_up=lambda: None, sleep=lambda: None)
    stats = {}
    for metric in ("reward", "em"):
        cfg = load_config(None, ["algorithm.group_sampling.enabled=true", f"algorithm.group_sampling.metric={metric}"])
        ref = Reference(cfg, tmp_path / metric, uses_anchor=True)
        ref.ensure_anchor(
            0,
            exs,
            rollout,
            policy_engine=engine,
            reference_engine=lambda: None,
            is_reference=True,
            seed=lambda *a: 0,
            show_progress=False,
        )
        assert ref.anchor is not None
        stats[metric] = ref.anchor.stats()
    assert stats["reward"][solved_by_cem].accuracy == 1.0 and stats["em"][solved_by_cem].accuracy == 0.0
    assert partition([e.uid for e in exs], stats["reward"]).dropped == [solved_by_cem]
    assert partition([e.uid for e in exs], stats["em"]).gt == [solved_by_cem, never]  # the old decision
    # the boundary: accuracy just below the drop threshold is kept, at it dropped
    part = partition(["a", "b", "c"], {"a": _stat(1.0 - 1e-6), "b": _stat(1.0), "c": _stat(1e-6)})
    assert (part.kept, part.dropped, part.gt) == (["a", "c"], ["b"], [])
    with pytest.raises(ConfigError, match="metric"):
        load_config(None, ["algorithm.group_sampling.metric=bleu"])


def test_never_solved_prompts_whose_gt_failed_leave_the_pool_are_counted_and_logged(tmp_path, monkeypatch, caplog):
    from pvpo.trainer.reference import machinery
    from pvpo.trainer.state.run_dir import RunDir

    cfg = load_config(None, ["algorithm.group_sampling.enabled=true", "algorithm.gt.attempts=2"])
    exs = WORLD.questions("train")[:4]
    a, b, c, d = (ex.uid for ex in exs)
    ref = machinery.Reference(cfg, tmp_path, uses_anchor=True)
    assert ref.anchor is not None
    for uid, acc in zip((a, b, c, d), (1.0, 0.5, 0.0, 0.0), strict=True):
        ref.anchor.update(uid, [acc] * 4, [acc] * 4)
    monkeypatch.setattr(machinery, "build_gt_source", lambda *args, **kw: ScriptedSource([{c}, set()]))
    with caplog.at_level("WARNING"):
        ref.ensure_group_sampling(exs, None, on_generated=lambda ts: None, reference_logprobs=None)  # type: ignore[arg-type]
    assert ref.partition is not None and ref.partition.gt == [c, d] and ref.partition.unavailable == [d]
    assert [ex.uid for ex in ref.pool(exs)] == [b, c]  # d: never solved, no GT -> out of the step
    assert ref.pop_report()["gt/unavailable"] == 1.0
    assert "1 never-solved prompt(s) have no GT trajectory" in caplog.text
    back = load_partition(RunDir(tmp_path).group_sampling)
    assert back is not None and back.unavailable == [d] and back.pool == {b, c}


# ---- cost accounting ---------------------------------------------------------------------------
def _t(tools: int, tokens: int) -> Trajectory:
    return Trajectory("u", [1], [3] * tokens, [1] * tokens, [0.0] * tokens, num_tool_calls=tools)


def test_cost_counter_counts_per_step_and_cumulatively_with_anchor_and_gt_included():
    c = CostCounter()
    c.add("anchor", [_t(2, 10)] * 4)
    c.add("gt", [_t(3, 7)], policy_tokens=False)
    c.add("train", [_t(1, 5), _t(0, 5)])
    m1 = c.step_metrics()
    assert (m1["cost/rollouts"], m1["cost/policy_tokens"], m1["cost/tool_calls"]) == (7, 50, 12)
    assert m1["cost/pvpo"] == pytest.approx(7 * 12 / 7)
    assert (m1["cost/cum_anchor_rollouts"], m1["cost/cum_gt_rollouts"], m1["cost/cum_gt_tokens"]) == (4, 1, 7)
    c.add("train", [_t(2, 4)])
    state = c.state_dict()
    m2 = c.step_metrics()
    assert (m2["cost/rollouts"], m2["cost/cum_rollouts"], m2["cost/cum_tool_calls"], m2["cost/cum_pvpo"]) == (
        1,
        8,
        14,
        14,
    )
    d = CostCounter()
    d.load_state_dict(state)
    assert d.step_metrics() == m2
    with pytest.raises(ValueError, match="known: train, anchor, gt"):
        c.add("bogus", [])


def test_cost_is_exported_per_kind_so_the_papers_measure_can_be_read_beside_the_all_in_one():
    c = CostCounter()
    c.add("anchor", [_t(2, 10)] * 4)
    c.add("gt", [_t(3, 7)], policy_tokens=False)
    c.add("train", [_t(1, 5), _t(0, 5)])
    m1 = c.step_metrics()
    assert (m1["cost/train_tool_calls"], m1["cost/anchor_tool_calls"], m1["cost/gt_tool_calls"]) == (1, 8, 3)
    assert m1["cost/pvpo"] == m1["cost/tool_calls"] == 12  # the all-in total stays
    c.add("train", [_t(4, 4)])
    m2 = c.step_metrics()
    assert (m2["cost/train_tool_calls"], m2["cost/anchor_tool_calls"], m2["cost/gt_tool_calls"]) == (4, 0, 0)
    # the paper's Fig. 4 cost (policy rollouts x mean tool calls, no anchor term) and the all-in one
    assert (m2["cost/cum_train_tool_calls"], m2["cost/cum_anchor_tool_calls"], m2["cost/cum_gt_tool_calls"]) == (
        5,
        8,
        3,
    )
    assert m2["cost/cum_pvpo"] == 16


# ---- end to end on the tiny world --------------------------------------------------------------
GS = TINY + [
    "algorithm.group_sampling.enabled=true",
    "rollout.max_turns=3",
    "rollout.max_response_tokens=200",
    "rollout.n=3",
    "algorithm.gt.replace_per_group=2",
]


def test_training_with_group_sampling_injects_gt_and_logs_its_ratio_fractions_and_cost(tmp_path):
    from pvpo.trainer.loop import train

    cfg = load_config(None, GS + ["run.steps=2"])
    result = train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    m1, m2 = result.metrics
    # a random policy solves nothing: every prompt is given GT, 2 of each group of 3 replaced
    assert m1["gs/gt_frac"] == 1.0 and m1["gs/dropped_frac"] == 0.0
    assert m1["gt/fraction"] == pytest.approx(2 / 3) and m2["gt/fraction"] == pytest.approx(2 / 3)
    assert 0.0 < m1["gt/ratio_mean"] < 1.0  # pi_theta / pi_gt with pi_gt = 1 (the deterministic oracle)
    assert m1["cost/cum_anchor_rollouts"] == 2 * m1["gs/pool_size"]  # M=2 reference rollouts per prompt
    sampled = 2 * 3 - 2 * 2  # 2 prompts x N=3, 2 of each group injected, not generated
    assert m1["cost/rollouts"] == m1["cost/cum_anchor_rollouts"] + m1["cost/cum_gt_rollouts"] + sampled
    assert m2["cost/rollouts"] == sampled and m2["cost/cum_rollouts"] == m1["cost/cum_rollouts"] + sampled
    cache = json.loads((tmp_path / "run" / "gt_cache.json").read_text())
    assert len(cache["records"]) == m1["gt/generated"] > 0


def test_one_rollout_of_each_group_stays_the_policys_own_whatever_replace_per_group_asks(tmp_path):
    from pvpo.trainer.loop import train

    cfg = load_config(None, GS + ["run.steps=1", "rollout.n=2", "algorithm.gt.replace_per_group=5"])
    (m,) = train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False).metrics
    assert m["gs/gt_frac"] == 1.0 and m["gt/fraction"] == pytest.approx(0.5)
    assert m["cost/rollouts"] == m["cost/cum_anchor_rollouts"] + m["cost/cum_gt_rollouts"] + 2


@pytest.mark.slow
def test_resume_uses_the_anchor_and_gt_state_of_the_checkpointed_step(tmp_path, monkeypatch):
    """Anchor refreshed every step from the current policy, checkpoints every 2 steps, a crash after
    step 4 is logged but before its checkpoint: on resume, steps 3-4 must see the anchor computed at
    step 2 (restored from checkpoint 2), not the step-3 anchor the crashed run left on disk."""
    from test_trainer_loop import Crash, crash_after_logging

    from pvpo.trainer.loop import train

    cfg = load_config(
        None,
        GS
        + [
            "run.steps=4",
            "run.checkpoint_every=2",
            "algorithm.anchor.refresh_every=1",
            "algorithm.anchor.refresh_from=current",
            "rollout.n=2",
            "algorithm.gt.replace_per_group=1",
        ],
    )
    searcher = OverlapSearcher(WORLD.passages)

    with monkeypatch.context() as m, pytest.raises(Crash):
        crash_after_logging(m, 4)
        train(cfg, tmp_path / "run", searcher=searcher, show_progress=False)
    assert json.loads((tmp_path / "run" / "anchor.json").read_text())["computed_at_step"] == 3
    resumed = train(cfg, tmp_path / "run", resume=True, searcher=searcher, show_progress=False)
    straight = train(cfg, tmp_path / "straight", searcher=searcher, show_progress=False)
    assert [m["step"] for m in resumed.metrics] == [1, 2, 3, 4]
    for a, b in zip(resumed.metrics, straight.metrics, strict=True):
        for k in ("anchor/mean", "reward/mean", "loss", "cost/cum_rollouts", "cost/cum_pvpo"):
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), (a["step"], k)


# ---- learning from GT: the prompts the reference never solves -----------------------------------
def _recording_trainer(*args, **kwargs):
    """A Trainer that keeps each step's sampled (kind="train") trajectories in `.sampled`."""
    from pvpo.trainer.loop import Trainer

    class RecordingTrainer(Trainer):
        def __init__(self, *a, **kw) -> None:
            self.sampled: list[list[Trajectory]] = []
            super().__init__(*a, **kw)

        def rollout(self, examples, *, kind="train", **kw):
            out = super().rollout(examples, kind=kind, **kw)
            if kind == "train":
                self.sampled.append(out)
            return out

    return RecordingTrainer(*args, **kwargs)


def _never_solved_accuracy(tmp_path, group_sampling: bool) -> tuple[float, float]:
    """(first 8 steps, last 8 steps): the accuracy of the policy's own sampled rollouts on the RL
    prompts its anchor rollouts never solved, in a 30-step run from a 1-hop warm start."""
    from pvpo.reward import SEARCH_R1
    from pvpo.trainer.data import Data

    train = WORLD.questions("train")
    one = [q for q in train if q.metadata["hops"] == 1]
    two = [q for q in train if q.metadata["hops"] == 2]
    texts = [p.contents for p in WORLD.passages] + [SEARCH_R1.instruction()] + [q.question for q in train]
    texts += ["".join(WORLD.oracle_trajectory(q)) for q in train]
    cfg = load_config(
        None,
        [
            "model.tiny.vocab_size=400",
            "model.tiny.hidden_size=64",
            "model.tiny.num_layers=2",
            "model.tiny.intermediate_size=128",
            "model.warm_start_steps=80",
            "model.warm_start_batch_size=8",
            f"algorithm.group_sampling.enabled={str(group_sampling).lower()}",
            "rollout.max_turns=3",
            "rollout.max_new_tokens=40",
            "rollout.max_response_tokens=240",
            "rollout.n=4",
            f"data.prompts_per_step={len(two)}",
            "algorithm.anchor.num_rollouts=2",
            "optim.lr=3e-3",
            "run.steps=30",
            "run.checkpoint_every=0",
            "run.tensorboard=false",
            "run.threads=1",
        ],
    )
    run_dir = tmp_path / f"run_{group_sampling}"
    run_dir.mkdir()
    from pvpo.trainer.setup import prepare_run

    data, searcher = Data(two, [], None, texts, WORLD, one), OverlapSearcher(WORLD.passages)
    start = prepare_run(cfg, run_dir, data, searcher, show_progress=False)  # the 1-hop warm start
    trainer = _recording_trainer(cfg, run_dir, data, searcher, start, show_progress=False)
    trainer.run()
    anchor = json.loads((run_dir / "anchor.json").read_text())["stats"]
    never = {u for u, s in anchor.items() if s["accuracy"] == 0.0}
    assert len(never) >= 3, "the 1-hop warm start should leave most 2-hop prompts unsolved"

    def acc(steps) -> float:
        ts = [t for step in steps for t in step if t.uid in never]
        return sum(t.accuracy for t in ts) / len(ts)

    return acc(trainer.sampled[:8]), acc(trainer.sampled[-8:])


@pytest.mark.slow
def test_group_sampling_teaches_prompts_the_reference_never_solves_more_than_rl_alone(tmp_path):
    """A policy warm-started on 1-hop questions and 2-hop RL prompts its anchor (M=2) never solves.
    With Group Sampling their GT trajectories are injected and the policy's own rollouts of those
    prompts succeed more often late in the run than early, and more than without it. (Before the
    asynchronous agent loop the policy never solved them without GT; with per-trajectory sampling
    it solves about 0.1 of its rollouts of them from step 1, so the comparison is between arms:
    measured late accuracy 0.30 with Group Sampling, 0.21 without.)"""
    gs_early, gs_late = _never_solved_accuracy(tmp_path, True)
    _, plain_late = _never_solved_accuracy(tmp_path, False)
    assert gs_late >= 0.1, f"GT injection did not teach the never-solved prompts: accuracy {gs_late:.2f} late"
    assert gs_late > gs_early, (gs_early, gs_late)
    assert gs_late > plain_late, f"Group Sampling {gs_late:.2f} vs RL alone {plain_late:.2f} in the last 8 steps"


def test_model_gt_source_runs_a_local_model_token_exact_with_its_own_logprobs_as_pi_gt(tmp_path, tiny):
    """PVPO's "larger model" as a local HF folder: its trajectories go through our agent loop
    token-exact, wrong answers are retried then given up on, and a model whose tokenizer is not
    the policy's is refused."""
    from pvpo.envs.data import QAExample
    from pvpo.envs.episode import EpisodeConfig
    from pvpo.trainer.model.policy import load_policy, policy_from_config
    from pvpo.trainer.reference.gt_registry import GTContext, build_gt_source
    from pvpo.trainer.rollout.agent_loop import LoopConfig
    from tests.eval_support import searching_policy

    questions = [
        "What is the capital of Germany?",
        "Which city is Germany's capital?",
        "Where does the German chancellor sit?",
    ]
    folder = searching_policy(tmp_path / "gt_model", questions)  # searches once, then answers "Berlin"
    tok = load_policy(folder).tokenizer
    exs = [QAExample(f"q{i}", q, ("Berlin",)) for i, q in enumerate(questions)] + [
        QAExample("wrong", questions[0], ("Paris",))
    ]
    cfg = load_config(
        None, ["algorithm.gt.source=model", f"algorithm.gt.model.path={folder}", "algorithm.gt.model.temperature=0"]
    )
    episode = EpisodeConfig(
        protocol="search_r1", reward="pvpo", max_turns=4, topk=3, max_obs_chars=None, prompt_template="search_r1"
    )
    ctx = GTContext(tok, tiny, episode, LoopConfig(max_new_tokens=32, max_response_tokens=512))
    source = build_gt_source("model", cfg.algorithm.gt, ctx)
    cache = GTCache(tmp_path / "gt.json")
    try:
        counts = fetch_gt(exs, source, cache, attempts=2, min_reward=1.0)
    finally:
        source.close()
    assert counts["gt/generated"] == 3 and counts["gt/failed"] == 1 and counts["gt/attempts"] == 4 + 1
    assert cache.failed == {"wrong": 2}
    for i in range(3):
        r = cache.records[f"q{i}"]
        assert r.reward == 1.0 and r.num_tool_calls == 1 and 0 in r.loss_mask and 1 in r.loss_mask
        model_lp = [lp for lp, m in zip(r.gt_logprobs, r.loss_mask) if m]
        assert all(lp <= 0.0 for lp in model_lp) and any(lp < 0.0 for lp in model_lp)  # the model's, not the oracle's 0
        assert all(lp == 0.0 for lp, m in zip(r.gt_logprobs, r.loss_mask) if not m)
        assert tok.decode(r.response_ids).rstrip().endswith("</answer>")
    other = policy_from_config(
        load_config(None, TINY).model, corpus_texts=questions, tags=("think", "search", "information", "answer"), seed=0
    )
    with pytest.raises(ValueError, match="tokenizer differs"):
        build_gt_source("model", cfg.algorithm.gt, GTContext(other.tokenizer, tiny, episode, ctx.loop))


def test_a_rollout_budget_ends_the_run_at_the_step_that_reaches_it_with_a_final_eval_and_checkpoint(tmp_path):
    from pvpo.trainer.loop import train

    cfg = load_config(None, TINY + ["run.steps=50", "run.rollout_budget=40", "run.checkpoint_every=0"])
    metrics = train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False).metrics
    assert metrics[-1]["cost/cum_rollouts"] >= 40 > metrics[-2]["cost/cum_rollouts"]
    assert len(metrics) < 50 and "eval/accuracy" in metrics[-1]
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == f"step_{len(metrics):06d}"


def test_a_run_reuses_an_earlier_runs_anchor_partition_and_gt_without_sampling_them(tmp_path):
    from pvpo.trainer.loop import train

    searcher = OverlapSearcher(WORLD.passages)
    first = train(load_config(None, GS + ["run.steps=1"]), tmp_path / "a", searcher=searcher, show_progress=False)
    assert first.metrics[0]["cost/cum_anchor_rollouts"] > 0
    cfg = load_config(None, GS + ["run.steps=1", f"algorithm.anchor.reuse_from={tmp_path / 'a'}"])
    second = train(cfg, tmp_path / "b", searcher=searcher, show_progress=False)
    m = second.metrics[0]
    assert m["cost/cum_anchor_rollouts"] == 0 and m["cost/cum_gt_rollouts"] == 0  # nothing sampled again
    for name in ("anchor.json", "group_sampling.json", "gt_cache.json"):
        a, b = (json.loads((tmp_path / run / name).read_text()) for run in ("a", "b"))
        assert "cost" not in b and {k: v for k, v in a.items() if k != "cost"} == b  # the cost was a's, not b's
    assert m["gt/fraction"] == first.metrics[0]["gt/fraction"]  # the same GT injected
    # another set of RL prompts: the anchor does not cover them
    other = load_config(
        None, GS + ["run.steps=1", "data.synthetic.seed=5", f"algorithm.anchor.reuse_from={tmp_path / 'a'}"]
    )
    with pytest.raises(ValueError, match=r"algorithm.anchor.reuse_from=.*lacks \d+ of this run's"):
        train(other, tmp_path / "c", searcher=searcher, show_progress=False)
    m3 = load_config(None, GS + ["algorithm.anchor.num_rollouts=3", f"algorithm.anchor.reuse_from={tmp_path / 'a'}"])
    with pytest.raises(ValueError, match="its anchor has M=2 reference rollouts a prompt, .*num_rollouts=3"):
        train(m3, tmp_path / "d", searcher=searcher, show_progress=False)
