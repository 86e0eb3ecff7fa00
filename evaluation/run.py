"""One evaluation run: a policy answers one dataset's questions through the search env, and every
answer is written in FlashRAG's item layout, resumably, with the run's metrics.

`<out>/predictions.jsonl` holds one item per question, as FlashRAG's `intermediate_data.json`
items (`id`, `question`, `golden_answers`, `output: {query, final_response, pred, metric_score:
{em, f1, acc}}`, acc = cover-EM; question and golden answers as the loader reads them: stripped,
duplicates dropped, which FlashRAG's normalisation makes no difference to), plus what an agent run adds to `output`: `num_searches`,
`num_queries_cut` (queries longer than the retriever takes, searched cut), `queries`, `num_turns`, `prompt_tokens`, `completion_tokens`, `format_ok`, `stop_reason`, and
`passages` (per search, the passages returned as `[{id, title, score}]`, for `pvpo view`).
`<out>/metrics.json` holds the means, the standard error of EM, N, the number of queries cut,
the subset's seed and the settings; `<out>/run.json` the settings, so a restarted run refuses to mix settings.

Resume: questions are processed in fixed batches by position in the (sub)set; items already in
predictions.jsonl are skipped, so a run killed mid-way and restarted writes the same file as an
uninterrupted one (a torn last line is dropped and redone). Items are read back by question id:
one process writes a folder at a time (`pvpo.locks`), and a line repeating an answered id or not
holding an item at all is dropped with a warning, so no question ever counts twice.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pvpo.atomic import append_jsonl, atomic_write_json, atomic_write_jsonl, read_json
from pvpo.envs.data import QAExample
from pvpo.envs.episode import EpisodeConfig, bounded_query
from pvpo.envs.loaders import read_records
from pvpo.evaluation.progress import EvalProgress

# the settings live in their own module; importers of this one find them here too
from pvpo.evaluation.settings import EvalError as EvalError
from pvpo.evaluation.settings import EvalSettings as EvalSettings
from pvpo.evaluation.settings import resolve_template as resolve_template
from pvpo.locks import folder_lock, is_lock_file
from pvpo.owned import (
    FolderError,
    FolderKind,
    Replacement,
    check_folder_path,
    claim,
    is_ours,
    recover,
    refuse_clashes,
    replacing,
    shown,
)
from pvpo.retriever.types import Searcher
from pvpo.reward import TagProtocol
from pvpo.reward.scoring import aggregate, flashrag_metric_score, flashrag_summary, item_score, score_answer
from pvpo.stats import mean

log = logging.getLogger(__name__)

PREDICTIONS = "predictions.jsonl"
METRICS = "metrics.json"
RUN = "run.json"


@dataclass
class Outcome:
    """What a policy did on one question: its prompt, response (turns and observations), answer."""

    prompt: str
    response: str
    prediction: str | None
    num_searches: int
    num_turns: int
    prompt_tokens: int
    completion_tokens: int
    stop_reason: str
    format_ok: bool = False
    num_queries_cut: int = 0  # search queries longer than the retriever takes, searched cut
    queries: list[str] = field(default_factory=list)
    passages: list[list[dict[str, Any]]] = field(default_factory=list)  # per search: [{id, title, score}]


class EvalPolicy(Protocol):
    """Anything that can answer a batch of questions through the env: the token engines
    (`TokenPolicy`) or an OpenAI-compatible endpoint (`pvpo.evaluation.policies.OpenAIPolicy`)."""

    def rollout(
        self,
        examples: Sequence[QAExample],
        searcher: Searcher,
        episode: EpisodeConfig,
        settings: EvalSettings,
        *,
        seed: int,
        indices: Sequence[int] | None = None,
        on_done: Callable[[int, Outcome], None] | None = None,
        on_start: Callable[[int, Any], None] | None = None,
    ) -> list[Outcome]:
        """One Outcome per example; `on_done(i, outcome)` as question i ends, `on_start(i,
        trajectory)` as it starts (the agent loop's live trajectory, for a progress meter)."""
        ...


def without_corrections(response: str, protocol: TagProtocol) -> str:
    """A response without the env's correction messages (whose literal tags are not the agent's):
    the text the env judges."""
    return response.replace(protocol.correction_message(), "")


def search_queries(response: str, protocol: TagProtocol, n: int) -> list[str]:
    """The first `n` search queries of a response, as the env ran them (an over-long one cut)."""
    text = without_corrections(response, protocol)
    found = [bounded_query(s.content.strip()) for s in protocol.segments(text) if s.tag == protocol.search and s.closed]
    return found[:n]


def item_id(example: QAExample) -> str:
    """The dataset's own id of a question (its uid without the `dataset/` prefix)."""
    return example.uid.split("/", 1)[1] if "/" in example.uid else example.uid


def prediction_item(example: QAExample, outcome: Outcome) -> dict[str, Any]:
    """One FlashRAG-layout item (see the module docstring)."""
    golds = list(example.golden_answers)
    score = score_answer(outcome.prediction, golds)
    return {
        "id": item_id(example),
        "question": example.question,
        "golden_answers": golds,
        "output": {
            "query": outcome.prompt,
            "final_response": outcome.response,
            "pred": outcome.prediction if outcome.prediction is not None else "",
            "metric_score": flashrag_metric_score(score),
            "num_searches": outcome.num_searches,
            "num_queries_cut": outcome.num_queries_cut,
            "queries": outcome.queries,
            "num_turns": outcome.num_turns,
            "prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": outcome.completion_tokens,
            "format_ok": outcome.format_ok,
            "stop_reason": outcome.stop_reason,
            "passages": outcome.passages,
        },
    }


# ---- files ------------------------------------------------------------------------------------
def read_items(path: str | Path) -> list[dict[str, Any]]:
    """Items of a FlashRAG-format file: a JSON list (FlashRAG's intermediate_data.json) or jsonl
    (errors name the file and line: `pvpo.envs.loaders.read_records`)."""
    return [dict(r) for r in read_records(path)]


def load_done(path: Path) -> list[dict[str, Any]]:
    """The answered items of a predictions.jsonl, one per question id, in file order.

    What a kill or a second writer can leave is repaired, with a warning, and the file rewritten
    (atomically) without it: a torn last line or a line that holds no item is dropped (its question
    is answered again), and a line repeating an id answered above it is dropped (the first answer
    counts), so the next append starts on a clean line and no question counts twice."""
    if not path.exists():
        return []
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    damaged = repeated = 0
    for line in path.read_bytes().splitlines(keepends=True):
        if not line.strip():
            continue
        try:
            item = json.loads(line) if line.endswith(b"\n") else None
        except ValueError:  # json.JSONDecodeError and UnicodeDecodeError
            item = None
        if not isinstance(item, dict) or "id" not in item:
            damaged += 1
        elif str(item["id"]) in seen:
            repeated += 1
        else:
            seen.add(str(item["id"]))
            items.append(item)
    if damaged or repeated:
        log.warning(
            "%s: dropped %d damaged or torn line(s) (their questions are answered again) and %d answer(s) "
            "repeating an id above them (the first counts); rewrote it with the %d answers left",
            path,
            damaged,
            repeated,
            len(items),
        )
        atomic_write_jsonl(path, items)
    return items


def answered_note(out_dir: str | Path, n: int) -> str:
    """How far an evaluation into `out_dir` of `n` questions got and how to finish it, for the line
    a stopped or failed `pvpo eval` ends with (the file is read as it is, not repaired)."""
    path = Path(out_dir) / PREDICTIONS
    ids: set[str] = set()
    with contextlib.suppress(OSError):
        for line in path.read_bytes().splitlines() if path.exists() else []:
            with contextlib.suppress(ValueError):
                item = json.loads(line)
                if isinstance(item, dict) and "id" in item:
                    ids.add(str(item["id"]))
    return f"{len(ids)} of {n} answers are saved in {path}: run the same command again to answer the rest"


def write_json(path: Path, data: Any) -> None:
    """`data` as indented JSON, atomically."""
    atomic_write_json(path, data, indent=2)


# ---- metrics -------------------------------------------------------------------------------------
def summarize_items(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The figures of FlashRAG-layout items: `pvpo.reward.scoring`'s aggregate of their stored scores
    (means of em, f1, acc = cover-EM, EM's standard error and, where the items carry them, format
    rate and searches) under metrics.json's names, then turns and tokens per question where recorded."""
    outs = [it.get("output", {}) for it in items]
    out = flashrag_summary(aggregate([item_score(it) for it in items]))
    for key, name in (("num_turns", "turns"), ("completion_tokens", "completion_tokens")):
        vals = [float(o[key]) for o in outs if key in o]
        if vals:
            out[name] = mean(vals)
    stops: dict[str, int] = {}
    for o in outs:
        if "stop_reason" in o:
            stops[str(o["stop_reason"])] = stops.get(str(o["stop_reason"]), 0) + 1
    if stops:
        out["stop_reasons"] = dict(sorted(stops.items()))
    if any("num_queries_cut" in o for o in outs):  # a count, not a mean: it should be 0
        out["queries_cut"] = int(sum(int(o.get("num_queries_cut", 0)) for o in outs))
    return out


# ---- the output folder -----------------------------------------------------------------------------
_SAME_RUN_KEYS = ("dataset", "split", "source", "limit", "sample_seed", "model", "engine", "settings")


def _is_run_folder(path: Path) -> bool:
    return (path / RUN).is_file() and is_ours(path, EVAL_KIND)


def _held(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


# An evaluation's dataset folder under pvpo's one rule for the folders it writes (`pvpo.owned`).
EVAL_KIND = FolderKind("evaluation", "an evaluation run", frozenset({PREDICTIONS, METRICS, RUN, "judge_cache.jsonl"}))


def check_out_dir(out: str | Path, datasets: Sequence[str], *, overwrite: bool) -> None:
    """Refuse (EvalError naming some files) an `--out` holding anything but evaluation runs of
    ours - a user's files, or a dataset's folder that is not a run - unless `overwrite`, before
    anything is loaded or written; and, with or without it, a dataset's place taken by a file or
    by a user's file of a name an evaluation writes. `overwrite` never deletes a user's file; a
    dataset's earlier run it replaces is kept until the new run's first answers (`run_eval`)."""
    out = Path(out)
    try:
        check_folder_path(out, "--out")
    except FolderError as e:
        raise EvalError(str(e)) from None
    for name in datasets:
        place = out / name
        if os.path.lexists(place) and not place.is_dir():
            raise EvalError(
                f"--out {out} holds a file {name!r} where dataset {name}'s results go: move it, or give the dataset "
                "another name (--name)"
            )
        if place.is_dir() and not is_ours(place, EVAL_KIND):
            users = sorted(p.name for p in place.iterdir())
            refuse_clashes(place, EVAL_KIND, users, error=EvalError)
            if users and not overwrite:
                raise EvalError(
                    f"{place} holds files pvpo did not write ({shown(users)}): give another --out, or --overwrite to "
                    f"write dataset {name}'s results beside them (they are kept)"
                )
    if overwrite or not out.is_dir():
        return
    wanted = set(datasets)
    foreign = sorted(
        p.name
        for p in out.iterdir()
        if not (is_lock_file(p.name) or (p.is_dir() and (_is_run_folder(p) or p.name in wanted)))
    )
    if foreign:
        raise EvalError(
            f"--out {out} holds files that are not evaluation runs ({shown(foreign)}): give a new or empty folder, "
            "or --overwrite to write into it anyway (those files are kept)"
        )


def _other_run(out_dir: Path, run: Mapping[str, Any]) -> str | None:
    """Why `out_dir` cannot be resumed as `run` (a differing setting, or files that are no run),
    or None when it can (new, empty, or the same run)."""
    if not _held(out_dir):
        return None
    path = out_dir / RUN
    if not path.exists() or not is_ours(out_dir, EVAL_KIND):  # a user's run.json marks nothing
        names = sorted(p.name for p in out_dir.iterdir())
        return f"files that are not an evaluation run ({', '.join(names[:3])})"
    before = read_json(path, fix=f"delete {out_dir} (or use another --out) and evaluate again")
    diff = [k for k in _SAME_RUN_KEYS if before.get(k) != run.get(k)]
    return (
        f"a run with other settings ({diff[0]}: {before.get(diff[0])!r} there, {run.get(diff[0])!r} now)"
        if diff
        else None
    )


# ---- the run ---------------------------------------------------------------------------------------


def run_eval(
    policy: EvalPolicy,
    examples: Sequence[QAExample],
    searcher: Searcher,
    settings: EvalSettings,
    out_dir: str | Path,
    *,
    meta: Mapping[str, Any],
    show_progress: bool = True,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Answer `examples` with `policy`, appending FlashRAG items to `out_dir/predictions.jsonl`
    (skipping the ids already there), then write and return `metrics.json`'s content. `meta`
    (dataset, split, source, limit, sample_seed, model, engine) is recorded with the settings.
    A folder holding another run or other files is refused (EvalError) unless `overwrite`; then
    it is moved aside, deleted once the first answers are written, and moved back if the run
    fails before. One process writes a folder at a time: another one writing `out_dir` is refused
    (`pvpo.locks.FolderInUse`, naming its PID)."""
    if not examples:
        raise EvalError(f"dataset {meta.get('dataset', '')!r} has no questions to evaluate ({meta.get('source', '')})")
    out = Path(out_dir)
    with folder_lock(out, "pvpo eval"):
        return _run_eval(
            policy, examples, searcher, settings, out, meta=meta, show_progress=show_progress, overwrite=overwrite
        )


def _run_eval(
    policy: EvalPolicy,
    examples: Sequence[QAExample],
    searcher: Searcher,
    settings: EvalSettings,
    out: Path,
    *,
    meta: Mapping[str, Any],
    show_progress: bool,
    overwrite: bool,
) -> dict[str, Any]:
    """`run_eval` with the folder's lock held."""
    run = {**dict(meta), "n": len(examples), "settings": asdict(settings)}
    recover(out, EVAL_KIND)
    other = _other_run(out, run)
    if other is None:  # new, empty, or this very run: answer what is left
        claim(out, EVAL_KIND)
        if not (out / RUN).exists():
            write_json(out / RUN, dict(run))
        return _answer(policy, examples, searcher, settings, out, run=run, show_progress=show_progress)
    with replacing(
        out,
        EVAL_KIND,
        overwrite=overwrite,
        refusal=f"{other}: use another --out, or --overwrite to replace it (kept until the new run's first answers)",
        error=EvalError,
    ) as replacement:
        write_json(out / RUN, dict(run))
        return _answer(
            policy, examples, searcher, settings, out, run=run, show_progress=show_progress, replaced=replacement
        )


def _answer(
    policy: EvalPolicy,
    examples: Sequence[QAExample],
    searcher: Searcher,
    settings: EvalSettings,
    out: Path,
    *,
    run: Mapping[str, Any],
    show_progress: bool,
    replaced: Replacement | None = None,
) -> dict[str, Any]:
    """`run_eval`'s loop; `replaced` (an earlier run moved aside) is dropped once the first answers are written."""
    meta = run
    episode = settings.episode()
    pred_path = out / PREDICTIONS
    done = {str(it["id"]) for it in load_done(pred_path)}
    wanted = {item_id(ex) for ex in examples}
    if len(wanted) != len(examples):
        raise EvalError("the dataset has duplicate ids; give each question its own id")
    stray = done - wanted
    if stray:
        raise EvalError(
            f"{pred_path} has {len(stray)} ids not in this run's questions (e.g. {sorted(stray)[0]!r}); use another --out"
        )
    started = time.perf_counter()
    sampled = getattr(policy, "sampled_tokens", None)
    bar = EvalProgress(
        total=len(examples),
        initial=len(done),
        desc=f"eval {meta.get('dataset', '')}",
        max_turns=settings.max_turns,
        most_tokens=settings.most_model_tokens(),
        sampled=sampled if callable(sampled) else None,
        enabled=show_progress,
    )
    # No batch barrier: at most batch_size questions are in flight and each answer is saved as it
    # ends, so a long trajectory never holds up the next questions (and a crash loses none).
    # Question p samples with index p of the whole dataset, resumed or not.
    todo = [(p, ex) for p, ex in enumerate(examples) if item_id(ex) not in done]

    def saved(i: int, outcome: Outcome) -> None:
        append_jsonl(pred_path, [prediction_item(todo[i][1], outcome)])
        if replaced is not None:
            replaced.commit()
        bar.answered(i, outcome.completion_tokens)

    try:
        if todo:
            policy.rollout(
                [ex for _, ex in todo],
                searcher,
                episode,
                settings,
                seed=settings.seed,
                indices=[p for p, _ in todo],
                on_done=saved,
                on_start=bar.started,
            )
    finally:
        bar.close()
    items = load_done(pred_path)
    if {str(it["id"]) for it in items} == wanted:  # complete: the file in the dataset's order
        order = {item_id(ex): k for k, ex in enumerate(examples)}
        items.sort(key=lambda it: order[str(it["id"])])
        atomic_write_jsonl(pred_path, items)
    metrics = {**run, **summarize_items(items), "seconds_this_session": round(time.perf_counter() - started, 2)}
    write_json(out / METRICS, metrics)
    return metrics
