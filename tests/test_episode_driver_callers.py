"""One episode driver for every caller: the same scripted model over the same questions gives the
same trajectory (token ids, loss mask, log-probs, reward, turn count, finish reason) through the
trainer's rollout (`run_agent_loop`), `pvpo eval` (`TokenPolicy`), the TRL adapter
(`SearchRollout`) and the verl adapter (`PVPOSearchAgentLoop`; the stand-in here, verl itself under
`make test-verl`). The questions cover every ending: an answer after a search, EOS without an
answer, an invalid action (corrected by the env, then answered), the turn limit and the token
budget."""

from __future__ import annotations

import asyncio
import importlib.util
import math
from collections import defaultdict
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from verl_support import agent_loop, chat_tokenizer

from pvpo.envs import EpisodeConfig, QAExample
from pvpo.integrations.verl.data import verl_rows
from pvpo.retriever.types import Passage
from pvpo.trainer.rollout.agent_loop import LoopConfig, run_agent_loop
from pvpo.trainer.rollout.engine import Completion, RolloutEngine, SamplingConfig
from pvpo.trainer.rollout.trajectory import Trajectory

BUDGET = 400  # response tokens (model and env) of one trajectory; also one turn's limit
MAX_TURNS = 3
EOS = "<|endoftext|>"
# question -> what the scripted model writes, turn by turn
SCRIPT = {
    "What is the capital of Germany?": [
        "<think>look it up</think><search> capital of Germany </search>",
        "<answer> Berlin </answer>",
    ],
    "Who wrote Hamlet?": [f"I think it is Shakespeare{EOS}"],
    "Where is the Louvre?": ["<think>hmm</think></search>", "<answer> Paris </answer>"],
    "Which river flows through Cairo?": ["<search> Cairo river </search>"] * MAX_TURNS,
    "How tall is Everest?": ["<think>" + " Everest height metres" * 30],
}
EXAMPLES = [
    QAExample(f"q{i}", q, (gold,))
    for i, (q, gold) in enumerate(zip(SCRIPT, ["Berlin", "Shakespeare", "Paris", "Nile", "8849"], strict=True))
]
ENDINGS = ["answer", "eos", "answer", "max_turns", "budget"]


def episode_config() -> EpisodeConfig:
    return EpisodeConfig("search_r1", "pvpo", {}, MAX_TURNS, 2, 120)


class StubSearcher:
    """Two passages per query, named after it."""

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        return [[Passage(f"{q}-{k}", f"{q} {k}\nAbout {q}.") for k in range(topk)] for q in queries]

    def close(self) -> None:
        pass


class Script:
    """The scripted model: for the question in the context, its next scripted turn, cut at the
    turn's token limit; every token's log-prob that of a uniform distribution over the vocabulary."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.turns = {q: [tokenizer.encode(t, add_special_tokens=False) for t in ts] for q, ts in SCRIPT.items()}
        self.done: defaultdict[str, int] = defaultdict(int)
        self.logprob = -math.log(len(tokenizer))

    def next(self, context: Sequence[int], max_new_tokens: int) -> list[int]:
        text = self.tok.decode(list(context))
        question = next(q for q in self.turns if q in text)
        k, self.done[question] = self.done[question], self.done[question] + 1
        return self.turns[question][k][:max_new_tokens]

    def finish(self, ids: list[int], max_new_tokens: int) -> str:
        if ids and ids[-1] == self.tok.eos_token_id:
            return "eos"
        if self.tok.decode(ids).endswith(("</search>", "</answer>")):
            return "stop"
        assert len(ids) == max_new_tokens, "a scripted turn ends on EOS, a stop string or its limit"
        return "length"


class ScriptedEngine(RolloutEngine):
    """The script as a rollout engine (what the trainer and `pvpo eval` sample with)."""

    def __init__(self, script: Script) -> None:
        self.script = script

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Completion]:
        out = []
        for p in prompts:
            ids = self.script.next(p, sampling.max_new_tokens)
            out.append(
                Completion(ids, [self.script.logprob] * len(ids), self.script.finish(ids, sampling.max_new_tokens))
            )
        return out

    def sync_weights(self, model: torch.nn.Module) -> None:
        pass


class ScriptedServer:
    """The script as verl's server manager (no finish reason: the adapter reads the ending)."""

    def __init__(self, script: Script) -> None:
        self.script = script

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **kw: Any) -> Any:
        ids = self.script.next(prompt_ids, sampling_params["max_tokens"])
        return SimpleNamespace(token_ids=ids, log_probs=[self.script.logprob] * len(ids))


class ScriptedHFModel(torch.nn.Module):
    """The script behind transformers' `generate` interface, as TRL's trainer calls it: left-padded
    rows in, the rows with their new tokens (padded with EOS) and each step's scores out."""

    is_gradient_checkpointing = False

    def __init__(self, script: Script) -> None:
        super().__init__()
        self.script = script

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, generation_config: Any, **kw: Any) -> Any:
        rows = [
            self.script.next(ids[mask.bool()].tolist(), generation_config.max_new_tokens)
            for ids, mask in zip(input_ids, attention_mask, strict=True)
        ]
        width = max(map(len, rows))
        pad = self.script.tok.eos_token_id
        new = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        scores = tuple(torch.zeros(len(rows), len(self.script.tok)) for _ in range(width))
        return SimpleNamespace(sequences=torch.cat([input_ids, new], dim=1), scores=scores)


def loop_config() -> LoopConfig:
    return LoopConfig(max_new_tokens=BUDGET, max_response_tokens=BUDGET, chat_template=True)


def record(t: Trajectory) -> dict[str, Any]:
    return {
        "prompt_ids": list(t.prompt_ids),
        "response_ids": list(t.response_ids),
        "mask": list(t.loss_mask),
        "logprobs": [round(x, 5) for x in t.old_logprobs],
        "reward": round(t.reward, 6),
        "turns": t.num_turns,
        "finish": t.finish_reason,
    }


def through_trainer(tok: Any) -> list[dict[str, Any]]:
    trajs = run_agent_loop(
        ScriptedEngine(Script(tok)), tok, EXAMPLES, StubSearcher(), episode_config(), loop_config(), seed=0
    )
    return [record(t) for t in trajs]


def through_eval(tok: Any, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    from pvpo.evaluation import policies
    from pvpo.evaluation.run import EvalSettings

    seen: dict[str, Trajectory] = {}
    make_outcome = policies._outcome

    def spy(prompt: str, t: Trajectory, protocol: Any) -> Any:  # the trajectory an Outcome is made of
        seen[t.uid] = t
        return make_outcome(prompt, t, protocol)

    monkeypatch.setattr(policies, "_outcome", spy)
    settings = EvalSettings(  # the trainer's limits: no per-question token cap, no repetition stop (eval's defaults)
        max_turns=MAX_TURNS,
        max_new_tokens=BUDGET,
        max_response_tokens=BUDGET,
        chat_template=True,
        topk=2,
        max_completion_tokens=None,
        repetition_stop=0,
    )
    outcomes = policies.TokenPolicy(ScriptedEngine(Script(tok)), tok).rollout(
        EXAMPLES, StubSearcher(), episode_config(), settings, seed=0
    )
    assert [o.stop_reason for o in outcomes] == ENDINGS
    return [record(seen[ex.uid]) for ex in EXAMPLES]


def through_trl(tok: Any) -> list[dict[str, Any]]:
    from accelerate import Accelerator
    from transformers import GenerationConfig

    from pvpo.integrations.trl import SearchRollout

    cfg = episode_config()
    rollout = SearchRollout(
        EXAMPLES,
        retriever=StubSearcher(),
        reward=cfg.reward,
        max_turns=cfg.max_turns,
        topk=cfg.topk,
        max_obs_chars=cfg.max_obs_chars,
        chat_template=True,
        max_turn_tokens=BUDGET,
    )
    trainer = SimpleNamespace(
        processing_class=tok,
        max_completion_length=BUDGET,
        accelerator=Accelerator(cpu=True),
        model_wrapped=ScriptedHFModel(Script(tok)),
        generation_config=GenerationConfig(do_sample=False),
        eos_token_ids=[tok.eos_token_id],
        args=SimpleNamespace(seed=0),
    )
    out = rollout(rollout.dataset()["prompt"], trainer)
    records = []
    for i in range(len(EXAMPLES)):
        records.append(
            {
                "prompt_ids": out["prompt_ids"][i],
                "response_ids": out["completion_ids"][i],
                "mask": out["env_mask"][i],
                "logprobs": [round(x, 5) for x in out["logprobs"][i]],
                "reward": round(out["search_reward"][i], 6),
                "turns": rollout.finished[i]["num_turns"],
                "finish": out["search_finish_reason"][i],
            }
        )
    return records


def through_verl(tok: Any, verl_api: Any) -> list[dict[str, Any]]:
    cfg = episode_config()
    entry = {
        "_target_": "pvpo.integrations.verl.agent_loop.PVPOSearchAgentLoop",
        "retriever_url": "http://127.0.0.1:9",  # replaced by the stub below; never called
        "reward": cfg.reward,
        "max_turns": cfg.max_turns,
        "topk": cfg.topk,
        "max_obs_chars": cfg.max_obs_chars,
    }
    server = ScriptedServer(Script(tok))

    async def go() -> list[Any]:
        outs = []
        for row in verl_rows(EXAMPLES):
            loop = agent_loop(verl_api, tok, server, entry, response_length=BUDGET)
            loop.retriever = StubSearcher()
            outs.append(await loop.run({"logprobs": True}, **{**row, "raw_prompt": row["prompt"]}))
        return outs

    records = []
    for out in asyncio.run(go()):
        records.append(
            {
                "prompt_ids": list(out.prompt_ids),
                "response_ids": list(out.response_ids),
                "mask": list(out.response_mask),
                "logprobs": [round(x, 5) for x in out.response_logprobs],
                "reward": round(out.reward_score, 6),
                "turns": out.num_turns - 1 - int(out.extra_fields["reward_extra_info"]["num_searches"]),
                "finish": out.extra_fields["finish_reason"],
            }
        )
    return records


def test_trainer_eval_trl_and_verl_give_identical_trajectories_for_every_ending(verl_api, monkeypatch) -> None:
    tok = chat_tokenizer()
    trainer = through_trainer(tok)
    assert [r["finish"] for r in trainer] == ENDINGS
    answered, eos, invalid, turns, budget = trainer
    assert answered["reward"] == 1.0 and 0 in answered["mask"] and answered["turns"] == 2
    assert eos["turns"] == 1 and set(eos["mask"]) == {1} and eos["response_ids"][-1] == tok.eos_token_id
    correction = [t for t, m in zip(invalid["response_ids"], invalid["mask"], strict=True) if m == 0]
    assert "<answer>" in tok.decode(correction) and invalid["turns"] == 2  # the env's correction, masked out
    assert turns["turns"] == MAX_TURNS
    assert len(budget["response_ids"]) == BUDGET and budget["turns"] == 1

    assert through_eval(tok, monkeypatch) == trainer
    assert through_verl(tok, verl_api) == trainer
    if importlib.util.find_spec("trl") is not None:  # in the dev extra; not in verl's venv (make test-verl)
        assert through_trl(tok) == trainer
