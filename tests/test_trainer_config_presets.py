"""The shipped presets: the Search-R1 recipe loads with Search-R1's limits."""

from __future__ import annotations

from pvpo.trainer.config.schema import load_config


def test_the_search_r1_recipe_loads_with_search_r1s_limits():
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[1] / "configs" / "search_r1_nq_hotpotqa_qwen2.5_3b.yaml"
    cfg = load_config(recipe, ["rollout.engine=hf"])  # the vllm engine needs vLLM installed to validate
    assert (cfg.rollout.n, cfg.rollout.max_turns, cfg.rollout.max_new_tokens, cfg.retriever.topk) == (5, 4, 500, 3)
    assert (cfg.env.prompt_template, cfg.model.dtype, cfg.algorithm.estimator) == ("search_r1", "bfloat16", "pvpo")
