"""The shipped presets: the Search-R1 recipe loads with Search-R1's limits."""

from __future__ import annotations

from pvpo.trainer.config.schema import load_config


def test_the_search_r1_recipe_loads_with_search_r1s_limits():
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[1] / "configs" / "search_r1_nq_hotpotqa_qwen2.5_3b.yaml"
    cfg = load_config(recipe, ["rollout.engine=hf"])  # the vllm engine needs vLLM installed to validate
    assert (cfg.rollout.n, cfg.rollout.max_turns, cfg.rollout.max_new_tokens, cfg.retriever.topk) == (5, 4, 500, 3)
    assert (cfg.env.prompt_template, cfg.model.dtype, cfg.algorithm.estimator) == ("search_r1", "bfloat16", "pvpo")


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
