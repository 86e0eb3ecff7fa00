"""Passage corpus on disk: reads the supported corpus formats, and looks passages up by row
without holding millions of Python strings (a JSON-lines file, memory-mapped, plus a NumPy array
of line offsets)."""

from __future__ import annotations

import json
import logging
import mmap
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from pvpo.retriever.types import Passage, make_contents

log = logging.getLogger(__name__)

_SCAN_CHUNK = 64 << 20  # bytes of the mapped file scanned for newlines at a time


def record_to_passage(record: object, row: int) -> tuple[str, str]:
    """(id, contents) of one corpus record in any supported layout; the row number is the id when
    the record has none."""
    if not isinstance(record, dict):
        raise ValueError(f"corpus record {row} is a {type(record).__name__}, expected an object")
    pid = record.get("id", record.get("_id", row))
    if "contents" in record:
        contents = record["contents"]
    elif "text" in record:
        contents = make_contents(str(record.get("title", "")), _joined(record["text"], row))
    else:
        raise ValueError(f"corpus record {row} has neither 'contents' nor 'text': keys {sorted(record)}")
    if not isinstance(contents, str):
        raise ValueError(f"corpus record {row}: contents must be a string")
    return str(pid), contents


FORMATS = (
    'JSON lines of {"id", "contents"} or {"id", "title", "text"}',
    'a JSON list of {"title", "text"} (MuSiQue, 2Wiki)',
    "a JSON object mapping title -> text or list of sentences (HotpotQA)",
)


def _joined(text: object, row: object) -> str:
    """A passage's text: a string, or a list of sentences (HotpotQA keeps their leading spaces)."""
    if isinstance(text, str):
        return text
    if isinstance(text, list) and all(isinstance(t, str) for t in text):
        return "".join(text)
    raise ValueError(f"corpus record {row}: text must be a string or a list of strings, got {type(text).__name__}")


def corpus_layout(path: str | Path) -> str:
    """ "jsonl" (one passage a line) or "json" (one JSON document: a list of records, or a
    title -> sentences mapping), from the file's first line."""
    with Path(path).open("rb") as f:
        for line in f:
            if not line.strip():
                continue
            if line.lstrip()[:1] == b"[":
                return "json"
            try:
                first = json.loads(line)
            except json.JSONDecodeError:
                return "json" if line.strip() == b"{" else "jsonl"  # a pretty-printed object, or a bad line
            is_record = isinstance(first, dict) and ("contents" in first or "text" in first)
            return "jsonl" if is_record or not isinstance(first, dict) else "json"
    return "jsonl"


def iter_corpus(path: str | Path) -> Iterator[tuple[str, str]]:
    """(id, contents) of every passage of a corpus file, in file order.

    Formats (`FORMATS`): JSON lines of `{"id", "contents"}` (Search-R1 / FlashRAG) or `{"id",
    "title", "text"}`; a JSON list of `{"title", "text"}` (with or without "id"; MuSiQue, 2Wiki);
    a JSON object mapping each title to its text or its list of sentences (HotpotQA's corpus;
    the title is the id)."""
    path = Path(path)
    if corpus_layout(path) == "json":
        with path.open("r", encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} is not a corpus file ({e}); corpus formats: {'; '.join(FORMATS)}") from None
        if isinstance(data, list):
            for row, rec in enumerate(data):
                yield record_to_passage(rec, row)
        elif isinstance(data, dict):
            for title, text in data.items():
                yield str(title), make_contents(str(title), _joined(text, repr(title)))
        else:
            raise ValueError(f"{path} holds a JSON {type(data).__name__}; corpus formats: {'; '.join(FORMATS)}")
        return
    with path.open("r", encoding="utf-8") as f:
        row = 0
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}: line {row + 1} is not valid JSON ({e}); corpus formats: {'; '.join(FORMATS)}"
                ) from None
            yield record_to_passage(rec, row)
            row += 1


class CorpusCheck:
    """Passes (id, contents) pairs through, counting empty passages and remembering a 64-bit hash
    of each id, so duplicate ids can be found without holding millions of strings (8 bytes a
    passage; a hash collision is ruled out by `duplicates` comparing the ids themselves)."""

    def __init__(self, source: str | Path) -> None:
        self.source = source
        self.n = 0
        self.empty = 0
        self.first_empty: str | None = None
        self._hashes: list[int] = []

    def __call__(self, passages: Iterator[tuple[str, str]]) -> Iterator[tuple[str, str]]:
        for pid, contents in passages:
            if not contents.split("\n", 1)[-1].strip():  # no text (a title line alone counts as none)
                self.empty += 1
                self.first_empty = self.first_empty or pid
            self._hashes.append(hash(pid))
            self.n += 1
            yield pid, contents

    def duplicate_hashes(self) -> set[int]:
        """Hashes that more than one passage's id has."""
        h = np.asarray(self._hashes, dtype=np.int64)
        values, counts = np.unique(h, return_counts=True)
        return set(values[counts > 1].tolist())

    def duplicates(self, written: str | Path) -> dict[str, list[int]]:
        """{id: [row, ...]} of the ids more than one passage of `written` (the jsonl the passages
        went to) has; rows from 1."""
        dup = self.duplicate_hashes()
        if not dup:
            return {}
        rows: dict[str, list[int]] = {}
        with Path(written).open(encoding="utf-8") as f:
            for row, line in enumerate(f, 1):
                pid = str(json.loads(line)["id"])
                if hash(pid) in dup:
                    rows.setdefault(pid, []).append(row)
        return {pid: r for pid, r in rows.items() if len(r) > 1}

    def report(self, written: str | Path) -> str | None:
        """Raise ValueError naming the duplicate ids (the corpus file and rows); a warning line
        counting empty passages, or None."""
        dups = self.duplicates(written)
        if dups:
            pid, rows = next(iter(dups.items()))
            raise ValueError(
                f"corpus {self.source}: {len(dups)} passage ids appear more than once (e.g. {pid!r} at passages "
                f"{', '.join(map(str, rows[:5]))}): give each passage its own id"
            )
        if self.empty:
            return (
                f"corpus {self.source}: {self.empty} of {self.n} passages have no text (first: id {self.first_empty!r}); "
                "they are indexed but match nothing useful"
            )
        return None


def write_jsonl(passages: Iterator[tuple[str, str]], out: str | Path) -> int:
    """Writes passages as `{"id", "contents"}` JSON lines; returns how many."""
    n = 0
    with Path(out).open("w", encoding="utf-8") as f:
        for pid, contents in passages:
            f.write(json.dumps({"id": pid, "contents": contents}, ensure_ascii=False))
            f.write("\n")
            n += 1
    return n


def line_spans(path: str | Path) -> np.ndarray:
    """Byte spans of the non-blank lines of a file, int64 of shape (n, 2): line i is
    bytes [spans[i, 0], spans[i, 1]), trailing newline included."""
    size = os.path.getsize(path)
    if size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        buf = np.frombuffer(mm, dtype=np.uint8)
        ends = []
        for start in range(0, size, _SCAN_CHUNK):
            chunk = buf[start : start + _SCAN_CHUNK]
            ends.append(np.flatnonzero(chunk == 0x0A).astype(np.int64) + start + 1)
        del buf, chunk
    ends_arr = np.concatenate(ends) if ends else np.zeros(0, dtype=np.int64)
    if ends_arr.size == 0 or ends_arr[-1] != size:
        ends_arr = np.append(ends_arr, size)
    starts = np.concatenate([[0], ends_arr[:-1]])
    # Blank lines ("\n" or "\r\n") are not passages.
    keep = (ends_arr - starts) > 2
    short = np.flatnonzero(~keep & (ends_arr - starts > 0))
    if short.size:
        with open(path, "rb") as f:
            for i in short:
                f.seek(starts[i])
                if f.read(int(ends_arr[i] - starts[i])).strip():
                    keep[i] = True
    return np.stack([starts[keep], ends_arr[keep]], axis=1)


def _cached_spans(path: Path, size: int) -> np.ndarray | None:
    """The line spans cached in `path` for a corpus file of `size` bytes, or None when there is no
    cache, it was made for another file, or it is damaged (a cache: it is rebuilt, with a warning)."""
    if not path.exists():
        return None
    try:
        cached = np.load(path, mmap_mode="r")
    except (ValueError, OSError, EOFError) as e:  # a cut or overwritten .npy
        log.warning("%s is damaged (%s): rebuilding it from the corpus", path, e)
        return None
    # The last row is a sentinel (-1, file size): a changed corpus file invalidates the cache.
    if cached.ndim == 2 and cached.shape[1:] == (2,) and len(cached) and tuple(cached[-1]) == (-1, size):
        return cached[:-1]
    return None


def _save_spans(path: Path, spans: np.ndarray) -> None:
    """Cache the line spans at `path` atomically (a kill never leaves half a cache); a folder that
    cannot be written (a read-only index) keeps no cache, with a warning."""
    tmp = path.with_name(path.name + ".tmp.npy")
    try:
        np.save(tmp, spans)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        log.warning("cannot cache the corpus line offsets in %s (%s): they are recomputed at each start", path, e)


class CorpusStore:
    """Row -> passage lookup over a JSON-lines corpus file, memory-mapped.

    `offsets_path` caches the line spans (computed on first open), so reopening a 21M-line
    corpus costs one small `np.load`."""

    def __init__(self, jsonl_path: str | Path, offsets_path: str | Path | None = None) -> None:
        self.path = Path(jsonl_path)
        if not self.path.exists():
            raise FileNotFoundError(f"corpus file {self.path} does not exist")
        size = self.path.stat().st_size
        spans = _cached_spans(Path(offsets_path), size) if offsets_path is not None else None
        if spans is None:
            spans = line_spans(self.path)
            if offsets_path is not None:
                _save_spans(Path(offsets_path), np.concatenate([spans, np.array([[-1, size]], dtype=np.int64)]))
        self._spans = spans
        self._file = self.path.open("rb")
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __len__(self) -> int:
        return len(self._spans)

    def record(self, row: int) -> tuple[str, str]:
        """(id, contents) of one row."""
        if row < 0 or row >= len(self):
            raise IndexError(f"corpus row {row} out of range (size {len(self)})")
        start, end = self._spans[row]
        return record_to_passage(json.loads(self._mm[int(start) : int(end)]), row)

    def passages(self, rows: Sequence[int], scores: Sequence[float] | None = None) -> list[Passage]:
        """Passages of the given rows (with scores when given), in order."""
        out = []
        for i, row in enumerate(rows):
            pid, contents = self.record(int(row))
            out.append(Passage(pid, contents, None if scores is None else float(scores[i])))
        return out

    def __iter__(self) -> Iterator[tuple[str, str]]:
        for row in range(len(self)):
            yield self.record(row)

    def close(self) -> None:
        if isinstance(self._mm, mmap.mmap):
            self._mm.close()
        self._file.close()
