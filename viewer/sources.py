"""What `pvpo view` reads: an evaluation folder of `pvpo eval` (one dataset's folder holding
`predictions.jsonl`, or `--out` holding one such folder per dataset), a FlashRAG-format predictions
file (`intermediate_data.json` or jsonl), or a training run dir (its `episodes.jsonl`, metrics and
validation curve). Nothing is written to what is read: a `predictions.jsonl` still being appended
to is read as it stands (a torn last line is left out)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pvpo.atomic import read_jsonl
from pvpo.evaluation.run import PREDICTIONS, RUN, EvalError, read_items, resolve_template
from pvpo.reward import TagProtocol, get_reward
from pvpo.trainer.state.episode_log import read_episode_log
from pvpo.trainer.state.run_dir import RunDir
from pvpo.viewer.episodes import Tokenize, detect_protocol, page_episode


class ViewError(ValueError):
    """A path `pvpo view` cannot show; the message names it and what to give instead."""


@dataclass
class Source:
    """One thing shown: its label, path and kind (`eval` or `run`), its episodes as the page holds
    them, and for a run its steps and curves."""

    label: str
    path: str
    kind: str
    episodes: list[dict[str, Any]] = field(default_factory=list)
    prompt: str = ""  # the first question's prompt, shown once (every episode's starts the same way)
    run: dict[str, Any] = field(default_factory=dict)


def _line_of(path: Path, row: int) -> int:
    """The line number of `path`'s `row`-th JSON line (from 0; `read_jsonl` leaves blank lines out)."""
    seen = -1
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            seen += bool(line.strip())
            if seen == row:
                return n
    return seen + 1


def _objects(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file (`read_jsonl`: a torn last line left out), each a JSON object;
    ViewError naming the file and line of one that is not."""
    rows = read_jsonl(path)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ViewError(
                f"{path}:{_line_of(path, i)}: expected a JSON object, got {type(row).__name__}: fix or remove that line"
            )
    return rows


def _line_name(path: Path, row: int) -> str:
    return f"line {_line_of(path, row)}"


def _bad_row(path: Path, where: str, err: Exception) -> ViewError:
    return ViewError(f"{path}: {where}: {err}: fix or remove that line")


def _json(path: Path) -> dict[str, Any]:
    """A JSON object file, or {} when it is absent or not an object (a folder is still shown)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# ---- evaluation folders and prediction files --------------------------------------------------------
def _eval_protocol(run: Mapping[str, Any]) -> TagProtocol | None:
    """The tag protocol an evaluation ran with (its `run.json` template), None when unknown."""
    template = (run.get("settings") or {}).get("template")
    if not template:
        return None
    try:
        return resolve_template(str(template))[0]
    except EvalError:
        return None


def _mapping(item: Mapping[str, Any], key: str, name: str = "") -> Mapping[str, Any]:
    """`item[key]` as a mapping ({} when absent); ValueError naming it (`name`, else `key`) when it
    is something else."""
    value = item.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"`{name or key}` is a JSON {type(value).__name__}, not an object")
    return value


def _strings(value: Any, key: str) -> list[str]:
    """A list of strings (one string stands for itself); ValueError naming the key otherwise."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ValueError(f"`{key}` is a JSON {type(value).__name__}, not a list")
    return [str(v) for v in value]


def _searches(value: Any, key: str) -> list[list[Mapping[str, Any]]]:
    """Per search, the passages the env recorded (`[[{id, title, score}...]...]`); ValueError naming the key."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(found, list) for found in value):
        raise ValueError(f"`{key}` is not a list of lists of passages")
    return value


def _number(value: Any, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"`{key}` is {value!r}, not a number")
    return int(value)


def item_episode(item: Mapping[str, Any], dataset: str, protocol: TagProtocol | None) -> dict[str, Any]:
    """The page's episode of one FlashRAG-layout item (`pvpo.evaluation.run.prediction_item`, or any
    FlashRAG file's: fields it lacks are shown as unknown). ValueError naming the field that is not
    of its kind."""
    out = _mapping(item, "output")
    scores = _mapping(out, "metric_score", "output.metric_score")
    for name in ("em", "f1", "acc", "cem"):
        if scores.get(name) is not None and not isinstance(scores[name], int | float):
            raise ValueError(f"`output.metric_score.{name}` is {scores[name]!r}, not a number")
    ident = str(item.get("id", "") if item.get("id") is not None else "")
    response = str(out.get("final_response", ""))
    protocol = protocol or detect_protocol(response)
    golds = _strings(item.get("golden_answers"), "golden_answers")
    ep = page_episode(
        key=f"{dataset}/{ident}",
        item_id=ident,
        dataset=dataset,
        question=str(item.get("question", "")),
        golds=golds,
        response=response,
        prediction=None if out.get("pred") is None else str(out["pred"]),
        scores=scores,
        format_ok=None if out.get("format_ok") is None else bool(out["format_ok"]),
        stop_reason=str(out.get("stop_reason", "")),
        num_searches=_number(out.get("num_searches"), "output.num_searches"),
        num_turns=_number(out.get("num_turns"), "output.num_turns"),
        passages=_searches(out.get("passages"), "output.passages"),
        protocol=protocol,
        tokens=_number(out.get("completion_tokens"), "output.completion_tokens"),
        queries=_strings(out.get("queries"), "output.queries"),
    )
    ep["r"] = gated_reward(response, golds, protocol)
    return ep


# the longest response whose reward the page recomputes: the format check reads about a million
# characters a second (7 s for a 6.6 MB response of one search repeated), and a response training
# can make is bounded by its token budget, far below this
MAX_REWARD_CHARS = 200_000


def gated_reward(response: str, golds: list[str], protocol: TagProtocol) -> float | None:
    """The reward training gives this response by default (`pvpo`: 0 unless the tag format holds,
    `pvpo.reward.rewards.pvpo_reward`), judged as the env judges it: without its correction
    messages; None for a response over MAX_REWARD_CHARS."""
    if len(response) > MAX_REWARD_CHARS:
        return None
    correction = protocol.correction_message()
    judged = response.replace(correction, "") if correction else response
    return float(get_reward("pvpo")(judged, golds, protocol).total)


def _unique_keys(episodes: list[dict[str, Any]]) -> None:
    """Give each episode a key of its own (the page opens an episode by key): an item without an id,
    or repeating one, is keyed by its place in its dataset (`dataset/#n`)."""
    seen: set[str] = set()
    place: dict[str, int] = {}
    for e in episodes:
        n = place[e["ds"]] = place.get(e["ds"], 0) + 1
        if not e["id"] or e["k"] in seen:
            e["k"] = f"{e['ds']}/#{n}"
        seen.add(e["k"])


def _items_episodes(
    items: list[Any], path: Path, where: Callable[[int], str], dataset: str, protocol: TagProtocol | None
) -> list[dict[str, Any]]:
    """`item_episode` of each item of `path`; ViewError naming the file and the line (`where(i)`) of a bad one."""
    episodes = []
    for i, item in enumerate(items):
        try:
            if not isinstance(item, Mapping):
                raise ValueError(f"expected a JSON object, got {type(item).__name__}")
            episodes.append(item_episode(item, dataset, protocol))
        except (TypeError, ValueError, AttributeError) as e:
            raise _bad_row(path, where(i), e) from None
    return episodes


def _first_prompt(items: list[Any]) -> str:
    out = items[0].get("output") if items and isinstance(items[0], Mapping) else None
    return str(out.get("query", "")) if isinstance(out, Mapping) else ""


def _dataset_folders(path: Path) -> list[Path]:
    """The folders of `path` holding predictions: itself, or its dataset folders (`pvpo eval --out`)."""
    if (path / PREDICTIONS).is_file():
        return [path]
    return sorted(p.parent for p in path.glob(f"*/{PREDICTIONS}"))


def read_eval(path: Path) -> Source:
    """An evaluation folder (one dataset's, or `--out` holding several) or a FlashRAG predictions file."""
    episodes: list[dict[str, Any]] = []
    if path.is_file():
        items = read_items(path)  # each an object, or an error naming the file and its line or row
        episodes = _items_episodes(items, path, lambda i: f"item {i + 1}", path.name.split(".")[0], None)
        _unique_keys(episodes)
        return Source(path.stem, str(path), "eval", episodes, _first_prompt(items))
    folders = _dataset_folders(path)
    prompt, labels = "", []
    for folder in folders:
        run = _json(folder / RUN)
        dataset = str(run.get("dataset") or folder.name)
        file = folder / PREDICTIONS
        items = read_jsonl(file)
        episodes += _items_episodes(items, file, functools.partial(_line_name, file), dataset, _eval_protocol(run))
        if items and not prompt:
            prompt = _first_prompt(items)
        labels.append(str(run.get("label") or ""))
    _unique_keys(episodes)
    label = labels[0] if labels and len(set(labels)) == 1 and labels[0] else path.resolve().name
    return Source(label, str(path), "eval", episodes, prompt)


# ---- training run dirs --------------------------------------------------------------------------------
def _run_protocol(files: RunDir) -> TagProtocol | None:
    """The tag protocol of a run (its config.yaml's `env.protocol`), None when unreadable: the
    config is read with the bounded loader (`pvpo.bounded_yaml`), so an alias bomb is refused at
    once rather than expanded."""
    import yaml

    from pvpo.bounded_yaml import load_yaml
    from pvpo.reward import get_protocol

    try:
        cfg = load_yaml(files.config.read_text(encoding="utf-8")) or {}
        return get_protocol(str(cfg["env"]["protocol"]))
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _steps(path: Path, rows: list[dict[str, Any]]) -> None:
    """ViewError naming `path`'s line whose `step` is not a whole number."""
    for i, row in enumerate(rows):
        step = row.get("step")
        if step is not None and not (_is_number(step) and float(step).is_integer()):
            raise ViewError(
                f"{path}:{_line_of(path, i)}: `step` is {step!r}, not a step number: fix or remove that line"
            )


def _curves(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step: the rollouts' mean reward, EM and format rate, and the evaluations logged at it
    (a value that is not a number is left out)."""
    keys = {
        "reward": "reward/mean",
        "acc": "accuracy",
        "fmt": "format_ok",
        "val": "val/accuracy",
        "val_se": "val/accuracy_se",
        "eval": "eval/accuracy",
    }
    return [
        {"step": int(m["step"]), **{k: m[name] for k, name in keys.items() if _is_number(m.get(name))}}
        for m in metrics
        if m.get("step") is not None
    ]


def _run_tokenizer(files: RunDir) -> Tokenize | None:
    """The run's tokenizer (its `initial_policy/tokenizer.json`, read by `tokenizers` alone: no
    model, no transformers) as token spans of a text; None when the run has none readable."""
    import tokenizers

    path = files.initial_policy / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        tokenizer = tokenizers.Tokenizer.from_file(str(path))
    except Exception:  # noqa: BLE001 - tokenizers raises a bare Exception on a file it cannot read
        return None
    return lambda text: tokenizer.encode(text, add_special_tokens=False).offsets


def run_episode(
    e: Mapping[str, Any], step: int, row: int, protocol: TagProtocol | None, tokenize: Tokenize | None = None
) -> dict[str, Any]:
    """The page's episode of one kept training episode (`pvpo.trainer.state.episode_log.episode_record`),
    with its turns' tokens where `tokenize` is given; ValueError naming a field that is not of its kind."""
    uid = str(e.get("uid", ""))
    dataset, _, ident = uid.partition("/") if "/" in uid else ("", "", uid)
    ep = page_episode(
        key=f"{step}/{row}/{uid}",
        item_id=ident,
        dataset=dataset,
        question=str(e.get("question", "")),
        golds=_strings(e.get("golden_answers"), "golden_answers"),
        response=str(e.get("response", "")),
        prediction=None if e.get("prediction") is None else str(e["prediction"]),
        scores={k: e[k] for k in ("em", "f1", "cem") if _is_number(e.get(k))},
        format_ok=None if e.get("format_ok") is None else bool(e["format_ok"]),
        stop_reason=str(e.get("stop_reason", "")),
        num_searches=_number(e.get("num_searches"), "num_searches"),
        num_turns=_number(e.get("num_turns"), "num_turns"),
        passages=_searches(e.get("passages"), "passages"),
        protocol=protocol,
        tokens=_number(e.get("model_tokens"), "model_tokens"),
        tokenize=tokenize,
    )
    components = _mapping(e, "reward_components")
    ep.update(step=step, uid=uid, gt=bool(e.get("is_gt")), adv=e.get("advantage"), r=e.get("reward"))
    for name in ("adv", "r"):
        if ep[name] is not None and not _is_number(ep[name]):
            raise ValueError(f"`{'advantage' if name == 'adv' else 'reward'}` is {ep[name]!r}, not a number")
    ep["rc"] = {str(k): v for k, v in components.items() if _is_number(v)}
    if e.get("pi_gt"):
        ep["pi"] = dict(_mapping(e, "pi_gt"))
    return ep


def _step_rows(record: Mapping[str, Any]) -> list[list[Any]]:
    rows = record.get("rows") or []
    if not isinstance(rows, list) or not all(isinstance(r, Mapping) for r in rows):
        raise ValueError("`rows` is not a list of objects")
    num = lambda v: v if _is_number(v) else None  # noqa: E731
    return [
        [str(r.get("uid", "")), num(r.get("reward")), num(r.get("advantage")), bool(r.get("is_gt")), num(r.get("em"))]
        for r in rows
    ]


def _held_out_flips(files: RunDir) -> list[list[Any]]:
    """`[uid, question, EM before RL, EM after]` per held-out question (`held_out_em.json`, the
    questions' text from `held_out.jsonl` where it has them); [] when the run wrote none or it is
    not in that layout (the page shows the rest)."""
    record = _json(files.held_out_em)
    uids, em = record.get("questions"), record.get("em")
    if not isinstance(uids, list) or not isinstance(em, Mapping):
        return []
    before, after = em.get("before"), em.get("after")
    if not (isinstance(before, list) and isinstance(after, list) and len(before) == len(after) == len(uids)):
        return []
    if not all(_is_number(x) for x in [*before, *after]):
        return []
    texts: dict[str, str] = {}
    try:
        for row in read_jsonl(files.held_out):
            if isinstance(row, Mapping):
                texts[str(row.get("id", ""))] = str(row.get("question", ""))
    except (OSError, ValueError):
        pass
    return [[str(u), texts.get(str(u), ""), b, a] for u, b, a in zip(uids, before, after, strict=True)]


def read_run(path: Path) -> Source:
    """A training run dir: the kept episodes of every step, each step's rows (group, reward,
    advantage, GT), the rollouts' curves and the validation curve (`checkpoints/best.json`)."""
    files = RunDir(path)
    protocol = _run_protocol(files)
    tokenize = _run_tokenizer(files)
    episodes: list[dict[str, Any]] = []
    steps = []
    _steps(files.episodes, _objects(files.episodes))
    records = read_episode_log(files.episodes)  # the steps a resumed run wrote again, as the trainer reads them
    for record in records:
        step = int(record["step"])
        first = len(episodes)
        try:
            kept = record.get("episodes") or []
            if not isinstance(kept, list):
                raise ValueError("`episodes` is not a list")
            for row, e in enumerate(kept):
                if not isinstance(e, Mapping):
                    raise ValueError(f"episode {row + 1} is a JSON {type(e).__name__}, not an object")
                episodes.append(run_episode(e, step, row, protocol, tokenize))
            rows = _step_rows(record)
        except (TypeError, ValueError, AttributeError) as e:
            raise ViewError(f"{files.episodes}: the line of step {step}: {e}: fix or remove that line") from None
        steps.append({"step": step, "rows": rows, "kept": list(range(first, len(episodes)))})
    best = _json(files.best)
    metrics = _objects(files.metrics)
    _steps(files.metrics, metrics)
    curves = _curves(metrics)
    before = (_json(files.eval_before).get("metrics") or {}).get("eval/accuracy")
    if _is_number(before):  # the evaluation before RL's first step: the curve's step 0
        curves.insert(0, {"step": 0, "eval": before})
    points = best.get("points")
    run = {
        "steps": steps,
        "curves": curves,
        "validation": [
            {k: p[k] for k in ("step", "accuracy", "accuracy_se", "n") if _is_number(p.get(k))}
            for p in points
            if isinstance(p, Mapping) and _is_number(p.get("step")) and _is_number(p.get("accuracy"))
        ]
        if isinstance(points, list)
        else [],
        "best": best.get("best") if isinstance(best.get("best"), Mapping) else None,
        "heldout": _held_out_flips(files),
    }
    return Source(path.resolve().name, str(path), "run", episodes, "", run)


def is_run_dir(path: Path) -> bool:
    """Whether `path` is a training run dir (its config.yaml beside its metrics or episodes)."""
    files = RunDir(path)
    return files.config.is_file() and (files.metrics.is_file() or files.episodes.is_file())


def read_source(path: str | Path) -> Source:
    """What `path` holds, read for the page (ViewError when it holds nothing `pvpo view` shows)."""
    path = Path(path)
    if not path.exists():
        raise ViewError(f"{path}: no such file or folder; give an evaluation folder (pvpo eval --out) or a run dir")
    if path.is_dir() and is_run_dir(path):
        return read_run(path)
    if path.is_file() or _dataset_folders(path):
        return read_eval(path)
    raise ViewError(
        f"{path} holds no {PREDICTIONS} (an evaluation folder of pvpo eval, or its --out) and is no training "
        "run dir (config.yaml with metrics.jsonl or episodes.jsonl): give one of those"
    )
