"""Endpoint turns through the one agent loop, against a fake OpenAI-compatible endpoint: the GT
endpoint source keeps the endpoint's log-probs as pi_gt when it reports them over the policy's
tokenization (reference fallback otherwise, with metrics saying which), sets the reward parts and
finish reason and enforces the response budget; `pvpo eval`'s endpoint policy, the token policy,
the GT sources and the oracle replay all run the same driver."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest
from trainer_support import WORLD, OverlapSearcher, policy  # noqa: F401 (fixture)

from pvpo.envs.episode import EpisodeConfig
from pvpo.trainer.rollout import agent_loop
from pvpo.trainer.rollout.agent_loop import LoopConfig
from pvpo.trainer.rollout.openai_client import OpenAIClient

EPISODE = EpisodeConfig(protocol="search_r1", reward="pvpo", max_turns=4, topk=2, max_obs_chars=120)


def resplit(pieces: list[str]) -> list[str]:
    """The same text in as many pieces, one boundary moved: the first piece followed by one of two
    or more characters gives that piece's first character to the piece before it."""
    i = next(k for k in range(1, len(pieces)) if len(pieces[k]) >= 2)
    out = list(pieces)
    out[i - 1], out[i] = out[i - 1] + out[i][0], out[i][1:]
    return out


def fake_client(
    tok,
    *,
    logprobs: bool,
    api: str = "chat",
    answer: str = "Kelmo",
    misaligned_first: bool = False,
    resplit_first: bool = False,
) -> tuple[OpenAIClient, list]:
    """A client whose endpoint searches on the first turn and answers on the next, as vLLM does:
    the stop string stripped from the text and named in `stop_reason`; per-token log-probs -0.5
    over the policy's tokenization (the stop string's tokens included) when `logprobs`, over
    single characters (another tokenizer's split) on the first turn when `misaligned_first`, over as
    many pieces as the policy's with one boundary moved (`resplit`) when `resplit_first`."""
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        first = len(body.get("messages", [])) == 1 if api == "chat" else "<search>the mentor" not in body["prompt"]
        full = "<search>the mentor of Zaro</search>" if first else f"<answer>{answer}</answer>"
        stop = "</search>" if first else "</answer>"
        ids = tok.encode(full, add_special_tokens=False)
        choice: dict = {"finish_reason": "stop", "stop_reason": stop}
        text = full[: -len(stop)]
        if api == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if logprobs and body.get("logprobs"):
            pieces = list(full) if first and misaligned_first else [tok.decode([t]) for t in ids]
            if first and resplit_first:
                pieces = resplit(pieces)
            if api == "chat":
                choice["logprobs"] = {"content": [{"token": p, "logprob": -0.5} for p in pieces]}
            else:
                choice["logprobs"] = {"tokens": pieces, "token_logprobs": [-0.5] * len(pieces)}
        usage = {"prompt_tokens": 50, "completion_tokens": len(ids)}
        return httpx.Response(200, json={"choices": [choice], "usage": usage})

    client = OpenAIClient("http://fake/v1", "gt", retries=0)
    client.http = httpx.Client(transport=httpx.MockTransport(handler))
    return client, bodies


def _gt_source(policy, client, loop=None):
    from pvpo.trainer.reference.gt_registry import GTContext
    from pvpo.trainer.reference.gt_sources import EndpointSource

    ctx = GTContext(
        policy.tokenizer,
        OverlapSearcher(WORLD.passages),
        EPISODE,
        loop or LoopConfig(max_new_tokens=40, max_response_tokens=600),
    )
    cfg = SimpleNamespace(
        logprobs="reference",
        model=SimpleNamespace(base_url="http://fake/v1", model="gt", api_key_env="NONE", timeout_s=5, temperature=0.7),
    )
    src = EndpointSource(cfg, ctx)
    src.client.close()
    src.client = client
    return src


@pytest.mark.parametrize("reported", [True, False])
def test_gt_endpoint_log_probs_are_pi_gt_when_reported_else_the_reference_fills_in(policy, tmp_path, reported):
    from pvpo.trainer.reference.gt_cache import GTCache, fetch_gt

    tok = policy.tokenizer
    ex = WORLD.questions("train")[:2]
    gold = ex[0].golden_answers[0]
    client, bodies = fake_client(tok, logprobs=reported, answer=gold)
    src = _gt_source(policy, client)
    trajs = src.generate(ex, attempt=0)
    t = trajs[0]
    assert all(b["logprobs"] is True for b in bodies)
    assert t.finish_reason == "answer" and t.num_turns == 2 and t.num_tool_calls == 1
    assert t.reward_components and t.reward == 1.0 and t.accuracy == 1.0
    assert t.loss_mask.count(0) > 0  # the observation, tokenized with the policy's tokenizer
    model_lps = [lp for lp, m in zip(t.old_logprobs, t.loss_mask) if m]
    assert t.logprobs_source == ("endpoint" if reported else "")
    assert model_lps == ([-0.5] * len(model_lps) if reported else [0.0] * len(model_lps))

    filled: list = []

    def reference(ts):
        filled.extend(ts)
        for x in ts:
            x.old_logprobs = [-1.0 if m else 0.0 for m in x.loss_mask]

    src.generate = lambda exs, attempt: [t]  # type: ignore[method-assign]
    counts = fetch_gt(ex[:1], src, GTCache(tmp_path / "gt.json"), attempts=1, min_reward=1.0, set_logprobs=reference)
    assert counts["gt/logprobs_endpoint"] == (1.0 if reported else 0.0)
    assert counts["gt/logprobs_reference"] == (0.0 if reported else 1.0)
    assert filled == ([] if reported else [t])


def test_gt_endpoint_pi_gt_is_set_per_turn_and_never_cached_as_placeholders(policy, tmp_path):
    """Two turns: the first's reported tokens do not line up with the policy's tokenizer, the
    second's do. The first takes the reference's log-probs, the second keeps the endpoint's."""
    from pvpo.trainer.reference.gt_cache import GTCache, fetch_gt

    tok = policy.tokenizer
    ex = WORLD.questions("train")[:1]
    client, _ = fake_client(tok, logprobs=True, answer=ex[0].golden_answers[0], misaligned_first=True)
    src = _gt_source(policy, client)
    t = src.generate(ex, attempt=0)[0]
    assert t.num_turns == 2 and [s for _, _, s in t.model_turns] == ["", "endpoint"] and t.logprobs_source == "mixed"
    (a0, b0, _), (a1, b1, _) = t.model_turns

    def reference(ts):
        for x in ts:
            x.old_logprobs = [-1.0 if m else 0.0 for m in x.loss_mask]

    src.generate = lambda exs, attempt: [t]  # type: ignore[method-assign]
    cache = GTCache(tmp_path / "gt.json")
    counts = fetch_gt(ex, src, cache, attempts=1, min_reward=1.0, set_logprobs=reference)
    record = GTCache(tmp_path / "gt.json").records[ex[0].uid]
    model_lps = [lp for lp, m in zip(record.gt_logprobs, record.loss_mask, strict=True) if m]
    assert 0.0 not in model_lps
    assert record.gt_logprobs[a0:b0] == [-1.0] * (b0 - a0) and record.gt_logprobs[a1:b1] == [-0.5] * (b1 - a1)
    assert [s for _, _, s in record.model_turns] == ["reference", "endpoint"]
    assert counts["gt/turns_endpoint"] == 1.0 and counts["gt/turns_reference"] == 1.0
    assert counts["gt/logprobs_endpoint"] == 0.0 and counts["gt/logprobs_reference"] == 1.0
    # without a reference to fill the first turn in, the trajectory is refused, not cached with 0.0
    t.model_turns = [(a0, b0, ""), (a1, b1, "endpoint")]
    bare = GTCache(tmp_path / "bare.json")
    with pytest.raises(ValueError, match=r"1 model turn\(s\) without log-probs.*gt\.logprobs=reference"):
        fetch_gt(ex, src, bare, attempts=1, min_reward=1.0)
    assert not bare.records and not (tmp_path / "bare.json").exists()


def test_an_endpoint_turn_split_otherwise_with_the_same_count_and_text_falls_back_to_the_reference(policy):
    """`["a", "bcd"]` from the endpoint must not lend its log-probs to the policy's `["ab", "cd"]`:
    alignment is token by token, not by the joined text and the count."""
    tok = policy.tokenizer
    ex = WORLD.questions("train")[:1]
    client, _ = fake_client(tok, logprobs=True, answer=ex[0].golden_answers[0], resplit_first=True)
    t = _gt_source(policy, client).generate(ex, attempt=0)[0]
    assert [s for _, _, s in t.model_turns] == ["", "endpoint"]


def test_gt_endpoint_source_enforces_the_response_budget(policy):
    tok = policy.tokenizer
    client, _ = fake_client(tok, logprobs=True)
    src = _gt_source(policy, client, LoopConfig(max_new_tokens=40, max_response_tokens=30))
    t = src.generate(WORLD.questions("train")[:1], attempt=0)[0]
    assert t.finish_reason == "budget" and len(t.response_ids) <= 30 and "format" in t.reward_components


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_eval_endpoint_policy_runs_the_agent_loop(policy, api):
    from pvpo.evaluation.policies import OpenAIPolicy
    from pvpo.evaluation.run import EvalSettings

    tok = policy.tokenizer
    client, bodies = fake_client(tok, logprobs=False, api=api)
    settings = EvalSettings(max_turns=4, max_new_tokens=40, max_response_tokens=600)
    outs = OpenAIPolicy(client, api=api, concurrency=2).rollout(
        WORLD.questions("train")[:3], OverlapSearcher(WORLD.passages), EPISODE, settings, seed=0
    )
    assert [o.stop_reason for o in outs] == ["answer"] * 3
    assert all(o.num_turns == 2 and o.num_searches == 1 and o.queries == ["the mentor of Zaro"] for o in outs)
    assert all(o.prompt_tokens == 50 and o.completion_tokens > 0 and o.format_ok for o in outs)
    assert all("max_tokens" in b and "logprobs" not in b for b in bodies)


def test_eval_gt_and_warm_start_paths_all_run_the_one_driver(policy, monkeypatch):
    from pvpo.evaluation.policies import OpenAIPolicy, TokenPolicy
    from pvpo.evaluation.run import EvalSettings
    from pvpo.trainer.rollout.hf_engine import HFEngine
    from pvpo.trainer.rollout.replay import oracle_trajectories

    runs: list[int] = []
    original = agent_loop.run_episodes_async

    async def spy(make_source, examples, *a, **kw):
        runs.append(len(examples))
        return await original(make_source, examples, *a, **kw)

    monkeypatch.setattr(agent_loop, "run_episodes_async", spy)
    tok, ex, searcher = policy.tokenizer, WORLD.questions("train")[:2], OverlapSearcher(WORLD.passages)
    settings = EvalSettings(max_turns=2, max_new_tokens=6, max_response_tokens=200)
    TokenPolicy(HFEngine(policy.model, tok), tok).rollout(ex, searcher, EPISODE, settings, seed=0)
    OpenAIPolicy(fake_client(tok, logprobs=False)[0], api="chat").rollout(ex, searcher, EPISODE, settings, seed=0)
    _gt_source(policy, fake_client(tok, logprobs=True)[0]).generate(ex, attempt=0)
    oracle_trajectories(ex, lambda e: WORLD.oracle_trajectory(e, EPISODE.tag_protocol), tok, searcher, EPISODE)
    assert runs == [2, 2, 2, 2]
