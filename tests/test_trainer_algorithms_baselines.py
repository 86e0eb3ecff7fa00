"""The group-baseline estimators (GRPO, Dr.GRPO, RLOO, PVPO): hand-computed cases, grouping by uid,
the estimator registry, Dr.GRPO's constant divisor; advantages spread over model tokens and logged."""

from __future__ import annotations

import random

import pytest
import torch

from pvpo.trainer.algorithms.advantages import advantage_stats, broadcast_to_tokens
from pvpo.trainer.algorithms.groups import group_std
from pvpo.trainer.algorithms.spec import available_estimators, get_estimator, get_spec, register_estimator
from pvpo.trainer.config.schema import load_config
from pvpo.trainer.model.update import loss_config


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def test_registry_lists_the_four_baselines_and_rejects_unknown_names_with_the_known_list():
    assert {"grpo", "dr_grpo", "rloo", "pvpo"} <= set(available_estimators())
    with pytest.raises(KeyError, match="grpo"):
        get_estimator("ppo-typo")


def test_registry_refuses_a_duplicate_name():
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("grpo")(lambda rewards, uids, **kw: rewards)


def test_only_pvpo_declares_it_needs_anchors():
    assert get_spec("pvpo").needs_anchors
    assert not any(get_spec(n).needs_anchors for n in ("grpo", "dr_grpo", "rloo"))


def test_grpo_hand_case_uses_unbiased_std():
    # group a: [1, 0, 0, 1] mean 0.5, unbiased var = 4*0.25/3 = 1/3, std = 0.57735
    #   adv = +-0.5/0.57735 = +-0.866025
    # group b: [2, 4] mean 3, unbiased var = (1+1)/1 = 2, std = 1.414214; adv = -+0.707107
    adv = get_estimator("grpo")(t(1, 0, 0, 1, 2, 4), ["a", "a", "a", "a", "b", "b"], eps=0.0)
    torch.testing.assert_close(adv, t(0.866025, -0.866025, -0.866025, 0.866025, -0.707107, 0.707107), atol=1e-6, rtol=0)


def test_group_std_matches_torch_std():
    r = t(0.3, 1.7, -2.0, 5.5)
    torch.testing.assert_close(group_std(r, ["g"] * 4), torch.full((4,), float(r.std()), dtype=torch.float64))


def test_grpo_equal_rewards_give_zero_advantage():
    adv = get_estimator("grpo")(t(1, 1, 1, 0, 0, 0), ["a", "a", "a", "b", "b", "b"])
    assert torch.equal(adv, torch.zeros(6, dtype=torch.float64))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_size_one_group_gets_zero(name: str):
    adv = get_estimator(name)(t(0.7, 1, 0), ["solo", "p", "p"])
    assert adv[0] == 0.0
    assert adv[1] > 0 > adv[2]


def test_dr_grpo_hand_case_is_reward_minus_group_mean():
    # group a: [1, 0, 0] mean 1/3 -> [2/3, -1/3, -1/3]; group b: [0.5, 1.5] mean 1 -> [-0.5, 0.5]
    adv = get_estimator("dr_grpo")(t(1, 0, 0.5, 0, 1.5), ["a", "a", "b", "a", "b"])
    torch.testing.assert_close(adv, t(2 / 3, -1 / 3, -0.5, -1 / 3, 0.5))


def test_rloo_hand_case_is_reward_minus_mean_of_others():
    # group [1, 0, 0, 1]: for r=1 others [0,0,1] mean 1/3 -> 2/3; for r=0 others [1,0,1] mean 2/3 -> -2/3
    # group [3, 5]: 3 - 5 = -2, 5 - 3 = 2
    adv = get_estimator("rloo")(t(1, 0, 3, 0, 1, 5), ["a", "a", "b", "a", "a", "b"])
    torch.testing.assert_close(adv, t(2 / 3, -2 / 3, -2, -2 / 3, 2 / 3, 2))


def test_rloo_is_dr_grpo_scaled_by_n_over_n_minus_1():
    # r - mean_others = n/(n-1) * (r - mean): an identity that pins both estimators against each other
    g = torch.Generator().manual_seed(0)
    r = torch.rand(8, generator=g, dtype=torch.float64)
    uids = ["x"] * 5 + ["y"] * 3
    scale = t(*([5 / 4] * 5 + [3 / 2] * 3))
    torch.testing.assert_close(get_estimator("rloo")(r, uids), scale * get_estimator("dr_grpo")(r, uids))


def test_pvpo_hand_case_subtracts_the_anchor_without_std():
    # a: anchor 0.25 -> [1-0.25, 0-0.25]; b: anchor 0.8 -> [0.5-0.8]
    adv = get_estimator("pvpo")(t(1, 0.5, 0), ["a", "b", "a"], anchors={"a": 0.25, "b": 0.8})
    torch.testing.assert_close(adv, t(0.75, -0.3, -0.25))


def test_pvpo_gives_signal_where_grpo_gives_none():
    # all-fail group on a prompt the reference solves 40% of the time: GRPO 0, PVPO -0.4
    # all-succeed group on a prompt the reference solves 10% of the time: GRPO 0, PVPO +0.9
    r, uids = t(0, 0, 0, 1, 1, 1), ["hard"] * 3 + ["easy"] * 3
    assert torch.equal(get_estimator("grpo")(r, uids), torch.zeros(6, dtype=torch.float64))
    adv = get_estimator("pvpo")(r, uids, anchors={"hard": 0.4, "easy": 0.1})
    torch.testing.assert_close(adv, t(-0.4, -0.4, -0.4, 0.9, 0.9, 0.9))


def test_pvpo_missing_anchor_raises_naming_the_uids():
    with pytest.raises(KeyError, match="q7"):
        get_estimator("pvpo")(t(1, 0), ["q1", "q7"], anchors={"q1": 0.5})
    with pytest.raises(KeyError, match="q1"):
        get_estimator("pvpo")(t(1, 0), ["q1", "q1"])


def test_pvpo_group_mean_fallback_for_missing_anchor():
    # q1 anchored at 0.0 -> 1.0; q7 has none -> its in-batch mean (1+0)/2 = 0.5 is the baseline
    adv = get_estimator("pvpo")(t(1, 1, 0), ["q1", "q7", "q7"], anchors={"q1": 0.0}, missing="group_mean")
    torch.testing.assert_close(adv, t(1.0, 0.5, -0.5))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "pvpo"])
def test_groups_are_formed_by_uid_not_position(name: str):
    g = torch.Generator().manual_seed(1)
    uids = [f"p{i % 4}" for i in range(16)]
    rewards = torch.rand(16, generator=g, dtype=torch.float64)
    anchors = {f"p{i}": 0.1 * i for i in range(4)}
    est = get_estimator(name)
    base = est(rewards, uids, anchors=anchors)
    perm = list(range(16))
    random.Random(2).shuffle(perm)
    shuffled = est(rewards[perm], [uids[i] for i in perm], anchors=anchors)
    torch.testing.assert_close(shuffled, base[perm])


def test_estimators_accept_and_ignore_unknown_keywords():
    adv = get_estimator("grpo")(t(1, 0), ["a", "a"], anchors=None, components=None, is_gt=[False, True])
    assert adv.shape == (2,)


def test_estimator_rejects_length_mismatch():
    with pytest.raises(ValueError, match="uids"):
        get_estimator("dr_grpo")(t(1, 0, 1), ["a", "a"])


def test_broadcast_to_tokens_puts_advantage_on_model_tokens_only():
    mask = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 0]])
    out = broadcast_to_tokens(t(0.5, -2.0), mask)
    torch.testing.assert_close(out, t(0.5, 0.5, 0, 0.5, 0, -2, -2, 0).view(2, 4))


def test_advantage_stats_counts_zero_signal_groups():
    # groups a (all equal -> zero adv), b (mixed), c (all equal) -> 2 of 3 groups carry no signal
    r, uids = t(1, 1, 0, 1, 0, 0), ["a", "a", "b", "b", "c", "c"]
    adv = get_estimator("grpo")(r, uids)
    s = advantage_stats(adv, uids)
    assert s["adv/zero_group_frac"] == pytest.approx(2 / 3)
    assert s["adv/num_groups"] == 3
    assert s["adv/mean"] == pytest.approx(0.0)
    assert s["adv/max"] == pytest.approx(float(adv.max()))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_group_estimators_normalise_each_reward_component_separately(name: str):
    # the GDPO seam: rewards [B, K] are normalised per component within each group
    g = torch.Generator().manual_seed(7)
    r = torch.rand(6, 2, generator=g, dtype=torch.float64)
    uids = ["a", "b", "a", "b", "a", "b"]
    est = get_estimator(name)
    both = est(r, uids)
    torch.testing.assert_close(both, torch.stack([est(r[:, 0], uids), est(r[:, 1], uids)], dim=1))


def test_dr_grpo_divides_by_the_response_budget_whatever_the_batch_longest_response():
    est = get_spec("dr_grpo")
    assert est.loss_agg == "seq-mean-token-sum-norm" and get_spec("grpo").loss_agg == "token-mean"
    cfg = load_config(None, ["algorithm.estimator=dr_grpo", "rollout.max_response_tokens=64"])
    lc = loss_config(cfg.optim, default_agg=est.loss_agg, norm_len=cfg.rollout.max_response_tokens)
    assert (lc.agg, lc.norm_len) == ("seq-mean-token-sum-norm", 64)
    lp = torch.full((2, 5), -1.0)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.float32)
    adv = torch.tensor([1.0, -1.0])
    short, _ = lc(lp, lp, adv, mask)
    wide, _ = lc(
        torch.nn.functional.pad(lp, (0, 7)),
        torch.nn.functional.pad(lp, (0, 7)),
        adv,
        torch.nn.functional.pad(mask, (0, 7)),
    )
    assert float(short) == pytest.approx(float(wide)) == pytest.approx(-(3 - 2) / 64 / 2)
    user = load_config(None, ["algorithm.estimator=dr_grpo", "optim.loss_agg=token-mean"])
    assert loss_config(user.optim, default_agg=est.loss_agg).agg == "token-mean"  # an explicit choice wins


# ---- an injected GT row is not a rollout of the policy ---------------------------------
# group "p": policy rollouts 0.0, 0.5, 1.0 and one GT row 1.0; group "q": two policy rollouts
GT_R, GT_UIDS = t(0.0, 0.5, 1.0, 1.0, 0.2, 0.4), ["p", "p", "p", "p", "q", "q"]
GT_POLICY = torch.tensor([True, True, True, False, True, True])


def test_group_baselines_are_taken_over_the_policy_rows_and_the_gt_row_is_measured_against_them():
    # p's policy rows: mean 0.5, unbiased std 0.5; q: mean 0.3, std 0.141421. The GT row (1.0): its
    # policy rows' mean, scaled by p's std over all four rows (0, 0.5, 1, 1: sqrt(0.6875 / 3))
    grpo = get_estimator("grpo")(GT_R, GT_UIDS, policy_rows=GT_POLICY, eps=0.0)
    q_std = 0.2 / 2**0.5
    torch.testing.assert_close(grpo, t(-1.0, 0.0, 1.0, 0.5 / (0.6875 / 3) ** 0.5, -0.1 / q_std, 0.1 / q_std))
    dr = get_estimator("dr_grpo")(GT_R, GT_UIDS, policy_rows=GT_POLICY)
    torch.testing.assert_close(dr, t(-0.5, 0.0, 0.5, 0.5, -0.1, 0.1))
    # RLOO: each policy row against the other policy rows; the GT row against all of them (0.5)
    rloo = get_estimator("rloo")(GT_R, GT_UIDS, policy_rows=GT_POLICY)
    torch.testing.assert_close(rloo, t(-0.75, 0.0, 0.75, 0.5, -0.2, 0.2))
    # counting the GT row in p's mean would give 0.625, and Dr.GRPO's policy rows -0.625, -0.125, 0.375
    old = get_estimator("dr_grpo")(GT_R, GT_UIDS)
    torch.testing.assert_close(old[:3], t(-0.625, -0.125, 0.375))


def test_pvpo_is_unaffected_by_gt_rows_its_anchor_comes_from_reference_rollouts():
    anchors = {"p": 0.25, "q": 0.5}
    pvpo = get_estimator("pvpo")
    with_rows = pvpo(GT_R, GT_UIDS, anchors=anchors, policy_rows=GT_POLICY)
    torch.testing.assert_close(with_rows, GT_R - t(0.25, 0.25, 0.25, 0.25, 0.5, 0.5))
    torch.testing.assert_close(with_rows, pvpo(GT_R, GT_UIDS, anchors=anchors))
    # the group-mean fallback for a prompt without an anchor reads the policy rows too
    fb = pvpo(GT_R, GT_UIDS, anchors={"q": 0.5}, missing="group_mean", policy_rows=GT_POLICY)
    torch.testing.assert_close(fb[:4], GT_R[:4] - 0.5)


def test_one_policy_row_gets_no_group_signal_and_its_gt_row_is_scaled_by_the_pair():
    r, uids, rows = t(1.0, 0.0, 1.0), ["p", "p", "q"], torch.tensor([False, True, False])
    # GRPO: the lone policy row has no baseline but itself (0); the GT row is 1 over the pair's std
    # (1 / sqrt(2)): sqrt(2), so N = 2 with one GT row still injects; q has no policy row at all (0)
    torch.testing.assert_close(get_estimator("grpo")(r, uids, policy_rows=rows, eps=0.0), t(2**0.5, 0.0, 0.0))
    # Dr.GRPO and RLOO: the GT row against the one policy row (1 - 0); that row has no other: 0
    for name in ("dr_grpo", "rloo"):
        torch.testing.assert_close(get_estimator(name)(r, uids, policy_rows=rows), t(1.0, 0.0, 0.0))


def test_a_training_step_with_gt_rows_gives_the_estimator_the_policy_rows_alone(tmp_path, monkeypatch):
    """Through `Trainer.train_step`, with Group Sampling injecting GT rows: the estimator is asked
    with `policy_rows` true on the policy's own rollouts and false on exactly the injected rows."""
    import dataclasses

    from trainer_support import TINY, WORLD, OverlapSearcher

    from pvpo.trainer import loop

    asked: list[torch.Tensor | None] = []
    batches: list[torch.Tensor] = []  # each step's batch's is_gt, as collated for its advantages
    real_get_spec, real_collate = loop.get_spec, loop.collate

    def spied(name: str):
        spec = real_get_spec(name)

        def fn(rewards, uids, **kwargs):
            asked.append(kwargs.get("policy_rows"))
            return spec.fn(rewards, uids, **kwargs)

        return dataclasses.replace(spec, fn=fn)

    def collate(trajs, pad_id):
        batch = real_collate(trajs, pad_id)
        batches.append(batch.is_gt.clone())
        return batch

    monkeypatch.setattr(loop, "get_spec", spied)
    monkeypatch.setattr(loop, "collate", collate)
    gt_rows = ["algorithm.group_sampling.enabled=true", "rollout.n=3", "algorithm.gt.replace_per_group=1"]
    cfg = load_config(None, [*TINY, *gt_rows, "algorithm.estimator=grpo", "run.steps=1", "run.checkpoint_every=0"])
    loop.train(cfg, tmp_path / "run", searcher=OverlapSearcher(WORLD.passages), show_progress=False)
    assert len(asked) == len(batches) == 1
    (rows,), (is_gt,) = asked, batches
    assert is_gt.any() and not is_gt.all()  # a random policy solves nothing: every group has a GT row
    assert rows is not None and torch.equal(rows, ~is_gt)
