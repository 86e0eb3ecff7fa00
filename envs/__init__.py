"""pvpo.envs: the search environment (Gymnasium), its batched form, dataset loaders and the
synthetic multi-hop world.

`import pvpo.envs` registers `pvpo/SearchQA-v0`, so `gymnasium.make("pvpo/SearchQA-v0",
dataset=..., retriever_url=...)` builds a `SearchEnv` and `gymnasium.make_vec(..., num_envs=N)`
a `SearchVectorEnv`. Light to import: no torch, faiss or transformers.
"""

import gymnasium as _gym

from pvpo.envs.corpus import corpus_from_examples, read_corpus, write_corpus
from pvpo.envs.data import Paragraph, QAExample
from pvpo.envs.episode import DEFAULT_PROMPT, Episode, EpisodeConfig, StepResult
from pvpo.envs.loaders import (
    DatasetFormat,
    available_datasets,
    available_formats,
    detect_format,
    iter_examples,
    load_dataset,
    register_dataset,
    register_format,
)
from pvpo.envs.retrieval import format_passages, resolve_retriever
from pvpo.envs.search_env import SearchEnv
from pvpo.envs.spaces import UnicodeText
from pvpo.envs.synthetic import SyntheticWorld, synthetic_world
from pvpo.envs.vector import SearchVectorEnv, info_at

ENV_ID = "pvpo/SearchQA-v0"

if ENV_ID not in _gym.registry:
    _gym.register(
        id=ENV_ID,
        entry_point="pvpo.envs.search_env:SearchEnv",
        vector_entry_point="pvpo.envs.vector:SearchVectorEnv",
    )

__all__ = [
    "DEFAULT_PROMPT",
    "ENV_ID",
    "DatasetFormat",
    "Episode",
    "EpisodeConfig",
    "Paragraph",
    "QAExample",
    "SearchEnv",
    "SearchVectorEnv",
    "StepResult",
    "SyntheticWorld",
    "UnicodeText",
    "available_datasets",
    "available_formats",
    "corpus_from_examples",
    "detect_format",
    "format_passages",
    "info_at",
    "iter_examples",
    "load_dataset",
    "read_corpus",
    "register_dataset",
    "register_format",
    "resolve_retriever",
    "synthetic_world",
    "write_corpus",
]
