"""Ground-truth search plans from a dataset's own annotations, and the agent turns that carry them
out in a tag protocol (the `dataset` GT source of PVPO's Group Sampling, arXiv:2508.21104).

Real multi-hop datasets say how each question is answered:
- MuSiQue's `question_decomposition`: one sub-question per hop, its answer, and the paragraph that
  supports it; a later sub-question names an earlier answer as `#k` (1-based), and some are written
  as `subject >> relation` (Wikidata style).
- HotpotQA's `supporting_facts`: the titles (and sentence numbers) of the two gold paragraphs, for a
  `bridge` question (the second entity is found through the first) or a `comparison` (both
  entities are looked up, then compared).

A plan is the list of hops (what to search, which paragraph it must retrieve, what was learnt) and
the answer; `plan_turns` writes it as the agent's turns (think, search, ..., think, answer), each
ending with its stop string so the env can replay it turn by turn, as the synthetic world's oracle
does. Whether a plan's searches really retrieve their paragraphs, with the sentences each finding
quotes (`Hop.evidence`) inside what the observation shows, is the caller's check (it needs the
retriever); this module is pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pvpo.envs.data import Paragraph, QAExample
from pvpo.reward import SEARCH_R1, TagProtocol

_PLACEHOLDER = re.compile(r"#(\d+)")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


class NoPlan(ValueError):
    """The example carries no annotation a plan can be written from (the reason says which)."""


@dataclass(frozen=True)
class Hop:
    """One search of a plan: the query, the paragraph it must bring back, what the agent learns;
    `need` is what the agent says it looks for (default: the query); `evidence`, the sentences of
    the paragraph that `finding` quotes, which the agent must be able to read in the observation."""

    query: str
    paragraph: Paragraph
    finding: str
    need: str | None = None
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    """How an annotated question is answered: its hops in order, then `answer`; `fallback`, the
    plan to try when one of this plan's searches misses its paragraph."""

    uid: str
    hops: tuple[Hop, ...]
    answer: str
    fallback: Plan | None = None

    def candidates(self) -> list[Plan]:
        """This plan, then its fallbacks in order."""
        out = [self]
        while (nxt := out[-1].fallback) is not None:
            out.append(nxt)
        return out


def substitute(question: str, answers: Sequence[str]) -> str:
    """MuSiQue's `#k` placeholders replaced by the answer of hop k (1-based); `subject >> relation`
    rewritten as `relation of subject`. A `#k` naming a hop not answered yet raises NoPlan."""

    def fill(m: re.Match[str]) -> str:
        k = int(m.group(1))
        if not 1 <= k <= len(answers):
            raise NoPlan(f"sub-question {question!r} refers to #{k}, but only {len(answers)} hop(s) precede it")
        return answers[k - 1]

    text = _PLACEHOLDER.sub(fill, question).strip()
    if ">>" in text:
        subject, _, relation = text.partition(">>")
        text = f"{relation.strip()} of {subject.strip()}"
    return " ".join(text.rstrip("?").split()).strip()


def musique_plan(example: QAExample) -> Plan:
    """The plan of a MuSiQue question: one hop per sub-question, earlier answers substituted."""
    steps = example.metadata.get("question_decomposition") or []
    if not steps:
        raise NoPlan("no question_decomposition")
    answers: list[str] = []
    hops = []
    for i, step in enumerate(steps):
        pos = step.get("paragraph")
        if pos is None or not 0 <= int(pos) < len(example.paragraphs):
            raise NoPlan(f"hop {i + 1} names no supporting paragraph")
        query = substitute(str(step.get("question", "")), answers)
        answer = str(step.get("answer", "")).strip()
        if not query or not answer:
            raise NoPlan(f"hop {i + 1} has an empty sub-question or answer")
        paragraph = example.paragraphs[int(pos)]
        said = f"The answer to '{query}' is {answer}."
        evidence = _sentence_with(paragraph.text, answer)
        quoted = (evidence,) if evidence else ()
        hops.append(Hop(query, paragraph, f"{evidence} {said}" if evidence else said, evidence=quoted))
        answers.append(answer)
    return Plan(example.uid, tuple(hops), _answer(example))


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def _sentence_with(text: str, answer: str, max_words: int = 40) -> str | None:
    """The first sentence of `text` that holds `answer` (case aside), the evidence a hop's
    finding quotes before stating the answer (copy, then extract); None when no sentence of at
    most `max_words` words holds it."""
    needle = answer.lower().strip()
    if not needle:
        return None
    return next((x for x in _sentences(text) if needle in x.lower() and len(x.split()) <= max_words), None)


def _fact(paragraph: Paragraph, sentence_ids: Sequence[int]) -> list[str]:
    """The supporting sentences of a paragraph (its first sentence when the ids fall outside)."""
    sents = _sentences(paragraph.text)
    return [sents[i] for i in sorted(set(sentence_ids)) if 0 <= i < len(sents)] or sents[:1]


def _base_title(title: str) -> str:
    """A Wikipedia title without its disambiguation: `Lilu (mythology)` -> `Lilu`."""
    return re.sub(r"\s*\([^)]*\)\s*$", "", title).strip()


def _mentions(question: str, title: str) -> bool:
    base = _base_title(title).lower()
    return bool(base) and base in question.lower()


def hotpotqa_plan(example: QAExample) -> Plan:
    """The plan of a HotpotQA question: one search per gold paragraph, queried by its title.
    Bridge: the paragraph holding the answer is read last (the other is the bridge entity's);
    comparison: both entities in the order the annotation lists them. A first paragraph whose
    title the question does not name is searched with the question itself: a policy cannot guess
    a title it has not read (later titles come from the passages already read)."""
    facts = example.metadata.get("supporting_facts") or []
    if isinstance(facts, dict):  # Hugging Face layout: {"title": [...], "sent_id": [...]}
        facts = list(zip(facts.get("title", []), facts.get("sent_id", []), strict=False))
    order: list[str] = []
    sentence_ids: dict[str, list[int]] = {}
    for fact in facts:
        title, sid = str(fact[0]), int(fact[1]) if len(fact) > 1 else 0
        if title not in sentence_ids:
            order.append(title)
            sentence_ids[title] = []
        sentence_ids[title].append(sid)
    by_title = {p.title: p for p in example.paragraphs}
    missing = [t for t in order if t not in by_title]
    if not order or missing:
        raise NoPlan(
            f"supporting_facts name paragraph(s) the example does not hold: {missing}"
            if missing
            else "no supporting_facts"
        )
    answer = _answer(example)
    if example.metadata.get("type", "bridge") != "comparison":
        has_answer = [t for t in order if answer.lower() in by_title[t].text.lower()]
        if len(has_answer) == 1:  # read the bridge entity first, the answer's paragraph last
            order = [t for t in order if t != has_answer[0]] + has_answer
    given = example.metadata.get("supporting_sentences") or {}

    def evidence(title: str) -> tuple[str, ...]:
        return tuple(given[title]) if given.get(title) else tuple(_fact(by_title[title], sentence_ids[title]))

    hops = [Hop(t, by_title[t], " ".join(evidence(t)), evidence=evidence(t)) for t in order]
    titled = Plan(example.uid, tuple(hops), answer)
    if _mentions(example.question, order[0]):
        return titled
    question = example.question.rstrip("?").strip()
    hops[0] = replace(hops[0], query=question, need="what the question asks")
    return Plan(example.uid, tuple(hops), answer, fallback=titled)


def _evidence_title(subject: str, index: int, titles: Sequence[str], n_triples: int) -> str | None:
    """The supporting paragraph a 2Wiki evidence triple's subject names: the title itself (case
    aside), the title without its disambiguation, the annotation's title at the same position when
    there is one triple per title, else the title sharing the most words (None when none shares one)."""
    low = subject.lower()
    for t in titles:
        if t.lower() == low or _base_title(t).lower() == _base_title(subject).lower():
            return t
    if n_triples == len(titles):
        return titles[index]
    words = set(low.split())
    best = max(titles, key=lambda t: len(words & set(t.lower().split())), default=None)
    return best if best is not None and words & set(best.lower().split()) else None


def twowiki_plan(example: QAExample) -> Plan:
    """The plan of a 2WikiMultihopQA question from its `evidences` triples (subject, relation,
    object) and `supporting_facts`: one search per supporting paragraph, in the annotation's order,
    each finding quoting the paragraph's supporting sentences and stating its triples ("The
    director of X is Y."). A paragraph the question names is searched by its title; one reached
    through an earlier hop (a bridge entity) by the name that hop learnt (the triple's object, the
    only name a policy has read), with the titled plan as a fallback."""
    triples = [t for t in example.metadata.get("evidences") or [] if isinstance(t, Sequence) and len(t) == 3]
    if not triples:
        raise NoPlan("no evidences triples")
    titles = list(dict.fromkeys(str(f[0]) for f in example.metadata.get("supporting_facts") or [] if f))
    by_title = {p.title: p for p in example.paragraphs}
    missing = [t for t in titles if t not in by_title]
    if not titles or missing:
        raise NoPlan(f"supporting_facts name paragraph(s) the example does not hold: {missing or 'none given'}")
    grouped: dict[str, dict[tuple[str, str], list[str]]] = {}
    for i, (subject, relation, obj) in enumerate(triples):
        title = _evidence_title(str(subject), i, titles, len(triples))
        if title is None:
            raise NoPlan(f"evidence subject {subject!r} names none of the supporting paragraphs {titles}")
        grouped.setdefault(title, {}).setdefault((str(subject), str(relation)), []).append(str(obj))
    given = example.metadata.get("supporting_sentences") or {}
    learnt: dict[str, str] = {}  # a later hop's title -> the object naming it in an earlier hop
    hops, titled = [], []
    for title in [t for t in titles if t in grouped] + [t for t in grouped if t not in titles]:
        paragraph = by_title[title]
        evidence = tuple(given[title]) if given.get(title) else tuple(_fact(paragraph, [0]))
        stated = " ".join(
            f"The {rel} of {subj} is {' and '.join(objs)}." for (subj, rel), objs in grouped[title].items()
        )
        hop = Hop(title, paragraph, f"{' '.join(evidence)} {stated}", evidence=evidence)
        titled.append(hop)
        name = learnt.get(title)
        hops.append(replace(hop, query=name) if name and not _mentions(example.question, title) else hop)
        for objs in grouped[title].values():
            for obj in objs:
                for later in titles:
                    if later != title and later not in learnt and _same_entity(obj, later):
                        learnt[later] = obj
    answer = _answer(example)
    plan_titled = Plan(example.uid, tuple(titled), answer)
    if hops == titled:
        return plan_titled
    return Plan(example.uid, tuple(hops), answer, fallback=plan_titled)


def _same_entity(name: str, title: str) -> bool:
    """Whether `name` (an evidence triple's object) names the paragraph titled `title`: equal
    without the title's disambiguation, or sharing its first and last word (`Jacqueline Bouvier`
    and `Jacqueline Kennedy Onassis` do not; `Edward Dillon` and `Edward Dillon (actor)` do)."""
    a, b = name.lower().split(), _base_title(title).lower().split()
    return bool(a and b) and (a == b or (a[0] == b[0] and a[-1] == b[-1]))


def _answer(example: QAExample) -> str:
    if not example.golden_answers:
        raise NoPlan("no golden answer")
    return example.golden_answers[0]


def has_supporting_paragraphs(example: QAExample) -> bool:
    """Whether the example's own paragraphs hold its evidence: every paragraph its supporting
    facts name (HotpotQA, 2Wiki), every hop's paragraph (MuSiQue), or at least one paragraph
    marked supporting (other formats)."""
    steps = example.metadata.get("question_decomposition")
    if steps:
        return all(step.get("paragraph") is not None for step in steps)
    facts = example.metadata.get("supporting_facts")
    if facts:
        titles = {p.title for p in example.paragraphs}
        named = facts.get("title", []) if isinstance(facts, dict) else [f[0] for f in facts if f]
        return all(str(t) in titles for t in named)
    return any(p.is_supporting for p in example.paragraphs)


def dataset_plan(example: QAExample) -> Plan:
    """The plan from whichever annotation the example carries (MuSiQue's decomposition first, then
    2Wiki's evidence triples, then HotpotQA's supporting facts);
    NoPlan saying why when it carries none a plan can be written from."""
    if example.metadata.get("question_decomposition"):
        return musique_plan(example)
    if example.metadata.get("evidences"):
        return twowiki_plan(example)
    if example.metadata.get("supporting_facts"):
        return hotpotqa_plan(example)
    raise NoPlan(
        "neither question_decomposition (MuSiQue), evidences (2WikiMultihopQA) nor supporting_facts (HotpotQA)"
    )


def plan_turns(plan: Plan, protocol: TagProtocol = SEARCH_R1) -> list[str]:
    """The agent turns that carry out `plan`: each hop a think (what was learnt so far, what is
    needed next) and a search; then a think and the answer. Each turn ends with its stop string."""
    t, s, a = protocol.think, protocol.search, protocol.answer
    turns, known = [], ""
    for hop in plan.hops:
        turns.append(f"<{t}>{known}I need to find {hop.need or hop.query}.</{t}>\n<{s}>{hop.query}</{s}>")
        known = f"{hop.finding} "
    answer = f"\\boxed{{{plan.answer}}}" if protocol.boxed_answer else plan.answer
    turns.append(f"<{t}>{known}So the answer is {plan.answer}.</{t}>\n<{a}>{answer}</{a}>")
    return turns
