"""The results directory of `bench/algorithms/algorithms.py` (`--results`, default `bench/results/algorithms`):
the per-run results it ships in the repository, small enough to commit, from which `--report-only`
recomputes the report, the benchmark page's table and the plot without any run folder.

- `bench.json`: the settings every run shares (config file and the sha256 of its text, overrides,
  steps, evaluations, warm start), the plan (algorithms, N, seeds, lr grid, E of the amortised
  cost, where the plot goes) and a record of each invocation that trained runs (command, commit,
  machine, software versions, niceness, load average, wall time, runs trained);
- `warm.json`: the shared warm start (its length and calibration, per-question EM on validation
  and test, the one-off anchor and GT work by kind, Group Sampling's fractions, the question uids);
- `sweep/<run>.json`, `final/<run>.json`: one per run (`<alg>_n<N>_lr<lr>_s<seed>`): algorithm, N,
  lr, seed, what it used, its wall time, and per evaluation (`step`) the per-question EM (a string
  of 0/1, one character per question in `warm.json`'s order; a list where a score is not 0/1) and
  the run's own cumulative cost by kind (`train`, `anchor`, `gt`: rollouts and tool calls; the
  one-off anchor and GT work it shares is in `warm.json`).

`load_run` gives back the dict `algorithms_runs.run_one` writes, so the report reads either.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pvpo.atomic import atomic_write_json

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # the root, for bench.* (bench/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


REPO = Path(__file__).resolve().parents[2]
KINDS = ("train", "anchor", "gt")
RUN_KEYS = (
    "stage",
    "alg",
    "n",
    "lr",
    "seed",
    "split",
    "uses_anchor",
    "group_sampling",
    "steps",
    "wall_s",
    "em",
    "format_ok",
    "searches_per_traj",
    "policy_tokens",
    "adv_var",
)


def pack_em(values: Sequence[float]) -> str | list[float]:
    """Per-question EM as a string of 0/1 (one character a question), or the list where a score
    is not 0 or 1."""
    if all(v in (0.0, 1.0) for v in values):
        return "".join("1" if v else "0" for v in values)
    return [float(v) for v in values]


def unpack_em(packed: str | Sequence[float]) -> list[float]:
    return [float(c) for c in packed] if isinstance(packed, str) else [float(v) for v in packed]


def compact_run(result: dict[str, Any]) -> dict[str, Any]:
    """The shipped form of a run's `result.json` (module docstring)."""
    out = {k: result[k] for k in RUN_KEYS}
    out["curve"] = [{"step": p["step"], "em_q": pack_em(p["em_q"]), "cost": _cost(p)} for p in result["curve"]]
    return out


def _cost(point: dict[str, Any]) -> dict[str, dict[str, float]]:
    if "cost" in point:
        return {k: {f: float(point["cost"][k][f]) for f in ("rollouts", "tool_calls")} for k in KINDS}
    # a curve point without the breakdown: the training rollouts' only (a run copies the one-off work)
    zero = {"rollouts": 0.0, "tool_calls": 0.0}
    train = {"rollouts": float(point["train_rollouts"]), "tool_calls": float(point["train_tool_calls"])}
    return {"train": train, "anchor": dict(zero), "gt": dict(zero)}


def load_run(path: Path) -> dict[str, Any]:
    """A shipped run as `run_one`'s summary: per-question EM as lists, the training cost as
    `train_rollouts` / `train_tool_calls` beside the breakdown."""
    run = json.loads(path.read_text())
    for p in run["curve"]:
        p["em_q"] = unpack_em(p["em_q"])
        p["train_rollouts"] = p["cost"]["train"]["rollouts"]
        p["train_tool_calls"] = p["cost"]["train"]["tool_calls"]
    return dict(run)


def compact_warm(summary: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(summary))
    for split in out["start"].values():
        split["em_q"] = pack_em(split["em_q"])
    return dict(out)


def load_warm(path: Path) -> dict[str, Any]:
    warm = json.loads(path.read_text())
    for split in warm["start"].values():
        split["em_q"] = unpack_em(split["em_q"])
    return dict(warm)


def _write(path: Path, doc: dict[str, Any]) -> None:
    """JSON with sorted keys and one space of indent: the same bytes for the same results."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, doc, indent=1, sort_keys=True)


def export(results: Path, warm: dict[str, Any] | None, runs: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Write the warm start (unless None) and every run of `runs` ((stage, name) -> `run_one`'s
    summary)."""
    if warm is not None:
        _write(results / "warm.json", compact_warm(warm))
    for (stage, name), r in runs.items():
        _write(results / stage / f"{name}.json", compact_run(r))


def stored_runs(results: Path, stage: str) -> list[dict[str, Any]]:
    """Every shipped run of `stage`, in file-name order."""
    return [load_run(p) for p in sorted((results / stage).glob("*.json"))]


def settings_record(settings: Any) -> dict[str, Any]:
    """What every run of a results directory depends on (`algorithms_runs.Settings`): the config
    (its path inside the repository and the sha256 of its text) and the schedule."""
    from bench.algorithms.algorithms_runs import schedule_record

    path = settings.config.resolve()
    return {
        "config": str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path),
        "config_sha256": hashlib.sha256(path.read_bytes() if path.exists() else b"").hexdigest(),
        **schedule_record(settings),
    }


def read_bench(results: Path) -> dict[str, Any]:
    path = results / "bench.json"
    if not path.exists():
        raise SystemExit(
            f"{results}: no benchmark results ({path}); run bench/algorithms/algorithms.py without --report-only first"
        )
    return dict(json.loads(path.read_text()))


def check_results(results: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """The results directory's `bench.json`, created with `settings` when new; a SystemExit when
    it holds runs trained under other settings (they would be mixed in one report)."""
    path = results / "bench.json"
    if not path.exists():
        doc: dict[str, Any] = {"settings": settings, "plan": {}, "invocations": []}
        _write(path, doc)
        return doc
    doc = dict(json.loads(path.read_text()))
    changed = [k for k in settings if k != "config" and doc["settings"].get(k) != settings[k]]
    if changed:
        raise SystemExit(
            f"{results} holds results of a benchmark with other {', '.join(changed)} ({path}): give another "
            "--results, or the same settings"
        )
    return doc


def save_bench(results: Path, doc: dict[str, Any]) -> None:
    _write(results / "bench.json", doc)


def invocation_record(
    command: str, machine: dict[str, Any], started: float, load_start: float, runs_trained: int
) -> dict[str, Any]:
    """One invocation that trained runs: its command, the machine and commit it started on
    (`machine_record` at its start: the code it runs), niceness, load average at its start and
    end, when it finished (UTC), its wall time and the number of runs it trained."""
    return {
        "command": command,
        "machine": machine,
        "niceness": os.nice(0),
        "load_average": [round(load_start, 1), round(os.getloadavg()[0], 1)],
        "finished_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "wall_s": round(time.perf_counter() - started),
        "runs_trained": runs_trained,
    }
