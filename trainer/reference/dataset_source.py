"""The GT source `dataset`: a question's own annotation (MuSiQue's decomposition, HotpotQA's
supporting facts; `pvpo.envs.dataset_gt`) written as the agent's turns and replayed through the
env with the run's real retriever, so the observations are exactly what the policy would see.

A plan is kept only when every search retrieves the paragraph its hop names (checked against the
same retriever and top-k the env uses); whether its answer earns `gt.min_reward` is `gt.py`'s
check. The source is deterministic, like `oracle`: pi_gt = 1 per token (log-prob 0) with
`gt.logprobs: source`, or the reference policy's with `gt.logprobs: reference`.

What was dropped and why is counted in `report` (no annotation, a search that missed its
paragraph) and logged after every call.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pvpo.envs.data import Paragraph, QAExample
from pvpo.envs.dataset_gt import NoPlan, Plan, dataset_plan, plan_turns
from pvpo.retriever.types import Passage
from pvpo.trainer.reference.sources import GTContext, register_gt_source
from pvpo.trainer.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


def retrieves(paragraph: Paragraph, passages: Sequence[Passage]) -> bool:
    """Whether `passages` hold `paragraph`: the same title and the same text (whitespace and case
    aside; a corpus may cut a long text, so a prefix of 200 characters decides)."""
    title, text = _norm(paragraph.title), _norm(paragraph.text)[:200]
    return any(_norm(p.title) == title and _norm(p.text)[:200] == text for p in passages)


def check_retrieval(plans: Sequence[Plan], searcher: Any, topk: int) -> list[int | None]:
    """For each plan, the 1-based number of its first hop whose search misses its paragraph, or
    None when every hop's paragraph comes back. All queries go to the retriever in one call."""
    queries = [hop.query for plan in plans for hop in plan.hops]
    results = searcher.search(queries, topk) if queries else []
    out: list[int | None] = []
    k = 0
    for plan in plans:
        miss = None
        for i, hop in enumerate(plan.hops):
            if miss is None and not retrieves(hop.paragraph, results[k + i]):
                miss = i + 1
        k += len(plan.hops)
        out.append(miss)
    return out


class DatasetSource:
    """GT trajectories written from the dataset's annotation, replayed through the env."""

    deterministic = True

    def __init__(self, context: GTContext) -> None:
        self.ctx = context
        self.report: Counter[str] = Counter()

    def generate(self, examples: Sequence[QAExample], *, attempt: int) -> list[Trajectory | None]:
        from pvpo.trainer.rollout.replay import oracle_trajectories

        c = self.ctx
        protocol = c.episode_config.tag_protocol
        plans: dict[int, Plan] = {}
        calls: Counter[str] = Counter(asked=len(examples))
        for i, ex in enumerate(examples):
            try:
                plan = dataset_plan(ex)
            except NoPlan as e:
                calls["no_plan"] += 1
                log.debug("dataset GT: %s: %s", ex.uid, e)
                continue
            if len(plan.hops) >= c.episode_config.max_turns:  # the answer needs a turn of its own
                calls["too_many_hops"] += 1
                continue
            plans[i] = plan
        misses = check_retrieval(list(plans.values()), c.searcher, c.episode_config.topk)
        for (i, plan), miss in zip(list(plans.items()), misses, strict=True):
            if miss is not None:
                calls["search_missed_paragraph"] += 1
                log.debug(
                    "dataset GT: %s: hop %d's search %r misses its paragraph", plan.uid, miss, plan.hops[miss - 1].query
                )
                del plans[i]
        keep = sorted(plans)
        turns = {examples[i].uid: plan_turns(plans[i], protocol) for i in keep}
        trajs = oracle_trajectories(
            [examples[i] for i in keep],
            lambda ex: turns[ex.uid],
            c.tokenizer,
            c.searcher,
            c.episode_config,
            chat_template=c.loop.chat_template,
            eos=False,
        )
        out: list[Trajectory | None] = [None] * len(examples)
        for i, t in zip(keep, trajs, strict=True):
            out[i] = t
        calls["written"] = len(keep)
        self.report.update(calls)
        log.info(
            "dataset GT: %d of %d questions written (%d without an annotation, %d too many hops for max_turns, "
            "%d whose search missed its paragraph); gt.min_reward decides which are kept",
            calls["written"],
            calls["asked"],
            calls["no_plan"],
            calls["too_many_hops"],
            calls["search_missed_paragraph"],
        )
        return out

    def close(self) -> None:
        return None


@register_gt_source("dataset")
def _dataset(gt_config: Any, context: GTContext) -> DatasetSource:
    return DatasetSource(context)
