"""PPO at its defaults (lambda 1, as verl): while the critic is still 0, every token of a correct
trajectory gets a positive advantage; and PPO takes no Group Sampling GT rows, refused at config
load in one line (rc 2) before any file is written, and by the estimator itself."""

from __future__ import annotations

import pytest
import torch

from pvpo.trainer.algorithms.spec import get_estimator
from pvpo.trainer.config.estimators import PPOConfig


def _two_rows_of_180_model_tokens() -> torch.Tensor:
    """Loss mask `[2, 240]`: three turns of 60 model tokens, each of the first two followed by 30
    environment tokens (mask 0), as a multi-turn search episode."""
    turn = [1.0] * 60 + [0.0] * 30
    return torch.tensor([turn + turn + [1.0] * 60] * 2)


def test_ppo_at_the_defaults_gives_every_token_of_the_correct_row_a_positive_advantage() -> None:
    cfg = PPOConfig()
    mask = _two_rows_of_180_model_tokens()
    adv = get_estimator("ppo")(
        torch.tensor([1.0, 0.0]),
        ["correct", "wrong"],
        values=torch.zeros_like(mask),  # the critic's head starts at V = 0
        mask=mask,
        gamma=cfg.gamma,
        lam=cfg.lam,
        whiten=cfg.whiten,
    )
    correct, wrong = adv[0][mask[0] > 0], adv[1][mask[1] > 0]
    assert correct.numel() == 180 and bool((correct > 0).all()), int((correct <= 0).sum())
    assert bool((wrong < 0).all())
    # at lambda 0.95 the first 123 of the correct row's tokens were negative (the first -0.347)
    old = get_estimator("ppo")(torch.tensor([1.0, 0.0]), ["c", "w"], values=torch.zeros_like(mask), mask=mask, lam=0.95)
    assert int((old[0][mask[0] > 0] < 0).sum()) == 123


def test_ppo_refuses_gt_rows_instead_of_swallowing_policy_rows() -> None:
    mask = torch.ones(3, 4)
    with pytest.raises(ValueError, match="ppo takes no GT rows"):
        get_estimator("ppo")(
            torch.tensor([0.1, 0.1, 1.0]),
            ["g"] * 3,
            values=torch.zeros(3, 4),
            mask=mask,
            policy_rows=torch.tensor([True, True, False]),
        )
    every = get_estimator("ppo")(
        torch.tensor([0.0, 1.0]), ["g"] * 2, values=torch.zeros(2, 4), mask=torch.ones(2, 4), policy_rows=None
    )
    assert float(every[1].min()) > 0


def test_ppo_with_group_sampling_is_refused_in_one_line_rc_2_before_the_run_dir_exists(tmp_path) -> None:
    from typer.testing import CliRunner

    from pvpo.cli import app

    run = tmp_path / "run"
    res = CliRunner().invoke(
        app, ["train", "--run-dir", str(run), "algorithm.estimator=ppo", "algorithm.group_sampling.enabled=true"]
    )
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "algorithm.estimator=ppo takes no Group Sampling GT rows" in res.output
    assert "algorithm.group_sampling.enabled=false" in res.output
    assert not run.exists()


def test_ppo_whitens_a_batch_whose_rows_share_one_reward_to_exactly_zero() -> None:
    # twelve float32 tokens at 0.1: a float32 mean's residue over a std of its size + eps gave -0.0147 each
    adv = get_estimator("ppo")(torch.full((4,), 0.1), ["g"] * 4, values=torch.zeros(4, 3), mask=torch.ones(4, 3))
    assert torch.equal(adv, torch.zeros(4, 3))
