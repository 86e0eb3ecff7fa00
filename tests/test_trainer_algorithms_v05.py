"""V0.5 (arXiv:2603.10848): shrinkage of a value prior towards the group mean, the adaptive
rollout budget's look-ahead, and the prompt-embedding value model. Hand-computed cases."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pvpo.trainer.algorithms.adaptive_budget import extend_groups, objective, scaled_cost, wants_more
from pvpo.trainer.algorithms.prior_fusion import NoiseFloor, floored_variance, fuse, fused_baselines, fusion_stats
from pvpo.trainer.algorithms.spec import get_estimator, get_spec
from pvpo.trainer.algorithms.value_model import PromptValueModel


def test_shrinkage_trusts_a_prior_the_rollouts_cannot_reject():
    # rewards 1,0,1,1: mean 0.75, unbiased s^2 = 0.25, noise s^2/k = 0.0625
    f = fuse(0.75, 0.25, 4, 0.7)  # (0.05)^2 - 0.0625 < 0 -> D^2 = 0 (positive part) -> w = 0
    assert (f.d2, f.w, f.mu, f.mse) == (0.0, 0.0, 0.7, 0.0)


def test_shrinkage_moves_to_the_group_mean_when_the_prior_is_off():
    f = fuse(0.75, 0.25, 4, 0.1)  # D^2 = 0.65^2 - 0.0625 = 0.36, w = 0.36 / 0.4225
    assert f.d2 == pytest.approx(0.36) and f.w == pytest.approx(0.852071, abs=1e-6)
    assert f.mu == pytest.approx(0.852071 * 0.75 + 0.147929 * 0.1, abs=1e-6)  # 0.653846
    assert f.mse == pytest.approx(0.36 * 0.0625 / 0.4225)  # D^2 (s^2/k) / (D^2 + s^2/k) = 0.053254
    assert fuse(0.75, 0.25, 4, None).w == 1.0  # no prior: the group mean


def test_noise_term_is_the_empirical_variance_of_rewards_in_0_1():
    # PVPO rewards 0.1 (format only) and 1.0: s^2 = 0.2025 * 4/3 = 0.27, not a {-1, 1} Bernoulli's
    rewards = torch.tensor([0.1, 1.0, 0.1, 1.0])
    _, per = fused_baselines(rewards, ["p"] * 4, {"p": 0.0})
    assert per["p"].noise == pytest.approx(0.27 / 4)
    assert per["p"].d2 == pytest.approx(0.55**2 - 0.0675)
    # all-equal rewards: s^2 = 0, so any deviation from the prior rejects it (w = 1)
    _, per = fused_baselines(torch.tensor([0.1, 0.1, 1.0, 0.0]), ["q", "q", "p", "p"], {"q": 0.3, "p": 0.5})
    assert per["q"].w == 1.0 and per["q"].mu == pytest.approx(0.1)
    assert fusion_stats(per) == pytest.approx(
        {"v05/w_mean": 0.5, "v05/prior_rejected_frac": 0.5, "v05/baseline_mse": 0.0, "v05/zero_variance_frac": 0.5}
    )


def test_v05_advantage_is_reward_minus_the_fused_baseline_with_anchor_or_given_prior():
    r, uids = torch.tensor([1.0, 0.0, 1.0, 1.0]), ["p"] * 4
    torch.testing.assert_close(get_estimator("v05")(r, uids, anchors={"p": 0.7}), r - 0.7)
    est = get_spec("v05_value")
    assert get_spec("v05").needs_anchors and not est.needs_anchors
    torch.testing.assert_close(est(r, uids, prior={"p": None}), r - 0.75)  # no prior yet: group mean
    # the plain sample variance (floor=None): the hand case of the shrinkage test above
    torch.testing.assert_close(est(r, uids, prior={"p": 0.1}, floor=None), r - 0.653846, atol=1e-6, rtol=0)


def test_budget_look_ahead_hand_case():
    # rewards 1,0,1,0 against prior 0: mean 0.5, s^2 = 1/3, D^2 = 0.25 - 1/12 = 1/6
    # J(4) = (1/6)(1/12)/(1/4) + 4/256 = 0.071181; J(5) = (1/6)(1/15)/(7/30) + 5/256 = 0.067150
    assert objective([1, 0, 1, 0], 0.0, 4, 1 / 256) == pytest.approx(0.071181, abs=1e-6)
    assert objective([1, 0, 1, 0], 0.0, 5, 1 / 256) == pytest.approx(0.067150, abs=1e-6)
    assert wants_more([1, 0, 1, 0], 0.0, k_max=16, cost=1 / 256)
    assert not wants_more([1, 0, 1, 0], 0.5, k_max=16, cost=1 / 256)  # prior agrees: D^2 = 0, MSE 0
    assert not wants_more([1, 0, 1, 0], 0.0, k_max=4, cost=1 / 256)  # at k_max


def _rollout(pattern: dict[str, list[float]], log: list[int]):
    pos = {u: 4 for u in pattern}

    def rollout(examples, rnd):
        log.append(len(examples))
        out = []
        for ex in examples:
            out.append(SimpleNamespace(uid=ex.uid, reward=pattern[ex.uid][pos[ex.uid] % len(pattern[ex.uid])]))
            pos[ex.uid] += 1
        return out

    return rollout


def test_budget_stops_at_k_init_when_the_prior_agrees_and_spends_more_when_it_is_off():
    exs = [SimpleNamespace(uid="agree"), SimpleNamespace(uid="off")]
    pattern = {"agree": [1.0, 0.0], "off": [1.0, 0.0]}
    first = [SimpleNamespace(uid=u, reward=r) for u in pattern for r in (1.0, 0.0, 1.0, 0.0)]
    log: list[int] = []
    new, report = extend_groups(exs, first, {"agree": 0.5, "off": 0.0}, _rollout(pattern, log), k_max=16, cost=1 / 256)
    assert all(t.uid == "off" for t in new) and len(new) > 0  # only the prompt whose prior is off
    assert set(log) == {1}  # one prompt a round
    assert 4 < report["v05/k_max"] <= 16 and report["v05/extra_rollouts"] == len(new)
    # the same rewards with no prior at all: the group mean alone, s^2 / (k (k+1)) must beat c
    new2, _ = extend_groups(exs[:1], first[:4], {}, _rollout(pattern, []), k_max=16, cost=1 / 256)
    # k=8 (four 1s, four 0s): s^2 = 2/7, gain s^2/(8*9) = 0.003968 > 1/256 = 0.003906 -> one more;
    # k=9 (five 1s): s^2 = 0.277778, gain s^2/(9*10) = 0.003086 < 1/256 -> stop at 9
    assert 4 + len(new2) == 9
    none, rep = extend_groups(exs, first, {"agree": 0.5, "off": 0.0}, _rollout(pattern, []), k_max=16, cost=1.0)
    assert none == [] and rep["v05/rounds"] == 0  # c too high: never worth a rollout


def test_value_model_knn_and_ridge_over_embeddings():
    vecs = {"q1": [1.0, 0.0], "q2": [0.0, 1.0], "q3": [0.8, 0.6]}
    vm = PromptValueModel(lambda texts: np.asarray([vecs[t] for t in texts], dtype=np.float32), k=2)
    assert vm.predict(["q3"], ["q3"]) == {"q3": None}  # nothing stored yet
    vm.update(["q1", "q2"], ["q1", "q2"], [1.0, 0.0])
    # q3's cosines: 0.8 to q1, 0.6 to q2 -> (0.8 * 1 + 0.6 * 0) / 1.4
    assert vm.predict(["q3"], ["q3"])["q3"] == pytest.approx(0.8 / 1.4)
    ridge = PromptValueModel(vm.embed, kind="ridge", alpha=1e-6)
    ridge.update(["q1", "q2"], ["q1", "q2"], [1.0, 0.0])
    assert ridge.predict(["q1"], ["q1"])["q1"] == pytest.approx(1.0, abs=1e-3)
    with pytest.raises(ValueError, match="knn, ridge"):
        PromptValueModel(vm.embed, kind="mlp")


def test_value_model_store_survives_a_reload(tmp_path):
    embed = lambda texts: np.asarray([[1.0, 0.0] for _ in texts], dtype=np.float32)  # noqa: E731
    PromptValueModel(embed, path=tmp_path / "vm.json").update(["a"], ["x"], [0.25])
    assert PromptValueModel(embed, path=tmp_path / "vm.json").predict(["b"], ["y"]) == {"b": 0.25}


# ---- GT rows, the variance floor, the budget's cost scale -------------------------------
POLICY = torch.tensor([True, True, True, False])  # three policy rollouts and one injected GT row


def test_gt_row_stays_out_of_v05s_baseline_and_is_measured_against_it():
    # the example: policy rows 0.1, 0.1, 0.1, GT row 1.0, prior 0.3 (plain variance, floor=None).
    # With the GT row in the group: mean 0.325, s^2 = 0.2025, noise 0.0506 > (0.025)^2, prior kept:
    # the policy rows got 0.1 - 0.3 = -0.2. Over the policy rows alone: mean 0.1, s^2 = 0, prior
    # rejected, baseline 0.1: the policy rows get 0 and the GT row 1.0 - 0.1 = 0.9.
    r, uids = torch.tensor([0.1, 0.1, 0.1, 1.0]), ["p"] * 4
    v05 = get_estimator("v05")
    old = v05(r, uids, anchors={"p": 0.3}, floor=None)
    torch.testing.assert_close(old, r - 0.3)  # no policy_rows given: every row counted (a caller's choice)
    new = v05(r, uids, anchors={"p": 0.3}, floor=None, policy_rows=POLICY)
    torch.testing.assert_close(new, torch.tensor([0.0, 0.0, 0.0, 0.9]))
    # with the default floor: k = 3, p~ = (0.3 + 1) / 5 = 0.26, s~^2 = 0.26 * 0.74 / 3 = 0.064133,
    # noise 0.021378, D^2 = 0.04 - 0.021378, w = 0.465556, mu = 0.206889
    mu = 0.465556 * 0.1 + 0.534444 * 0.3
    torch.testing.assert_close(v05(r, uids, anchors={"p": 0.3}, policy_rows=POLICY), r - mu, atol=1e-6, rtol=0)


def test_a_group_without_policy_rows_takes_its_prior_or_gets_zero():
    r, uids = torch.tensor([1.0, 1.0]), ["p", "q"]
    rows = torch.tensor([False, False])
    torch.testing.assert_close(
        get_estimator("v05")(r, uids, anchors={"p": 0.25}, prior={"p": 0.25, "q": None}, policy_rows=rows),
        torch.tensor([0.75, 0.0]),
    )


def test_variance_floor_of_a_uniform_group_and_a_group_of_one():
    f = NoiseFloor()
    # four rewards 0: p~ = 1/6, s~^2 = (0 + 5/36) / (3 + 1) = 0.034722; one reward 0: p~ = 1/3, s~^2 = 2/9
    assert floored_variance(0.0, 0.0, 4, f) == pytest.approx(5 / 144)
    assert floored_variance(0.0, 0.0, 1, f) == pytest.approx(2 / 9)
    assert floored_variance(1.0, 0.0, 1, f) == pytest.approx(2 / 9)  # symmetric at the top of the range
    assert floored_variance(0.0, 0.0, 4, NoiseFloor(pseudo_count=0)) == 0.0  # a = 0: the plain variance
    assert floored_variance(0.5, 0.3, 4, None) == 0.3
    # the floor fades with k: 64 equal rewards weigh the bound 1/64
    assert floored_variance(0.0, 0.0, 64, f) == pytest.approx((1 / 66) * (65 / 66) / 64)
    # a reward range [-1, 1] (the paper's): R^2 = 4 times the [0, 1] bound at the same rescaled mean
    assert floored_variance(-1.0, 0.0, 4, NoiseFloor(-1.0, 1.0)) == pytest.approx(4 * 5 / 144)
    with pytest.raises(ValueError, match="lo < hi"):
        NoiseFloor(1.0, 0.0)


def test_uniform_and_size_one_groups_keep_a_prior_they_cannot_reject():
    v05 = get_estimator("v05")
    zeros = torch.zeros(4)
    # four 0s against prior 0.05: noise 0.00868 > 0.05^2, the prior is kept: advantages -0.05, not 0
    torch.testing.assert_close(v05(zeros, ["p"] * 4, anchors={"p": 0.05}), zeros - 0.05)
    # without the floor: s^2 = 0, w = 1, every advantage 0
    torch.testing.assert_close(v05(zeros, ["p"] * 4, anchors={"p": 0.05}, floor=None), zeros)
    # against prior 0.3: D^2 = 0.09 - 0.00868 = 0.08132, w = 0.903549, mu = 0.028935
    torch.testing.assert_close(v05(zeros, ["p"] * 4, anchors={"p": 0.3}), zeros - 0.028935, atol=1e-6, rtol=0)
    # a group of one reward 1.0 against prior 0.6: noise 2/9 > 0.4^2, prior kept: 1 - 0.6
    torch.testing.assert_close(v05(torch.ones(1), ["p"], anchors={"p": 0.6}), torch.tensor([0.4]))
    _, per = fused_baselines(zeros, ["p"] * 4, {"p": 0.3}, floor=NoiseFloor())
    assert fusion_stats(per)["v05/zero_variance_frac"] == 0.0


def test_budget_asks_for_more_rollouts_of_a_uniform_group_that_rejects_its_prior():
    f = NoiseFloor()
    price = scaled_cost(1 / 256, f)
    assert price == pytest.approx(1 / 1024)  # the paper's c on rewards +-1, rescaled to [0, 1]
    assert scaled_cost(1 / 256, NoiseFloor(-1.0, 1.0)) == pytest.approx(1 / 256)
    # four 0s against prior 0.3: J(4) = 0.011750 > J(5) = 0.011281 (before the floor: MSE 0, never more)
    assert objective([0, 0, 0, 0], 0.3, 4, price, f) == pytest.approx(0.011750, abs=1e-6)
    assert objective([0, 0, 0, 0], 0.3, 5, price, f) == pytest.approx(0.011281, abs=1e-6)
    assert wants_more([0, 0, 0, 0], 0.3, k_max=16, cost=price, floor=f)
    assert not wants_more([0, 0, 0, 0], 0.3, k_max=16, cost=1 / 256)  # no floor: the old behaviour
    exs = [SimpleNamespace(uid="p")]
    first = [SimpleNamespace(uid="p", reward=0.0) for _ in range(4)]
    new, report = extend_groups(
        exs,
        first,
        {"p": 0.3},
        lambda todo, rnd: [SimpleNamespace(uid="p", reward=0.0)],
        k_max=16,
        cost=1 / 256,
        floor=f,
    )
    assert len(new) >= 1 and report["v05/k_mean"] == 4 + len(new)


def test_v05_state_hands_the_estimator_the_floor_of_the_config():
    from pvpo.trainer.algorithms.estimator_state import EstimatorContext
    from pvpo.trainer.algorithms.v05 import V05State
    from pvpo.trainer.config.schema import load_config

    cfg = load_config(
        None, ["algorithm.prior_fusion.reward_range=[-1, 1]", "algorithm.prior_fusion.var_pseudo_count=2"]
    )
    state = V05State(EstimatorContext(cfg.algorithm, rollout_n=4))
    assert state.floor == NoiseFloor(-1.0, 1.0, 2.0)
    assert state.kwargs([], None)["floor"] == state.floor  # type: ignore[arg-type]
