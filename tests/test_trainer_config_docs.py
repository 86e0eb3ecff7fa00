"""Config keys are documented by `Field(description=...)` alone, and the CLI
prints every key with its default and description."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.trainer.config.docs import config_keys

TRAINER = Path(__file__).resolve().parents[1] / "trainer"


def test_every_config_key_has_a_description() -> None:
    keys = config_keys()
    assert len(keys) > 100
    assert [k.key for k in keys if not k.description] == []


def test_no_field_is_documented_by_a_trailing_comment_only_its_description() -> None:
    for name in ("config/schema.py", "config/estimators.py"):
        for n, line in enumerate((TRAINER / name).read_text().splitlines(), 1):
            assert not re.match(r"^    \w+: [^=]+= .*#", line), f"{name}:{n}: {line.strip()}"


def test_config_keys_prints_each_key_with_its_default_type_and_description() -> None:
    res = CliRunner().invoke(app, ["config", "keys", "rollout.n"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == ["rollout.n = 4  (int)", "    group size: rollouts per prompt"]
    every = CliRunner().invoke(app, ["config", "keys"]).output
    assert "algorithm.ppo.critic.lr = 0.0001  (float)" in every and "run.rollout_budget = null  (int | null)" in every


def test_config_keys_names_the_sections_for_an_unknown_prefix() -> None:
    res = CliRunner().invoke(app, ["config", "keys", "rollouts"])
    assert res.exit_code == 2 and "no config key starts with 'rollouts'; sections: ['algorithm'" in res.output


def test_config_show_resolves_a_preset_with_overrides() -> None:
    res = CliRunner().invoke(app, ["config", "show", "--config", "smoke", "rollout.n=3"])
    assert res.exit_code == 0, res.output
    assert "\n  n: 3\n" in res.output and res.output.startswith("model:\n")
