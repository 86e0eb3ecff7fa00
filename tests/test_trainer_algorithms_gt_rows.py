"""Every registered estimator x Group Sampling on / off x the group shapes GT injection meets:
advantages finite and bounded, a GT row that beats its group's policy rows positive, and one hand
computation per estimator (the zero-spread group of the format floor that sent GRPO's GT row to
900,000 and GDPO's to 1,414,214 when they were scaled by the policy rows' std + 1e-6)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from pvpo.trainer.algorithms.spec import available_estimators, get_estimator

T_TOKENS = 3  # response length of every row for the token-level estimator (PPO)

# name -> (policy rewards, GT rewards): one group each, uid "g"
SHAPES: dict[str, tuple[list[float], list[float]]] = {
    "zero spread (format floor)": ([0.1, 0.1, 0.1, 0.1], [1.0]),
    "N=2": ([0.1], [1.0]),
    "all rows equal": ([1.0, 1.0, 1.0], [1.0]),
    "one GT row, spread": ([0.0, 0.5, 1.0], [1.0]),
    "two GT rows": ([0.1, 0.1], [1.0, 1.0]),
}


def _kwargs(name: str, rewards: torch.Tensor, uids: list[str], rows: torch.Tensor) -> dict[str, Any]:
    """What the trainer would pass `name` beyond rewards and uids: the anchor / prior is the mean of
    the group's policy rows (a reference that solves as the policy does), GDPO's one component the
    reward, PPO's critic values 0 on every token."""
    mean = float(rewards[rows].mean()) if bool(rows.any()) else 0.0
    extra: dict[str, Any] = {"policy_rows": rows, "anchors": {u: mean for u in uids}}
    if name in ("v05", "v05_value"):
        extra["prior"] = {u: mean for u in uids}
    if name == "gdpo":
        extra["components"] = rewards.unsqueeze(1)
    if name == "ppo":
        extra["values"] = torch.zeros(len(uids), T_TOKENS)
        extra["mask"] = torch.ones(len(uids), T_TOKENS)
    return extra


def _advantages(
    name: str, policy: list[float], gt: list[float], group_sampling: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-row advantages [B], policy-row mask) of one group; without Group Sampling the GT rows
    are not injected (the group holds its policy rows only)."""
    values = policy + (gt if group_sampling else [])
    rewards = torch.tensor(values)
    rows = torch.tensor([True] * len(policy) + [False] * (len(values) - len(policy)))
    uids = ["g"] * len(values)
    adv = get_estimator(name)(rewards, uids, **_kwargs(name, rewards, uids, rows))
    if adv.dim() == 2:  # token-level: the first token carries the most discounted GAE term; use the mean
        adv = adv.mean(dim=1)
    return adv, rows


def test_the_table_covers_every_registered_estimator() -> None:
    assert set(available_estimators()) == {"grpo", "dr_grpo", "rloo", "pvpo", "gdpo", "v05", "v05_value", "ppo"}


@pytest.mark.parametrize("group_sampling", [True, False], ids=["GS on", "GS off"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("name", sorted({"grpo", "dr_grpo", "rloo", "pvpo", "gdpo", "v05", "v05_value", "ppo"}))
def test_advantages_are_finite_bounded_and_a_gt_row_that_beats_its_group_is_positive(
    name: str, shape: str, group_sampling: bool
) -> None:
    policy, gt = SHAPES[shape]
    if name == "ppo" and group_sampling:  # refused at config load (spec.NO_GT_ROWS); the estimator too
        with pytest.raises(ValueError, match="ppo takes no GT rows"):
            _advantages(name, policy, gt, group_sampling)
        return
    adv, rows = _advantages(name, policy, gt, group_sampling)
    assert bool(torch.isfinite(adv).all())
    # a group-normalised advantage is at most sqrt(n) in a group of n rows; the others live in the reward range
    assert float(adv.abs().max()) <= math.sqrt(len(adv)) + 1e-4, adv
    if not group_sampling:
        return
    gt_adv = adv[~rows]
    if max(gt) > sum(policy) / len(policy):
        assert bool((gt_adv > 0).all()), f"{name}: GT rows {gt_adv.tolist()} do not beat the group"
    else:  # a GT row equal to every policy row has nothing to teach
        assert bool((gt_adv == 0).all()), gt_adv


def _ppo_hand(rewards: list[float]) -> list[float]:
    """GAE with critic values 0, gamma 1, lambda 1 (the defaults): every token of a row carries its
    reward r; whitened over every token of the batch; each row's token mean."""
    tokens = [[r] * T_TOKENS for r in rewards]
    flat = torch.tensor(tokens).reshape(-1)
    white = (flat - flat.mean()) / (flat.std() + 1e-6)
    return white.reshape(len(rewards), T_TOKENS).mean(dim=1).tolist()


S5 = math.sqrt(5)
# the zero-spread group: four policy rows at the format floor 0.1, one GT row at 1.0
HAND: dict[str, Callable[[], list[float]]] = {
    # the GT row: 0.9 over the std of all five rows (0.9 / sqrt(5)): sqrt(5); the policy rows: 0
    "grpo": lambda: [0.0] * 4 + [S5],
    # GDPO's group step as GRPO's; the batch step: the policy rows' mean 0, the batch's std with the GT
    # row (sqrt(5) / sqrt(5) = 1): the GT row stays sqrt(5)
    "gdpo": lambda: [0.0] * 4 + [S5],
    "dr_grpo": lambda: [0.0] * 4 + [0.9],
    "rloo": lambda: [0.0] * 4 + [0.9],
    "pvpo": lambda: [0.0] * 4 + [0.9],  # anchor 0.1
    "v05": lambda: [0.0] * 4 + [0.9],  # prior = group mean = 0.1: the fused baseline is 0.1
    "v05_value": lambda: [0.0] * 4 + [0.9],
}


@pytest.mark.parametrize("name", sorted(HAND))
def test_the_zero_spread_group_with_a_gt_row_equals_the_hand_computation(name: str) -> None:
    adv, _ = _advantages(name, [0.1] * 4, [1.0], group_sampling=True)
    torch.testing.assert_close(adv, torch.tensor(HAND[name]()), atol=1e-4, rtol=0)


def test_ppo_without_gt_rows_equals_the_hand_computation() -> None:
    adv, _ = _advantages("ppo", [0.1] * 4 + [1.0], [], group_sampling=False)
    torch.testing.assert_close(adv, torch.tensor(_ppo_hand([0.1] * 4 + [1.0])), atol=1e-4, rtol=0)
