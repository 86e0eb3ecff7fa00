"""Dataset loaders: QA files in their published formats -> `QAExample`s, format detected from the
content; plus named datasets (e.g. `synthetic`) that are built rather than read.

Formats: FlashRAG jsonl (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue, Bamboogle, ...), raw
MuSiQue (json list or jsonl), raw HotpotQA (distractor json), raw 2WikiMultiHopQA.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pvpo.envs.data import Paragraph, QAExample, unique_strings
from pvpo.envs.retrieval import trim
from pvpo.registry import Registry

Record = Mapping[str, Any]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DatasetFormat:
    """A file format: `detect(record)` says whether a record is of it, `parse(record, name, index)`
    turns one record into a QAExample whose uid starts with `name/`."""

    name: str
    detect: Callable[[Record], bool]
    parse: Callable[[Record, str, int], QAExample]


FORMATS: Registry[DatasetFormat] = Registry("dataset format")
DATASETS: Registry[Callable[..., list[QAExample]]] = Registry("dataset")


def register_format(fmt: DatasetFormat) -> DatasetFormat:
    """Add a file format; detection tries formats in registration order, most specific first."""
    return FORMATS.register(fmt.name, fmt)


def register_dataset(name: str) -> Callable[[Callable[..., list[QAExample]]], Callable[..., list[QAExample]]]:
    """Decorator: make a dataset that is built by a function loadable by name (`load_dataset(name)`)."""
    return DATASETS.register(name)


def available_formats() -> list[str]:
    """Format names in detection order."""
    return [fmt.name for fmt in FORMATS.values()]


def available_datasets() -> list[str]:
    return DATASETS.names()


# ---- reading ------------------------------------------------------------------------------------
class DataFileError(ValueError):
    """A data file that cannot be read as asked; the message names the file, the line (or row)
    and the fix."""


def _decode(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataFileError(
            f"{path}: line {line}: byte 0x{raw[e.start]:02x} is not UTF-8: re-save the file as UTF-8"
        ) from None


def _json_error(path: Path, e: json.JSONDecodeError, line: int | None = None) -> DataFileError:
    where = f"line {line if line is not None else e.lineno}, column {e.colno}"
    return DataFileError(f"{path}: {where}: malformed JSON ({e.msg}): fix that line, or remove it")


def _read_parquet(path: Path) -> list[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataFileError(f"{path}: reading parquet needs pyarrow: pip install pyarrow, or give jsonl") from None
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow's errors (ArrowInvalid, OSError) name no row; the file is what we know
        raise DataFileError(f"{path}: not a readable parquet file ({e}): give a parquet, jsonl or JSON file") from None
    return [(f"row {i + 1}", r) for i, r in enumerate(rows)]


def read_located(path: str | Path) -> list[tuple[str, Any]]:
    """(where, record) of every record of a data file - a JSON list, a JSON object holding a list
    under `data`, JSON lines, or parquet - where `where` is "line N" (jsonl) or "row N" (a list or
    parquet). A bad file is a DataFileError naming it, the line or row, and the fix."""
    path = Path(path)
    if path.is_dir():
        raise DataFileError(f"{path} is a folder: give a data file (jsonl, JSON list or parquet)")
    if path.suffix == ".parquet":
        return _read_parquet(path)
    text = _decode(path)
    lines = text.splitlines()
    first = next((ln for ln in lines if ln.strip()), "")
    jsonl = False
    if first.lstrip()[:1] == "{":
        try:
            jsonl = isinstance(json.loads(first), dict)  # a whole object on the first line: JSON lines
        except json.JSONDecodeError:
            jsonl = len(lines) > 1 and first.strip() != "{"  # a bad first jsonl line, not a pretty-printed object
    if jsonl:
        out: list[tuple[str, Any]] = []
        for n, line in enumerate(lines, 1):
            if line.strip():
                try:
                    out.append((f"line {n}", json.loads(line)))
                except json.JSONDecodeError as e:
                    raise _json_error(path, e, n) from None
        return out
    if not text.strip():
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise _json_error(path, e) from None
    if isinstance(data, dict):
        data = data.get("data", [data])
    if not isinstance(data, list):
        raise DataFileError(f"{path}: holds a JSON {type(data).__name__}: give a list of objects, or JSON lines")
    return [(f"row {i + 1}", r) for i, r in enumerate(data)]


def read_records(path: str | Path) -> list[Record]:
    """Records of a data file (`read_located`), each a JSON object (DataFileError naming the
    first line or row that is not)."""
    located = read_located(path)
    for where, rec in located:
        if not isinstance(rec, Mapping):
            raise DataFileError(f"{path}: {where}: expected a JSON object, got {type(rec).__name__}: fix that line")
    return [rec for _, rec in located]


def bound_questions(examples: Sequence[QAExample], max_chars: int | None, source: object = "") -> list[QAExample]:
    """`examples` with each question longer than `max_chars` cut at a word (`trim`), and one
    warning counting them; nothing longer ever reaches a tokenizer."""
    if max_chars is None:
        return list(examples)
    long = [i for i, e in enumerate(examples) if len(e.question) > max_chars]
    if not long:
        return list(examples)
    out = list(examples)
    for i in long:
        out[i] = replace(out[i], question=trim(out[i].question, max_chars))
    first = examples[long[0]]
    log.warning(
        "%s: %d of %d questions longer than %d characters were cut to it (first: %s, %d characters)",
        source or "dataset",
        len(long),
        len(examples),
        max_chars,
        first.uid,
        len(first.question),
    )
    return out


def detect_format(record: Record) -> DatasetFormat:
    """The first registered format that recognises `record`; ValueError naming the keys otherwise."""
    for fmt in FORMATS.values():
        if fmt.detect(record):
            return fmt
    raise ValueError(f"unrecognised QA record with keys {sorted(record)}; known formats: {available_formats()}")


_GENERIC_STEMS = {"questions", "question", "data", "train", "dev", "test", "validation", "val", "eval"}


def dataset_name_for(path: str | Path) -> str:
    """The name of a dataset file, the prefix of its uids and, in `pvpo eval`, its results'
    folder: its name up to the first dot (`bamboogle.test.jsonl` -> `bamboogle`), or its folder's
    name when the file name is generic or has nothing before the dot (`musique_mini/questions.json`
    -> `musique_mini`, so the README's two `questions.json` files do not share a name)."""
    p = Path(path)
    stem = p.name.split(".", 1)[0]
    if not stem or stem.lower() in _GENERIC_STEMS:
        return p.absolute().parent.name or stem or "dataset"
    return stem


def iter_examples(path: str | Path, *, name: str | None = None, format: str | None = None) -> Iterator[QAExample]:
    """QAExamples of one file, in file order; the format is detected from the first record unless
    given. A record that cannot be parsed or has an empty question is a DataFileError naming its
    line; records without golden answers are skipped with one warning that counts them."""
    located = read_located(path)
    for where, rec in located:
        if not isinstance(rec, Mapping):
            raise DataFileError(f"{path}: {where}: expected a JSON object, got {type(rec).__name__}: fix that line")
    if not located:
        return
    try:
        fmt = FORMATS.get(format) if format else detect_format(located[0][1])
    except ValueError as e:
        raise DataFileError(f"{path}: {located[0][0]}: {e}") from None
    prefix = name or dataset_name_for(path)
    skipped: list[str] = []
    for i, (where, record) in enumerate(located):
        # a file that mixes formats (rows pasted from two releases): each row read by the format
        # that recognises it, so no row's answers are missed as "no golden answers"
        own = fmt if format or fmt.detect(record) else next((f for f in FORMATS.values() if f.detect(record)), fmt)
        try:
            example = own.parse(record, prefix, i)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise DataFileError(f"{path}: {where}: not a {own.name} record ({type(e).__name__}: {e}): fix it") from None
        if not example.question.strip():
            raise DataFileError(f"{path}: {where}: the question is empty: fill it in or remove the line")
        if not example.golden_answers:
            skipped.append(where)
            continue
        yield example
    if skipped:
        log.warning(
            "%s: skipped %d of %d records without golden answers (first at %s); they are not evaluated nor counted",
            path,
            len(skipped),
            len(located),
            skipped[0],
        )


def load_dataset(
    source: str | Path | Sequence[QAExample],
    *,
    name: str | None = None,
    format: str | None = None,
    limit: int | None = None,
    **kwargs: Any,
) -> list[QAExample]:
    """Questions from a registered dataset name (`kwargs` go to its builder, e.g. `split`, `seed`),
    a file path (format detected from its content), or an already-built sequence of QAExamples.
    uids are checked to be unique."""
    if isinstance(source, (str, Path)) and str(source) in DATASETS:
        examples = list(DATASETS.get(str(source))(**kwargs))
    elif isinstance(source, (str, Path)):
        if not Path(source).exists():
            raise FileNotFoundError(f"{source} is neither a file nor a registered dataset ({available_datasets()})")
        examples = list(iter_examples(source, name=name, format=format))
        if not examples:
            raise DataFileError(f"{source} holds no questions with golden answers: give a dataset with at least one")
    else:
        examples = [QAExample.coerce(e) for e in source]
    if limit is not None:
        examples = examples[:limit]
    seen: set[str] = set()
    for e in examples:
        if e.uid in seen:
            where = str(source) if isinstance(source, str | Path) else "the questions given"
            raise ValueError(f"duplicate uid {e.uid!r} in dataset {where}: give each question its own id")
        seen.add(e.uid)
    return examples


# ---- paragraphs -----------------------------------------------------------------------------------
def _join_sentences(sentences: Sequence[str]) -> str:
    """HotpotQA sentences carry their leading space, 2Wiki's do not."""
    out = ""
    for s in sentences:
        out += s if not out or s[:1].isspace() else " " + s
    return out.strip()


def _context_paragraphs(context: Any, supporting_titles: set[str]) -> tuple[Paragraph, ...]:
    """Paragraphs of a HotpotQA-style context: `[[title, [sentences]], ...]` (raw) or
    `{"title": [...], "sentences"|"content": [[...], ...]}` (Hugging Face / FlashRAG)."""
    if isinstance(context, Mapping):
        titles = context.get("title", [])
        bodies = context.get("sentences", context.get("content", []))
        pairs = list(zip(titles, bodies))
    else:
        pairs = [(c[0], c[1]) for c in context or []]
    return tuple(
        Paragraph(str(t), _join_sentences(b) if not isinstance(b, str) else b.strip(), str(t) in supporting_titles)
        for t, b in pairs
    )


def _supporting_sentences(context: Any, facts: Any) -> dict[str, list[str]]:
    """The sentences `supporting_facts` point at, by title, as the context splits them (HotpotQA
    numbers a paragraph's sentences; re-splitting the joined text does not give the same list)."""
    if isinstance(context, Mapping):
        pairs = list(zip(context.get("title", []), context.get("sentences", context.get("content", []))))
    else:
        pairs = [(c[0], c[1]) for c in context or [] if len(c) > 1]
    bodies = {str(t): b for t, b in pairs if not isinstance(b, str)}
    if isinstance(facts, Mapping):
        facts = list(zip(facts.get("title", []), facts.get("sent_id", [])))
    out: dict[str, list[str]] = {}
    for fact in facts or []:
        if len(fact) < 2:
            continue
        title, sid = str(fact[0]), fact[1]
        body = bodies.get(title)
        if body is not None and isinstance(sid, int) and 0 <= sid < len(body) and str(body[sid]).strip():
            out.setdefault(title, []).append(str(body[sid]).strip())
    return out


def _supporting_titles(facts: Any) -> set[str]:
    if isinstance(facts, Mapping):
        return {str(t) for t in facts.get("title", [])}
    return {str(f[0]) for f in facts or []}


def _musique_paragraphs(raw: Sequence[Record]) -> tuple[tuple[Paragraph, ...], dict[int, int]]:
    """Paragraphs in `idx` order and the map from MuSiQue's `idx` to the position in that tuple."""
    ordered = sorted(enumerate(raw), key=lambda p: p[1].get("idx", p[0]))
    paragraphs = tuple(
        Paragraph(
            str(p.get("title", "")),
            str(p.get("paragraph_text", p.get("text", ""))).strip(),
            bool(p.get("is_supporting", False)),
        )
        for _, p in ordered
    )
    position = {int(p.get("idx", i)): pos for pos, (i, p) in enumerate(ordered)}
    return paragraphs, position


def _musique_decomposition(steps: Sequence[Record], position: Mapping[int, int]) -> list[dict[str, Any]]:
    """MuSiQue's sub-questions, each with `paragraph`: the position of its supporting paragraph."""
    out = []
    for step in steps or []:
        step = dict(step)
        idx = step.get("paragraph_support_idx")
        step["paragraph"] = position.get(int(idx)) if idx is not None else None
        out.append(step)
    return out


# ---- formats ---------------------------------------------------------------------------------------
def _parse_musique(r: Record, name: str, i: int) -> QAExample:
    paragraphs, position = _musique_paragraphs(r.get("paragraphs", []))
    return QAExample(
        uid=f"{name}/{r.get('id', i)}",
        question=str(r["question"]).strip(),
        golden_answers=unique_strings([r.get("answer"), *r.get("answer_aliases", [])]),
        paragraphs=paragraphs,
        metadata={
            "question_decomposition": _musique_decomposition(r.get("question_decomposition", []), position),
            "answerable": r.get("answerable", True),
        },
    )


def _flat_facts(facts: Any) -> Any:
    """`supporting_facts` as `[title, sentence_id]` pairs: some HotpotQA releases write a fact as
    `[title, [ids], [sentences], {document}]` (87 of 683 in the hard dev sample); the Hugging Face
    mapping layout is kept as it is."""
    if isinstance(facts, Mapping) or not facts:
        return facts
    out = []
    for fact in facts:
        if isinstance(fact, Sequence) and not isinstance(fact, str) and len(fact) > 1 and isinstance(fact[1], list):
            out += [[fact[0], sid] for sid in fact[1]]
        else:
            out.append(fact)
    return out


def _parse_hotpot_like(r: Record, name: str, i: int) -> QAExample:
    facts = _flat_facts(r.get("supporting_facts", []))
    supporting = _supporting_titles(facts)
    meta = {k: r[k] for k in ("type", "level", "evidences") if k in r}
    if "supporting_facts" in r:
        meta["supporting_facts"] = facts
    sentences = _supporting_sentences(r.get("context", []), facts)
    if sentences:
        meta["supporting_sentences"] = sentences
    return QAExample(
        uid=f"{name}/{r.get('_id', r.get('id', i))}",
        question=str(r["question"]).strip(),
        golden_answers=unique_strings([r.get("answer"), *r.get("answer_aliases", [])]),
        paragraphs=_context_paragraphs(r.get("context", []), supporting),
        metadata=meta,
    )


def _parse_flashrag(r: Record, name: str, i: int) -> QAExample:
    golds = r.get("golden_answers", [])
    meta = dict(r.get("metadata") or {})
    paragraphs: tuple[Paragraph, ...] = ()
    if isinstance(meta.get("paragraphs"), list):  # FlashRAG MuSiQue keeps the raw paragraphs
        paragraphs, position = _musique_paragraphs(meta["paragraphs"])
        meta["question_decomposition"] = _musique_decomposition(meta.get("question_decomposition", []), position)
    elif "context" in meta:  # FlashRAG HotpotQA / 2Wiki keep a Hugging Face style context
        paragraphs = _context_paragraphs(meta["context"], _supporting_titles(meta.get("supporting_facts", [])))
        sentences = _supporting_sentences(meta["context"], meta.get("supporting_facts", []))
        if sentences:
            meta["supporting_sentences"] = sentences
    return QAExample(
        uid=f"{name}/{r.get('id', i)}",
        question=str(r["question"]).strip(),
        golden_answers=unique_strings([golds] if isinstance(golds, str) else list(golds)),
        paragraphs=paragraphs,
        metadata=meta,
    )


_TWOWIKI_TYPES = {"comparison", "inference", "compositional", "bridge_comparison"}

register_format(
    DatasetFormat(
        "musique", lambda r: "paragraphs" in r and "question_decomposition" in r and "question" in r, _parse_musique
    )
)
register_format(
    DatasetFormat(
        "2wikimultihopqa",
        lambda r: "context" in r and "question" in r and ("evidences" in r or r.get("type") in _TWOWIKI_TYPES),
        _parse_hotpot_like,
    )
)
register_format(
    DatasetFormat(
        "hotpotqa", lambda r: "context" in r and "supporting_facts" in r and "question" in r, _parse_hotpot_like
    )
)
register_format(DatasetFormat("flashrag", lambda r: "question" in r and "golden_answers" in r, _parse_flashrag))
