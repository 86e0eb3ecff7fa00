"""Which config a run directory is trained with: a fresh run refuses a directory that already
holds a run (unless told to overwrite it), and a resumed run keeps the config it was started
with, changing only the keys that cannot change what the next step computes."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from pvpo.trainer.config.schema import ConfigError, TrainConfig, load_config
from pvpo.trainer.state.checkpoint import latest_checkpoint
from pvpo.trainer.state.run_dir import RunDir

# Keys a resume may change: how long to train, how often to checkpoint / evaluate / log, how many
# CPU threads, and how to reach the retriever (it may have moved or restarted). Everything else
# (model, data, rollout, algorithm, optim, seed, ...) decides the trajectories and updates, so a
# different value would silently continue a different run.
SAFE_ON_RESUME = frozenset(
    {
        "run.steps",
        "run.checkpoint_every",
        "run.eval_every",
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


def saved_config(run_dir: str | Path) -> TrainConfig | None:
    """The config a run was started with (`<run>/config.yaml`), or None when it has none."""
    path = RunDir(run_dir).config
    return load_config(path) if path.exists() else None


def check_resume_config(run_dir: str | Path, cfg: TrainConfig) -> None:
    """Raise RunDirError when `cfg` differs from the run's saved config in a key outside
    SAFE_ON_RESUME, or asks for fewer steps than its latest checkpoint already holds."""
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


def prepare_fresh(run_dir: str | Path, *, overwrite: bool = False) -> None:
    """Make `run_dir` ready for a new run: refuse one that holds files (RunDirError naming them
    and the two ways on), or, with `overwrite`, delete what is in it."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return
    held = sorted(p.name for p in run_dir.iterdir())
    if not held:
        return
    if not overwrite:
        shown = ", ".join(held[:6]) + (", ..." if len(held) > 6 else "")
        raise RunDirError(
            f"{run_dir} already holds a run ({shown}): pass --resume to continue it, "
            f"or --overwrite to delete it and start over"
        )
    for p in run_dir.iterdir():
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
