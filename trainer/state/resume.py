"""Which config a run directory is trained with: a fresh run refuses a directory that already
holds a run (unless told to overwrite it), and a resumed run keeps the config it was started
with, changing only the keys that cannot change what the next step computes. Each checkpoint
records the config it was trained with (`config_record`), so a hand-edited `config.yaml` is
refused too, not only a differing `--config` or override."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pvpo.atomic import replaced_path
from pvpo.owned import FolderError, Replacement, check_folder_path, is_ours, recover, remove_temp_files, replacing
from pvpo.trainer.config.schema import QUESTIONS_CORPUS, ConfigError, TrainConfig, load_config
from pvpo.trainer.state.checkpoint import CheckpointError, latest_checkpoint, recorded_config
from pvpo.trainer.state.metrics_log import read_metrics
from pvpo.trainer.state.run_dir import CHECKPOINT_KIND, RUN_KIND, RunDir

log = logging.getLogger(__name__)

# Keys a resume may change: how long to train, how often to checkpoint / evaluate / log, how many
# CPU threads, and how to reach the retriever (it may have moved or restarted). Everything else
# (model, data, rollout, algorithm, optim, seed, ...) decides the trajectories and updates, so a
# different value would silently continue a different run.
SAFE_ON_RESUME = frozenset(
    {
        "run.steps",
        "run.checkpoint_every",
        "run.eval_every",
        "run.keep_episodes",
        "run.tensorboard",
        "run.threads",
        "retriever.url",
        "retriever.token",
        "retriever.timeout",
        "retriever.retries",
        "retriever.max_backoff",
    }
)


class RunDirError(ConfigError):
    """A run directory that cannot be trained in as asked; the message says what to pass instead."""


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(_flatten(v, key) if isinstance(v, dict) and v else {key: v})
    return out


def config_diff(a: TrainConfig, b: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """`{dotted.key: (a's value, b's value)}` for every leaf that differs."""
    fa, fb = _flatten(a.model_dump(mode="json")), _flatten(b.model_dump(mode="json"))
    return {k: (fa.get(k), fb.get(k)) for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k)}


def config_record(cfg: TrainConfig) -> dict[str, str]:
    """What a checkpoint records of the config it was trained with: the keys a resume may not
    change (all but SAFE_ON_RESUME) as canonical JSON, and its sha256."""
    values = {k: v for k, v in _flatten(cfg.model_dump(mode="json")).items() if k not in SAFE_ON_RESUME}
    text = json.dumps(values, sort_keys=True, ensure_ascii=False)
    return {"sha256": hashlib.sha256(text.encode()).hexdigest(), "values": text}


def check_checkpoint_config(ckpt: Path, cfg: TrainConfig) -> None:
    """Raise RunDirError when `cfg` differs from the config checkpoint `ckpt` was trained with in a
    key a resume may not change (a hand-edited config.yaml); a checkpoint saved without a record
    is not checked. A key one of the two configs does not have (added to or dropped from the
    schema since) is not compared."""
    recorded = recorded_config(ckpt)
    now = config_record(cfg)
    if recorded is None or recorded.get("sha256") == now["sha256"]:
        return
    old, new = json.loads(recorded["values"]), json.loads(now["values"])
    changed = {k: (old[k], new[k]) for k in sorted(old.keys() & new.keys()) if old[k] != new[k]}
    if not changed:
        return
    lines = "\n".join(f"  {k}: checkpoint has {a!r}, resumed with {b!r}" for k, (a, b) in changed.items())
    config = RunDir(ckpt.parent.parent).config
    raise RunDirError(
        f"{config} no longer describes the run: its checkpoint {ckpt.name} was trained with another config:\n{lines}\n"
        f"put those values back in {config} (a resume may change only {', '.join(sorted(SAFE_ON_RESUME))}), "
        "or train into a new --run-dir"
    )


def where_stopped(run_dir: str | Path, resume: str) -> str:
    """Where a run that stopped stands and how to continue it (`resume`: the command, without its
    --run-dir), for the line a stopped or failed run ends with."""
    run_dir = Path(run_dir)
    try:
        ckpt = latest_checkpoint(run_dir)
        logged = max((r["step"] for r in read_metrics(RunDir(run_dir).metrics)), default=0)
    except (CheckpointError, OSError, ValueError):
        return f"see {run_dir}"
    command = f"`{resume} --run-dir {shlex.quote(str(run_dir))} --resume`"
    if ckpt is None:
        return f"{run_dir} has no checkpoint yet: {command} starts it again from step 0"
    return f"{run_dir} logged {logged} step(s), checkpointed at {ckpt.name}: continue it with {command}"


def saved_config(run_dir: str | Path) -> TrainConfig | None:
    """The config a run was started with (`<run>/config.yaml`), or None when it has none."""
    path = RunDir(run_dir).config
    return load_config(path) if path.exists() else None


def check_resume_config(run_dir: str | Path, cfg: TrainConfig) -> None:
    """Raise RunDirError when `cfg` differs from the run's saved config, or from the config its
    latest checkpoint was trained with, in a key outside SAFE_ON_RESUME, or asks for fewer steps
    than that checkpoint already holds. An `--overwrite` a kill cut short is undone first
    (`recover_run_dir`, by the main process alone)."""
    if os.environ.get("RANK", "0") == "0":
        recover_run_dir(run_dir)
    saved = saved_config(run_dir)
    if saved is not None:
        unsafe = {k: v for k, v in config_diff(saved, cfg).items() if k not in SAFE_ON_RESUME}
        if unsafe:
            lines = "\n".join(f"  {k}: run has {old!r}, asked {new!r}" for k, (old, new) in unsafe.items())
            raise RunDirError(
                f"cannot resume {run_dir} with a different config:\n{lines}\n"
                f"resume without --config to use the run's own {RunDir(run_dir).config.name} (overrides allowed: "
                f"{', '.join(sorted(SAFE_ON_RESUME))}), or train into a new --run-dir"
            )
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        log.warning("%s has no checkpoint yet: --resume starts it from step 0", run_dir)
    else:
        check_checkpoint_config(ckpt, cfg)
    checkpoint_step = int(ckpt.name.removeprefix("step_")) if ckpt is not None else 0
    if checkpoint_step > cfg.run.steps:
        raise RunDirError(
            f"{run_dir} is checkpointed at step {checkpoint_step} but run.steps={cfg.run.steps}: "
            f"pass run.steps={checkpoint_step} or more to continue it"
        )


def resume_config(run_dir: str | Path, overrides: list[str], config: str | Path | None = None) -> TrainConfig:
    """The config to resume `run_dir` with: its own `config.yaml` plus `overrides`, or, when
    `config` is given, that file plus `overrides`, checked against the run's own (a run that
    stopped before writing its config.yaml resumes with `config`)."""
    path = RunDir(run_dir).config
    if not path.exists() and config is None:
        raise RunDirError(f"nothing to resume: {path} does not exist (pass --config, or train without --resume)")
    cfg = load_config(config if config is not None else path, overrides)
    check_resume_config(run_dir, cfg)
    return cfg


def run_inputs(cfg: TrainConfig) -> list[str | None]:
    """The paths a run reads (data, corpus, index, model), where the config names one."""
    data = cfg.data
    files = [] if data.source == "synthetic" else [data.source] if isinstance(data.source, str) else data.source
    corpus = data.corpus if data.corpus != QUESTIONS_CORPUS else None
    return [*files, data.eval_source, corpus, cfg.retriever.index_dir, cfg.model.path, cfg.algorithm.gt.model.path]


def recover_run_dir(run_dir: str | Path) -> None:
    """Before a run dir is read: an `--overwrite` a SIGKILL cut short is undone (the replaced run
    put back, `pvpo.owned.recover`), and the temporary files of atomic writes a kill left behind
    are removed. Call it with the run dir's lock held."""
    run_dir = Path(run_dir)
    did = recover(run_dir, RUN_KIND)
    if did is not None:
        log.warning("%s: %s", run_dir, did)
    if is_ours(run_dir, RUN_KIND):
        remove_temp_files(run_dir, RUN_KIND)
        remove_temp_files(RunDir(run_dir).checkpoints, CHECKPOINT_KIND)


@contextmanager
def fresh_run_dir(
    run_dir: str | Path,
    *,
    overwrite: bool = False,
    inputs: Sequence[str | Path | None] = (),
    command: str = "pvpo train",
) -> Iterator[Replacement]:
    """Make `run_dir` ready for a new run for the duration of the block, by pvpo's rule for the
    folders it writes (`pvpo.owned`): a folder holding an earlier run is refused (RunDirError
    saying the two ways on) unless `overwrite`; then the run's entries are moved aside, dropped by
    the new run's first checkpoint (`checkpoint.save_checkpoint`) and put back if the block fails
    or is stopped before one is written - so a bad config, dataset, index or model never costs the
    old run. A user's files in the folder are refused without `overwrite` and kept with it.
    `inputs`: paths the new run reads, refused when inside what is being replaced; `command`
    (recorded in the run's manifest): which command's run it is."""
    run_dir = Path(run_dir)
    try:
        check_folder_path(run_dir, "--run-dir")
    except FolderError as e:
        raise RunDirError(str(e)) from None
    legacy = replaced_path(run_dir)
    if os.path.lexists(legacy):
        raise RunDirError(
            f"{legacy} holds a run an earlier --overwrite replaced before its first checkpoint: "
            f"delete it, or move it back to {run_dir}, then run again"
        )
    cwd = Path.cwd().resolve()
    if overwrite and run_dir.is_dir() and cwd.is_relative_to(run_dir.resolve()) and cwd != run_dir.resolve():
        raise RunDirError(
            f"--overwrite would move a folder of {run_dir} aside while it holds the current folder: cd elsewhere first"
        )
    with replacing(
        run_dir,
        RUN_KIND,
        overwrite=overwrite,
        refusal="pass --resume to continue it, or --overwrite to replace it (it is kept until the new run's "
        "first checkpoint)",
        inputs=inputs,
        error=RunDirError,
        info={"command": command},
    ) as replacement:
        yield replacement
        replacement.commit()  # a run that ended without a checkpoint is complete all the same
