"""The agent loop and training step: token-exact trajectories, zero gradient on env tokens,
exact resume after a crash, and the smoke config end to end."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from trainer_support import TINY, WORLD, OverlapSearcher, policy  # noqa: F401 (fixture)

from pvpo.envs.episode import EpisodeConfig
from pvpo.trainer.algorithms.losses import token_logprobs
from pvpo.trainer.config.schema import load_config
from pvpo.trainer.model.update import loss_config, micro_batch_loss
from pvpo.trainer.rollout.agent_loop import LoopConfig, run_agent_loop
from pvpo.trainer.rollout.hf_engine import HFEngine
from pvpo.trainer.rollout.trajectory import collate, response_logits

REPO = Path(__file__).resolve().parents[1]


class SpyEngine(HFEngine):
    """Records every (context, completion) its asynchronous session returns, in order."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.log: list[tuple[list[int], object]] = []

    def async_session(self, executor):
        from pvpo.trainer.rollout.engine import AsyncGenerate

        inner = super().async_session(executor)

        async def generate(prompt, sampling):
            context = list(prompt)
            c = await inner.generate(prompt, sampling)
            self.log.append((context, c))
            return c

        return AsyncGenerate(generate, inner.close)


@contextlib.contextmanager
def search_biased(policy):
    """Bias the random model's logits towards `</search>` so trajectories have several turns."""
    stop_id = policy.tokenizer.convert_tokens_to_ids("</search>")
    bias = lambda m, i, o: o.index_add(-1, torch.tensor([stop_id]), torch.full_like(o[..., :1], 4.0))  # noqa: E731
    handle = policy.model.lm_head.register_forward_hook(bias)
    try:
        yield
    finally:
        handle.remove()


def _rollout(policy, n_examples=4, max_turns=3):
    tok = policy.tokenizer
    eng = SpyEngine(policy.model, tok)
    epcfg = EpisodeConfig(protocol="search_r1", reward="pvpo", max_turns=max_turns, topk=2, max_obs_chars=120)
    examples = WORLD.questions("train")[:n_examples]
    with search_biased(policy):
        trajs = run_agent_loop(
            eng,
            tok,
            examples,
            OverlapSearcher(WORLD.passages),
            epcfg,
            LoopConfig(max_new_tokens=12, max_response_tokens=400),
            seed=5,
        )
    return eng, trajs


def test_trajectories_hold_exactly_the_sampled_ids_with_env_tokens_between_turns(policy):
    eng, trajs = _rollout(policy)
    assert any(t.loss_mask.count(0) for t in trajs), "some trajectory must have an observation"
    # rebuild each trajectory's model segments from the spy's log: the turns whose context is a
    # prefix of the trajectory, shortest context first
    for t in trajs:
        full = t.prompt_ids + t.response_ids
        segs = [c.token_ids for ctx, c in sorted(eng.log, key=lambda e: len(e[0])) if full[: len(ctx)] == ctx]
        assert len(segs) == t.num_turns
        runs, cur, kind = [], [], None
        for tid, m in zip(t.response_ids, t.loss_mask):
            if m != kind and cur:
                runs.append((kind, cur))
                cur = []
            kind = m
            cur.append(tid)
        if cur:
            runs.append((kind, cur))
        assert [r for k, r in runs if k == 1] == segs
        assert [k for k, _ in runs] == [1, 0] * (len(runs) // 2) + [1] * (len(runs) % 2)
        for k, r in runs:
            if k == 0:
                assert policy.tokenizer.decode(r).startswith(
                    "\n\n<information>"
                ) or "invalid" in policy.tokenizer.decode(r)
        assert all(lp == 0.0 for lp, m in zip(t.old_logprobs, t.loss_mask) if m == 0)


def test_old_logprobs_match_recomputation_over_the_whole_trajectory(policy):
    _, trajs = _rollout(policy)
    policy.model.eval()
    batch = collate(trajs, policy.tokenizer.pad_token_id)
    with torch.no_grad(), search_biased(policy):
        lp = token_logprobs(response_logits(policy.model, batch), batch.response_ids, 1.0)
    m = batch.loss_mask > 0
    assert torch.allclose(lp[m], batch.old_logprobs[m], atol=2e-4)


def test_env_and_padding_tokens_get_zero_gradient_in_the_training_step(policy):
    _, trajs = _rollout(policy)
    batch = collate(trajs, policy.tokenizer.pad_token_id)
    cfg = load_config(None, ["optim.kl_coef=0.1", "optim.entropy_coef=0.01"])
    ref = [p.detach().clone() for p in policy.model.parameters()]
    with torch.no_grad():
        ref_lp = token_logprobs(response_logits(policy.model, batch), batch.response_ids, 1.0) - 0.3
    policy.model.train()
    adv = torch.linspace(-1.0, 1.0, len(batch))
    loss, _, logits = micro_batch_loss(
        policy.model, batch, adv, loss_config(cfg.optim), temperature=1.0, ref_logprobs=ref_lp
    )
    logits.retain_grad()
    loss.backward()
    g = logits.grad.abs().sum(-1)
    assert float(g[batch.loss_mask == 0].max()) == 0.0
    assert float(g[batch.loss_mask == 1].max()) > 0.0
    policy.model.zero_grad(set_to_none=True)
    assert all(torch.equal(a, b) for a, b in zip(ref, policy.model.parameters()))


class Crash(RuntimeError):
    pass


def crash_after_logging(monkeypatch: pytest.MonkeyPatch, at_step: int) -> None:
    """Make training raise Crash right after step `at_step` is logged, before its checkpoint."""
    from pvpo.trainer.state.metrics_log import MetricsLogger

    log = MetricsLogger.log

    def log_then_crash(self, step, metrics):  # type: ignore[no-untyped-def]
        log(self, step, metrics)
        if step == at_step:
            raise Crash(f"injected after logging step {at_step}, before its checkpoint")

    monkeypatch.setattr(MetricsLogger, "log", log_then_crash)


def test_resume_after_crash_logs_each_step_once_and_matches_an_uninterrupted_run(tmp_path, monkeypatch):
    from pvpo.trainer.loop import train

    cfg = load_config(None, TINY + ["run.steps=3", "run.checkpoint_every=1"])
    searcher = OverlapSearcher(WORLD.passages)

    with monkeypatch.context() as m, pytest.raises(Crash):
        crash_after_logging(m, 2)
        train(cfg, tmp_path / "run", searcher=searcher, show_progress=False)
    anchor_before = json.loads((tmp_path / "run" / "anchor.json").read_text())
    resumed = train(cfg, tmp_path / "run", resume=True, searcher=searcher, show_progress=False)
    assert [m["step"] for m in resumed.metrics] == [1, 2, 3]
    assert json.loads((tmp_path / "run" / "anchor.json").read_text())["stats"] == anchor_before["stats"]
    straight = train(cfg, tmp_path / "straight", searcher=searcher, show_progress=False)
    for a, b in zip(resumed.metrics, straight.metrics):
        for k in ("reward/mean", "response_length", "loss", "grad_norm"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), (a["step"], k)


@pytest.mark.slow
def test_smoke_config_trains_on_cpu_against_a_loopback_retriever(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pvpo.cli",
            "train",
            "--config",
            str(REPO / "configs" / "smoke.yaml"),
            "--run-dir",
            str(tmp_path / "smoke"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "smoke" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(v is not None and math.isfinite(v) for r in rows for v in r.values())
    assert wall < 120, f"smoke run took {wall:.0f}s"
    assert (tmp_path / "smoke" / "checkpoints" / "latest").exists()
    # the update path runs (with reward 0 everywhere it would not): GT injection on
    assert max(r["grad_norm"] for r in rows) > 0 and rows[0]["gs/gt_frac"] > 0


class TickBatchedHF(HFEngine):
    """The HF engine behind the default asynchronous session (the turns submitted in one event-loop
    tick go to `generate` together), for the scripted model, which keeps no KV cache."""

    def async_session(self, executor):
        from pvpo.trainer.rollout.engine import RolloutEngine

        return RolloutEngine.async_session(self, executor)


class CountingSearcher(OverlapSearcher):
    def __init__(self, passages) -> None:
        super().__init__(passages)
        self.calls: list[list[str]] = []

    def search(self, queries, topk=None):
        self.calls.append(list(queries))
        return super().search(queries, topk)


def test_searches_of_trajectories_finishing_a_turn_together_meet_in_one_retriever_call(policy):
    from trainer_support import ScriptedLM

    tok = policy.tokenizer
    queries = ["the mentor of Zaro", "the mentor of Zaro", "the rival of Kelmo"]
    scripts = [tok.encode(f"<search>{q}</search>", add_special_tokens=False) for q in queries]
    searcher = CountingSearcher(WORLD.passages)
    epcfg = EpisodeConfig(protocol="search_r1", reward="pvpo", max_turns=2, topk=2, max_obs_chars=120)
    trajs = run_agent_loop(
        TickBatchedHF(ScriptedLM(scripts, len(tok)), tok),
        tok,
        WORLD.questions("train")[:3],
        searcher,
        epcfg,
        LoopConfig(max_new_tokens=30, max_response_tokens=400),
        seed=0,
    )
    # turn 1: three searches, one call, the duplicate asked once; turn 2 ends every episode
    assert [[tok.decode(tok.encode(q, add_special_tokens=False)) for q in c] for c in searcher.calls] == [
        [tok.decode(tok.encode(q, add_special_tokens=False)) for q in queries[1:]]
    ]
    assert [t.num_tool_calls for t in trajs] == [1, 1, 1]
    assert all(t.finish_reason == "max_turns" and t.loss_mask.count(0) > 0 for t in trajs)


def test_eos_without_answer_and_the_token_budget_end_trajectories_scored_as_they_stand(policy):
    from trainer_support import ScriptedLM

    from pvpo.reward import get_protocol, get_reward

    tok = policy.tokenizer
    ex = WORLD.questions("train")[:3]
    gold = ex[2].golden_answers[0]
    scripts = [
        tok.encode("<think>hm</think>", add_special_tokens=False) + [tok.eos_token_id],
        tok.encode(" word", add_special_tokens=False) * 40,
        tok.encode(f"<answer>{gold}</answer>", add_special_tokens=False),
    ]
    epcfg = EpisodeConfig(protocol="search_r1", reward="pvpo", max_turns=3, topk=2, max_obs_chars=120)
    loop = LoopConfig(max_new_tokens=30, max_response_tokens=30)
    trajs = run_agent_loop(
        TickBatchedHF(ScriptedLM(scripts, len(tok)), tok), tok, ex, OverlapSearcher(WORLD.passages), epcfg, loop, seed=0
    )
    assert [t.finish_reason for t in trajs] == ["eos", "budget", "answer"]
    assert trajs[0].response_ids == scripts[0] and trajs[0].loss_mask == [1] * len(scripts[0])
    assert len(trajs[1].response_ids) <= loop.max_response_tokens
    protocol = get_protocol("search_r1")
    for t, e in (trajs[0], ex[0]), (trajs[2], ex[2]):
        # the env scored exactly the text the policy wrote (the budget row's is also judged with
        # the observation that does not fit)
        r = get_reward("pvpo")(t.response_text, list(e.golden_answers), protocol)
        assert (t.reward, t.prediction) == (r.total, r.prediction)
    assert trajs[2].accuracy == 1.0 and trajs[0].accuracy == 0.0


def test_chat_template_option_wraps_the_prompt_as_a_user_turn(policy):
    import copy

    from pvpo.trainer.rollout.agent_loop import prompt_ids

    tok = copy.deepcopy(policy.tokenizer)
    ex = WORLD.questions("train")[:2]
    epcfg = EpisodeConfig(protocol="search_r1", reward="pvpo", max_turns=1, topk=2, max_obs_chars=120)
    loop = LoopConfig(max_new_tokens=4, max_response_tokens=40, chat_template=True)
    with pytest.raises(ValueError, match="model.chat_template"):
        run_agent_loop(HFEngine(policy.model, tok), tok, ex, OverlapSearcher(WORLD.passages), epcfg, loop, seed=0)
    tok.chat_template = (
        "{% for m in messages %}USER: {{ m['content'] }}{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
    )
    trajs = run_agent_loop(HFEngine(policy.model, tok), tok, ex, OverlapSearcher(WORLD.passages), epcfg, loop, seed=0)
    plain = prompt_ids(tok, epcfg.prompt(ex[0]))
    assert trajs[0].prompt_ids == tok.encode("USER: " + epcfg.prompt(ex[0]) + "ASSISTANT:", add_special_tokens=False)
    assert trajs[0].prompt_ids != plain and len(trajs[0].prompt_ids) > len(plain)
