"""Held-out evaluation: one rollout per question (greedy by default), scored by the one scoring
layer `pvpo.reward.scoring` (EM, F1, CEM, reward, format rate, searches, the standard error of EM,
and EM per hop count when the questions carry one) under a run's `eval/*` names;
`evaluate_policy` runs it with a run's settings (before the warm start, and every `eval_every`
steps; a run's own points are `points.py`'s)."""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pvpo.envs.data import QAExample
from pvpo.envs.episode import EpisodeConfig
from pvpo.progress import Progress
from pvpo.retriever.types import Searcher
from pvpo.reward.scoring import QuestionScore, aggregate, on_disk, score_answer
from pvpo.trainer.config.schema import TrainConfig
from pvpo.trainer.data import agent_settings
from pvpo.trainer.model.device import Placement
from pvpo.trainer.rollout.agent_loop import LoopConfig, run_agent_loop
from pvpo.trainer.rollout.engine import RolloutEngine
from pvpo.trainer.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)


def trajectory_scores(trajs: Sequence[Trajectory], examples: Sequence[QAExample]) -> list[QuestionScore]:
    """Each trajectory's scores (`pvpo.reward.scoring.score_answer`: its answer against its
    example's golden answers, the env's format verdict, its searches and reward), in order."""
    return [
        score_answer(
            t.prediction, list(ex.golden_answers), format_ok=t.format_ok, searches=t.num_tool_calls, reward=t.reward
        )
        for t, ex in zip(trajs, examples, strict=True)
    ]


def eval_metrics(trajs: Sequence[Trajectory], examples: Sequence[QAExample]) -> dict[str, float]:
    """`eval/*` metrics of one trajectory per example (in the same order): `pvpo.reward.scoring`'s
    aggregate (EM per hop count where the examples carry one) under a run's names (`on_disk`)."""
    return _figures(trajectory_scores(trajs, examples), examples)


def _figures(scored: Sequence[QuestionScore], examples: Sequence[QAExample]) -> dict[str, float]:
    hops = [int(ex.metadata["hops"]) if "hops" in ex.metadata else None for ex in examples]
    return on_disk(aggregate(scored, hops))


def question_scores(trajs: Sequence[Trajectory], examples: Sequence[QAExample]) -> list[dict[str, float]]:
    """Each question's scores (`em`, `f1`, `cem`, `format_ok`, `searches`, `reward`), in order:
    what a per-dataset table and a paired comparison of two evaluations are computed from."""
    return [s.as_dict() for s in trajectory_scores(trajs, examples)]


def eval_seed(tag: str) -> int:
    """The sampling seed of the held-out evaluation named `tag` (before, after, step10, base)."""
    return zlib.crc32(f"eval/{tag}".encode())


def evaluate(
    engine: RolloutEngine,
    tokenizer: Any,
    examples: Sequence[QAExample],
    searcher: Searcher,
    episode_config: EpisodeConfig,
    loop: LoopConfig,
    *,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    batch_size: int = 64,
    per_question: list[float] | None = None,
    scores: list[dict[str, float]] | None = None,
    show_progress: bool = False,
    desc: str = "held-out evaluation",
) -> dict[str, float]:
    """Roll out each of `examples` once (greedy at temperature 0, else sampled with `top_p`) and
    return `eval_metrics` of the trajectories; `per_question`, if given, receives each one's EM,
    `scores` each one's `question_scores`; `show_progress`: a meter named `desc` (a line every 30 s
    off a terminal)."""
    loop = replace(loop, temperature=temperature, top_p=top_p)
    trajs: list[Trajectory] = []
    with Progress(total=len(examples), desc=desc, unit="q", enabled=show_progress, brief=True) as meter:
        for start in range(0, len(examples), batch_size):
            trajs += run_agent_loop(
                engine,
                tokenizer,
                examples[start : start + batch_size],
                searcher,
                episode_config,
                loop,
                seed=seed + start,
                on_done=lambda i, t: meter.update(1),
            )
    scored = trajectory_scores(trajs, examples)
    if per_question is not None:  # each question's EM, in order: paired comparisons of two evaluations
        per_question[:] = [s.em for s in scored]
    if scores is not None:
        scores[:] = [s.as_dict() for s in scored]
    return _figures(scored, examples)


def evaluate_policy(
    cfg: TrainConfig,
    engine: RolloutEngine,
    tokenizer: Any,
    where: Placement,
    examples: Sequence[QAExample],
    searcher: Searcher,
    tag: str,
    per_question: list[float] | None = None,
    scores: list[dict[str, float]] | None = None,
    show_progress: bool = False,
) -> dict[str, float]:
    """Held-out metrics (`eval/*`) of the policy behind `engine` on `examples`, one rollout each at
    the run's evaluation temperature, seeded by `tag`; `per_question` receives each one's EM,
    `scores` each one's scores (`heldout.question_scores`); `show_progress`: a meter while it runs."""
    agent = agent_settings(cfg)
    with where.autocast():
        return evaluate(
            engine,
            tokenizer,
            examples,
            searcher,
            agent.episode(),
            agent.loop(),
            temperature=cfg.run.eval_temperature,
            top_p=cfg.run.eval_top_p,
            seed=eval_seed(tag),
            batch_size=cfg.rollout.batch_size,
            per_question=per_question,
            scores=scores,
            show_progress=show_progress,
            desc=f"{cfg.data.evaluate_on.replace('_', '-')} evaluation ({tag})",
        )


def load_eval_before(path: Path) -> tuple[dict[str, float], list[float], list[dict[str, float]]]:
    """A resumed run's evaluation before RL, as the first process measured it (eval_before.json):
    its metrics, each question's EM and scores; all empty (and a warning) when the file is missing
    (a run from before that file existed: its summary says n/a)."""
    if not path.exists():
        log.warning("%s is missing: the summary has no evaluation before RL to compare with", path)
        return {}, [], []
    saved = json.loads(path.read_text())
    return saved.get("metrics", {}), saved.get("em") or [], saved.get("scores") or []


def as_validation(metrics: dict[str, float]) -> dict[str, float]:
    """`eval/*` metrics of a validation evaluation under the `val/*` names."""
    return {"val/" + k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith("eval/")}
