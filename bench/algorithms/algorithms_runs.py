"""The runs of `bench/algorithms/algorithms.py`: its testbed (one synthetic world, its question splits and one
shared warm start), the one-off reference work every PVPO-style run shares, and one training run.

The testbed, from the demo's world (40 people, 4 relations, 1-2 hops) with 40% of each hop's
questions held out (`TESTBED_OVERRIDES`):
- RL prompts: 339 train questions; warm-start (SFT) questions: 128 other train questions;
- validation: 155 held-out questions, the only ones the learning-rate sweep sees;
- test: the other 156 held-out questions, evaluated only by the final runs and reported.
No question is in two of the four sets (`split_held_out` checks it).

One warm start (`--warm-steps` SFT steps from `--warm-seed`) is shared by every run: all RL runs
start from the same weights, and only the RL seed varies between seeds. The PVPO anchor (M
reference rollouts per RL prompt, arXiv:2508.21104 Sec. 3.2), Group Sampling's partition and the
oracle's GT trajectories (Sec. 3.3) are a function of the reference policy and the prompts alone
(the anchor's sampling seeds carry no `run.seed`), so they are built once from the shared warm start
and copied into every run that uses them: the same numbers each run would compute, computed once.
Their cost is charged to each run that uses them by the report (`algorithms_report.py`).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pvpo.atomic import atomic_write_json
from pvpo.envs.data import QAExample

# the demo config (configs/demo.yaml) with a validation split carved out of a larger held-out share
TESTBED_OVERRIDES = [
    "data.synthetic.test_fraction=0.4",  # 311 held-out questions: 155 validation + 156 test
    "data.max_eval_examples=null",  # every held-out question (shuffled with data.shuffle_seed)
    "data.max_train_examples=339",  # every train question the 128 warm-start questions leave
    "run.threads=1",
    "run.checkpoint_every=0",
    "run.tensorboard=false",
    "run.eval_base=false",
    # one loss aggregation for every arm, the demo's, so that only the advantages differ: Dr.GRPO's own
    # constant-length aggregation is not used here (docs/benchmarks/algorithms.md)
    "optim.loss_agg=token-mean",
]
STAGES = ("sweep", "final")  # sweep: evaluated on validation; final: on test


def algorithm_overrides(name: str) -> list[str]:
    """Config overrides of an algorithm name: an estimator, `+gs` for Group Sampling with GT."""
    estimator, _, flag = name.partition("+")
    if flag not in ("", "gs"):
        raise SystemExit(f"algorithm {name!r}: the only suffix is '+gs' (Group Sampling with GT trajectories)")
    from pvpo.trainer.algorithms.spec import available_estimators

    if estimator not in available_estimators():
        raise SystemExit(f"algorithm {name!r}: unknown estimator; known: {', '.join(available_estimators())}")
    return [f"algorithm.estimator={estimator}", f"algorithm.group_sampling.enabled={'true' if flag else 'false'}"]


@dataclass(frozen=True)
class Settings:
    """What every run of one benchmark shares: the config, the overrides, the schedule."""

    config: Path
    overrides: tuple[str, ...]
    out: Path
    steps: int  # RL steps per run (the same for every algorithm and N, as in the paper's Fig. 4)
    evals: int  # test evaluations per final run (the last at its end); a sweep run evaluates once, at its end
    warm_steps: tuple[int, ...]  # warm-start lengths to try, in order, until one lands in `warm_band`
    warm_seed: int
    warm_band: tuple[float, float] = (0.3, 0.6)  # the validation EM the shared start should have


@dataclass(frozen=True)
class Job:
    """One training run: `stage` sweep (validation) or final (test)."""

    stage: str
    alg: str
    n: int
    lr: float
    seed: int

    @property
    def name(self) -> str:
        return f"{self.alg}_n{self.n}_lr{self.lr:g}_s{self.seed}"

    def run_dir(self, out: Path) -> Path:
        return out / self.stage / self.name


@dataclass
class Testbed:
    """The RL data (`data.train` the RL prompts, `data.warm_start` the SFT questions, `data.eval`
    empty) and the two held-out splits."""

    data: Any  # pvpo.trainer.data.Data
    validation: list[QAExample]
    test: list[QAExample]
    uids: dict[str, list[str]] = field(default_factory=dict)


def schedule_record(settings: Settings) -> dict[str, Any]:
    """What every run of a benchmark shares besides its config: overrides, steps, evaluations and
    the warm start."""
    return {
        "overrides": list(settings.overrides),
        "steps": settings.steps,
        "evals": settings.evals,
        "warm_steps": list(settings.warm_steps),
        "warm_seed": settings.warm_seed,
        "warm_band": list(settings.warm_band),
    }


def check_settings(settings: Settings) -> None:
    """Record in `<out>/bench.json` what every run of `settings.out` depends on (the config and its
    text, the overrides, steps, evaluations, the warm start), and refuse other values there: a kept
    run would otherwise be reused under settings it was not trained with."""
    from pvpo.atomic import atomic_write_json

    record = {
        "config": str(settings.config),
        "config_text": settings.config.read_text(encoding="utf-8") if settings.config.exists() else None,
        **schedule_record(settings),
    }
    path = settings.out / "bench.json"
    if path.exists():
        old = json.loads(path.read_text())
        changed = [k for k in record if k != "config" and old.get(k) != record[k]]  # the text, wherever it lives
        if changed:
            raise SystemExit(
                f"{settings.out} holds a benchmark with other {', '.join(changed)} ({path}); its runs would be reused: "
                "give another --out, or the same settings"
            )
        return
    settings.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, record, indent=1)


def config(settings: Settings, extra: list[str]) -> Any:
    """The resolved TrainConfig: the bench config, the testbed's overrides, the user's, then `extra`."""
    from pvpo.trainer.config.schema import load_config

    return load_config(settings.config, TESTBED_OVERRIDES + list(settings.overrides) + extra)


def job_config(settings: Settings, job: Job, warm_steps: int) -> Any:
    """The config of `job`: its algorithm, N, learning rate and seed, for `settings.steps` steps,
    with `settings.evals` evaluations spread over a final run (one at the end of a sweep run), from
    a warm start of `warm_steps` SFT steps (run only where no initial policy is saved yet)."""
    every = settings.steps // settings.evals if job.stage == "final" and settings.evals > 1 else 0
    return config(
        settings,
        algorithm_overrides(job.alg)
        + [
            f"rollout.n={job.n}",
            f"optim.lr={job.lr!r}",
            f"run.seed={job.seed}",
            f"run.steps={settings.steps}",
            f"run.eval_every={every}",
            f"model.warm_start_steps={warm_steps}",
        ],
    )


def split_held_out(
    held_out: list[QAExample], n_validation: int, *, others: list[list[QAExample]]
) -> tuple[list[QAExample], list[QAExample]]:
    """(validation, test): the first `n_validation` of `held_out` (already shuffled) and the rest;
    refuses an empty side or a question shared with any list of `others` (RL prompts, SFT)."""
    if not 0 < n_validation < len(held_out):
        raise ValueError(f"validation size {n_validation} must leave both splits non-empty ({len(held_out)} held out)")
    val, test = held_out[:n_validation], held_out[n_validation:]
    seen: set[str] = set()
    for part in (val, test, *others):
        uids = {q.uid for q in part}
        if uids & seen:
            raise ValueError(f"the benchmark's question sets overlap: {sorted(uids & seen)[:3]}")
        seen |= uids
    return val, test


def build_testbed(settings: Settings, scratch: Path) -> Testbed:
    """The world's questions split into RL prompts, SFT questions, validation and test (the corpus
    is written under `scratch`)."""
    from pvpo.trainer.data import load_data

    data = load_data(config(settings, []), scratch)
    val, test = split_held_out(data.eval, len(data.eval) // 2, others=[data.train, data.warm_start])
    uids = {
        k: [q.uid for q in v] for k, v in (("rl", data.train), ("sft", data.warm_start), ("val", val), ("test", test))
    }
    return Testbed(replace(data, eval=[]), val, test, uids)


def _em_list(values: list[float]) -> list[float]:
    return [float(v) for v in values]


def warm_try(
    settings: Settings, testbed: Testbed, searcher: Any, steps: int, *, show_progress: bool = True
) -> dict[str, Any]:
    """A warm start of `steps` SFT steps from `settings.warm_seed` in `<out>/warm/steps<steps>`,
    and its validation EM (kept in `try.json` there, so a resumed calibration redoes nothing)."""
    from pvpo.trainer.heldout.scoring import evaluate_policy
    from pvpo.trainer.loop import Trainer
    from pvpo.trainer.setup import prepare_run

    where = settings.out / "warm" / f"steps{steps}"
    done = where / "try.json"
    if done.exists():
        return dict(json.loads(done.read_text()))
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    cfg = job_config(settings, Job("warm", "grpo", 4, 1e-4, settings.warm_seed), steps)
    t0 = time.perf_counter()
    start = prepare_run(cfg, where, testbed.data, searcher, show_progress=show_progress)  # the warm start
    with Trainer(cfg, where, testbed.data, searcher, start, show_progress=show_progress) as t:
        t_warm = time.perf_counter() - t0
        m = evaluate_policy(cfg, t.engine, t.tokenizer, t.where, testbed.validation, searcher, "before")
    losses = t.result.warm_start_losses
    out = {
        "steps": steps,
        "validation_em": m["eval/accuracy"],
        "warm_s": t_warm,
        "final_loss": losses[-1] if losses else None,
    }
    atomic_write_json(done, out)
    return out


def calibrate(
    settings: Settings, testbed: Testbed, searcher: Any, *, show_progress: bool = True
) -> list[dict[str, Any]]:
    """Warm starts of `settings.warm_steps` lengths in order, up to the first whose validation EM
    lies in `settings.warm_band` (the last of the list is the choice); when none does, every length
    is tried and the one closest to the band's centre is moved to the end of the list."""
    lo, hi = settings.warm_band
    tries = []
    for steps in settings.warm_steps:
        tries.append(warm_try(settings, testbed, searcher, steps, show_progress=show_progress))
        if lo <= tries[-1]["validation_em"] <= hi:
            return tries
    best = min(tries, key=lambda t: abs(t["validation_em"] - (lo + hi) / 2))
    print(
        f"warning: no warm start of {list(settings.warm_steps)} steps has validation EM in [{lo}, {hi}]; "
        f"keeping {best['steps']} steps (EM {best['validation_em']:.3f})",
        flush=True,
    )
    return [t for t in tries if t is not best] + [best]


def warm_phase(settings: Settings, testbed: Testbed, searcher: Any, *, show_progress: bool = True) -> dict[str, Any]:
    """The shared warm start (`calibrate`), its held-out EM on validation and test (each run's
    start), and the one-off reference work (anchor, Group Sampling partition, GT trajectories) with
    its cost. Written to `<out>/warm/summary.json` once and reused."""
    from pvpo.trainer.heldout.scoring import evaluate_policy
    from pvpo.trainer.loop import Trainer
    from pvpo.trainer.setup import prepare_run

    done = settings.out / "warm" / "summary.json"
    if done.exists():
        return dict(json.loads(done.read_text()))
    tries = calibrate(settings, testbed, searcher, show_progress=show_progress)
    chosen = tries[-1]
    policy_dir = f"steps{chosen['steps']}"
    where = settings.out / "warm" / policy_dir
    cfg = job_config(settings, Job("warm", "pvpo+gs", 4, 1e-4, settings.warm_seed), chosen["steps"])
    t0 = time.perf_counter()
    start = prepare_run(cfg, where, testbed.data, searcher, show_progress=show_progress)  # reloads the policy
    with Trainer(cfg, where, testbed.data, searcher, start, show_progress=show_progress) as t:
        t.ensure_reference(0)  # anchor, partition, GT trajectories: written into `where`
        cost = t.cost.step_metrics()
        part = t.reference.partition
        fractions = part.fractions() if part is not None else {}
        start: dict[str, Any] = {}
        for split, questions in (("validation", testbed.validation), ("test", testbed.test)):
            em: list[float] = []
            metrics = evaluate_policy(cfg, t.engine, t.tokenizer, t.where, questions, searcher, "before", em)
            start[split] = {"metrics": metrics, "em_q": _em_list(em)}
    lo, hi = settings.warm_band
    summary = {
        "warm_steps": chosen["steps"],
        "warm_seed": settings.warm_seed,
        "warm_band": [lo, hi],
        "in_band": lo <= chosen["validation_em"] <= hi,
        "tries": [{"steps": x["steps"], "validation_em": x["validation_em"]} for x in tries],
        "policy_dir": policy_dir,
        "warm_s": chosen["warm_s"],
        "warm_final_loss": chosen["final_loss"],
        "wall_s": time.perf_counter() - t0 + sum(x["warm_s"] for x in tries),
        "start": start,
        "one_off": {
            kind: {"rollouts": cost[f"cost/cum_{kind}_rollouts"], "tool_calls": cost[f"cost/cum_{kind}_tool_calls"]}
            for kind in ("anchor", "gt")
        },
        "group_sampling": fractions,
        "n_rl": len(testbed.data.train),
        "prompts_per_step": cfg.data.prompts_per_step,
        "anchor_m": cfg.algorithm.anchor.num_rollouts,
        "uids": testbed.uids,
    }
    atomic_write_json(done, summary)
    return summary


def uses_reference(settings: Settings, alg: str) -> tuple[bool, bool]:
    """(uses the anchor, uses Group Sampling with GT) for algorithm `alg`."""
    from pvpo.trainer.algorithms.spec import get_spec
    from pvpo.trainer.setup import uses_anchor

    cfg = config(settings, algorithm_overrides(alg))
    return uses_anchor(cfg, get_spec(cfg.algorithm.estimator)), bool(cfg.algorithm.group_sampling.enabled)


def _shared_start_trainer() -> type:
    from pvpo.trainer.loop import Trainer

    class SharedStartTrainer(Trainer):
        """The trainer, with its `before` evaluation taken from the shared warm start's (the same
        policy, questions and greedy decoding: the same numbers, computed once)."""

        start: dict[str, Any] | None = None

        def evaluate(self, tag: str) -> dict[str, float]:
            if tag == "before" and self.start is not None:
                self.result.eval_em[tag] = list(self.start["em_q"])
                return dict(self.start["metrics"])
            return super().evaluate(tag)

    return SharedStartTrainer


def cost_by_kind(metrics: dict[str, float]) -> dict[str, dict[str, float]]:
    """A run's own cumulative rollouts and tool calls by kind (`train`, `anchor`, `gt`) at a step
    (the one-off anchor and GT work it copied from the shared start are in the warm phase's)."""
    one_off = {k: metrics[f"cost/cum_{k}_rollouts"] for k in ("anchor", "gt")}
    rollouts = {"train": metrics["cost/cum_rollouts"] - sum(one_off.values()), **one_off}
    return {k: {"rollouts": rollouts[k], "tool_calls": metrics[f"cost/cum_{k}_tool_calls"]} for k in rollouts}


def run_one(settings: Settings, testbed: Testbed, warm: dict[str, Any], job: Job, searcher: Any) -> dict[str, Any]:
    """Train `job` from the shared warm start (with the shared anchor, partition and GT when it
    uses them) and evaluate on validation (sweep) or test (final); the summary is saved as
    `result.json` in its run dir, and a finished run is read back, not redone."""
    from pvpo.trainer.setup import prepare_run
    from pvpo.trainer.state.run_dir import RunDir

    run_dir = job.run_dir(settings.out)
    done = run_dir / "result.json"
    if done.exists():
        return dict(json.loads(done.read_text()))
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    src, dst = RunDir(settings.out / "warm" / warm["policy_dir"]), RunDir(run_dir)
    shutil.copytree(src.initial_policy, dst.initial_policy)
    shutil.copy2(src.warm_start, dst.warm_start)
    anchor, gs = uses_reference(settings, job.alg)
    for used, path in ((anchor, "anchor"), (gs, "group_sampling"), (gs, "gt_cache")):
        if used:
            shutil.copy2(getattr(src, path), getattr(dst, path))
    split = "validation" if job.stage == "sweep" else "test"
    questions = testbed.validation if split == "validation" else testbed.test
    cfg = job_config(settings, job, warm["warm_steps"])
    t0 = time.perf_counter()
    trainer_cls = _shared_start_trainer()
    data = replace(testbed.data, eval=questions)
    start = prepare_run(cfg, run_dir, data, searcher, show_progress=False)  # the shared warm start, reloaded
    with trainer_cls(cfg, run_dir, data, searcher, start, show_progress=False) as t:
        t.start = warm["start"][split]
        result = t.run()
    wall = time.perf_counter() - t0
    m = result.metrics
    zero = {k: {"rollouts": 0.0, "tool_calls": 0.0} for k in ("train", "anchor", "gt")}
    curve = [
        {"step": 0, "em_q": warm["start"][split]["em_q"], "train_rollouts": 0.0, "train_tool_calls": 0.0, "cost": zero}
    ]
    for r in m:
        if "eval/accuracy" in r:
            tag = "after" if r is m[-1] else f"step{r['step']}"
            curve.append(
                {
                    "step": r["step"],
                    "em_q": _em_list(result.eval_em[tag]),
                    "train_rollouts": r["cost/cum_rollouts"]
                    - r["cost/cum_anchor_rollouts"]
                    - r["cost/cum_gt_rollouts"],
                    "train_tool_calls": r["cost/cum_train_tool_calls"],
                    "cost": cost_by_kind(r),
                }
            )
    last = m[-1]
    summary = {
        "stage": job.stage,
        "alg": job.alg,
        "n": job.n,
        "lr": job.lr,
        "seed": job.seed,
        "split": split,
        "uses_anchor": anchor,
        "group_sampling": gs,
        "steps": len(m),
        "wall_s": wall,
        "em": result.eval_after["eval/accuracy"],
        "format_ok": result.eval_after["eval/format_ok"],
        "searches_per_traj": result.eval_after["eval/searches_per_traj"],
        "policy_tokens": last["cost/cum_policy_tokens"],
        "adv_var": sum(r["adv/std"] ** 2 for r in m) / len(m),
        "curve": curve,
    }
    atomic_write_json(done, summary)
    return summary


# ---- worker processes (`--jobs` > 1): each runs one job at a time with one torch thread --------

_WORKER: dict[str, Any] = {}


def init_worker(settings: Settings, testbed: Testbed, warm: dict[str, Any], url: str) -> None:
    """A worker's state: the testbed and warm phase from the parent, and a client of its retriever."""
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from pvpo.retriever.client import RetrieverClient

    torch.set_num_threads(1)
    topk = int(config(settings, []).retriever.topk)
    _WORKER.update(settings=settings, testbed=testbed, warm=warm, searcher=RetrieverClient(url, topk=topk))


def work(job: Job) -> dict[str, Any]:
    """`run_one` of `job` in a worker set up by `init_worker`."""
    return run_one(_WORKER["settings"], _WORKER["testbed"], _WORKER["warm"], job, _WORKER["searcher"])
