"""The shipped presets: the Search-R1 recipe loads with Search-R1's limits."""

from __future__ import annotations

from pvpo.trainer.config.schema import load_config


def test_the_search_r1_recipe_loads_with_search_r1s_limits():
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[1] / "configs" / "search_r1_nq_hotpotqa_qwen2.5_3b.yaml"
    cfg = load_config(recipe, ["rollout.engine=hf"])  # the vllm engine needs vLLM installed to validate
    assert (cfg.rollout.n, cfg.rollout.max_turns, cfg.rollout.max_new_tokens, cfg.retriever.topk) == (5, 4, 500, 3)
    assert (cfg.env.prompt_template, cfg.model.dtype, cfg.algorithm.estimator) == ("search_r1", "bfloat16", "pvpo")


def test_the_pvpo_paper_preset_resolves_by_name_with_the_papers_method_keys():
    from pvpo.trainer.config.presets import resolve_config

    cfg = load_config(resolve_config("pvpo_paper"), [])
    alg, gs = cfg.algorithm, cfg.algorithm.group_sampling
    assert (cfg.rollout.n, alg.anchor.num_rollouts, alg.estimator, alg.reward) == (5, 5, "pvpo", "pvpo")
    assert (gs.enabled, gs.drop_threshold, gs.gt_threshold, gs.metric) == (True, 1.0, 0.0, "reward")
    assert alg.gt.replace_per_group == 1
    assert (cfg.optim.loss_agg, cfg.optim.clip_low, cfg.optim.clip_high) == ("seq-mean-token-mean", 0.2, 0.2)
    assert (alg.anchor.refresh_every, alg.anchor.refresh_from) == (0, "reference")
    # every key of the preset carries a comment citing the paper or saying why it differs
    path = resolve_config("pvpo_paper")
    for line in path.read_text().splitlines():
        if ":" in line and not line.lstrip().startswith("#") and not line.rstrip().endswith(":"):
            assert "#" in line, line


def test_config_show_prints_the_pvpo_paper_presets_sampling_optimiser_and_limits():
    """Training samples at T = 1.0, top-p 1.0; evaluation at 0.6 / 0.95; lr 1e-6, 8 prompts a step,
    8,192 response tokens, a KL term (arXiv:2508.21104, experimental setup)."""
    import yaml
    from typer.testing import CliRunner

    from pvpo.cli import app

    res = CliRunner().invoke(app, ["config", "show", "--config", "pvpo_paper"])
    assert res.exit_code == 0, res.output
    shown = yaml.safe_load(res.output)
    rollout, run, optim = shown["rollout"], shown["run"], shown["optim"]
    assert (rollout["temperature"], rollout["top_p"]) == (1.0, 1.0)
    assert (run["eval_temperature"], run["eval_top_p"]) == (0.6, 0.95)
    assert optim["lr"] == 1e-6 and optim["kl_coef"] > 0 and optim["kl_estimator"] == "k3"
    assert (shown["data"]["prompts_per_step"], rollout["max_response_tokens"]) == (8, 8192)
    assert shown["algorithm"]["anchor"]["temperature"] is None  # the anchor samples as training does


def test_a_yaml_syntax_error_is_one_line_with_the_file_line_and_column_rc_2(tmp_path):
    from typer.testing import CliRunner

    from pvpo.cli import app

    bad = tmp_path / "bad.yaml"
    bad.write_text("run:\n  steps: 3\nrollout: {n: 4\n")
    res = CliRunner().invoke(app, ["train", "--config", str(bad), "--run-dir", str(tmp_path / "run")])
    assert res.exit_code == 2 and "Traceback" not in res.output and res.output.count("\n") <= 2, res.output
    assert f"{bad}: line 4, column 1: YAML syntax error" in res.output
    assert not (tmp_path / "run").exists()


def test_a_training_dataset_without_questions_is_refused_rc_2(tmp_path):
    from typer.testing import CliRunner

    from pvpo.cli import app

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    res = CliRunner().invoke(
        app, ["train", "--run-dir", str(tmp_path / "run"), f"data.source={empty}", f"data.corpus={empty}"]
    )
    assert res.exit_code == 2 and "empty.jsonl holds no questions" in res.output and "Traceback" not in res.output, (
        res.output
    )


def test_the_real_data_recipe_needs_its_qa_files_and_splits_them_three_ways(tmp_path):
    import pytest

    from pvpo.trainer.config.presets import resolve_config
    from pvpo.trainer.config.schema import ConfigError

    path = resolve_config("real_smollm2_hotpotqa_musique")
    with pytest.raises(ConfigError, match=r"data.corpus=questions indexes the paragraphs of QA files"):
        load_config(path, [])
    cfg = load_config(path, ["data.source=[a/questions.json, b/questions.json]"])
    d, alg = cfg.data, cfg.algorithm
    assert d.source == ["a/questions.json", "b/questions.json"] and d.corpus == "questions"
    assert d.held_out_examples and d.held_out_examples >= 40 and d.warm_start_examples and cfg.model.warm_start_steps
    assert (cfg.model.path, cfg.model.chat_template, cfg.run.eval_base) == ("smollm2-135m-instruct", True, True)
    assert (alg.estimator, alg.group_sampling.enabled, alg.gt.source) == ("pvpo", True, "dataset")


def test_the_pvpo_paper_presets_response_length_can_bind_no_per_turn_cap_stops_it_first():
    from pvpo.trainer.config.presets import resolve_config

    r = load_config(resolve_config("pvpo_paper"), []).rollout
    assert r.max_response_tokens == 8192
    # one turn may generate the whole budget: 8,192 is what ends a long response, not max_new_tokens x turns
    assert r.max_new_tokens >= r.max_response_tokens


def test_a_presets_aggregation_never_silently_replaces_dr_grpos_own():
    import pytest

    from pvpo.trainer.algorithms.spec import get_spec, own_aggregation
    from pvpo.trainer.config.presets import resolve_config
    from pvpo.trainer.config.schema import ConfigError

    preset = resolve_config("pvpo_paper")
    with pytest.raises(
        ConfigError, match=r"dr_grpo aggregates its loss with seq-mean-token-sum-norm.*optim\.loss_agg=null"
    ):
        load_config(preset, ["algorithm.estimator=dr_grpo"])
    # followed when asked, kept when asked
    assert load_config(preset, ["algorithm.estimator=dr_grpo", "optim.loss_agg=null"]).optim.loss_agg is None
    kept = load_config(preset, ["algorithm.estimator=dr_grpo", "optim.loss_agg=seq-mean-token-mean"])
    assert kept.optim.loss_agg == "seq-mean-token-mean"
    # an estimator without an aggregation of its own takes the preset's; the registry agrees with the table
    assert load_config(preset, ["algorithm.estimator=grpo"]).optim.loss_agg == "seq-mean-token-mean"
    assert get_spec("dr_grpo").loss_agg == own_aggregation("dr_grpo") == "seq-mean-token-sum-norm"
