"""Our search episode in TRL by the tag protocol: `SearchRollout`, a `GRPOTrainer(rollout_func=...)`.

TRL's `environment_factory` reads tool calls only (the chat template's tool-call markup), so a
Search-R1-style agent, which writes `<search>` / `<answer>` tags in plain text, runs through TRL's
other hook: `rollout_func(prompts, trainer)` returns `prompt_ids`, `completion_ids`, `logprobs`,
`env_mask` (1 = model token, 0 = environment token, TRL's loss mask) and any other field, which
TRL hands to the reward functions (TRL 1.16, `GRPOTrainer._generate`). Here the episodes of a batch
run in our one episode driver (`pvpo.trainer.rollout.agent_loop`, as in `pvpo train` and `pvpo
eval`: the same ending, mask and reward rules; the searches of turns that end together meet in one
retriever call); each turn is generated with the trainer's own model and sampling settings
(`trainer.generation_config`, `TrainerEngine`) until a stop string (`</search>`, `</answer>`) or
EOS; the model's tokens are kept as generated, the env's text is tokenized and masked out. The
reward reaches TRL as the `search_reward` field, which the `search_reward` reward function returns.

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

from pvpo.envs import EpisodeConfig, QAExample, load_dataset, resolve_retriever
from pvpo.envs.retrieval import close_retriever
from pvpo.integrations.reference import training_pool
from pvpo.retriever.types import Searcher
from pvpo.reward import TagProtocol
from pvpo.trainer.reference.group_sampling import Partition
from pvpo.trainer.rollout.agent_loop import LoopConfig, run_agent_loop
from pvpo.trainer.rollout.engine import Completion, RolloutEngine, SamplingConfig

REWARD_FIELD = "search_reward"
EM_FIELD = "search_em"
FINISH_FIELD = "search_finish_reason"


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
        budget = int(trainer.max_completion_length)
        loop = LoopConfig(
            max_new_tokens=self.max_turn_tokens,
            max_response_tokens=budget,
            chat_template=self.chat_template,
            max_concurrency=max(1, len(examples)),
        )
        seed = int(getattr(getattr(trainer, "args", None), "seed", 0) or 0)
        trajs = run_agent_loop(TrainerEngine(trainer), tok, examples, self.retriever, self.config, loop, seed=seed)
        for t in trajs:
            # the driver's turn count: with the turn it ended on, read or not
            self.finished.append(
                {"reward": t.reward, **t.info, "num_turns": t.num_turns, "finish_reason": t.finish_reason}
            )
        del self.finished[: -self.keep]
        self.last = {
            "prompt_ids": [t.prompt_ids for t in trajs],
            "completion_ids": [t.response_ids for t in trajs],
            "logprobs": [t.old_logprobs for t in trajs],
            "env_mask": [t.loss_mask for t in trajs],
            REWARD_FIELD: [t.reward for t in trajs],
            EM_FIELD: [t.accuracy for t in trajs],
            FINISH_FIELD: [t.finish_reason for t in trajs],
        }
        return self.last

    # ---- helpers ------------------------------------------------------------------------------------
    def _example(self, prompt: Any) -> QAExample:
        text = prompt[-1]["content"] if isinstance(prompt, list) else prompt
        try:
            return self.by_prompt[text]
        except KeyError:
            raise KeyError(
                "a prompt this SearchRollout was not given; build the train dataset with rollout.dataset()"
            ) from None


class TrainerEngine(RolloutEngine):
    """The TRL trainer's own policy as a rollout engine: transformers' `generate` on the unwrapped
    model with the trainer's sampling settings (`trainer.generation_config`), as TRL's own
    non-vLLM path generates. The turns of one batch that share a token limit go to one `generate`
    call; TRL seeds its own sampling, so the driver's per-turn seeds are not used."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Completion]:
        from trl.models import unwrap_model_for_generation

        trainer = self.trainer
        tok = trainer.processing_class
        sequences = [list(p) for p in prompts]
        width = max(map(len, sequences))
        pad = tok.pad_token_id
        device = trainer.accelerator.device
        input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in sequences], device=device)
        attention = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences], device=device)
        config = copy.deepcopy(trainer.generation_config)
        config.max_new_tokens = max(1, sampling.max_new_tokens)
        config.stop_strings = list(sampling.stop) or None
        config.return_dict_in_generate, config.output_scores = True, True
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model, torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=attention, generation_config=config, tokenizer=tok)
        new = out.sequences[:, width:].tolist()
        scores = torch.stack(out.scores, dim=1).float().log_softmax(-1) if out.scores else None
        eos = set(trainer.eos_token_ids)
        completions = []
        for b, ids in enumerate(new):
            end, finish = self._turn_end(ids, tok, eos, sampling.stop)
            ids = ids[:end]
            lps = [float(scores[b, t, tok_id]) for t, tok_id in enumerate(ids)] if scores is not None else [0.0] * end
            completions.append(Completion(ids, lps, finish))
        return completions

    @staticmethod
    def _turn_end(ids: list[int], tok: Any, eos: set[int], stops: Sequence[str]) -> tuple[int, str]:
        """Where a generated turn ends in a padded batch row, and how: just after the token that
        completes a stop string ("stop"), else just after the first EOS ("eos"; padding may
        repeat it), else all of it ("length")."""
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
                return lo, "stop"
        if first_eos < len(ids):
            return first_eos + 1, "eos"
        return len(ids), "length"

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Nothing to do: the engine samples from the trainer's model itself."""
