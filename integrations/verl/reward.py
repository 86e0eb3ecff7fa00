"""Our rewards as verl's `custom_reward_function`, with PVPO's static anchor subtracted.

verl calls `compute_score(data_source=, solution_str=, ground_truth=, extra_info=)` on each
decoded response (`reward.custom_reward_function.path: pkg://pvpo.integrations.verl.reward`,
`name: compute_score`) and merges `reward_kwargs` from the config into the call. A dict result's
`score` becomes the trajectory's reward and its other keys are logged beside it.

Why the anchor is subtracted here and not in the estimator: verl hands an advantage estimator
only the token rewards, the response mask and `index`, a uuid its trainer draws per prompt per
step (verl 0.9.1 `trainer/ppo/v1/trainer_base.py`, `compute_advantage` in `ray_trainer.py`), so an
estimator cannot tell which prompt a group is; the reward side sees the row (`extra_info.uid`).
With `anchors` set, `score = r - anchor[uid]` and the `pvpo` estimator
(`pvpo.integrations.verl.estimator`) uses the score as the advantage, with no group mean or std:
together they give PVPO's `r - anchor[uid]` (arXiv:2508.21104 Eq. 5). The raw reward is kept as
`pvpo_reward`, the anchor as `pvpo_anchor`.

Pure: imports nothing of verl.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from pvpo.integrations.reference import anchor_for, load_anchors, uid_of
from pvpo.reward import answer_metrics, as_golds, get_protocol, get_reward


def golds_of(ground_truth: Any) -> list[str]:
    """The accepted answers of a verl row's `reward_model.ground_truth`: a string, a list, or
    Search-R1's `{"target": [...]}`."""
    if isinstance(ground_truth, Mapping):
        ground_truth = ground_truth.get("target", ground_truth.get("golden_answers", ()))
    if hasattr(ground_truth, "tolist"):  # a numpy array, as parquet rows hold lists
        ground_truth = ground_truth.tolist()
    return as_golds(ground_truth)


@lru_cache(maxsize=8)
def _anchors_at(path: str) -> dict[str, float]:
    """An anchor file read once per process (the static anchor does not change during a run)."""
    return load_anchors(path)


def anchors_from(source: str | Path | Mapping[str, float] | None) -> dict[str, float] | None:
    """uid -> anchor from a file path (cached) or a mapping; None for no anchor."""
    if source is None or source == "":
        return None
    if isinstance(source, Mapping):
        return {str(k): float(v) for k, v in source.items()}
    return _anchors_at(str(Path(source).resolve()))


def compute_score(
    data_source: str | None = None,
    solution_str: str = "",
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    *,
    reward: str = "pvpo",
    protocol: str = "search_r1",
    reward_params: Mapping[str, Any] | None = None,
    anchors: str | Path | Mapping[str, float] | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """verl's reward: `reward` (a `pvpo.reward` name: pvpo, em, search_r1_format, research_f1)
    of `solution_str` read with the tag `protocol`, against the row's golds; minus the row's
    anchor (`extra_info["uid"]` looked up in `anchors`, an anchor file or mapping) when given.
    Returns `score` and, for verl's logs, `pvpo_reward`, `em`, `f1`, `format_ok` (and
    `pvpo_anchor`). Other keyword arguments verl passes are accepted and ignored."""
    golds = golds_of(ground_truth)
    result = get_reward(reward, **dict(reward_params or {}))(solution_str, golds, get_protocol(protocol))
    metrics = answer_metrics(result.prediction, golds)
    out = {
        "score": result.total,
        "pvpo_reward": result.total,
        "em": metrics["em"],
        "f1": metrics["f1"],
        "format_ok": float(result.format_ok),
    }
    table = anchors_from(anchors)
    if table is not None:
        anchor = anchor_for(uid_of(extra_info or {}), table)
        out["score"] = result.total - anchor
        out["pvpo_anchor"] = anchor
    return out
