"""A run's held-out points: the evaluation before RL, every `run.eval_every` steps and after,
and the validation points that pick the best step. Each takes a narrow view of the run
(`PolicyUnderTest`: what evaluating its current policy needs; `ValidatedRun`: its config, splits,
result and an evaluation), never the Trainer itself; the scoring is `scoring.py`'s."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pvpo.atomic import atomic_write_json
from pvpo.envs.data import QAExample
from pvpo.retriever.types import Searcher
from pvpo.trainer.config.schema import TrainConfig
from pvpo.trainer.data import Data
from pvpo.trainer.heldout.scoring import as_validation, evaluate_policy, load_eval_before
from pvpo.trainer.model.device import PhaseMemory, Placement
from pvpo.trainer.parallel import distributed as ddp
from pvpo.trainer.rollout.engine import RolloutEngine
from pvpo.trainer.state.result import TrainResult


@dataclass(frozen=True)
class PolicyUnderTest:
    """What a held-out evaluation of a run's current policy uses (`evaluate_current`): the run's
    config, the engine and tokenizer over the policy and where it runs, the retriever, the memory
    meter of the run's phases, the step mode's pause (rollouts beside the update wait meanwhile)
    and whether a meter shows."""

    cfg: TrainConfig
    engine: RolloutEngine
    tokenizer: Any
    where: Placement
    searcher: Searcher
    memory: PhaseMemory
    paused: Callable[[], AbstractContextManager[None]]
    show_progress: bool


def evaluate_current(
    policy: PolicyUnderTest,
    tag: str,
    questions: Sequence[QAExample],
    *,
    result: TrainResult | None = None,
    per_question_out: list[float] | None = None,
) -> dict[str, float]:
    """Held-out metrics (`eval/*`) of a run's current policy, one rollout per question of
    `questions`, each rank its share, the metrics weighted by share size; `result`, if given,
    keeps each question's EM and scores under `tag` and `per_question_out` receives each
    question's EM (one process only)."""
    if not questions:
        return {}
    share = ddp.rank_share(questions)
    per_question: list[float] = []
    scores: list[dict[str, float]] = []
    with policy.paused(), policy.memory.phase("eval"):  # mem/eval_*: logged with the step the evaluation follows
        metrics = (
            evaluate_policy(
                policy.cfg,
                policy.engine,
                policy.tokenizer,
                policy.where,
                share,
                policy.searcher,
                tag,
                per_question,
                scores,
                show_progress=policy.show_progress,
            )
            if share
            else {}
        )
    if not ddp.is_distributed() and result is not None:
        result.eval_em[tag] = per_question
        result.eval_scores[tag] = scores
    if not ddp.is_distributed() and per_question_out is not None:
        per_question_out[:] = per_question
    return ddp.reduce_metrics(metrics, len(share))


class ValidatedRun(Protocol):
    """What the evaluation before RL and the validation points use of a run (`loop.Trainer`): its
    config, splits and result, and an evaluation of its current policy."""

    @property
    def cfg(self) -> TrainConfig: ...

    @property
    def data(self) -> Data: ...

    @property
    def result(self) -> TrainResult: ...

    def evaluate(
        self, tag: str, examples: Sequence[QAExample] | None = None, per_question_out: list[float] | None = None
    ) -> dict[str, float]: ...


def watches_validation(cfg: TrainConfig, data: Data) -> bool:
    """Whether the run watches a validation split (`run.eval_every` and `data.validation_examples`)."""
    return bool(cfg.run.eval_every and data.validation)


def validation_point(run: ValidatedRun, step: int, last: bool) -> tuple[dict[str, float], list[float]]:
    """The validation metrics (`val/*`) and each validation question's EM at `step` (0: before RL)
    when the run watches its validation split and the step is due (every `run.eval_every`, and the
    last); empty otherwise. With `data.evaluate_on=validation` the evaluation before and after RL
    are the validation ones and are reused, not run twice."""
    every = run.cfg.run.eval_every
    if not watches_validation(run.cfg, run.data) or not (step == 0 or last or step % every == 0):
        return {}, []
    result = run.result
    if run.data.validation is run.data.eval and (step == 0 or last):
        tag = "before" if step == 0 else "after"
        return as_validation(result.eval_before if step == 0 else result.eval_after), result.eval_em.get(tag, [])
    em: list[float] = []
    tag = "val_before" if step == 0 else f"val_step{step}"
    return as_validation(run.evaluate(tag, run.data.validation, em)), em


def evaluation_before(run: ValidatedRun, *, fresh: bool, saved: Path) -> None:
    """A run's evaluation before RL into its result: measured (and saved to `saved`,
    eval_before.json, by the main rank) on a `fresh` run, read back from that file on a resumed one."""
    result = run.result
    if fresh:
        result.eval_before = run.evaluate("before")
        if ddp.is_main():
            atomic_write_json(
                saved,
                {
                    "metrics": result.eval_before,
                    "em": result.eval_em.get("before", []),
                    "scores": result.eval_scores.get("before", []),
                },
            )
        return
    result.eval_before, em, scores = load_eval_before(saved)
    if not ddp.is_distributed():
        result.eval_em.update({"before": em} if em else {})
        result.eval_scores.update({"before": scores} if scores else {})
