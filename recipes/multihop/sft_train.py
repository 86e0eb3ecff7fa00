"""The compute-matched SFT arm's training (`pvpo recipe sft-arm`): the recipe's warm start continued
for the planned steps (`sft_plan`) in one data-order seed, each seed in a child process into
OUT/seed_<k> (`policy/`, `sft.json`: losses, seconds, steps, how many new trajectories); a finished
seed is kept, a killed one starts again.

- **Data.** The warm start's own GT trajectories, rebuilt as it built them (the same questions,
  index and settings; checked against its `warm_start.json`): first those its steps never drew
  (new trajectories), then whole epochs, each shuffled with the arm's data-order seed
  (`pvpo.trainer.model.warmstart.continued_batches`).
- **SFT.** The warm start's own (its learning rate, batch size, micro-batch budget, dtype and
  schedule: a fresh AdamW, warm-up to 10% of the steps then linear decay; the warm start's AdamW
  state is not kept by a run). Run the arm as the RL runs ran (the same `run.threads`, nothing
  beside): its step count divides one wall time by another."""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pvpo.atomic import atomic_write_json
from pvpo.recipes.multihop.evaluate import run_child
from pvpo.recipes.multihop.runs import recipe_config

SEED_ENTRIES = {"policy", "policy.tmp", "sft.json", "eval"}  # what a seed's folder holds


def seed_dir(out: Path, seed: int) -> Path:
    """Where data-order seed `seed`'s continuation lives."""
    return out / f"seed_{seed}"


def seed_finished(folder: Path) -> bool:
    """A seed whose SFT ended: its policy and its record written."""
    return (folder / "sft.json").is_file() and (folder / "policy" / "config.json").is_file()


def check_seed_folder(folder: Path) -> None:
    """Refuse a seed folder holding anything this arm does not write (it is never modified)."""
    foreign = sorted(p.name for p in folder.iterdir() if p.name not in SEED_ENTRIES) if folder.is_dir() else []
    if foreign:
        raise ValueError(f"{folder} holds files this arm does not write ({', '.join(foreign[:3])}): give another --out")


def train_command(recipe_run: Path, seed: int, steps: int, out: Path) -> list[str]:
    """The child process that trains data-order seed `seed` (`train_seed`): the hidden
    `pvpo recipe sft-seed` command."""
    return [
        sys.executable,
        "-m",
        "pvpo.cli",
        "recipe",
        "sft-seed",
        "--recipe-run",
        str(recipe_run),
        "--out",
        str(out),
        "--seed",
        str(seed),
        "--steps",
        str(steps),
    ]


def sft_overrides(recipe_run: Path) -> list[str]:
    """The recipe run's config with its warm start as the model and its index as the retriever's
    (the questions, splits and agent settings the warm start's trajectories were written with)."""
    return [f"model.path={recipe_run / 'initial_policy'}", f"retriever.index_dir={recipe_run / 'index'}"]


def train_seed(
    recipe_run: Path, seed: int, steps: int, folder: Path, *, searcher: Any = None, show_progress: bool = True
) -> dict[str, Any]:
    """Continue `recipe_run`'s warm start for `steps` SFT steps in data-order seed `seed` (module
    docstring) and save the policy to FOLDER/policy and the record to FOLDER/sft.json; `searcher`
    replaces a loopback server of the run's index (tests)."""
    import tempfile

    import torch

    from pvpo.atomic import atomic_write_dir
    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.data import load_data, retriever_session
    from pvpo.trainer.model.device import place_policy_model, placement, resolve_device, with_resolved_dtype
    from pvpo.trainer.model.memory import process_peak_rss_gib
    from pvpo.trainer.model.policy import load_policy, save_policy
    from pvpo.trainer.model.warmstart import continued_batches, sft_batches, warm_start
    from pvpo.trainer.setup import warm_start_trajectories

    recipe_config(recipe_run, warm_start_only=True)  # a run past its warm start, or a one-line error
    cfg = load_config(recipe_run / "config.yaml", sft_overrides(recipe_run))
    cfg = with_resolved_dtype(cfg, resolve_device(cfg.model.device))
    m = cfg.model
    saved = json.loads((recipe_run / "warm_start.json").read_text())
    if len(saved.get("losses", [])) != m.warm_start_steps:
        raise ValueError(
            f"{recipe_run}/warm_start.json: {len(saved.get('losses', []))} steps recorded, the config says "
            f"model.warm_start_steps={m.warm_start_steps}"
        )
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    torch.manual_seed(seed)
    policy = load_policy(recipe_run / "initial_policy", dtype="float32")
    where = placement(m.device, m.dtype, m.attn_implementation, m.gradient_checkpointing)
    place_policy_model(policy.model, where)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:  # load_data writes the split files: not into the recipe run
        data = load_data(cfg, Path(tmp))
        session = contextlib.nullcontext(searcher) if searcher is not None else None
        with session or retriever_session(cfg, Path(tmp), data.corpus_path) as s:
            trajs, questions, _ = warm_start_trajectories(cfg, data, policy.tokenizer, s)
    if [q.uid for q in questions] != saved["questions"]:
        differ = len(set(saved["questions"]) ^ {q.uid for q in questions})
        raise ValueError(
            f"{recipe_run}: the warm start's GT trajectories were not rebuilt as its warm_start.json lists them "
            f"({len(questions)} questions against {len(saved['questions'])}, {differ} differ): another index, "
            "data file or retriever setting"
        )
    trajectories_s = time.perf_counter() - t0
    first = {"first_steps": m.warm_start_steps, "first_seed": cfg.run.seed}
    batches = continued_batches(len(trajs), m.warm_start_batch_size, steps, seed=seed, **first)
    seen = {i for b in sft_batches(len(trajs), m.warm_start_batch_size, m.warm_start_steps, cfg.run.seed) for i in b}
    t1 = time.perf_counter()
    with where.autocast():  # the warm start's compute dtype
        losses = warm_start(
            policy.model,
            trajs,
            policy.tokenizer.pad_token_id,
            steps=steps,
            lr=m.warm_start_lr,
            batch_size=m.warm_start_batch_size,
            seed=seed,
            max_tokens=cfg.optim.max_tokens_per_micro_batch,
            show_progress=show_progress,
            batches=batches,
        )
    sft_s = time.perf_counter() - t1
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_dir(folder / "policy", lambda tmp: save_policy(policy, tmp))
    record = {
        "seed": seed,
        "steps": steps,
        "losses": losses,
        "sft_seconds": sft_s,
        "trajectories_seconds": trajectories_s,
        "trajectories": len(trajs),
        "new_trajectories": len({i for b in batches for i in b} - seen),
        "epochs": steps * m.warm_start_batch_size / len(trajs),
        "peak_rss_gib": process_peak_rss_gib(),  # the child process's, the policy's SFT and its data
        "start": str(recipe_run / "initial_policy"),
    }
    atomic_write_json(folder / "sft.json", record)
    return record


def run_seeds(recipe_run: Path, seeds: Sequence[int], steps: int, out: Path) -> None:
    """Train each unfinished seed in a child process (`train_seed`); finished ones are kept."""
    for k, seed in enumerate(seeds, 1):
        folder = seed_dir(out, seed)
        if seed_finished(folder):
            print(f"[sft seed {seed}, {k}/{len(seeds)}] finished earlier, kept", flush=True)
            continue
        check_seed_folder(folder)
        cmd = train_command(recipe_run, seed, steps, out)
        print(f"[sft seed {seed}, {k}/{len(seeds)}] {shlex.join(cmd)}", flush=True)
        run_child(cmd, f"SFT seed {seed}")
