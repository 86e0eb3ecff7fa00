"""The episodes a training step sampled, for `pvpo view`: `episodes.jsonl` in the run dir, one JSON
line per step.

A step's line holds every row of the step (group uid, reward, advantage, whether it is an injected
GT row, EM), so a group's advantages can be read beside its rewards, and `run.keep_episodes` whole
episodes: the question, golden answers, the response as the policy wrote it and the env answered
(observations inside the protocol's result tags), prediction, reward and its components, EM / F1 /
cover-EM, format, ending reason, the passages each search returned, and for a GT row its pi_gt
(the log-probability of its model tokens under the policy that wrote it, `trajectory.SOURCES`).

Episodes are kept by whole groups (a group's advantages mean something only together), drawn in an
order seeded by `(run.seed, step)`, until `run.keep_episodes` are kept; the group that reaches the
number is kept whole. Under torchrun rank 0 writes its own share of the step's groups.

The writer only appends (fsynced, one line a step). A run resumed from an earlier checkpoint writes
its redone steps again; `read_episode_log` keeps the line written last for each step and drops the
lines of steps a resumed run has not redone yet, as `metrics.jsonl` is cut back on resume.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pvpo.atomic import append_jsonl, read_jsonl
from pvpo.reward import answer_metrics

if TYPE_CHECKING:
    import torch

    from pvpo.envs.data import QAExample
    from pvpo.trainer.config.schema import RunConfig
    from pvpo.trainer.rollout.trajectory import Trajectory


def row_advantages(adv: torch.Tensor, loss_mask: torch.Tensor) -> list[float]:
    """One advantage per row: the row's own for outcome-level estimators (`[B]`), the mean over its
    model tokens for token-level ones (`[B, T]`, PPO's GAE)."""
    if adv.dim() == 1:
        return [float(a) for a in adv.detach().double().tolist()]
    mask = loss_mask.to(adv.device).double()
    total = (adv.detach().double() * mask).sum(dim=1)
    return [float(s) / max(1.0, float(n)) for s, n in zip(total.tolist(), mask.sum(dim=1).tolist(), strict=True)]


def kept_rows(uids: Sequence[str], keep: int, seed: int, step: int) -> list[int]:
    """The rows whose episodes are kept: whole groups (rows sharing a uid, in row order) drawn in an
    order seeded by `(seed, step)` until at least `keep` rows are kept; none when `keep` is 0."""
    if keep <= 0:
        return []
    groups: dict[str, list[int]] = {}
    for i, uid in enumerate(uids):
        groups.setdefault(uid, []).append(i)
    order = list(groups)
    random.Random(zlib.crc32(f"{seed}/episodes/{step}".encode())).shuffle(order)
    rows: list[int] = []
    for uid in order:
        if len(rows) >= keep:
            break
        rows += groups[uid]
    return rows


def _pi_gt(t: Trajectory) -> dict[str, Any]:
    """A GT row's pi_gt: the summed and mean log-probability of its model tokens, and their source."""
    logprobs = t.gt_logprobs if t.gt_logprobs is not None else t.old_logprobs
    model = [lp for lp, m in zip(logprobs, t.loss_mask, strict=True) if m]
    return {
        "logprob": float(sum(model)),
        "logprob_per_token": float(sum(model) / len(model)) if model else 0.0,
        "tokens": len(model),
        "source": t.logprobs_source,
    }


def episode_record(t: Trajectory, example: QAExample | None, advantage: float, tokenizer: Any) -> dict[str, Any]:
    """One kept episode as `episodes.jsonl` holds it (see the module docstring). An injected GT row
    carries no text of its own: its response is decoded from its token ids."""
    golds = list(example.golden_answers) if example is not None else list(t.info.get("golden_answers", []))
    text = t.response_text or tokenizer.decode(t.response_ids, skip_special_tokens=False)
    scores = answer_metrics(t.prediction, golds)
    record: dict[str, Any] = {
        "uid": t.uid,
        "question": example.question if example is not None else str(t.info.get("question", "")),
        "golden_answers": golds,
        "response": text,
        "prediction": t.prediction,
        "reward": float(t.reward),
        "reward_components": {k: float(v) for k, v in t.reward_components.items()},
        "em": scores["em"],
        "f1": scores["f1"],
        "cem": scores["cem"],
        # an injected GT row has no env verdict of its own: its reward's format component is one
        "format_ok": bool(t.format_ok or t.reward_components.get("format", 0.0) >= 1.0),
        "stop_reason": t.finish_reason,
        "num_searches": int(t.num_tool_calls),
        "num_turns": int(t.num_turns),
        "model_tokens": int(t.num_model_tokens),
        "passages": [list(found) for found in t.info.get("passages", [])],
        "is_gt": bool(t.is_gt),
        "advantage": advantage,
    }
    if t.is_gt:
        record["pi_gt"] = _pi_gt(t)
    return record


def log_step_episodes(
    path: Path,
    step: int,
    trajs: Sequence[Trajectory],
    adv: torch.Tensor,
    loss_mask: torch.Tensor,
    examples: Sequence[QAExample],
    tokenizer: Any,
    run: RunConfig,
) -> None:
    """Append step `step`'s line to `path` (rank 0 only; nothing when `run.keep_episodes` is 0): every
    row of `trajs` with its advantage (`adv`, per row or per token under `loss_mask`) and the kept
    episodes, whose questions come from `examples` (the step's prompts) by uid."""
    from pvpo.trainer.parallel.distributed import is_main

    if run.keep_episodes <= 0 or not is_main():
        return
    advantages = row_advantages(adv, loss_mask)
    by_uid = {ex.uid: ex for ex in examples}
    rows = [
        {"uid": t.uid, "reward": float(t.reward), "advantage": a, "is_gt": bool(t.is_gt), "em": float(t.accuracy)}
        for t, a in zip(trajs, advantages, strict=True)
    ]
    kept = kept_rows([t.uid for t in trajs], run.keep_episodes, run.seed, step)
    episodes = [episode_record(trajs[i], by_uid.get(trajs[i].uid), advantages[i], tokenizer) for i in kept]
    append_jsonl(path, [{"step": step, "rows": rows, "episodes": episodes}])


def read_episode_log(path: str | Path) -> list[dict[str, Any]]:
    """The step lines of an `episodes.jsonl`, by step: for each step the line written last, without
    the lines of steps after a step written again (a resumed run's; see the module docstring)."""
    steps: dict[int, dict[str, Any]] = {}
    for record in read_jsonl(path):
        step = int(record.get("step", 0))
        if steps and max(steps) >= step:
            steps = {s: r for s, r in steps.items() if s < step}
        steps[step] = record
    return [steps[s] for s in sorted(steps)]
