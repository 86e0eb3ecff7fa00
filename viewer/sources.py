"""What `pvpo view` reads: an evaluation folder of `pvpo eval` (one dataset's folder holding
`predictions.jsonl`, or `--out` holding one such folder per dataset), a FlashRAG-format predictions
file (`intermediate_data.json` or jsonl), or a training run dir (its `episodes.jsonl`, metrics and
validation curve). Nothing is written to what is read: a `predictions.jsonl` still being appended
to is read as it stands (a torn last line is left out)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pvpo.atomic import read_jsonl
from pvpo.evaluation.run import PREDICTIONS, RUN, EvalError, read_items, resolve_template
from pvpo.reward import TagProtocol
from pvpo.trainer.episode_log import read_episode_log
from pvpo.trainer.state.run_dir import RunDir
from pvpo.viewer.episodes import page_episode


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


def item_episode(item: Mapping[str, Any], dataset: str, protocol: TagProtocol | None) -> dict[str, Any]:
    """The page's episode of one FlashRAG-layout item (`pvpo.evaluation.run.prediction_item`, or any
    FlashRAG file's: fields it lacks are shown as unknown)."""
    out = item.get("output") or {}
    ident = str(item.get("id", ""))
    return page_episode(
        key=f"{dataset}/{ident}",
        item_id=ident,
        dataset=dataset,
        question=str(item.get("question", "")),
        golds=[str(g) for g in item.get("golden_answers") or []],
        response=str(out.get("final_response", "")),
        prediction=out.get("pred"),
        scores=out.get("metric_score") or {},
        format_ok=out.get("format_ok"),
        stop_reason=str(out.get("stop_reason", "")),
        num_searches=out.get("num_searches"),
        num_turns=out.get("num_turns"),
        passages=out.get("passages") or [],
        protocol=protocol,
        tokens=out.get("completion_tokens"),
    )


def _dataset_folders(path: Path) -> list[Path]:
    """The folders of `path` holding predictions: itself, or its dataset folders (`pvpo eval --out`)."""
    if (path / PREDICTIONS).is_file():
        return [path]
    return sorted(p.parent for p in path.glob(f"*/{PREDICTIONS}"))


def read_eval(path: Path) -> Source:
    """An evaluation folder (one dataset's, or `--out` holding several) or a FlashRAG predictions file."""
    episodes: list[dict[str, Any]] = []
    if path.is_file():
        items = read_items(path)
        dataset = path.name.split(".")[0]
        episodes = [item_episode(it, dataset, None) for it in items]
        prompt = str((items[0].get("output") or {}).get("query", "")) if items else ""
        return Source(path.stem, str(path), "eval", episodes, prompt)
    folders = _dataset_folders(path)
    prompt, labels = "", []
    for folder in folders:
        run = _json(folder / RUN)
        dataset = str(run.get("dataset") or folder.name)
        protocol = _eval_protocol(run)
        items = read_jsonl(folder / PREDICTIONS)
        episodes += [item_episode(it, dataset, protocol) for it in items]
        if items and not prompt:
            prompt = str((items[0].get("output") or {}).get("query", ""))
        labels.append(str(run.get("label") or ""))
    label = labels[0] if labels and len(set(labels)) == 1 and labels[0] else path.resolve().name
    return Source(label, str(path), "eval", episodes, prompt)


# ---- training run dirs --------------------------------------------------------------------------------
def _run_protocol(files: RunDir) -> TagProtocol | None:
    """The tag protocol of a run (its config.yaml's `env.protocol`), None when unreadable."""
    import yaml

    from pvpo.reward import get_protocol

    try:
        cfg = yaml.safe_load(files.config.read_text(encoding="utf-8")) or {}
        return get_protocol(str(cfg["env"]["protocol"]))
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        return None


def _curves(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step: the rollouts' mean reward, EM and format rate, and the evaluations logged at it."""
    keys = {
        "reward": "reward/mean",
        "acc": "accuracy",
        "fmt": "format_ok",
        "val": "val/accuracy",
        "val_se": "val/accuracy_se",
        "eval": "eval/accuracy",
    }
    return [
        {"step": int(m["step"]), **{k: m[name] for k, name in keys.items() if m.get(name) is not None}}
        for m in metrics
        if "step" in m
    ]


def run_episode(e: Mapping[str, Any], step: int, row: int, protocol: TagProtocol | None) -> dict[str, Any]:
    """The page's episode of one kept training episode (`pvpo.trainer.episode_log.episode_record`)."""
    uid = str(e.get("uid", ""))
    dataset, _, ident = uid.partition("/") if "/" in uid else ("", "", uid)
    ep = page_episode(
        key=f"{step}/{row}/{uid}",
        item_id=ident,
        dataset=dataset,
        question=str(e.get("question", "")),
        golds=[str(g) for g in e.get("golden_answers") or []],
        response=str(e.get("response", "")),
        prediction=e.get("prediction"),
        scores=e,
        format_ok=e.get("format_ok"),
        stop_reason=str(e.get("stop_reason", "")),
        num_searches=e.get("num_searches"),
        num_turns=e.get("num_turns"),
        passages=e.get("passages") or [],
        protocol=protocol,
        tokens=e.get("model_tokens"),
    )
    ep.update(step=step, uid=uid, gt=bool(e.get("is_gt")), adv=e.get("advantage"), r=e.get("reward"))
    ep["rc"] = dict(e.get("reward_components") or {})
    if e.get("pi_gt"):
        ep["pi"] = dict(e["pi_gt"])
    return ep


def read_run(path: Path) -> Source:
    """A training run dir: the kept episodes of every step, each step's rows (group, reward,
    advantage, GT), the rollouts' curves and the validation curve (`checkpoints/best.json`)."""
    files = RunDir(path)
    protocol = _run_protocol(files)
    episodes: list[dict[str, Any]] = []
    steps = []
    for record in read_episode_log(files.episodes):
        step = int(record["step"])
        first = len(episodes)
        for row, e in enumerate(record.get("episodes") or []):
            episodes.append(run_episode(e, step, row, protocol))
        rows = [
            [str(r.get("uid", "")), r.get("reward"), r.get("advantage"), bool(r.get("is_gt")), r.get("em")]
            for r in record.get("rows") or []
        ]
        steps.append({"step": step, "rows": rows, "kept": list(range(first, len(episodes)))})
    best = _json(files.best)
    curves = _curves(read_jsonl(files.metrics))
    before = (_json(files.eval_before).get("metrics") or {}).get("eval/accuracy")
    if before is not None:  # the evaluation before RL's first step: the curve's step 0
        curves.insert(0, {"step": 0, "eval": before})
    run = {
        "steps": steps,
        "curves": curves,
        "validation": list(best.get("points") or []),
        "best": best.get("best"),
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
