"""The held-out table per dataset: each policy's scores by dataset and overall, and paired gains."""

from __future__ import annotations

import pytest

from pvpo.recipes.heldout_table import dataset_groups, per_dataset_table
from pvpo.stats import paired_difference


def _scores(ems: list[float]) -> list[dict[str, float]]:
    return [{"em": e, "f1": e / 2, "cem": e, "format_ok": 1.0, "searches": 2.0, "reward": e} for e in ems]


UIDS = ["hotpotqa/1", "hotpotqa/2", "2wiki/1", "2wiki/2", "2wiki/3", "musique/1"]


def test_questions_group_by_their_uid_prefix_in_order_then_all():
    groups = dataset_groups(UIDS)
    assert list(groups) == ["hotpotqa", "2wiki", "musique", "all"]
    assert groups["2wiki"] == [2, 3, 4] and groups["all"] == list(range(6))
    assert list(dataset_groups(["a/1", "a/2"])) == ["a"]  # one dataset: no separate `all` row


def test_the_table_gives_each_policys_em_with_its_se_per_dataset_and_the_paired_rl_gain():
    base, warm, rl = [0.0] * 6, [0, 1, 0, 0, 1, 0], [1, 1, 0, 1, 1, 0]
    table = per_dataset_table(UIDS, {"base": _scores(base), "before": _scores(warm), "after": _scores(rl)})
    rows = table.splitlines()
    assert "| 2wiki | 3 | after RL | 0.667 (0.333) | 0.333 | 0.667 | 1.000 | 2.00 |" in rows
    assert "| hotpotqa | 2 | base model | 0.000 (0.000) | 0.000 | 0.000 | 1.000 | 2.00 |" in rows
    gain, se = paired_difference(warm, rl)
    assert gain == pytest.approx(2 / 6)
    assert f"| all | 6 | +{gain:.3f} ({se:.3f}, +{gain / se:.1f} s.e.) |" in next(
        r for r in rows if r.startswith("| all | 6 | +")
    )


def test_an_evaluation_missing_or_of_other_questions_is_left_out():
    table = per_dataset_table(UIDS, {"before": _scores([0] * 6), "after": _scores([1] * 5)})
    assert "after RL" not in table and "RL - warm start" not in table and "after warm start" in table
    assert per_dataset_table(UIDS, {}) == ""
