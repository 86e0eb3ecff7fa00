"""The question records every loader yields and the environment consumes."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pvpo.retriever.types import make_contents


@dataclass(frozen=True)
class Paragraph:
    """One context paragraph a dataset ships with a question; `is_supporting` marks gold evidence."""

    title: str
    text: str
    is_supporting: bool = False

    @property
    def contents(self) -> str:
        """Search-R1 corpus text (`pvpo.retriever.types.make_contents`): title, then the text."""
        return make_contents(self.title, self.text)


@dataclass(frozen=True)
class QAExample:
    """One question: a globally unique `uid` (prefixed with the dataset name), the question, its
    accepted answers, the paragraphs the dataset gives with it (empty when it has none) and any
    format-specific extras in `metadata` (e.g. MuSiQue's `question_decomposition`)."""

    uid: str
    question: str
    golden_answers: tuple[str, ...]
    paragraphs: tuple[Paragraph, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def supporting(self) -> tuple[Paragraph, ...]:
        """The paragraphs marked as evidence for the answer."""
        return tuple(p for p in self.paragraphs if p.is_supporting)

    @classmethod
    def coerce(cls, value: QAExample | Mapping[str, Any]) -> QAExample:
        """Accept a QAExample or a mapping with `question`, `golden_answers` (a string or a list)
        and optionally `uid` (default: `given/` and a hash of the question, the same for the same
        question), as a caller passing questions through `reset(options=...)` may write them. A
        mapping without a question is a ValueError naming the keys it has."""
        if isinstance(value, QAExample):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"expected a QAExample or a mapping, got {type(value).__name__}")
        if not isinstance(value.get("question"), str) or not value["question"].strip():
            raise ValueError(
                f"a question given as a mapping needs a non-empty 'question' string (it has {sorted(map(str, value))})"
            )
        golds = value.get("golden_answers", value.get("answers", ()))
        if isinstance(golds, str) or not isinstance(golds, Sequence):
            golds = () if golds is None else (golds,)
        uid = value.get("uid")
        if uid is None:
            uid = "given/" + hashlib.sha256(value["question"].encode("utf-8", "surrogateescape")).hexdigest()[:12]
        return cls(
            uid=str(uid),
            question=str(value["question"]),
            golden_answers=tuple(str(g) for g in golds),
            metadata=dict(value.get("metadata", {})),
        )


def unique_strings(values: Sequence[Any]) -> tuple[str, ...]:
    """Non-empty strings of `values`, stripped, first occurrence kept, order preserved."""
    out: dict[str, None] = {}
    for v in values:
        if v is None:
            continue
        s = str(v).strip()
        if s:
            out.setdefault(s, None)
    return tuple(out)
