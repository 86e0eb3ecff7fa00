"""`pvpo demo`: the embedded end-to-end run, and its report (curve PNG + summary table).

Builds the synthetic world, indexes it with the packaged MiniLM encoder, serves it on loopback,
warm-starts a tiny Qwen2 policy on oracle trajectories of questions the RL run never sees, measures
held-out accuracy, trains with PVPO, measures again, and writes `metrics.jsonl`, `curves.png` and
`summary.md` in the run dir.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pvpo.atomic import atomic_write_json
from pvpo.locks import folder_lock
from pvpo.owned import entries, recorded, replaceable
from pvpo.recipes.heldout_table import per_dataset_table
from pvpo.stats import paired_difference
from pvpo.trainer.config.preflight import preflight
from pvpo.trainer.config.schema import TrainConfig
from pvpo.trainer.data import load_data, retriever_session
from pvpo.trainer.loop import Trainer, TrainResult
from pvpo.trainer.setup import prepare_run
from pvpo.trainer.state.resume import RunDirError, fresh_run_dir, run_inputs
from pvpo.trainer.state.run_dir import RUN_KIND, RunDir, foreign_entries

logger = logging.getLogger(__name__)


def _cost_axis(ax: Any, steps: Sequence[float], cost: Sequence[float]) -> None:
    """A second x-axis on top of `ax`: the cumulative rollout cost at each step."""
    import numpy as np

    if len(steps) < 2:
        return
    # from step 1 on: the anchor's rollouts all land on step 1, so a (0, 0) point would crowd the ticks
    xs, cs = np.asarray(steps, dtype=float), np.asarray(cost, dtype=float)
    top = ax.secondary_xaxis("top", functions=(lambda x: np.interp(x, xs, cs), lambda c: np.interp(c, cs, xs)))
    top.set_xticks(cost_ticks(cs.tolist()))
    top.set_xlabel("cumulative rollouts (anchor and GT generation included)", fontsize=8)
    top.tick_params(labelsize=7)


def cost_ticks(cost: Sequence[float], bins: int = 6) -> list[float]:
    """Round tick values for the cumulative-cost axis, inside the costs the run reached: the axis
    maps a cost outside them onto the first or last step (`np.interp` clamps), where matplotlib's
    own ticks drew two labels on top of each other ("75" and "100" at step 1 of the recipe)."""
    from matplotlib.ticker import MaxNLocator

    lo, hi = float(min(cost)), float(max(cost))
    if hi <= lo:
        return [lo]
    return [float(t) for t in MaxNLocator(nbins=bins).tick_values(lo, hi) if lo <= t <= hi]


def plot_curves(
    metrics: Sequence[dict[str, Any]],
    path: str | Path,
    *,
    eval_before: dict[str, float] | None = None,
    eval_after: dict[str, float] | None = None,
    validation: Sequence[dict[str, float]] = (),
    smooth: int = 5,
) -> Path:
    """Train reward per step (raw and a `smooth`-step moving average), the PVPO anchor on the same
    prompts and their difference, held-out EM (with s.e.) at every evaluation and, when the run
    watched a validation split, its EM by step (`validation`: best.json's points), against RL steps
    (bottom axis) and cumulative rollout cost (top axis), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    steps = [m["step"] for m in metrics]
    cost = [m.get("cost/cum_rollouts", 0.0) for m in metrics]
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.4))
    reward = np.array([m["reward/mean"] for m in metrics], dtype=float)
    ax[0].plot(steps, reward, color="C0", alpha=0.3, lw=1, label="train reward (per step)")
    if len(reward) >= smooth:
        ma = np.convolve(reward, np.ones(smooth) / smooth, mode="valid")
        ax[0].plot(steps[smooth - 1 :], ma, color="C0", lw=2.2, label=f"train reward ({smooth}-step mean)")
    lo = -0.02
    if metrics and "anchor/mean" in metrics[0]:
        anchor = np.array([m["anchor/mean"] for m in metrics], dtype=float)
        ax[0].plot(steps, anchor, color="C1", ls="--", lw=1.2, label="PVPO anchor (reference policy, same prompts)")
        if len(reward) >= smooth:
            gain = np.convolve(reward - anchor, np.ones(smooth) / smooth, mode="valid")
            ax[0].plot(steps[smooth - 1 :], gain, color="C4", lw=2, label=f"reward - anchor ({smooth}-step mean)")
            ax[0].axhline(0, color="0.6", lw=0.8)
            lo = min(lo, float(gain.min()) - 0.05)
    ax[0].set_xlabel("RL step")
    ax[0].set_title("RL training prompts (unseen in warm start)", fontsize=10)
    ax[0].set_ylim(lo, 1.02)
    ax[0].legend(loc="upper left", fontsize=7.5, framealpha=0.8)
    _cost_axis(ax[0], steps, cost)
    pts = [(0, eval_before or {})] + [(m["step"], m) for m in metrics if "eval/accuracy" in m and m is not metrics[-1]]
    if metrics:
        pts.append((steps[-1], eval_after or {}))
    pts = [(s_, e) for s_, e in pts if "eval/accuracy" in e]
    if pts:
        xs = [s_ for s_, _ in pts]
        em = np.array([e["eval/accuracy"] for _, e in pts])
        se = np.array([e.get("eval/accuracy_se", 0.0) for _, e in pts])
        ax[1].errorbar(xs, em, yerr=se, marker="s", capsize=3, color="C2", lw=2, label="held-out EM (+- s.e.)")
        for h, mk in ((1, "v"), (2, "^"), (3, "<"), (4, ">")):
            key = f"eval/accuracy_{h}hop"
            if all(key in e for _, e in pts):
                ax[1].plot(
                    xs, [e[key] for _, e in pts], marker=mk, ls=":", color=f"C{4 + h}", label=f"held-out EM, {h}-hop"
                )
        ax[1].plot(
            xs, [e["eval/format_ok"] for _, e in pts], marker=".", ls=":", color="C7", label="held-out format ok"
        )
    if validation:
        vs = sorted(validation, key=lambda p: p["step"])
        ax[1].errorbar(
            [p["step"] for p in vs],
            [p["accuracy"] for p in vs],
            yerr=[p.get("accuracy_se", 0.0) for p in vs],
            marker="o",
            capsize=3,
            color="C3",
            lw=1.5,
            ls="--",
            label=f"validation EM (n={int(vs[0].get('n', 0))}, +- s.e.)",
        )
    ax[1].set_xlabel("RL step")
    ax[1].set_title(f"held-out test questions (n={int((eval_before or {}).get('eval/n', 0))}, greedy)", fontsize=10)
    ax[1].set_ylim(-0.02, 1.19)
    ax[1].legend(loc="upper center", ncol=3, fontsize=7.5, framealpha=0.8)
    _cost_axis(ax[1], steps, cost)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def learning_check(
    before: dict[str, float],
    after: dict[str, float],
    *,
    em_before: Sequence[float] = (),
    em_after: Sequence[float] = (),
    min_gain: float = 0.15,
    min_se: float = 3.0,
    split: str = "held-out",
) -> tuple[bool, str]:
    """Whether EM on the `split` questions (held-out, or validation) rose by at least `min_gain`
    and by `min_se` standard errors of the gain, with the sentence that says so. Given each
    question's EM before and after (the same questions), the s.e. is the paired one,
    sd(after_i - before_i) / sqrt(n); otherwise sqrt(se_b^2 + se_a^2)."""
    b, a = before.get("eval/accuracy"), after.get("eval/accuracy")
    if b is None or a is None:
        return False, "no held-out evaluation"
    n = len(em_before)
    if n > 1 and len(em_after) == n:
        se, kind = paired_difference(em_before, em_after)[1], "paired"
    else:
        se, kind = (
            math.sqrt(before.get("eval/accuracy_se", 0.0) ** 2 + after.get("eval/accuracy_se", 0.0) ** 2),
            "unpaired",
        )
    z = (a - b) / se if se > 0 else (float("inf") if a > b else 0.0)
    ok = a - b >= min_gain and z >= min_se
    return ok, (
        f"{split} EM {b:.3f} -> {a:.3f}: {a - b:+.3f}, {z:.1f} {kind} s.e. of the gain "
        f"({'meets' if ok else 'misses'} the demo's bar of {min_gain:+.2f} and {min_se:.0f} s.e.)"
    )


def paired_gain(
    em_from: Sequence[float], em_to: Sequence[float], *, what: str, min_se: float, split: str = "held-out"
) -> tuple[bool, str]:
    """Whether EM on the same questions (of `split`) rose by at least `min_se` paired standard
    errors (sd(to_i - from_i) / sqrt(n)), with the sentence that says so."""
    if not em_from or len(em_from) != len(em_to):
        return False, f"{what}: no paired evaluation"
    gain, se = paired_difference(em_from, em_to)
    a, b = sum(em_from) / len(em_from), sum(em_to) / len(em_to)
    z = gain / se if se > 0 else (float("inf") if gain > 0 else 0.0)
    ok = z >= min_se
    return ok, (
        f"{what}: {split} EM {a:.3f} -> {b:.3f}, {gain:+.3f} (paired s.e. {se:.3f}, {z:.1f} s.e.; "
        f"{'meets' if ok else 'misses'} the bar of {min_se:.0f} s.e.)"
    )


def validation_row(curve: dict[str, Any]) -> str:
    """`0: 0.153, 8: 0.180, 16: 0.173; best step 8 (checkpoints/step_000008)` from best.json's record."""
    points = ", ".join(
        f"{int(p['step'])}: {p['accuracy']:.3f}" for p in sorted(curve["points"], key=lambda p: p["step"])
    )
    best = curve.get("best")
    if not best:
        return points
    kept = f"checkpoints/{best['checkpoint']}" if best.get("checkpoint") else "the policy RL started from"
    return f"{points}; best step {best['step']} ({kept})"


def _mean(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def summary_table(
    cfg: TrainConfig,
    result: TrainResult,
    timings: dict[str, float],
    *,
    n_sft: int,
    n_rl: int,
    load: str = "",
    uids: Sequence[str] = (),
) -> str:
    """A markdown table of what the demo measured: held-out before/after, training, timings; with
    the held-out questions' `uids`, the per-dataset table (`heldout_table`) after it."""
    b, a, m = result.eval_before, result.eval_after, result.metrics

    def f(v: float | None, fmt: str = ".3f") -> str:
        return format(v, fmt) if v is not None else "n/a"

    def ba(key: str, fmt: str = ".3f") -> tuple[str, str, str]:
        x, y = b.get(key), a.get(key)
        delta = f"{y - x:+{fmt}}" if x is not None and y is not None else "n/a"
        return f(x, fmt), f(y, fmt), delta

    k = min(5, len(m))
    # a run choosing its settings evaluates the validation split; its held-out split stays unseen
    split = "Validation" if cfg.data.evaluate_on == "validation" else "Held-out"
    split_name = split.lower()  # the verdict lines name the split they measured
    n_held = int(b.get("eval/n") or a.get("eval/n") or 0)  # a resumed run from before eval_before.json has no b
    ws = result.warm_start_losses
    held = [
        ("EM", "eval/accuracy"),
        ("F1", "eval/f1"),
        ("reward", "eval/reward"),
        ("format ok", "eval/format_ok"),
        ("searches per answer", "eval/searches_per_traj"),
    ]
    held += [(f"EM, {h}-hop", f"eval/accuracy_{h}hop") for h in range(1, 5) if f"eval/accuracy_{h}hop" in b]
    if result.eval_base:  # three points: the base model, after the warm start, after RL
        base = result.eval_base

        def three(key: str) -> str:
            x, y, z = base.get(key), b.get(key), a.get(key)
            delta = f"{z - y:+.3f}" if y is not None and z is not None else "n/a"
            return f"{f(x)} | {f(y)} | {f(z)} | {delta}"

        em = result.eval_em
        lines = [
            f"{split}: {n_held} questions, greedy, in neither the warm start nor RL "
            f"(s.e. of EM base / warm start / RL: {f(base.get('eval/accuracy_se'))} / "
            f"{f(b.get('eval/accuracy_se'))} / {f(a.get('eval/accuracy_se'))}).",
            "",
            "- "
            + paired_gain(
                em.get("base", []), em.get("after", []), what="base model -> after RL", min_se=3, split=split_name
            )[1],
            "- "
            + paired_gain(
                em.get("before", []), em.get("after", []), what="RL over the warm start", min_se=2, split=split_name
            )[1],
            "",
            f"| {split.lower()} | base model | after warm start | after RL | RL - warm start |",
            "|---|---|---|---|---|",
        ]
        lines += [f"| {name} | {three(key)} |" for name, key in held]
    else:
        lines = [
            f"{split}: {n_held} test questions, greedy, never trained on "
            f"(s.e. of EM before / after: {f(b.get('eval/accuracy_se'))} / {f(a.get('eval/accuracy_se'))}).",
            "",
            learning_check(
                b,
                a,
                em_before=result.eval_em.get("before", ()),
                em_after=result.eval_em.get("after", ()),
                split=split_name,
            )[1]
            + ".",
            "",
            f"| {split.lower()} | before RL | after RL | change |",
            "|---|---|---|---|",
        ]
        lines += [f"| {name} | {' | '.join(ba(key))} |" for name, key in held]
    rows = [
        (
            "warm start",
            f"{len(ws)} SFT steps on {n_sft} {'oracle' if cfg.data.source == 'synthetic' else 'dataset GT'} trajectories ("
            + ("disjoint from RL and test" if cfg.data.warm_start_examples else "the RL prompts'")
            + "), loss "
            + (f"{ws[0]:.3f} -> {ws[-1]:.3f}" if ws else "n/a")
            if cfg.model.warm_start_steps
            else f"none: RL starts from {cfg.model.path or 'the tiny policy'} as given",
        ),
        (
            "RL",
            f"{cfg.algorithm.estimator}{' + Group Sampling with GT trajectories' if cfg.algorithm.group_sampling.enabled else ''}, "
            f"{len(m)} steps x {cfg.data.prompts_per_step} prompts x {cfg.rollout.n} rollouts, {n_rl} distinct train prompts",
        ),
        (
            f"train reward, first -> last {k} steps",
            f"{f(_mean(m[:k], 'reward/mean'))} -> {f(_mean(m[-k:], 'reward/mean'))}",
        ),
        (
            f"train reward - PVPO anchor, first -> last {k} steps",
            f"{f(_mean([{'g': r['reward/mean'] - r['anchor/mean']} for r in m[:k] if 'anchor/mean' in r], 'g'), '+.3f')} -> "
            f"{f(_mean([{'g': r['reward/mean'] - r['anchor/mean']} for r in m[-k:] if 'anchor/mean' in r], 'g'), '+.3f')}",
        ),
        (f"train EM, first -> last {k} steps", f"{f(_mean(m[:k], 'accuracy'))} -> {f(_mean(m[-k:], 'accuracy'))}"),
        (
            "rollout cost: rollouts / policy tokens / tool calls (anchor and GT included)",
            " / ".join(f"{m[-1].get(f'cost/cum_{x}', 0):.0f}" for x in ("rollouts", "policy_tokens", "tool_calls"))
            if m
            else "n/a",
        ),
        (
            "wall time (s): total / index+serve / warm start / RL+eval"
            + (f", this process only (resumed at step {result.resumed_from})" if result.resumed_from else ""),
            " / ".join(f"{timings.get(x, 0):.0f}" for x in ("total", "setup", "warm_start", "train")),
        ),
    ]
    gs = m[0] if m and "gs/gt_frac" in m[0] else None
    if gs is not None:
        rows.insert(
            2,
            (
                "Group Sampling (reference accuracy over the anchor's rollouts)",
                f"dropped {gs['gs/dropped_frac']:.1%} / kept {gs['gs/kept_frac']:.1%} / given a GT trajectory "
                f"{gs['gs/gt_frac']:.1%} of {n_rl} prompts ({gs.get('gt/generated', 0):.0f} GT trajectories, "
                f"{gs.get('gt/failed', 0):.0f} failed)",
            ),
        )
    if result.validation.get("points"):
        rows.append(("validation EM by RL step (run.eval_every)", validation_row(result.validation)))
    peak = m[-1].get("mem/process_peak_rss_gib") if m else None
    if peak is not None:  # /usr/bin/time reports only the last phase's peak (trainer/model/memory.py)
        rows.append(("peak resident memory of the process, up to the last step (GiB)", f"{peak:.1f}"))
    if load:
        rows.append(("load average at start / end", load))
    lines += ["", "| run | value |", "|---|---|"] + [f"| {k_} | {v} |" for k_, v in rows]
    per_dataset = per_dataset_table(uids, result.eval_scores) if uids else ""
    if per_dataset:
        lines += ["", f"{split} per dataset:", "", per_dataset]
    return "\n".join(lines)


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _replace_demo(
    run_dir: Path, *, fresh: bool, overwrite: bool, cfg: TrainConfig
) -> contextlib.AbstractContextManager[object]:
    """A fresh demo replaces an earlier run in `run_dir` (kept until the new run's first
    checkpoint); a folder holding anything a run does not write is refused unless `overwrite`,
    and those files are kept either way (`pvpo.owned`)."""
    if not fresh:
        return contextlib.nullcontext()
    if not _holds_demo_or_nothing(run_dir):
        raise RunDirError(
            f"--run-dir {run_dir} holds a training run ({recorded(run_dir, 'command') or 'pvpo train'}), which a demo "
            f"never replaces: give the demo another --run-dir (its default is runs/demo), or continue the run with "
            f"`pvpo train --run-dir {run_dir} --resume`"
        )
    foreign = foreign_entries(run_dir)
    if foreign and not overwrite:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise RunDirError(
            f"--run-dir {run_dir} holds files a demo run does not write ({shown}): give a new or empty folder, "
            "or --overwrite to run beside them (they are kept; an earlier run there is kept until the new run's "
            "first checkpoint)"
        )
    latest = RunDir(run_dir).checkpoints / "latest"
    if latest.is_file():  # a crashed or stopped demo re-run without --resume would start over unannounced
        logger.warning(
            "replacing the demo run in %s (its last checkpoint, %s, is kept until this run's first one); "
            "pvpo demo --resume continues it instead",
            run_dir,
            latest.read_text(encoding="utf-8", errors="replace").strip(),
        )
    return fresh_run_dir(run_dir, overwrite=True, inputs=run_inputs(cfg), command="pvpo demo")


def _holds_demo_or_nothing(run_dir: Path) -> bool:
    """Whether `run_dir` holds no run, or a run of `pvpo demo`'s: its manifest says so, or (a
    manifest from before it named the command) it holds the summary only a demo writes."""
    if not replaceable(entries(run_dir, RUN_KIND)[0]):
        return True
    command = recorded(run_dir, "command")
    return command == "pvpo demo" or (command is None and RunDir(run_dir).summary.exists())


def run_demo(
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    fresh: bool = True,
    overwrite: bool = False,
    show_progress: bool = True,
    preflighted: bool = False,
) -> str:
    """Run the demo into `run_dir`; returns the summary table (also written to summary.md).
    `fresh` replaces an earlier demo run there; a folder holding a user's files needs `overwrite`.
    `preflighted`: the caller (`pvpo demo`) ran `config.preflight` already, before its lock."""
    run_dir = Path(run_dir)
    if not preflighted:
        preflight(cfg, resume=not fresh)  # before the run dir is touched or a model built
    with folder_lock(run_dir, "pvpo demo"), _replace_demo(run_dir, fresh=fresh, overwrite=overwrite, cfg=cfg):
        return _run_demo(cfg, run_dir, fresh=fresh, show_progress=show_progress)


def _run_demo(cfg: TrainConfig, run_dir: Path, *, fresh: bool, show_progress: bool) -> str:
    run_dir.mkdir(parents=True, exist_ok=True)
    load_start, t0 = _load(), time.perf_counter()
    timings: dict[str, float] = {}
    data = load_data(cfg, run_dir)
    with retriever_session(cfg, run_dir, data.corpus_path) as searcher:
        timings["setup"] = time.perf_counter() - t0
        # the recipe's stages before the Trainer: the policy at step 0, on a fresh run evaluated
        # (run.eval_base) and warm-started on oracle trajectories, then saved as initial_policy
        start = prepare_run(cfg, run_dir, data, searcher, resume=not fresh, show_progress=show_progress)
        timings["warm_start"] = start.warm_start_seconds
        with Trainer(cfg, run_dir, data, searcher, start, show_progress=show_progress) as trainer:
            result = trainer.run()
    timings["total"] = time.perf_counter() - t0
    timings["train"] = timings["total"] - timings["setup"] - timings["warm_start"]
    files = RunDir(run_dir)
    plot_curves(
        result.metrics,
        files.curves,
        eval_before=result.eval_before,
        eval_after=result.eval_after,
        validation=result.validation.get("points", ()),
    )
    n_sft = len(data.warm_start) if cfg.model.warm_start_steps else 0
    if n_sft and files.warm_start.exists():  # the questions that had a GT trajectory (dataset GT drops some)
        n_sft = len(json.loads(files.warm_start.read_text()).get("questions", [])) or n_sft
    table = summary_table(
        cfg,
        result,
        timings,
        n_sft=n_sft,
        n_rl=len(data.train),
        load=f"{load_start} / {_load()}",
        uids=[q.uid for q in data.eval],
    )
    files.summary.write_text(table + "\n")
    if result.eval_em:
        atomic_write_json(
            files.held_out_em,
            {"questions": [q.uid for q in data.eval], "em": result.eval_em, "scores": result.eval_scores},
        )
    return f"{table}\n\nwrote {files.metrics}, {files.curves}, {files.summary}"
