"""Rollout-cost accounting, so estimators are compared at equal cost.

Every trajectory the run generates for training is counted by kind: `train` (the step's groups),
`anchor` (the reference rollouts of PVPO's static anchor and Group Sampling) and `gt` (attempts of
the GT source); held-out evaluation is not training cost and is not counted. Per step and
cumulatively: rollouts, policy tokens (tokens the trained policy sampled), tool calls, and PVPO's
cost, "number of rollouts x average number of tool calls per rollout" (arXiv:2508.21104, Fig. 4),
which over any set of rollouts equals the tool calls made; the GT source's tokens are counted as
`gt_tokens`, not as policy tokens.

Two cost measures can be read from a run: the all-in one (`cost/pvpo`, `cost/tool_calls`: train,
anchor and GT together: what the run spent) and the paper's (Fig. 4: policy rollouts x mean tool
calls, no anchor term: `cost/train_tool_calls`). Each kind's tool calls are exported per step
(`cost/<kind>_tool_calls`) and cumulatively (`cost/cum_<kind>_tool_calls`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

KINDS = ("train", "anchor", "gt")
FIELDS = ("rollouts", "policy_tokens", "tool_calls")


class _Rollout(Protocol):
    num_tool_calls: int

    @property
    def num_model_tokens(self) -> int: ...


def _zero() -> dict[str, dict[str, float]]:
    return {k: dict.fromkeys(FIELDS, 0.0) for k in KINDS}


class CostCounter:
    """Counts generated rollouts by kind; `step_metrics()` closes a step and returns its `cost/*`."""

    def __init__(self) -> None:
        self.pending = _zero()
        self.total = _zero()
        self.gt_tokens = 0.0
        self.pending_gt_tokens = 0.0

    def add(self, kind: str, rollouts: Iterable[_Rollout], *, policy_tokens: bool = True) -> None:
        """Count `rollouts` of `kind`; `policy_tokens=False` for tokens another model wrote
        (a GT source), which go to `gt_tokens`."""
        if kind not in KINDS:
            raise ValueError(f"unknown rollout kind {kind!r}; known: {', '.join(KINDS)}")
        row = self.pending[kind]
        for r in rollouts:
            row["rollouts"] += 1
            row["tool_calls"] += r.num_tool_calls
            if policy_tokens:
                row["policy_tokens"] += r.num_model_tokens
            else:
                self.pending_gt_tokens += r.num_model_tokens

    def step_metrics(self, reduce: Callable[[Sequence[float]], list[float]] | None = None) -> dict[str, float]:
        """The cost of everything counted since the last call (anchor and GT generation included),
        plus the cumulative totals; moves the pending counts into the totals. `reduce` sums the
        pending counts over the ranks of a torchrun run first (each rank counts what it generated),
        so every rank's counter holds the run's totals, and a checkpoint's is any rank's."""
        if reduce is not None:
            flat = reduce([self.pending[k][f] for k in KINDS for f in FIELDS] + [self.pending_gt_tokens])
            it = iter(flat)
            self.pending = {k: {f: next(it) for f in FIELDS} for k in KINDS}
            self.pending_gt_tokens = next(it)
        self.gt_tokens += self.pending_gt_tokens
        self.pending_gt_tokens = 0.0
        out: dict[str, float] = {}
        for k in KINDS:
            for f in FIELDS:
                self.total[k][f] += self.pending[k][f]
        spent = {f: sum(self.pending[k][f] for k in KINDS) for f in FIELDS}
        cum = {f: sum(self.total[k][f] for k in KINDS) for f in FIELDS}
        for f in FIELDS:
            out[f"cost/{f}"] = spent[f]
            out[f"cost/cum_{f}"] = cum[f]
        out["cost/pvpo"] = pvpo_cost(spent["rollouts"], spent["tool_calls"])
        out["cost/cum_pvpo"] = pvpo_cost(cum["rollouts"], cum["tool_calls"])
        for k in ("anchor", "gt"):
            out[f"cost/cum_{k}_rollouts"] = self.total[k]["rollouts"]
        for k in KINDS:  # the paper's Fig. 4 cost is cost/train_tool_calls (policy rollouts only)
            out[f"cost/{k}_tool_calls"] = self.pending[k]["tool_calls"]
            out[f"cost/cum_{k}_tool_calls"] = self.total[k]["tool_calls"]
        out["cost/cum_gt_tokens"] = self.gt_tokens
        self.pending = _zero()
        return out

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (plain floats, loadable with `torch.load(weights_only=True)`)."""
        return {
            "pending": {k: dict(v) for k, v in self.pending.items()},
            "total": {k: dict(v) for k, v in self.total.items()},
            "gt_tokens": self.gt_tokens,
            "pending_gt_tokens": self.pending_gt_tokens,
        }

    def count_saved(self, costs: Mapping[str, Mapping[str, float]]) -> None:
        """Count, as not yet logged, what state files recorded they cost (`{kind: cost}`, each cost
        as `add_rollout_cost` keeps it): a resume without a checkpoint reuses them, and their
        rollouts were never logged."""
        for kind, cost in costs.items():
            for f in FIELDS:
                self.pending[kind][f] += float(cost.get(f, 0.0))
            self.pending_gt_tokens += float(cost.get("gt_tokens", 0.0))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending = {k: {f: float(state["pending"][k][f]) for f in FIELDS} for k in KINDS}
        self.total = {k: {f: float(state["total"][k][f]) for f in FIELDS} for k in KINDS}
        self.gt_tokens = float(state.get("gt_tokens", 0.0))
        self.pending_gt_tokens = float(state.get("pending_gt_tokens", 0.0))


def add_rollout_cost(cost: dict[str, float], rollouts: Iterable[_Rollout], *, policy_tokens: bool = True) -> None:
    """Add `rollouts` to `cost`, the cost a state file records of what made it (`rollouts`,
    `tool_calls`, and `policy_tokens`, or `gt_tokens` for another model's tokens): saved with the
    file in the same write, so a run killed before its first checkpoint and resumed counts the
    state it reuses exactly once (`CostCounter.count_saved`)."""
    tokens = "policy_tokens" if policy_tokens else "gt_tokens"
    for r in rollouts:
        cost["rollouts"] = cost.get("rollouts", 0.0) + 1
        cost["tool_calls"] = cost.get("tool_calls", 0.0) + r.num_tool_calls
        cost[tokens] = cost.get(tokens, 0.0) + r.num_model_tokens


def pvpo_cost(rollouts: float, tool_calls: float) -> float:
    """PVPO's rollout cost, rollouts x mean tool calls per rollout: over any set of rollouts, the
    tool calls they made (0 without rollouts)."""
    return float(tool_calls) if rollouts else 0.0
