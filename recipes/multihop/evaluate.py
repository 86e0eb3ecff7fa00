"""`pvpo eval` of the multi-hop recipe's saved policies as its own run evaluated them: the recipe's
agent settings, greedy, against a loopback server of the run's own index; each evaluation kept in
its folder and never run again (the held-out-once rule), or run again on purpose to check that it
reproduces the run's own answers (`--reproduce`)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pvpo.recipes.multihop.runs import SPLITS, load_seed, question_ids, read_predictions, recipe_config, split_of
from pvpo.stats import mean


def offline_env() -> dict[str, str]:
    """The environment of a child `pvpo` process: this one's, with the Hugging Face hub offline
    (every model the recipe evaluates is a local folder or a cached catalog model)."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def run_child(cmd: list[str], what: str) -> None:
    """Run a child `pvpo` process (its output goes to this one's); a failure is one line naming
    `what` failed, its own error printed above it."""
    done = subprocess.run(cmd, check=False, env=offline_env())
    if done.returncode != 0:
        raise ValueError(f"{what} failed (exit status {done.returncode}): its output is above")


def eval_command(cfg: dict[str, Any], model: Path, questions: Path, url: str, out: Path) -> list[str]:
    """`pvpo eval` of `model` on `questions` with the recipe's agent settings (what the run's own
    held-out evaluation used), greedy."""
    r, env = cfg["rollout"], cfg["env"]
    cmd = [sys.executable, "-m", "pvpo.cli", "eval", "--model", str(model), "--dataset", str(questions)]
    # the run's prompt: a named template, else the default prompt under the run's tag protocol
    template = env.get("prompt_template", "default")
    if template == "default" and env["protocol"] != "search_r1":
        template = env["protocol"]
    cmd += ["--retriever-url", url, "--out", str(out), "--overwrite", "--template", template]
    cmd += ["--max-turns", str(r["max_turns"]), "--max-new-tokens", str(r["max_new_tokens"])]
    cmd += ["--max-response-tokens", str(r["max_response_tokens"]), "--topk", str(cfg["retriever"]["topk"])]
    cmd += ["--batch-size", str(r["batch_size"]), "--dtype", str(cfg["model"]["dtype"])]
    if env.get("max_obs_chars"):
        cmd += ["--max-obs-chars", str(env["max_obs_chars"])]
    engine = r.get("engine", "auto")
    if engine in ("auto", "vllm"):
        if importlib.util.find_spec("vllm") is not None:
            cmd += ["--engine", "vllm"]
            kv = (r.get("vllm") or {}).get("kv_cache_memory_bytes")
            cmd += ["--engine-option", f"kv_cache_memory_bytes={kv}"] if kv else []
        else:
            cmd += ["--engine", "hf"]
    else:
        cmd += ["--engine", engine]
    return cmd


def evaluate_once(
    recipe_run: Path, todo: Sequence[tuple[str, Path, Path]], questions: Path
) -> list[dict[str, dict[str, float]]]:
    """`pvpo eval` of each (label, model, output folder) of `todo` on `questions` (`eval_command`)
    against a loopback server of the recipe run's index, once: a folder that holds a finished
    evaluation (its `done` file, naming the model) is read, never evaluated again. Each folder's
    answers by question id (`read_predictions`), which must cover `questions`."""
    from pvpo.retriever.server import BackgroundServer

    cfg = recipe_config(recipe_run)
    pending = [(label, model, folder) for label, model, folder in todo if not (folder / "done").exists()]
    server = BackgroundServer(str(recipe_run / "index")) if pending else contextlib.nullcontext(None)
    with server as srv:
        for k, (label, model, folder) in enumerate(pending, 1):
            assert srv is not None  # started above whenever an evaluation is pending
            cmd = eval_command(cfg, model, questions, srv.url, folder)
            print(f"[eval {k}/{len(pending)}: {label}] {shlex.join(cmd)}", flush=True)
            run_child(cmd, f"pvpo eval of {label} ({model})")
            (folder / "done").write_text(f"{model}\n")
    ids = set(question_ids(questions))
    answers = [read_predictions(folder) for _, _, folder in todo]
    short = [str(folder) for (_, _, folder), got in zip(todo, answers) if not ids <= set(got)]
    if short:
        raise ValueError(f"evaluations that do not cover the {len(ids)} questions of {questions}: {', '.join(short)}")
    return answers


def reproduce(recipe_run: Path, todo: Sequence[tuple[str, Path, Path, str]], out: Path) -> list[str]:
    """`pvpo eval`, run again into OUT/eval/<label>, of each (label, model, its run, stage) of
    `todo` on the questions the runs evaluated (held-out, or validation); one line per policy: its
    EM, the run's own EM at `stage` (`before` RL or `after`), and how many questions' EM differ
    (greedy ties in another batch mix may flip a few)."""
    from pvpo.retriever.server import BackgroundServer

    cfg = recipe_config(recipe_run)
    questions = recipe_run / SPLITS[split_of(cfg)][1]
    lines = []
    with BackgroundServer(str(recipe_run / "index")) as server:
        for k, (label, model, run_dir, stage) in enumerate(todo, 1):
            folder = out / "eval" / label
            cmd = eval_command(cfg, model, questions, server.url, folder)
            print(f"[reproduce {k}/{len(todo)}: {label}] {shlex.join(cmd)}", flush=True)
            run_child(cmd, f"pvpo eval of {label} ({model})")
            got = {q: a["em"] for q, a in read_predictions(folder).items()}
            rec = load_seed(run_dir)
            want = dict(zip(map(str, rec["questions"]), rec["em"][stage]))
            differ = sum(1 for q, v in want.items() if got.get(q) != v)
            lines.append(
                f"- `pvpo eval` of {label} ({model}): EM {mean(list(got.values())):.3f} against the run's "
                f"{mean(list(want.values())):.3f}; {differ} of {len(want)} questions differ"
            )
    return lines
