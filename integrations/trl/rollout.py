"""Our search episode in TRL by the tag protocol: `SearchRollout`, a `GRPOTrainer(rollout_func=...)`.

TRL's `environment_factory` reads tool calls only (the chat template's tool-call markup), so a
Search-R1-style agent, which writes `<search>` / `<answer>` tags in plain text, runs through TRL's
other hook: `rollout_func(prompts, trainer)` returns `prompt_ids`, `completion_ids`, `logprobs`,
`env_mask` (1 = model token, 0 = environment token, TRL's loss mask) and any other field, which
TRL hands to the reward functions (TRL 1.16, `GRPOTrainer._generate`). Here the episodes of a batch
run in a `SearchVectorEnv` (our rules, one retriever call per turn for the whole batch); each turn
is generated with the trainer's own model and sampling settings (`trainer.generation_config`) until
a stop string (`</search>`, `</answer>`) or EOS; the model's tokens are kept as generated, the
env's text is tokenized and masked out. The reward reaches TRL as the `search_reward` field, which
the `search_reward` reward function returns.

TRL passes a rollout function the prompts only, not their rows, so the questions are given here
(`SearchRollout(examples, ...)`) and found again by their prompt text; `rollout.dataset()` writes
the matching train dataset. Generation uses transformers' `generate` on the unwrapped policy, as
TRL's own non-vLLM path does (with vLLM, use the tool-calling environment instead).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from pvpo.envs import EpisodeConfig, QAExample, SearchVectorEnv, info_at, load_dataset, resolve_retriever
from pvpo.envs.retrieval import close_retriever
from pvpo.integrations.reference import training_pool
from pvpo.retriever.types import Searcher
from pvpo.reward import ActionKind, TagProtocol
from pvpo.trainer.reference.group_sampling import Partition

REWARD_FIELD = "search_reward"
EM_FIELD = "search_em"


def search_reward(
    completions: Sequence[Any], search_reward: Sequence[float] | None = None, **kwargs: Any
) -> list[float]:
    """TRL reward function returning the episodes' rewards that `SearchRollout` computed."""
    if search_reward is None:
        raise ValueError("search_reward needs GRPOTrainer(rollout_func=SearchRollout(...)), which provides the rewards")
    return [float(r) for r in search_reward]


class SearchRollout:
    """`rollout_func` for TRL's `GRPOTrainer`: tag-protocol search episodes over `examples` (a
    registered dataset name, a file, or QAExamples) against `retriever_url` (or `retriever`), with
    the episode rules of `pvpo/SearchQA-v0` (`protocol`, `reward`, `reward_params`, `max_turns`,
    `topk`, `max_obs_chars`, `prompt_template`). `max_turn_tokens` caps one turn's generation;
    the whole completion is capped by GRPOConfig's `max_completion_length`. Pair it with
    `reward_funcs=search_reward` and `train_dataset=rollout.dataset()`. `chat_template=True`
    renders prompts with the tokenizer's chat template (instruct models). `finished` keeps the
    last `keep` finished episodes' infos."""

    def __init__(
        self,
        examples: str | Path | Sequence[QAExample],
        retriever_url: str | Sequence[str] | None = None,
        *,
        retriever: Searcher | None = None,
        reward: str = "pvpo",
        reward_params: Mapping[str, Any] | None = None,
        protocol: str | TagProtocol = "search_r1",
        max_turns: int = 6,
        topk: int = 3,
        max_obs_chars: int | None = 2000,
        prompt_template: str = "default",
        chat_template: bool = False,
        max_turn_tokens: int = 512,
        dataset_kwargs: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
        keep: int = 4096,
    ) -> None:
        self.retriever, self._owns_retriever = resolve_retriever(retriever, retriever_url, topk=topk, timeout=timeout)
        self.config = EpisodeConfig(
            protocol, reward, dict(reward_params or {}), max_turns, topk, max_obs_chars, prompt_template
        )
        self._envs: dict[int, SearchVectorEnv] = {}
        self.examples = load_dataset(examples, **dict(dataset_kwargs or {}))
        self.by_prompt: dict[str, QAExample] = {}
        for ex in self.examples:
            text = self.config.prompt(ex)
            other = self.by_prompt.setdefault(text, ex)
            if other.golden_answers != ex.golden_answers:
                raise ValueError(f"questions {other.uid!r} and {ex.uid!r} have one prompt but different answers")
        self.chat_template = chat_template
        self.max_turn_tokens = max_turn_tokens
        self.keep = keep
        self.finished: list[dict[str, Any]] = []
        self.last: dict[str, Any] = {}

    def dataset(self, partition: Partition | str | Path | None = None) -> Any:
        """The train dataset whose prompts this rollout knows (`prompt`, `uid`, `question`,
        `golden_answers`; a chat message when `chat_template`), without what Group Sampling dropped."""
        from datasets import Dataset

        rows = []
        for ex in self.examples:
            text = self.config.prompt(ex)
            prompt: Any = [{"role": "user", "content": text}] if self.chat_template else text
            rows.append(
                {"prompt": prompt, "uid": ex.uid, "question": ex.question, "golden_answers": list(ex.golden_answers)}
            )
        return Dataset.from_list(training_pool(rows, partition))

    def close(self) -> None:
        """Close the retriever client this rollout opened (not one it was given)."""
        if self._owns_retriever:
            close_retriever(self.retriever)
            self._owns_retriever = False

    # ---- the rollout -------------------------------------------------------------------------------
    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, Any]:
        tok = trainer.processing_class
        examples = [self._example(p) for p in prompts]
        prompt_ids = [self._prompt_ids(p, tok) for p in prompts]
        n = len(prompts)
        env = self._batch_env(n)
        env.reset(options={"questions": examples})
        completions: list[list[int]] = [[] for _ in range(n)]
        masks: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        infos: list[dict[str, Any]] = [{} for _ in range(n)]
        rewards = [0.0] * n
        budget = int(trainer.max_completion_length)
        while not env.done.all():
            active = [i for i in range(n) if not env.done[i]]
            for i in [i for i in active if len(completions[i]) >= budget]:  # out of completion tokens
                rewards[i], infos[i] = env.finish(i)
            active = [i for i in active if not env.done[i]]
            if not active:
                break
            turns = self._generate(
                trainer,
                [prompt_ids[i] + completions[i] for i in active],
                min(self.max_turn_tokens, min(budget - len(completions[i]) for i in active)),
            )
            actions = [""] * n
            for i, (ids, lps, text, ended) in zip(active, turns):
                completions[i] += ids
                masks[i] += [1] * len(ids)
                logprobs[i] += lps
                if ended and self.config.tag_protocol.parse_action(text).kind is ActionKind.INVALID:
                    rewards[i], infos[i] = env.finish(i, text)  # EOS or no tokens left without an action
                else:
                    actions[i] = text
            stepping = [i for i in active if not env.done[i]]
            if not stepping:
                continue
            obs, step_rewards, terminated, truncated, step_infos = env.step(actions)
            for i in stepping:
                if terminated[i] or truncated[i]:
                    rewards[i], infos[i] = float(step_rewards[i]), info_at(step_infos, i)
                elif obs[i]:
                    ids = tok.encode(obs[i], add_special_tokens=False)
                    completions[i] += ids
                    masks[i] += [0] * len(ids)
                    logprobs[i] += [0.0] * len(ids)
        for i in range(n):
            self.finished.append({"reward": rewards[i], **infos[i]})
        del self.finished[: -self.keep]
        self.last = {
            "prompt_ids": prompt_ids,
            "completion_ids": [c[:budget] for c in completions],
            "logprobs": [lp[:budget] for lp in logprobs],
            "env_mask": [m[:budget] for m in masks],
            REWARD_FIELD: rewards,
            EM_FIELD: [float(info.get("metrics", {}).get("em", 0.0)) for info in infos],
        }
        return self.last

    # ---- helpers ------------------------------------------------------------------------------------
    def _batch_env(self, n: int) -> SearchVectorEnv:
        """A vector env of `n` episodes sharing this rollout's retriever and rules (one per batch size)."""
        if n not in self._envs:
            cfg = self.config
            self._envs[n] = SearchVectorEnv(
                n,
                None,
                retriever=self.retriever,
                protocol=cfg.tag_protocol,
                reward=cfg.reward,
                reward_params=cfg.reward_params,
                max_turns=cfg.max_turns,
                topk=cfg.topk,
                max_obs_chars=cfg.max_obs_chars,
                prompt_template=cfg.prompt_template,
            )
        return self._envs[n]

    def _example(self, prompt: Any) -> QAExample:
        text = prompt[-1]["content"] if isinstance(prompt, list) else prompt
        try:
            return self.by_prompt[text]
        except KeyError:
            raise KeyError(
                "a prompt this SearchRollout was not given; build the train dataset with rollout.dataset()"
            ) from None

    def _prompt_ids(self, prompt: Any, tok: Any) -> list[int]:
        if isinstance(prompt, list):
            text = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            return list(tok(text, add_special_tokens=False)["input_ids"])
        return list(tok(prompt)["input_ids"])  # as TRL tokenizes a standard prompt

    def _generate(
        self, trainer: Any, sequences: list[list[int]], max_new_tokens: int
    ) -> list[tuple[list[int], list[float], str, bool]]:
        """One turn for each sequence: `(token ids, their sampling log-probs, text, ended)`, where
        `ended` means it stopped without a stop string (EOS, or `max_new_tokens` reached)."""
        from trl.models import unwrap_model_for_generation

        tok = trainer.processing_class
        device = trainer.accelerator.device
        width = max(map(len, sequences))
        pad = tok.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in sequences], device=device)
        attention = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences], device=device)
        config = copy.deepcopy(trainer.generation_config)
        config.max_new_tokens = max(1, max_new_tokens)
        config.stop_strings = list(self.config.tag_protocol.stop_strings)
        config.return_dict_in_generate, config.output_scores = True, True
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model, torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=attention, generation_config=config, tokenizer=tok)
        new = out.sequences[:, width:].tolist()
        scores = torch.stack(out.scores, dim=1).float().log_softmax(-1) if out.scores else None
        eos = set(trainer.eos_token_ids)
        turns = []
        for b, ids in enumerate(new):
            end, stopped = self._turn_end(ids, tok, eos)
            ids = ids[:end]
            lps = [float(scores[b, t, tok_id]) for t, tok_id in enumerate(ids)] if scores is not None else [0.0] * end
            turns.append((ids, lps, tok.decode(ids, skip_special_tokens=True), not stopped))
        return turns

    def _turn_end(self, ids: list[int], tok: Any, eos: set[int]) -> tuple[int, bool]:
        """Where a generated turn ends in a padded batch row, and whether a stop string ended it:
        just after the token that completes a stop string, else just after the first EOS (padding
        may repeat it), else all of it."""
        stops = self.config.tag_protocol.stop_strings
        first_eos = next((k for k, t in enumerate(ids) if t in eos), len(ids))
        if any(s in tok.decode(ids) for s in stops):
            lo, hi = 1, len(ids)  # the shortest prefix whose text holds a stop string
            while lo < hi:
                mid = (lo + hi) // 2
                if any(s in tok.decode(ids[:mid]) for s in stops):
                    hi = mid
                else:
                    lo = mid + 1
            if lo <= first_eos + 1:
                return lo, True
        return min(first_eos + 1, len(ids)), False
