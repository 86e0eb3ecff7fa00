"""Our questions as verl's RL dataset rows (the parquet `data.train_files` points at).

A row (verl's `RLHFDataset` hands every column to the agent loop; Search-R1's layout for the
reward): `data_source`, `prompt` (chat messages), `ability`, `reward_model: {style: rule,
ground_truth: {target: [golds]}}`, `extra_info: {uid, index, question, need_tools_kwargs,
tools_kwargs}` and `agent_name` (which registered agent loop runs it). `extra_info.uid` is the
prompt uid PVPO's anchor is keyed by.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pvpo.envs import EpisodeConfig, QAExample, load_dataset
from pvpo.integrations.reference import training_pool
from pvpo.reward import TagProtocol
from pvpo.trainer.reference.group_sampling import Partition

AGENT_LOOP = "pvpo_search"  # ours: the tag protocol (agent_loop.py)
TOOL_AGENT = "tool_agent"  # verl's: tool calling (with search_tool.yaml)

TOOL_INSTRUCTION = (
    "Answer the given question. You can call the search tool to look up facts, as many times as you need. "
    "When you know the answer, give it inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>."
)


def verl_rows(
    examples: str | Path | Sequence[QAExample],
    *,
    agent_name: str = AGENT_LOOP,
    data_source: str = "pvpo",
    protocol: str | TagProtocol = "search_r1",
    prompt_template: str = "default",
    partition: Partition | str | Path | None = None,
    dataset_kwargs: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One verl row per question of `examples` (a registered dataset name, a file, or
    QAExamples), without the prompts a Group Sampling `partition` dropped. For the `pvpo_search`
    agent loop the prompt is our episode's (the protocol's instruction and the question, through
    `prompt_template`); for verl's `tool_agent` it asks for the search tool and an `<answer>`
    block, which `compute_score` reads."""
    config = EpisodeConfig(protocol=protocol, prompt_template=prompt_template)
    rows = []
    for i, ex in enumerate(load_dataset(examples, **dict(dataset_kwargs or {}))):
        if agent_name == TOOL_AGENT:
            content = f"{TOOL_INSTRUCTION} Question: {ex.question.strip()}"
        else:
            content = config.prompt(ex)
        extra_info: dict[str, Any] = {"uid": ex.uid, "index": i, "question": ex.question}
        if agent_name == TOOL_AGENT:  # verl's tool agent creates each tool with its create_kwargs
            extra_info |= {"need_tools_kwargs": True, "tools_kwargs": {"search": {"create_kwargs": {"uid": ex.uid}}}}
        rows.append(
            {
                "data_source": data_source,
                "prompt": [{"role": "user", "content": content}],
                "ability": "search_qa",
                "reward_model": {"style": "rule", "ground_truth": {"target": list(ex.golden_answers)}},
                "extra_info": extra_info,
                "agent_name": agent_name,
            }
        )
    return training_pool(rows, partition, uid=lambda row: row["extra_info"]["uid"])


def write_parquet(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write `verl_rows` to a parquet file (needs pandas and pyarrow, which verl installs)."""
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(list(rows)).to_parquet(path, index=False)
    return path
