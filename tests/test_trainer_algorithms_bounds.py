"""Every estimator on every batch shape Group Sampling meets (groups 1, 2, 8, 32, 64; n 2-5; 0-2 GT
rows; world size 1 and 2, simulated by two threads whose `all_sum` adds both ranks' tensors, so
the batch is every rank's): a GT row's |advantage| at most sqrt(n) under the group-normalised
estimators (GRPO, GDPO's batch step included); a group whose rows share one float32 reward (2/3)
exactly 0; no |advantage| above 10, except the two named in docs/deviations.md with their bounds
(GDPO's batch step on the policy rows, (B_p - 1) / sqrt(B_p); PPO's token whitening, sqrt(B - 1)
at V = 0). PPO takes no GT rows (refused at config load): its batches hold the policy rows."""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from pvpo.trainer.algorithms.spec import available_estimators, get_estimator

GROUPS, SIZES, GT_ROWS, WORLD = (1, 2, 8, 32, 64), (2, 3, 4, 5), (0, 1, 2), (1, 2)
LEVELS = torch.tensor([0.0, 0.1, 1 / 3, 2 / 3, 1.0])  # float32: the format floor, F1-like, correct
NORMALISED = ("grpo", "gdpo")  # divide by a spread: a GT row's bound is sqrt(n)
EXACT_ZERO = ("grpo", "dr_grpo", "rloo", "gdpo")  # group baselines: a group without spread gives 0
T_TOKENS = 6


class Ranks:
    """`world` simulated ranks: `all_sum(rank)` is a collective that returns the sum of every
    rank's tensor (threads meet at a barrier, as torch.distributed's ranks at an all-reduce)."""

    def __init__(self, world: int) -> None:
        self.world, self.slots = world, [torch.zeros(0)] * world
        self.barrier = threading.Barrier(world)

    def all_sum(self, rank: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def reduce(x: torch.Tensor) -> torch.Tensor:
            self.slots[rank] = x.detach().clone()
            self.barrier.wait()
            out = torch.stack(self.slots).sum(0)
            self.barrier.wait()
            return out

        return reduce

    def run(self, fn: Callable[[int, Callable[[torch.Tensor], torch.Tensor] | None], Any]) -> list[Any]:
        if self.world == 1:
            return [fn(0, None)]
        with ThreadPoolExecutor(self.world) as pool:
            return list(pool.map(lambda r: fn(r, self.all_sum(r)), range(self.world)))


def _batch(groups: int, n: int, gt: int, gen: torch.Generator, *, with_gt: bool) -> dict[str, Any]:
    """One rank's batch: `groups` groups of n rows, the last `gt` of each a GT row (when `with_gt`)
    sharing one reward; a third of the groups at one reward (float32 2/3 among them), the rest drawn
    from LEVELS or uniform. Two reward components for GDPO (the reward and a format bit)."""
    rewards, comps, rows, uids, flat = [], [], [], [], []
    for g in range(groups):
        kind = int(torch.randint(0, 3, (1,), generator=gen))
        m = n - gt if with_gt else n
        if kind == 0:
            pol = [float(LEVELS[int(torch.randint(0, 5, (1,), generator=gen))])] * m
        elif kind == 1:
            pol = [float(LEVELS[i]) for i in torch.randint(0, 5, (m,), generator=gen)]
        else:
            pol = torch.rand(m, generator=gen).tolist()
        gt_r = [1.0] * (n - m)
        vals = pol + gt_r
        flat.append(kind == 0 and (not gt_r or gt_r[0] == pol[0]) if pol else False)
        rewards += vals
        comps += [[v, float(v > 0)] for v in vals]
        rows += [True] * m + [False] * (n - m)
        uids += [f"g{g}"] * n
    return {
        "rewards": torch.tensor(rewards),
        "components": torch.tensor(comps),
        "rows": torch.tensor(rows),
        "uids": uids,
        "flat": flat,
    }


def _estimate(name: str, b: dict[str, Any], all_sum: Callable[[torch.Tensor], torch.Tensor] | None) -> torch.Tensor:
    r, rows, uids = b["rewards"], b["rows"], b["uids"]
    means = {u: float(r[[i for i, x in enumerate(uids) if x == u]].mean()) for u in set(uids)}
    kw: dict[str, Any] = {"policy_rows": rows, "anchors": means}
    if name in ("v05", "v05_value"):
        kw["prior"] = means
    if name == "gdpo":
        kw |= {"components": b["components"], "all_sum": all_sum}
    if name == "ppo":  # the critic at its start (V = 0), the defaults otherwise (lambda 1, whitening)
        kw |= {"values": torch.zeros(len(uids), T_TOKENS), "mask": torch.ones(len(uids), T_TOKENS), "all_sum": all_sum}
    adv = get_estimator(name)(r, uids, **kw)
    return adv


def _on_rank(
    name: str, batches: list[dict[str, Any]], rank: int, all_sum: Callable[[torch.Tensor], torch.Tensor] | None
) -> torch.Tensor:
    return _estimate(name, batches[rank], all_sum)


CASES = [(g, n, k, w) for g in GROUPS for n in SIZES for k in GT_ROWS if k < n or n == 2 for w in WORLD]


@pytest.mark.parametrize("name", sorted(available_estimators()))
def test_every_batch_shape_and_world_size_keeps_each_advantage_within_its_bound(name: str) -> None:
    gen = torch.Generator().manual_seed(78)
    for groups, n, gt, world in CASES:
        with_gt = name != "ppo"  # ppo + Group Sampling is refused at config load
        per_rank = [_batch(max(1, groups // world), n, gt, gen, with_gt=with_gt) for _ in range(world)]
        advs = Ranks(world).run(functools.partial(_on_rank, name, per_rank))
        total_rows = sum(len(b["uids"]) for b in per_rank)
        policy_rows = sum(int(b["rows"].sum()) for b in per_rank)
        where = f"{name}: {groups} groups of {n}, {gt} GT, world {world}"
        for b, adv in zip(per_rank, advs, strict=True):
            assert bool(torch.isfinite(adv).all()), where
            row_adv = adv.abs().amax(dim=1) if adv.dim() == 2 else adv.abs()
            if name in NORMALISED and bool((~b["rows"]).any()):
                gt_max = float(row_adv[~b["rows"]].max())
                assert gt_max <= math.sqrt(n) * (1 + 1e-6), f"{where}: GT row {gt_max} > sqrt({n})"
            if name in EXACT_ZERO:
                for g, flat in enumerate(b["flat"]):
                    if flat:
                        got = adv[[i for i, u in enumerate(b["uids"]) if u == f"g{g}"]]
                        assert bool((got == 0).all()), f"{where}: group g{g} without spread got {got.tolist()}"
            if name == "gdpo":  # Eq. 6 on the policy rows: Samuelson's bound over every rank's policy rows
                bound = (policy_rows - 1) / math.sqrt(policy_rows) if policy_rows > 1 else 10.0
                assert float(row_adv.max()) <= max(bound, math.sqrt(n)) * (1 + 1e-6), where
            elif name == "ppo":  # whitening over every rank's tokens, each row's tokens at its reward
                assert float(row_adv.max()) <= math.sqrt(max(total_rows - 1, 1)) * (1 + 1e-6), where
            else:
                assert float(row_adv.max()) <= 10.0, where


def test_gdpo_gives_a_gt_row_at_most_sqrt_n_where_the_batch_step_once_gave_it_2_83() -> None:
    # two groups of four: three policy rows at the 0.1 floor and a GT row at 1; four policy rows at 0.1.
    # The group step gives the GT row sqrt(4) = 2 and every policy row 0; dividing it by the std of the
    # batch with it (0.707) gave 2.83
    r = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.1, 0.1, 0.1, 0.1])
    rows = torch.tensor([True, True, True, False, True, True, True, True])
    adv = get_estimator("gdpo")(r, ["p"] * 4 + ["q"] * 4, components=r.unsqueeze(1), policy_rows=rows)
    assert float(adv[3]) == pytest.approx(2.0, abs=1e-5) and float(adv[3]) <= 2.0, adv
    assert torch.equal(adv[rows], torch.zeros(7)), adv


@pytest.mark.parametrize("name", EXACT_ZERO)
def test_eight_rows_at_float32_two_thirds_give_exactly_zero(name: str) -> None:
    r = torch.full((8,), 2 / 3)
    kw: dict[str, Any] = {"components": r.unsqueeze(1)} if name == "gdpo" else {}
    assert torch.equal(get_estimator(name)(r, ["g"] * 8, **kw), torch.zeros(8))


def test_gdpo_batch_step_leaves_sixteen_groups_without_spread_at_zero_beside_one_with_spread() -> None:
    # 16 groups of 8 at F1 2/3 (float32): the float32 residue once became +3.86 on one group, -0.26 elsewhere
    r = torch.cat([torch.full((128,), 2 / 3), torch.tensor([0.0, 1.0])])
    uids = [f"g{i // 8}" for i in range(128)] + ["s", "s"]
    adv = get_estimator("gdpo")(r, uids, components=r.unsqueeze(1))
    assert torch.equal(adv[:128], torch.zeros(128)) and float(adv[129]) > 0 > float(adv[128])


def test_the_gt_credit_rule_gives_a_gt_row_less_than_a_policy_row_of_equal_reward() -> None:
    """docs/deviations.md's numbers: policy rows [0, 0, 0, 1] and a GT row at 1. GRPO: the policy row
    0.75 / 0.5 = 1.5, the GT row 0.75 over the std of the policy rows and itself (sqrt(0.3)): 1.369.
    RLOO: the policy row against the other three (1.0), the GT row against all four (0.75). GDPO: its
    group step is GRPO's, the batch step's policy std is 1 here: 1.5 and 1.369."""
    r = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0])
    rows = torch.tensor([True, True, True, True, False])
    uids = ["g"] * 5
    grpo = get_estimator("grpo")(r, uids, policy_rows=rows, eps=0.0)
    assert (float(grpo[3]), float(grpo[4])) == pytest.approx((1.5, 0.75 / math.sqrt(0.3)), abs=1e-6)
    rloo = get_estimator("rloo")(r, uids, policy_rows=rows)
    assert (float(rloo[3]), float(rloo[4])) == pytest.approx((1.0, 0.75), abs=1e-6)
    gdpo = get_estimator("gdpo")(r, uids, policy_rows=rows, components=r.unsqueeze(1), eps=0.0)
    assert (float(gdpo[3]), float(gdpo[4])) == pytest.approx((1.5, 0.75 / math.sqrt(0.3)), abs=1e-6)


def test_a_gt_row_is_bounded_whatever_the_other_gt_rows_of_its_group_hold() -> None:
    # one policy row at 2/3, GT rows at 0 and 1/3: over the whole group's std the first reached 2.0 > sqrt(3)
    r = torch.tensor([2 / 3, 0.0, 1 / 3])
    adv = get_estimator("grpo")(r, ["g"] * 3, policy_rows=torch.tensor([True, False, False]))
    assert float(adv.abs().max()) <= math.sqrt(2) * (1 + 1e-6), adv
