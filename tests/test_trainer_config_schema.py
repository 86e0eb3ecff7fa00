"""The typed config: unknown keys and bad values name the key, overrides parse as YAML, placement
keys list their choices, and training rollouts refuse top-p below 1 (evaluation may use it)."""

from __future__ import annotations

import pytest

from pvpo.trainer.config.schema import ConfigError, load_config


# ---- config ------------------------------------------------------------------------------------
def test_config_unknown_key_fails_naming_it():
    with pytest.raises(ConfigError, match=r"optim\.lrr: unknown key"):
        load_config(None, ["optim.lrr=0.1"])


def test_config_bad_value_and_unknown_estimator_name_the_key():
    with pytest.raises(ConfigError, match=r"rollout\.temperature"):
        load_config(None, ["rollout.temperature=-1"])
    with pytest.raises(ConfigError, match=r"algorithm\.estimator.*unknown advantage estimator"):
        load_config(None, ["algorithm.estimator=nope"])


def test_config_overrides_parse_yaml_values(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim: {lr: 0.5}\nrun: {steps: 3}\n")
    cfg = load_config(path, ["run.steps=7", "algorithm.anchor.refresh_from=current"])
    assert (cfg.optim.lr, cfg.run.steps, cfg.algorithm.anchor.refresh_from) == (0.5, 7, "current")


def test_training_rollouts_refuse_top_p_below_one_while_evaluation_may_use_it():
    with pytest.raises(ConfigError, match=r"rollout.top_p.*run.eval_top_p"):
        load_config(None, ["rollout.top_p=0.95"])
    cfg = load_config(None, ["run.eval_temperature=0.6", "run.eval_top_p=0.95"])
    assert (cfg.run.eval_temperature, cfg.run.eval_top_p) == (0.6, 0.95)


def test_config_names_bad_placement_keys_and_lists_the_choices():
    with pytest.raises(ConfigError, match=r"model\.device.*auto"):
        load_config(None, ["model.device=tpu"])
    with pytest.raises(ConfigError, match=r"model\.attn_implementation.*sdpa"):
        load_config(None, ["model.attn_implementation=xformers"])
    with pytest.raises(ConfigError, match=r"env\.prompt_template.*search_r1"):
        load_config(None, ["env.prompt_template=nope"])
    cfg = load_config(
        None, ["model.device=cuda:1", "optim.max_tokens_per_micro_batch=4096", "env.prompt_template=search_r1"]
    )
    assert (cfg.model.device, cfg.optim.max_tokens_per_micro_batch) == ("cuda:1", 4096)


def test_a_yaml_alias_bomb_is_refused_at_its_line_before_anything_expands_it(tmp_path) -> None:
    import time

    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi", strict=True)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"bomb.yaml: line \d+, column \d+: YAML refused .*alias bomb"):
        load_config(bomb)
    assert time.monotonic() - t0 < 5
    with pytest.raises(ConfigError, match="override run.steps=...: its value is not YAML"):
        load_config(None, ["run.steps=&a [*a]"])


def test_a_section_given_twice_in_a_config_is_refused_naming_the_key_and_both_lines(tmp_path) -> None:
    cfg = tmp_path / "twice.yaml"
    cfg.write_text("run:\n  steps: 3\nrollout:\n  n: 4\nrun:\n  seed: 7\n")
    with pytest.raises(
        ConfigError, match=r"line 5, column 1: YAML refused \(key 'run' is given twice \(first on line 1\)"
    ):
        load_config(cfg)


def test_a_reward_parameter_the_reward_does_not_take_is_refused_at_load_naming_those_it_takes() -> None:
    """`algorithm.reward_params.foramt_score=0.1` once trained with every reward 0 (the total
    reward swallowed the TypeError), grad norm 0, rc 0."""
    with pytest.raises(ConfigError, match="reward 'pvpo' takes no parameter 'foramt_score'; its parameters: floor"):
        load_config(None, ["algorithm.reward_params.foramt_score=0.1"])
    with pytest.raises(ConfigError, match="parameter 'floor' must be a float"):
        load_config(None, ["algorithm.reward_params.floor=high"])
    assert load_config(None, ["algorithm.reward_params.floor=0.2"]).algorithm.reward_params == {"floor": 0.2}


def test_a_retriever_token_is_never_echoed_and_an_all_digit_one_is_a_token() -> None:
    digits = "8731129940215566"
    assert load_config(None, [f"retriever.token={digits}"]).retriever.token == digits
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"retriever.token=[{digits}]"])
    assert digits not in str(info.value) and "retriever.token" in str(info.value)


def test_config_show_masks_the_token_and_a_urls_password() -> None:
    from typer.testing import CliRunner

    from pvpo.cli import app

    res = CliRunner().invoke(
        app, ["config", "show", "retriever.token=s3cret", "retriever.url=http://admin:PASSWORD99@h:1"]
    )
    assert res.exit_code == 0 and "s3cret" not in res.output and "PASSWORD99" not in res.output, res.output
    assert "token: '***'" in res.output and "http://admin:***@h:1" in res.output
