"""The transformers rollout engine: log-probs equal a recomputation under left padding, turns stop
at a stop string or EOS keeping the sampled ids, sampling is seeded."""

from __future__ import annotations

import torch
from trainer_support import ScriptedLM, policy  # noqa: F401 (fixture)

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
