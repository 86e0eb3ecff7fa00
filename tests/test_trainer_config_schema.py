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
