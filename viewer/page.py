"""The viewer's page: one self-contained HTML file (styles, script and data inside it; nothing
fetched, so it opens from file:// as well as from `--serve`).

The data travel as one JSON block the script parses once; the list renders one page of rows at a
time and an episode's turns only when it is opened, so a folder of 10,000 episodes opens as fast
as one of a hundred (measured in docs/guides/viewer.md).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from pvpo.atomic import atomic_write_text
from pvpo.viewer.compare import PairingError, pair_episodes, pairing
from pvpo.viewer.sources import Source, ViewError, read_source

DATA_MARK = "/*PVPO_DATA*/"


def page_data(sources: Sequence[Source]) -> dict[str, Any]:
    """The page's data for one source (an evaluation or a run) or two evaluations to compare (A, B)."""
    if not 1 <= len(sources) <= 2:
        raise ViewError(f"pvpo view takes one folder or two to compare, not {len(sources)}")
    if len(sources) == 2 and any(s.kind != "eval" for s in sources):
        run = next(s for s in sources if s.kind != "eval")
        raise ViewError(
            f"{run.path} is a training run dir: a comparison takes two evaluation folders (pvpo eval --out of each policy)"
        )
    kind = "compare" if len(sources) == 2 else sources[0].kind
    data: dict[str, Any] = {
        "kind": kind,
        "generated": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "sources": [{"label": s.label, "path": s.path, "prompt": s.prompt} for s in sources],
        "episodes": [s.episodes for s in sources],
    }
    if kind == "compare":
        a, b = sources
        try:
            by, _ = pairing(a.episodes, b.episodes)
        except PairingError as e:
            if e.disjoint:
                raise ViewError(
                    f"{a.path} and {b.path} share no question (by dataset and id, or by question text): compare "
                    "evaluations of the same questions"
                ) from None
            raise ViewError(
                f"{a.path} and {b.path} cannot be paired question by question ({e}): compare two evaluations of "
                "the same questions, whose files record each question's id"
            ) from None
        pairs = pair_episodes(a.episodes, b.episodes)
        data["pairs"] = pairs
        data["paired_by"] = by
    if kind == "run":
        data["run"] = sources[0].run
    data["warnings"] = []
    return data


_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(value: Any, where: str, problems: list[str], deep: bool = True) -> Any:
    """`value` with each number that is not finite made None and each lone surrogate (text that no
    UTF-8 file can hold) made U+FFFD, in place; what was changed appended to `problems`, named
    `where` (with the keys below it where `deep`)."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        problems.append(f"{where or 'a value'} is {value} (shown as –)")
        return None
    if isinstance(value, str):
        if value.isascii() or not _SURROGATE.search(value):
            return value
        problems.append(f"{where or 'a text'} holds a lone surrogate (shown as \ufffd)")
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        for k in list(value):
            v = _clean(value[k], f"{where}.{k}" if deep and where else where or str(k), problems, deep)
            k2 = _clean(k, where, problems, deep) if isinstance(k, str) else k
            if k2 != k:
                del value[k]
            value[k2] = v
        return value
    if isinstance(value, list):
        for i, v in enumerate(value):
            value[i] = _clean(v, where, problems, deep)
    return value


# an episode's keys as its file names them
_NAMES = {
    "adv": "advantage",
    "r": "reward",
    "rc": "reward_components",
    "q": "question",
    "pred": "prediction",
    "turns": "response",
    "gold": "golden_answers",
    "pi": "pi_gt",
}


def mark_bad_values(data: dict[str, Any]) -> None:
    """Make `page_data`'s `data` fit a page (JSON has no NaN, a UTF-8 file no lone surrogate) and
    say where it did not: an episode holding such a value keeps it as unknown (None, or U+FFFD)
    and lists what in its `bad`, so the page shows that episode marked rather than refusing every
    other; what was changed outside episodes goes to `data["warnings"]`, one line each."""
    for side in data["episodes"]:
        for e in side:
            problems: list[str] = []
            for k in list(e):
                e[k] = _clean(e[k], _NAMES.get(k, k), problems, deep=False)
            if problems:
                e["bad"] = sorted(set(problems))
    warnings: list[str] = []
    for k in [k for k in data if k not in ("episodes", "warnings")]:
        data[k] = _clean(data[k], k, warnings)
    data["warnings"] = sorted(set(warnings))


def data_block(data: dict[str, Any]) -> str:
    """`embed_json(data)`, with `mark_bad_values` first where the data hold a value no page can
    (tried on the whole data first: a clean folder, nearly every one, costs no walk and no second
    `json.dumps`, which is 0.4 s of 10,000 episodes)."""
    try:
        text = embed_json(data)
        text.encode("utf-8")
        return text
    except (ValueError, UnicodeEncodeError):
        mark_bad_values(data)
        return embed_json(data)


def _asset(name: str) -> str:
    return resources.files("pvpo.viewer").joinpath("assets").joinpath(name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """`data` as JSON that can stand inside a `<script>` element: a `</` or `<!--` in any string is
    escaped (JSON's `\\/` and `\\u0021`), so no text of an episode can end the element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("</", "<\\/").replace("<!--", "<\\u0021--")


_MARKS = re.compile(r"/\*PVPO_STYLE\*/|/\*PVPO_SCRIPT\*/|PVPO_TITLE|" + re.escape(DATA_MARK))


def render_page(data: dict[str, Any]) -> str:
    """The whole HTML page for `page_data`'s `data` (`data_block` marks its bad values in it). The
    template's marks are replaced in one pass over the template alone, so no label, style or
    script text is ever read as a mark."""
    block = data_block(data)  # first: it makes the labels fit the title too
    title = {"compare": "comparison", "run": "training run", "eval": "evaluation"}[data["kind"]]
    labels = " vs ".join(s["label"] for s in data["sources"])
    parts = {
        "/*PVPO_STYLE*/": _asset("view.css"),
        "/*PVPO_SCRIPT*/": _asset("view.js"),
        "PVPO_TITLE": _escape(f"pvpo view: {title} of {labels}"),
        DATA_MARK: block,
    }
    return _MARKS.sub(lambda m: parts[m.group(0)], _asset("view.html"))


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def build_page(paths: Sequence[str | Path]) -> str:
    """The page for `pvpo view PATH [PATH2]`: one evaluation folder or run dir, or two evaluations."""
    return render_page(page_data([read_source(p) for p in paths]))


def save_page(page: str, out: str | Path) -> Path:
    """`page` written to the file `out` (atomically); its path."""
    out = Path(out)
    if out.is_dir():
        raise ViewError(f"--out {out} is a folder: give the page's file name, e.g. {out / 'view.html'}")
    atomic_write_text(out, page)
    out.chmod(0o666 & ~_umask())  # as `open` would make it: the temporary file behind it is 0600
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_page(paths: Sequence[str | Path], out: str | Path) -> Path:
    """`build_page(paths)` written to `out`; its path."""
    return save_page(build_page(paths), out)
