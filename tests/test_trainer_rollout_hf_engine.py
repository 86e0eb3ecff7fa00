"""The transformers rollout engine: log-probs equal a recomputation under left padding, turns stop
at a stop string or EOS keeping the sampled ids, sampling is seeded, and after new weights load
between two turns (rollouts beside the update) no turn reuses a KV prefix of the old weights."""

from __future__ import annotations

import torch
from trainer_support import WORLD, ScriptedLM, policy  # noqa: F401 (fixture)

from pvpo.trainer.rollout.engine import SamplingConfig
from pvpo.trainer.rollout.hf_engine import HFEngine


def test_engine_logprobs_match_recomputation_with_left_padding(policy):
    from pvpo.trainer.algorithms.losses import token_logprobs

    eng = HFEngine(policy.model, policy.tokenizer)
    prompts = [policy.tokenizer.encode("Who is the rival of"), policy.tokenizer.encode("Q")]
    for temp in (1.0, 0.7):
        outs = eng.generate(prompts, SamplingConfig(temperature=temp, max_new_tokens=12, seed=3))
        for p, c in zip(prompts, outs):
            ids = torch.tensor([list(p) + c.token_ids])
            with torch.no_grad():
                logits = policy.model(ids).logits[:, len(p) - 1 : -1]
            ref = token_logprobs(logits, torch.tensor([c.token_ids]), temp)[0]
            assert torch.allclose(ref, torch.tensor(c.logprobs), atol=1e-4)


def test_engine_stops_after_stop_string_or_eos_and_keeps_sampled_ids(policy):
    tok = policy.tokenizer
    search = tok.encode("<think>hm</think><search>the mentor of Zaro</search> junk after", add_special_tokens=False)
    answer = tok.encode("<answer>Kelmo", add_special_tokens=False) + [tok.eos_token_id] + tok.encode(" more")
    eng = HFEngine(ScriptedLM([search, answer, search], len(tok)), tok)
    out = eng.generate(
        [[1, 2], [3], [4, 5, 6]], SamplingConfig(max_new_tokens=40, seed=0, stop=("</search>", "</answer>"))
    )
    end = search.index(tok.convert_tokens_to_ids("</search>")) + 1
    assert out[0].token_ids == search[:end] and out[0].finish_reason == "stop" and out[0].stop_string == "</search>"
    assert out[1].token_ids == answer[: answer.index(tok.eos_token_id) + 1] and out[1].finish_reason == "eos"
    eng = HFEngine(ScriptedLM([search], len(tok)), tok)
    short = eng.generate([[1]], SamplingConfig(max_new_tokens=3, seed=0, stop=("</search>",)))[0]
    assert short.finish_reason == "length" and len(short.token_ids) == 3


def test_engine_is_seeded(policy):
    eng = HFEngine(policy.model, policy.tokenizer)
    prompts = [policy.tokenizer.encode("The mentor of")] * 4
    s = SamplingConfig(max_new_tokens=20, seed=11)
    assert [c.token_ids for c in eng.generate(prompts, s)] == [c.token_ids for c in eng.generate(prompts, s)]


def _greedy(model, prompt: list[int], n: int) -> list[int]:
    """`n` greedy tokens after `prompt`, each from a full forward (no cache)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def _perturbed(model, seed: int):
    import copy

    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    return out


def test_turns_after_a_weight_load_between_turns_are_the_new_weights_greedy_output_not_a_stale_kv_prefix(policy):
    """The HF engine's own copy in the rollout thread (rollouts beside the update): an episode's
    turns after new weights load must not reuse the KV cache its earlier turns left (computed with
    the old weights); each turn is the greedy continuation of the weights its version names."""
    import threading

    from pvpo.envs.episode import EpisodeConfig
    from pvpo.retriever.types import Passage
    from pvpo.trainer.rollout.agent_loop import LoopConfig
    from pvpo.trainer.rollout.engine import AsyncGenerate
    from pvpo.trainer.rollout.episode_stream import EpisodeStream, Planned

    class FirstPassages:
        def search(self, queries, topk=None):
            return [[Passage(id="1", contents="Doc: Oslo is the capital.", title="Oslo")] for _ in queries]

    first = threading.Event()

    class Signalling(HFEngine):  # sets `first` once a turn has been sampled
        def async_session(self, executor):
            inner = super().async_session(executor)

            async def generate(prompt, sampling):
                out = await inner.generate(prompt, sampling)
                first.set()
                return out

            return AsyncGenerate(generate, inner.close, inner.reset)

    examples = WORLD.questions("train")[:6]
    engine = Signalling(policy.model, policy.tokenizer, share_weights=False)
    trained = _perturbed(policy.model, 3)
    stream = EpisodeStream(
        engine,
        policy.tokenizer,
        FirstPassages(),
        EpisodeConfig(protocol="search_r1", reward="pvpo", max_turns=6, topk=1, max_obs_chars=80),
        LoopConfig(temperature=0.0, max_new_tokens=4, max_response_tokens=400),
        eta=1,
        per_turn=True,
        concurrency=8,
    )
    try:
        stream.plan(1, [Planned(1, j, ex, seed=0, index=j) for j, ex in enumerate(examples)])
        assert first.wait(60)
        stream.gate.pause(timeout=60)  # the turns in flight end; the next ones wait for the new weights
        stream.publish(1, lambda: engine.sync_weights(trained))
        stream.gate.wait_applied(timeout=60)
        stream.gate.resume()
        taken = stream.take(lambda buffer, outstanding: list(range(6)) if len(buffer) == 6 else None, timeout=120)
    finally:
        stream.close()
    went_on, after = 0, 0
    for f in taken:
        t, versions = f.trajectory, []
        for start, end, _ in t.model_turns:
            (version,) = set(t.versions[start:end])  # one version a turn
            context, ids = t.prompt_ids + t.response_ids[:start], t.response_ids[start:end]
            assert ids == _greedy(trained if version else policy.model, context, len(ids)), (version, start)
            versions.append(version)
            after += version == 1
        assert versions == sorted(versions)
        went_on += versions[0] == 0 and versions[-1] == 1
    assert went_on and after, "no episode went on with the new weights after a turn with the old ones"
