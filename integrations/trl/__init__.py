"""pvpo.integrations.trl: our search environment and PVPO's static anchor in TRL's `GRPOTrainer`.

Tool calling (`environment_factory=SearchEnvFactory(...)`: `search` and `answer` tools) or the tag
protocol (`rollout_func=SearchRollout(...)`, `reward_funcs=search_reward`: `<search>` / `<answer>`
in plain text, as Search-R1); either with `PVPOGRPOTrainer` for PVPO's advantage.

    from pvpo.integrations.trl import PVPOGRPOTrainer, SearchEnvFactory, search_dataset

    env = SearchEnvFactory(retriever_url="http://127.0.0.1:8000", reward="pvpo")
    trainer = GRPOTrainer(model, args=GRPOConfig(...), train_dataset=search_dataset("synthetic"),
                          environment_factory=env)           # or PVPOGRPOTrainer(..., anchor_rollouts=5)

Exports load on first use: `PVPOGRPOTrainer` imports trl, `SearchRollout` torch; the rest neither.
"""

from pvpo.lazy_exports import lazy_exports

_EXPORTS = {
    "SearchEnvFactory": "env",
    "SearchToolEnv": "env",
    "TOOL_INSTRUCTION": "env",
    "tool_prompt": "env",
    "search_dataset": "dataset",
    "search_rows": "dataset",
    "SearchRollout": "rollout",
    "search_reward": "rollout",
    "PVPOGRPOTrainer": "pvpo_trainer",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
