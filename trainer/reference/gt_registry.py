"""Ground-truth (GT) trajectories for Group Sampling's never-solved prompts (PVPO, arXiv:2508.21104).

A GT source writes a correct trajectory for a prompt; the trainer injects it into that prompt's
groups with its own per-token probabilities, pi_gt, as the PPO ratio's denominator. Sources are
registered by name (`algorithm.gt.source`):

- `oracle`: the synthetic world's oracle trajectory, replayed through the env (offline). The
  oracle is deterministic, so under it every token it wrote has probability 1: pi_gt = 1 (log 0)
  with `gt.logprobs: source`. The ratio pi_theta / pi_gt is then pi_theta itself, never above 1,
  so the clip never stops a GT token from being pushed up; `gt.logprobs: reference` uses the frozen
  initial policy instead (ratio 1 at the start, clipped once the policy exceeds it by 1+eps).
- `model`: PVPO's "larger model" (the paper used Qwen2.5-72B-Instruct). A local HF folder runs the
  agent loop through our engines, token-exact, its sampled log-probs are pi_gt (its tokenizer must
  be the policy's); an OpenAI-compatible chat endpoint runs the same turns as text, which are
  tokenized with the policy's tokenizer: pi_gt of a turn is the endpoint's log-probs where its
  tokens spell the turn as the policy's tokenizer does, the reference policy's otherwise
  (`gt.logprobs: reference`, required; `gt.set_pi_gt` decides turn by turn).
- `dataset`: the question's own annotation (MuSiQue's `question_decomposition`, HotpotQA's
  `supporting_facts`) written as search turns and replayed through the env with the run's
  retriever (`dataset_source.py`); kept only where every search retrieves its gold paragraph and
  the observation shows the sentences the next turn quotes.
  Deterministic like `oracle`: pi_gt = 1 per token with `gt.logprobs: source`.

What is kept and cached is `gt.py`'s. This module imports nothing heavy: the config checks
`algorithm.gt.source` against the registry's names without importing a source.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pvpo.registry import Registry

if TYPE_CHECKING:
    from pvpo.envs.data import QAExample
    from pvpo.envs.episode import EpisodeConfig
    from pvpo.retriever.types import Searcher
    from pvpo.trainer.rollout.agent_loop import LoopConfig
    from pvpo.trainer.rollout.trajectory import Trajectory


@dataclass
class GTContext:
    """What a source needs from the run: the policy's tokenizer, the env's rules and retriever,
    the loop limits, and the synthetic world (for `oracle`)."""

    tokenizer: Any
    searcher: Searcher
    episode_config: EpisodeConfig
    loop: LoopConfig
    world: Any = None


class GTSource(Protocol):
    """Writes one trajectory per example (None where it produced nothing), `attempt` 0, 1, ...;
    a `deterministic` source writes the same every time, so it gets one attempt."""

    deterministic: bool

    def generate(self, examples: Sequence[QAExample], *, attempt: int) -> list[Trajectory | None]: ...

    def close(self) -> None: ...


SourceFactory = Callable[[Any, GTContext], GTSource]
GT_SOURCES: Registry[SourceFactory] = Registry(
    "GT source",
    lazy={
        "oracle": "pvpo.trainer.reference.gt_sources",
        "model": "pvpo.trainer.reference.gt_sources",
        "dataset": "pvpo.trainer.reference.dataset_source",
    },
)


def register_gt_source(name: str) -> Callable[[SourceFactory], SourceFactory]:
    """Make a GT source factory `(gt_config, context) -> GTSource` available by name."""
    return GT_SOURCES.register(name)


def build_gt_source(name: str, gt_config: Any, context: GTContext) -> GTSource:
    """The registered source `name`; UnknownNameError listing the known ones otherwise."""
    return GT_SOURCES.get(name)(gt_config, context)
