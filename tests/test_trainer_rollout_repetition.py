"""What keeps a degenerate answer short: a turn that falls into a loop ends there (the transformers
engine stops at once, any other engine's looping turn ends its episode after it), and an episode's
model tokens have a budget of their own."""

from __future__ import annotations

import torch
from trainer_support import WORLD, OverlapSearcher, policy  # noqa: F401 (fixture)

from pvpo.envs.episode import EpisodeConfig
from pvpo.trainer.rollout.agent_loop import LoopConfig, run_agent_loop
from pvpo.trainer.rollout.engine import AsyncGenerate, Completion, RolloutEngine, SamplingConfig
from pvpo.trainer.rollout.hf_engine import HFEngine
from pvpo.trainer.rollout.repetition import MAX_PERIOD, ends_in_loop

EPISODE = EpisodeConfig(protocol="search_r1", reward="pvpo", max_turns=4, topk=2, max_obs_chars=120)


def test_a_loop_is_its_last_n_tokens_repeating_the_n_before_at_a_short_period() -> None:
    assert ends_in_loop([7] * 9, 8) and not ends_in_loop([7] * 8, 8)  # n + 1 tokens of one token
    three = [1, 2, 3] * 4  # 12 tokens: the last 9 repeat the 9 three before them
    assert ends_in_loop(three, 9) and not ends_in_loop(three, 10)
    assert not ends_in_loop([*three, 4], 3)  # the loop was left
    long = list(range(MAX_PERIOD)) * 3
    assert ends_in_loop(long, MAX_PERIOD) and not ends_in_loop(list(range(MAX_PERIOD + 1)) * 3, MAX_PERIOD)
    assert not ends_in_loop([5] * 100, 0)  # 0: the stop is off


def _always(policy, token: int):  # noqa: F811 (the fixture's name)
    """A hook making the tiny policy's argmax `token` at every position: a loop of period 1."""
    bias = torch.zeros(policy.model.config.vocab_size)
    bias[token] = 1e4
    return policy.model.lm_head.register_forward_hook(lambda m, i, o: o + bias)


def test_the_transformers_engine_ends_a_looping_turn_after_n_plus_one_tokens(policy) -> None:  # noqa: F811
    tok = policy.tokenizer
    word = tok.convert_tokens_to_ids(tok.tokenize(" Zaro")[0])
    hook = _always(policy, word)
    try:
        eng = HFEngine(policy.model, tok)
        prompt = tok.encode("The mentor of", add_special_tokens=False)
        stopped = eng.generate([prompt], SamplingConfig(temperature=0.0, max_new_tokens=200, repetition_stop=8))[0]
        free = eng.generate([prompt], SamplingConfig(temperature=0.0, max_new_tokens=40))[0]
        examples = WORLD.questions("train")[:2]
        loop = LoopConfig(temperature=0.0, max_new_tokens=200, max_response_tokens=2000, repetition_stop=8)
        trajs = run_agent_loop(eng, tok, examples, OverlapSearcher(WORLD.passages), EPISODE, loop, seed=0)
    finally:
        hook.remove()
    assert stopped.finish_reason == "repetition" and stopped.token_ids == [word] * 9
    assert free.finish_reason == "length" and len(free.token_ids) == 40
    assert [t.finish_reason for t in trajs] == ["repetition", "repetition"]
    assert [(t.num_turns, t.completion_tokens) for t in trajs] == [(1, 9), (1, 9)]
    assert eng.sampled_tokens == 9 + 40 + 2 * 9  # counted as sampled, for the progress meter


class LoopingEngine(RolloutEngine):
    """An engine without a repetition stop of its own: every turn is `text`, cut at the turn's token
    budget ("length") unless it ends sooner."""

    def __init__(self, tok, text: str) -> None:
        self.ids = tok.encode(text, add_special_tokens=False)

    def generate(self, prompts, sampling):
        raise NotImplementedError

    def sync_weights(self, model):
        pass

    def async_session(self, executor):
        async def generate(prompt, sampling):
            ids = self.ids[: sampling.max_new_tokens]
            finish = "length" if len(ids) == sampling.max_new_tokens else "eos"
            return Completion(ids, [-1.0] * len(ids), finish)

        return AsyncGenerate(generate)


def test_a_turn_an_engine_ran_to_its_budget_in_a_loop_ends_the_episode(policy) -> None:  # noqa: F811
    tok = policy.tokenizer
    examples = WORLD.questions("train")[:1]
    eng = LoopingEngine(tok, "<think> " + "the mentor of " * 200)
    search = OverlapSearcher(WORLD.passages)
    loop = LoopConfig(max_new_tokens=60, max_response_tokens=4000, repetition_stop=16)
    looped = run_agent_loop(eng, tok, examples, search, EPISODE, loop, seed=0)[0]
    off = run_agent_loop(
        eng, tok, examples, search, EPISODE, LoopConfig(max_new_tokens=60, max_response_tokens=4000), seed=0
    )[0]
    assert (looped.finish_reason, looped.num_turns, looped.completion_tokens) == ("repetition", 1, 60)
    assert off.finish_reason == "max_turns" and off.num_turns == EPISODE.max_turns  # each turn corrected, then the next


def test_the_model_tokens_of_an_episode_stop_at_their_own_budget(policy) -> None:  # noqa: F811
    tok = policy.tokenizer
    examples = WORLD.questions("train")[:1]
    eng = LoopingEngine(tok, "<think> " + " ".join(f"w{i}" for i in range(300)))  # no loop, no tag closed
    search = OverlapSearcher(WORLD.passages)
    loop = LoopConfig(max_new_tokens=50, max_response_tokens=4000, max_completion_tokens=120)
    t = run_agent_loop(eng, tok, examples, search, EPISODE, loop, seed=0)[0]
    assert (t.finish_reason, t.completion_tokens, t.num_turns) == ("budget", 120, 3)  # 50 + 50 + 20
    unbounded = run_agent_loop(
        eng, tok, examples, search, EPISODE, LoopConfig(max_new_tokens=50, max_response_tokens=4000), seed=0
    )[0]
    assert unbounded.completion_tokens == 50 * EPISODE.max_turns
