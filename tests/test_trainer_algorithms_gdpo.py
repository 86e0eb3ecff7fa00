"""GDPO (arXiv:2601.05242): per-component group normalisation, weighted sum, batch normalisation;
the paper's toy example of two binary rewards in groups of two rollouts."""

from __future__ import annotations

import math

import pytest
import torch

from pvpo.trainer.algorithms.gdpo import component_matrix, condition
from pvpo.trainer.algorithms.spec import get_estimator
from pvpo.trainer.config.schema import ConfigError, load_config

R2 = 1 / math.sqrt(2)  # 0.7071: (r - mean) / std of two different values, unbiased std


def toy() -> tuple[torch.Tensor, list[str]]:
    # three groups of two rollouts, rewards (r1, r2) in {0, 1}: summed rewards (0, 1), (0, 2), (1, 2)
    comps = torch.tensor(
        [
            [0, 0],
            [0, 1],  # group a: sums 0, 1
            [0, 0],
            [1, 1],  # group b: sums 0, 2
            [0, 1],
            [1, 1],
        ],
        dtype=torch.float64,
    )  # group c: sums 1, 2
    return comps, ["a", "a", "b", "b", "c", "c"]


def test_grpo_collapses_the_three_reward_combinations_to_one_advantage():
    comps, uids = toy()
    adv = get_estimator("grpo")(comps.sum(1), uids)
    torch.testing.assert_close(adv, torch.tensor([-R2, R2] * 3, dtype=torch.float64), atol=1e-5, rtol=0)


def test_gdpo_separates_them_with_the_papers_numbers_before_and_after_the_batch_step():
    comps, uids = toy()
    gdpo = get_estimator("gdpo")
    raw = gdpo(comps.sum(1), uids, components=comps, batch_norm=False)
    # (0, 2) differs in both rewards: twice the advantage of the patterns where one reward differs
    torch.testing.assert_close(
        raw, torch.tensor([-R2, R2, -2 * R2, 2 * R2, -R2, R2], dtype=torch.float64), atol=1e-5, rtol=0
    )
    # batch step: mean 0, unbiased std sqrt((4 * 0.5 + 2 * 2) / 5) = sqrt(1.2)
    out = gdpo(comps.sum(1), uids, components=comps)
    s = math.sqrt(1.2)
    torch.testing.assert_close(
        out, torch.tensor([-R2, R2, -2 * R2, 2 * R2, -R2, R2], dtype=torch.float64) / s, atol=1e-5, rtol=0
    )
    assert round(float(out[3]), 4) == 1.291 and round(float(out[1]), 4) == 0.6455


def test_gdpo_weights_by_name_and_a_size_one_group_gets_no_group_signal():
    comps = torch.tensor([[0, 0], [1, 1], [1, 0]], dtype=torch.float64)
    adv = get_estimator("gdpo")(
        comps.sum(1),
        ["p", "p", "solo"],
        components=comps,
        component_names=["format", "accuracy"],
        weights={"accuracy": 2.0},
        batch_norm=False,
    )
    torch.testing.assert_close(adv, torch.tensor([-3 * R2, 3 * R2, 0.0], dtype=torch.float64), atol=1e-5, rtol=0)
    with pytest.raises(KeyError, match="'lenght'.*components"):
        get_estimator("gdpo")(
            comps.sum(1),
            ["p", "p", "q"],
            components=comps,
            component_names=["format", "accuracy"],
            weights={"lenght": 1.0},
        )


def test_conditioned_reward_counts_only_where_the_other_reaches_its_threshold():
    # columns: accuracy, length; length counts only for correct answers (accuracy >= 1)
    comps = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]])
    out = condition(comps, ["accuracy", "length"], [("length", "accuracy", 1.0)])
    torch.testing.assert_close(out, torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(KeyError, match="'acc'"):
        condition(comps, ["accuracy", "length"], [("length", "acc", 1.0)])


def test_components_come_from_the_rewards_named_parts_and_a_failed_reward_scores_zero():
    m, names = component_matrix([{"format": 1.0, "accuracy": 0.5}, {}, {"accuracy": 1.0, "format": 0.0}])
    assert names == ["accuracy", "format"]
    torch.testing.assert_close(m, torch.tensor([[0.5, 1.0], [0.0, 0.0], [1.0, 0.0]]))
    with pytest.raises(KeyError, match="'em'.*has \\['accuracy', 'format'\\]"):
        component_matrix([{"format": 1.0, "accuracy": 0.5}], ["em"])


def test_gdpo_without_components_says_what_it_needs():
    with pytest.raises(ValueError, match="components="):
        get_estimator("gdpo")(torch.tensor([1.0, 0.0]), ["a", "a"])


def test_gdpo_config_keys_load_and_a_typo_is_named():
    cfg = load_config(
        None,
        [
            "algorithm.estimator=gdpo",
            "algorithm.gdpo.weights={accuracy: 2.0}",
            "algorithm.gdpo.conditions=[{component: accuracy, when: format, threshold: 1.0}]",
        ],
    )
    assert cfg.algorithm.gdpo.weights == {"accuracy": 2.0} and cfg.algorithm.gdpo.conditions[0].when == "format"
    with pytest.raises(ConfigError, match=r"algorithm\.gdpo\.batchnorm: unknown key"):
        load_config(None, ["algorithm.gdpo.batchnorm=false"])


def test_gdpo_normalises_each_group_over_its_policy_rows_only():
    # group p: policy rows (0, 1), (1, 0) and a GT row (1, 1); group q: policy rows (1, 0), (0, 1)
    comps = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    uids = ["p", "p", "p", "q", "q"]
    rows = torch.tensor([True, True, False, True, True])
    gdpo = get_estimator("gdpo")
    adv = gdpo(comps.sum(1), uids, components=comps, batch_norm=False, policy_rows=rows)
    # each component of p: policy mean 0.5, unbiased std R2; the GT row is 0.5 above that mean on
    # both, scaled by the component's std over the policy rows and itself (0, 1, 1: 1 / sqrt(3)): 2 x sqrt(3) / 2
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.0, math.sqrt(3), 0.0, 0.0]), atol=1e-5, rtol=0)
    # counting the GT row in p's statistics (mean 2/3, std 0.57735 per component) would give
    # the GT row 2 x (1/3) / 0.57735 = 1.1547 and push the policy rows below 0
    old = gdpo(comps.sum(1), uids, components=comps, batch_norm=False)
    torch.testing.assert_close(old[:3], torch.tensor([-0.57735, -0.57735, 1.1547]), atol=1e-4, rtol=0)


def test_gdpo_batch_step_gives_the_policy_rows_the_same_advantages_with_or_without_gt_rows():
    # group p: policy rows (0, 1), (1, 0); group q: (0, 0), (1, 1); then each gets a GT row (1, 1)
    comps = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    uids = ["p", "p", "q", "q"]
    gdpo = get_estimator("gdpo")
    alone = gdpo(comps.sum(1), uids, components=comps, policy_rows=torch.ones(4, dtype=torch.bool))
    # before the batch step (0, 0, -2 R2, +2 R2): mean 0, unbiased std sqrt(4 / 3)
    torch.testing.assert_close(alone, torch.tensor([0.0, 0.0, -2 * R2, 2 * R2]) / math.sqrt(4 / 3), atol=1e-5, rtol=0)
    with_gt = torch.cat([comps, torch.tensor([[1.0, 1.0], [1.0, 1.0]])])
    rows = torch.tensor([True] * 4 + [False] * 2)
    adv = gdpo(with_gt.sum(1), [*uids, "p", "q"], components=with_gt, policy_rows=rows)
    torch.testing.assert_close(adv[:4], alone, atol=1e-5, rtol=0)
    # the GT rows (sqrt(3) / 2 on each component before the batch step, as in the test above) get the
    # weighted mean of their components, sqrt(3) / 2, divided by no batch std (dividing by the
    # batch's std with them, 1.0954, gave 1.5811)
    torch.testing.assert_close(adv[4:], torch.full((2,), math.sqrt(3) / 2), atol=1e-5, rtol=0)
