"""The GT source `dataset`: a question's own annotation (MuSiQue's decomposition, HotpotQA's
supporting facts; `pvpo.envs.dataset_gt`) written as the agent's turns and replayed through the
env with the run's real retriever, so the observations are exactly what the policy would see.

A plan is kept only when every search retrieves the paragraph its hop names and the observation,
cut to `max_obs_chars`, shows the sentences the hop's finding quotes (checked against the same
retriever, top-k and budget the env uses); whether its answer earns `gt.min_reward` is `gt.py`'s
check. The source is deterministic, like `oracle`: pi_gt = 1 per token (log-prob 0) with
`gt.logprobs: source`, or the reference policy's with `gt.logprobs: reference`.

What was dropped and why is counted in `report` (no annotation, a search that missed its
paragraph, a quoted sentence the observation cut) and logged after every call.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pvpo.envs.data import Paragraph, QAExample
from pvpo.envs.dataset_gt import Hop, NoPlan, Plan, dataset_plan, plan_turns
from pvpo.envs.episode import EpisodeConfig
from pvpo.retriever.types import Passage
from pvpo.trainer.reference.gt_registry import GTContext, register_gt_source
from pvpo.trainer.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


def retrieves(paragraph: Paragraph, passages: Sequence[Passage]) -> bool:
    """Whether `passages` hold `paragraph`: the same title and the same text (whitespace and case
    aside; a corpus may cut a long text, so a prefix of 200 characters decides)."""
    title, text = _norm(paragraph.title), _norm(paragraph.text)[:200]
    return any(_norm(p.title) == title and _norm(p.text)[:200] == text for p in passages)


class _Memo:
    """A searcher that answers a (query, top-k) it has answered before from memory, so the replay
    reuses the retrieval check's results instead of searching every hop twice."""

    def __init__(self, searcher: Any) -> None:
        self.searcher = searcher
        self.seen: dict[tuple[str, int | None], list[Passage]] = {}

    def search(self, queries: Sequence[str], topk: int | None = None) -> list[list[Passage]]:
        new = list(dict.fromkeys(q for q in queries if (q, topk) not in self.seen))
        if new:
            self.seen.update(((q, topk), r) for q, r in zip(new, self.searcher.search(new, topk), strict=True))
        return [self.seen[(q, topk)] for q in queries]


MISSED = "search_missed_paragraph"
CUT = "evidence_cut"  # the paragraph came back, but the sentence its finding quotes is past the observation's budget


def _unseen(hop: Hop, passages: Sequence[Passage], episode_config: EpisodeConfig) -> str | None:
    """Why the agent could not read what `hop` quotes in the observation of `passages` (MISSED or
    CUT), or None when it can."""
    if not retrieves(hop.paragraph, passages):
        return MISSED
    text = _norm(episode_config.passages_text(passages))
    return None if all(_norm(e) in text for e in hop.evidence) else CUT


def check_retrieval(
    plans: Sequence[Plan], searcher: Any, episode_config: EpisodeConfig
) -> list[tuple[int, str] | None]:
    """For each plan, its first hop (1-based) whose observation does not show what the hop's
    finding quotes, with the reason (MISSED: the paragraph is not in the top-k; CUT: it is, but
    the quoted sentence lies past `max_obs_chars`), or None when every hop's evidence is shown.
    A GT turn quoting a sentence its observation cut would teach the policy to write facts it
    never read (MiniLM, top-2, 600 characters, the 200 questions of ../shared/data: 23 of the 158
    plans whose paragraphs all came back; 5 at 1,000 characters). All queries go to the retriever
    in one call."""
    queries = [hop.query for plan in plans for hop in plan.hops]
    results = searcher.search(queries, episode_config.topk) if queries else []
    out: list[tuple[int, str] | None] = []
    k = 0
    for plan in plans:
        miss = None
        for i, hop in enumerate(plan.hops):
            why = _unseen(hop, results[k + i], episode_config)
            if why is not None:
                miss = (i + 1, why)
                break
        k += len(plan.hops)
        out.append(miss)
    return out


def dataset_trajectories(
    examples: Sequence[QAExample],
    tokenizer: Any,
    searcher: Any,
    episode_config: EpisodeConfig,
    *,
    chat_template: bool = False,
    eos: bool = False,
) -> tuple[list[Trajectory | None], Counter[str]]:
    """Each example's dataset GT trajectory replayed through the env (None where there is no plan,
    the plan needs more searches than `max_turns` leaves room for, or a search misses its
    paragraph), and the counts of each outcome. `eos` as in `oracle_trajectories` (SFT: True;
    GT injection: False, ending at the answer's stop string as the agent loop's do)."""
    from pvpo.trainer.rollout.replay import oracle_trajectories

    plans: dict[int, Plan] = {}
    counts: Counter[str] = Counter(asked=len(examples))
    for i, ex in enumerate(examples):
        try:
            plan = dataset_plan(ex)
        except NoPlan as e:
            counts["no_plan"] += 1
            log.debug("dataset GT: %s: %s", ex.uid, e)
            continue
        if len(plan.hops) >= episode_config.max_turns:  # the answer needs a turn of its own
            counts["too_many_hops"] += 1
            continue
        plans[i] = plan
    searcher = _Memo(searcher)
    # every candidate of every plan checked in one retriever call; the first whose observations all
    # show what its turns quote is kept
    tries = [(i, c) for i, plan in plans.items() for c in plan.candidates()]
    misses = check_retrieval([c for _, c in tries], searcher, episode_config)
    chosen: dict[int, Plan] = {}
    last_reason: dict[int, str] = {}
    for (i, cand), miss in zip(tries, misses, strict=True):
        if miss is None and i not in chosen:
            chosen[i] = cand
        elif miss is not None:
            hop, last_reason[i] = miss
            log.debug("dataset GT: %s: hop %d's search %r: %s", cand.uid, hop, cand.hops[hop - 1].query, last_reason[i])
    counts.update(last_reason[i] for i in plans if i not in chosen)
    fallbacks = sum(chosen[i] is not plans[i] for i in chosen)
    if fallbacks:
        counts["fallback_plan"] += fallbacks
    plans = chosen
    keep = sorted(plans)
    turns = {examples[i].uid: plan_turns(plans[i], episode_config.tag_protocol) for i in keep}
    trajs = oracle_trajectories(
        [examples[i] for i in keep],
        lambda ex: turns[ex.uid],
        tokenizer,
        searcher,
        episode_config,
        chat_template=chat_template,
        eos=eos,
    )
    out: list[Trajectory | None] = [None] * len(examples)
    for i, t in zip(keep, trajs, strict=True):
        out[i] = t
    counts["written"] = len(keep)
    log.info(
        "dataset GT: %d of %d questions written (%d without an annotation, %d with more hops than max_turns allows, "
        "%d whose search missed its paragraph, %d whose quoted sentence the observation cut at max_obs_chars)",
        counts["written"],
        counts["asked"],
        counts["no_plan"],
        counts["too_many_hops"],
        counts[MISSED],
        counts[CUT],
    )
    return out, counts


class DatasetSource:
    """GT trajectories written from the dataset's annotation, replayed through the env; `report`
    sums the outcome counts over every call (gt.min_reward then decides which are kept)."""

    deterministic = True

    def __init__(self, context: GTContext) -> None:
        self.ctx = context
        self.report: Counter[str] = Counter()

    def generate(self, examples: Sequence[QAExample], *, attempt: int) -> list[Trajectory | None]:
        c = self.ctx
        trajs, counts = dataset_trajectories(
            examples, c.tokenizer, c.searcher, c.episode_config, chat_template=c.loop.chat_template
        )
        self.report.update(counts)
        return trajs

    def close(self) -> None:
        return None


@register_gt_source("dataset")
def _dataset(gt_config: Any, context: GTContext) -> DatasetSource:
    return DatasetSource(context)
