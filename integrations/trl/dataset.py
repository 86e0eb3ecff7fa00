"""Our questions as a TRL train dataset: conversational prompts plus the columns the environment
(`reset(**row)`) and the PVPO trainer (`uid`) read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pvpo.envs import QAExample, load_dataset
from pvpo.integrations.reference import training_pool
from pvpo.integrations.trl.env import TOOL_INSTRUCTION, tool_prompt
from pvpo.trainer.reference.group_sampling import Partition


def search_rows(
    examples: str | Path | Sequence[QAExample],
    *,
    instruction: str = TOOL_INSTRUCTION,
    partition: Partition | str | Path | None = None,
    dataset_kwargs: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One row per question: `prompt` (a one-message conversation: `instruction`, then the
    question), `uid`, `question`, `golden_answers`. `examples` is a registered dataset name, a
    file, or QAExamples; with a Group Sampling `partition` (a `group_sampling.json` of a `pvpo
    train` run, or a Partition) the prompts it dropped are left out."""
    rows = [
        {
            "prompt": [{"role": "user", "content": tool_prompt(ex.question, instruction)}],
            "uid": ex.uid,
            "question": ex.question,
            "golden_answers": list(ex.golden_answers),
        }
        for ex in load_dataset(examples, **dict(dataset_kwargs or {}))
    ]
    return training_pool(rows, partition)


def search_dataset(
    examples: str | Path | Sequence[QAExample],
    *,
    instruction: str = TOOL_INSTRUCTION,
    partition: Partition | str | Path | None = None,
    dataset_kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """`search_rows` as a `datasets.Dataset` (what `GRPOTrainer(train_dataset=...)` takes)."""
    from datasets import Dataset

    return Dataset.from_list(
        search_rows(examples, instruction=instruction, partition=partition, dataset_kwargs=dataset_kwargs)
    )
