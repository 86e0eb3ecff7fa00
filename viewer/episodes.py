"""One episode as the page shows it: the response cut into the model's turns, the env's search
results (each passage with its id, score and whether a golden answer is in it) and the env's
correction messages, and the outcome flags the filters read (right, format, answer in reach).

The response is the text the agent loop keeps: each model turn followed by what the env appended
(`TagProtocol.wrap_observation` of `Doc i(Title: t) text` lines after a search, the correction
message after an invalid turn). A result block counts as the env's only right after a closed search
block, where the env puts it; one the model wrote itself elsewhere stays in the model's text.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pvpo.reward import TagProtocol, available_protocols, get_protocol, normalize_answer

# A gold answer that is a verdict, not an entity: a passage holding the word "yes" is no evidence
# that the question was in reach, so these golds never mark a passage.
_VERDICTS = frozenset({"yes", "no", "true", "false"})
_DROP_PUNCTUATION = str.maketrans("", "", string.punctuation)
_NON_SPACE = re.compile(r"\S")


def usable_golds(golds: Sequence[str]) -> list[str]:
    """The normalised golden answers a passage is searched for (verdicts and empty ones left out)."""
    out = []
    for g in golds:
        n = normalize_answer(str(g))
        if n and n not in _VERDICTS:
            out.append(n)
    return out


def holds_gold(text: str, golds: Sequence[str]) -> bool:
    """Whether some normalised gold of `golds` (from `usable_golds`) occurs in normalised `text` as
    whole words (a bare substring would find the gold "1" in "1990")."""
    if not golds:
        return False
    # `normalize_answer` costs 0.5 ms on a 100-word passage (10,000 episodes: 20 s); lowercasing and
    # dropping punctuation is its first half, in C, and dropping articles and folding whitespace
    # cannot make a word appear, so a gold whose first word is not in this text is not in the
    # normalised one either
    rough = text.lower().translate(_DROP_PUNCTUATION)
    if not any(g.split(" ", 1)[0] in rough for g in golds):
        return False
    padded = f" {normalize_answer(text)} "
    return any(f" {g} " in padded for g in golds)


def _env_blocks(response: str, protocol: TagProtocol) -> Iterator[tuple[int, int, int, int, str]]:
    """`(start, end, inner_start, inner_end, kind)` of each block the env appended, in order: a result
    block right after a closed search (`"o"`, its passages at `[inner_start, inner_end)`) or a
    correction message (`"c"`); the model's text ends at `start`. Plain `str.find`: a regex with a
    lazy `(.*?)` took 3 s over 10,000 responses, most of a page's making. Each tag's next position
    is kept until the scan passes it, so the text is read once: searching again from every
    unanswered search took 60 s on a 6.6 MB response of one search repeated."""
    close_search = protocol.close_tag(protocol.search)
    open_res, close_res = protocol.open_tag(protocol.result), protocol.close_tag(protocol.result)
    correction = protocol.correction_message()
    at, n = 0, len(response)
    # the next occurrence at or after the scan point of each string; -1 once there is none
    ahead: dict[str, int] = {}

    def next_at(tag: str, start: int) -> int:
        found = ahead.get(tag)
        if found is None or 0 <= found < start:
            found = response.find(tag, start) if tag else -1
            ahead[tag] = found
        return found

    while True:
        next_c = next_at(correction, at)
        s = next_at(close_search, at)
        if next_c >= 0 and (s < 0 or next_c < s):
            yield next_c, next_c + len(correction), next_c, next_c + len(correction), "c"
            at = next_c + len(correction)
            continue
        if s < 0:
            return
        after = s + len(close_search)
        o = next_at(open_res, after)
        # the env's result follows the search after blank lines only: whitespace up to `o`, found
        # without slicing what lies between (megabytes, when the result is far away)
        space = _NON_SPACE.search(response, after)
        gap = response[after:o] if o >= 0 and o == (space.start() if space else n) else ""
        e = next_at(close_res, o) if "\n\n" in gap else -1
        if e < 0:
            at = after  # a search the env did not answer (the last turn, cut by the turn limit)
            continue
        end = e + len(close_res)
        while end < n and response[end] == "\n":
            end += 1
        yield after, end, o + len(open_res), e, "o"
        at = end


def detect_protocol(text: str, default: str = "search_r1") -> TagProtocol:
    """The tag protocol whose result block appears first in `text` (the env's observations), or
    `default` when none does (a response without a search reads the same under every protocol)."""
    best: tuple[int, str] | None = None
    for name in available_protocols():
        p = get_protocol(name)
        at = text.find(p.open_tag(p.result))
        if at >= 0 and (best is None or at < best[0]):
            best = (at, name)
    return get_protocol(best[1] if best else default)


_DOC = re.compile(r"(?m)^Doc (\d+)\(Title: ")


def split_passages(text: str) -> list[dict[str, Any]]:
    """Search-R1's `Doc i(Title: t) text` lines (`pvpo.envs.retrieval.format_passages`) as
    `{n, title, text}`; a title holding parentheses is read to its balancing one. [] when the
    result is not in that layout."""
    starts = list(_DOC.finditer(text))
    out = []
    for k, m in enumerate(starts):
        end = starts[k + 1].start() if k + 1 < len(starts) else len(text)
        body = text[m.end() : end]
        depth, cut = 1, len(body)
        for i, ch in enumerate(body):
            depth += (ch == "(") - (ch == ")")
            if depth == 0:
                cut = i
                break
        out.append({"n": int(m.group(1)), "title": body[:cut], "text": body[cut + 1 :].strip()})
    return out


def _last_query(text: str, protocol: TagProtocol) -> str | None:
    """The query of the search block `text` ends with (a model turn's last search), None without one;
    read back from its last closing tag, so a turn of a thousand searches is read once."""
    close = text.rfind(protocol.close_tag(protocol.search))
    if close < 0:
        return None
    opened = text.rfind(protocol.open_tag(protocol.search), 0, close)
    return text[opened + len(protocol.open_tag(protocol.search)) : close].strip() if opened >= 0 else None


# a tokenizer as the page needs it: the character spans of a text's tokens
Tokenize = Callable[[str], Sequence[tuple[int, int]]]


def token_cuts(text: str, tokenize: Tokenize) -> tuple[int, list[int]]:
    """(how many tokens `text` is, the lengths in characters between token boundaries): the page
    draws the boundaries (several byte-level tokens of one character share one)."""
    spans = tokenize(text)
    lengths, at = [], 0
    for end in sorted({e for _, e in spans if e > 0}):
        lengths.append(end - at)
        at = end
    return len(spans), lengths


def split_turns(
    response: str,
    protocol: TagProtocol,
    passages: Sequence[Sequence[Mapping[str, Any]]] = (),
    golds: Sequence[str] = (),
    queries: Sequence[str] = (),
    tokenize: Tokenize | None = None,
) -> list[dict[str, Any]]:
    """`response` as the page's turns: `{"t": "m", "x": text}` the model's text, `{"t": "o", "x": raw,
    "p": [passage...], "q": query}` a search result, `{"t": "c", "x": text}` a correction. A passage is
    `{n, title, text, gold}` plus `id` and `score` where `passages` (per search, as the env recorded
    them) has them; `golds` are `usable_golds`. A result's query is the one the env recorded
    (`queries`, per search) where there is one, else the last search block of the turn before it.
    With `tokenize`, a model turn also holds its tokens (`tn` and `tl`, `token_cuts`) and an env
    block its number of tokens (`tn`), re-tokenized from the text."""
    turns: list[dict[str, Any]] = []
    at, search = 0, 0
    query: str | None = None

    def model(text: str) -> None:
        nonlocal query
        if text.strip():
            turn: dict[str, Any] = {"t": "m", "x": text.strip("\n")}
            if tokenize is not None:
                turn["tn"], turn["tl"] = token_cuts(turn["x"], tokenize)
            turns.append(turn)
            query = _last_query(text, protocol)

    def env(turn: dict[str, Any], start: int, end: int) -> dict[str, Any]:
        if tokenize is not None:
            turn["tn"] = len(tokenize(response[start:end]))
        return turn

    for start, end, lo, hi, kind in _env_blocks(response, protocol):
        model(response[at:start])
        at = end
        if kind == "c":
            turns.append(env({"t": "c", "x": response[lo:hi].strip()}, start, end))
            continue
        raw = response[lo:hi]
        found = split_passages(raw)
        recorded = list(passages[search]) if search < len(passages) else []
        for p in found:
            if 0 < p["n"] <= len(recorded) and isinstance(recorded[p["n"] - 1], Mapping):
                r = recorded[p["n"] - 1]
                p["id"] = str(r.get("id", ""))
                if isinstance(r.get("score"), int | float):
                    p["score"] = round(float(r["score"]), 4)
            p["gold"] = holds_gold(p["title"] + " " + p["text"], golds)
        obs: dict[str, Any] = {"t": "o", "p": found}
        if not found:
            obs["x"] = raw
            obs["gold"] = holds_gold(raw, golds)
        said = str(queries[search]) if search < len(queries) else query
        if said is not None:
            obs["q"] = said
        turns.append(env(obs, start, end))
        search += 1
    model(response[at:])
    return turns


def first_gold(turns: Sequence[Mapping[str, Any]]) -> list[int] | None:
    """`[search, rank]` (both from 1) of the first passage holding a golden answer, rank 0 for a
    result not split into passages; None when no search found one."""
    search = 0
    for t in turns:
        if t["t"] != "o":
            continue
        search += 1
        if t.get("gold"):
            return [search, 0]
        for rank, p in enumerate(t["p"], 1):
            if p["gold"]:
                return [search, rank]
    return None


def repeated_queries(turns: Sequence[Mapping[str, Any]]) -> int:
    """How many searches repeat an earlier search's query of the episode (case and spaces aside)."""
    seen: set[str] = set()
    repeats = 0
    for t in turns:
        if t["t"] == "o" and t.get("q") is not None:
            q = " ".join(str(t["q"]).lower().split())
            repeats += q in seen
            seen.add(q)
    return repeats


def in_reach(turns: Sequence[Mapping[str, Any]]) -> bool:
    """Whether some search result of `turns` held a golden answer."""
    return any(t["t"] == "o" and (t.get("gold") or any(p["gold"] for p in t["p"])) for t in turns)


def page_episode(
    *,
    key: str,
    item_id: str,
    dataset: str,
    question: str,
    golds: Sequence[str],
    response: str,
    prediction: str | None,
    scores: Mapping[str, Any],
    format_ok: bool | None,
    stop_reason: str,
    num_searches: int | None,
    num_turns: int | None,
    passages: Sequence[Sequence[Mapping[str, Any]]] = (),
    protocol: TagProtocol | None = None,
    tokens: int | None = None,
    queries: Sequence[str] = (),
    tokenize: Tokenize | None = None,
) -> dict[str, Any]:
    """The page's record of one episode (short keys: 10,000 of them travel inside the page). `scores`
    holds `em`, `f1` and cover-EM as `cem` or FlashRAG's `acc`; `format_ok` None (a file that did not
    record it) shows as unknown, never as a failure; `queries` are the searches' queries as the env
    recorded them; `tokenize` adds each turn's tokens (`split_turns`). `gr` is `first_gold`, `rq`
    `repeated_queries`."""
    protocol = protocol or detect_protocol(response)
    turns = split_turns(response, protocol, passages, usable_golds(golds), queries, tokenize)
    searches = sum(t["t"] == "o" for t in turns)
    return {
        "k": key,
        "id": item_id,
        "ds": dataset,
        "q": question,
        "gold": [str(g) for g in golds],
        "pred": prediction if prediction is not None else "",
        "em": float(scores.get("em", 0.0) or 0.0),
        "f1": float(scores.get("f1", 0.0) or 0.0),
        "cem": float(scores.get("cem", scores.get("acc", 0.0)) or 0.0),
        "fmt": format_ok,
        "stop": stop_reason,
        "ns": int(num_searches if num_searches is not None else searches),
        "nt": int(num_turns if num_turns is not None else sum(t["t"] == "m" for t in turns)),
        "reach": in_reach(turns),
        "gr": first_gold(turns),
        "rq": repeated_queries(turns),
        "tok": tokens,
        "turns": turns,
    }
