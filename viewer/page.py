"""The viewer's page: one self-contained HTML file (styles, script and data inside it; nothing
fetched, so it opens from file:// as well as from `--serve`).

The data travel as one JSON block the script parses once; the list renders one page of rows at a
time and an episode's turns only when it is opened, so a folder of 10,000 episodes opens as fast
as one of a hundred (measured in docs/guides/viewer.md).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from pvpo.atomic import atomic_write_text
from pvpo.viewer.compare import pair_episodes
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
        pairs = pair_episodes(a.episodes, b.episodes)
        if a.episodes and b.episodes and not any(i >= 0 and j >= 0 for i, j, _ in pairs):
            raise ViewError(
                f"{a.path} and {b.path} share no question (by dataset and id): compare evaluations of the same questions"
            )
        data["pairs"] = pairs
    if kind == "run":
        data["run"] = sources[0].run
    return data


def _asset(name: str) -> str:
    return resources.files("pvpo.viewer").joinpath("assets").joinpath(name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """`data` as JSON that can stand inside a `<script>` element: a `</` or `<!--` in any string is
    escaped (JSON's `\\/` and `\\u0021`), so no text of an episode can end the element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("</", "<\\/").replace("<!--", "<\\u0021--")


def render_page(data: dict[str, Any]) -> str:
    """The whole HTML page for `page_data`'s `data`."""
    html = _asset("view.html")
    title = {"compare": "comparison", "run": "training run", "eval": "evaluation"}[data["kind"]]
    labels = " vs ".join(s["label"] for s in data["sources"])
    return (
        html.replace("/*PVPO_STYLE*/", _asset("view.css"))
        .replace("/*PVPO_SCRIPT*/", _asset("view.js"))
        .replace("PVPO_TITLE", _escape(f"pvpo view: {title} of {labels}"))
        .replace(DATA_MARK, embed_json(data))
    )


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
    return out


def write_page(paths: Sequence[str | Path], out: str | Path) -> Path:
    """`build_page(paths)` written to `out`; its path."""
    return save_page(build_page(paths), out)
