"""Retriever corpora (jsonl `{"id", "contents"}`, title on the first line) written from a dataset's
own paragraphs or from any list of passages."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pvpo.envs.data import QAExample
from pvpo.retriever.types import Passage, make_contents


def corpus_from_examples(examples: Iterable[QAExample]) -> list[Passage]:
    """The distinct paragraphs of `examples` (same title and text = one passage), in first-seen
    order, with ids "0", "1", ..."""
    seen: dict[tuple[str, str], None] = {}
    for ex in examples:
        for p in ex.paragraphs:
            seen.setdefault((p.title.strip(), p.text.strip()), None)
    return [Passage(str(i), make_contents(title, text)) for i, (title, text) in enumerate(seen)]


def write_corpus(passages: Iterable[Passage | Mapping[str, Any]], path: str | Path) -> int:
    """Write passages as retriever corpus jsonl; returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for p in passages:
            pid, contents = (p.id, p.contents) if isinstance(p, Passage) else (p["id"], p["contents"])
            f.write(json.dumps({"id": str(pid), "contents": contents}, ensure_ascii=False) + "\n")
            n += 1
    return n


def read_corpus(path: str | Path) -> list[Passage]:
    """Passages of a corpus jsonl written by `write_corpus` (or any Search-R1 corpus)."""
    out = []
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                out.append(Passage(str(d["id"]), d["contents"]))
    return out
