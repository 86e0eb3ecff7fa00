"""The verl configs this package ships (`agent_loop.yaml`, `search_tool.yaml`), and copies of them
with values set, since verl reads both as files (`actor_rollout_ref.rollout.agent.
agent_loop_config_path`, `actor_rollout_ref.rollout.multi_turn.tool_config_path`) that Hydra's
command-line overrides do not reach."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CONFIGS = ("agent_loop.yaml", "search_tool.yaml")
# PVPOSearchAgentLoop's keyword arguments (tests check the two agree)
AGENT_LOOP_KEYS = (
    "retriever_url",
    "protocol",
    "reward",
    "reward_params",
    "max_turns",
    "topk",
    "max_obs_chars",
    "anchors",
    "timeout",
)
SEARCH_TOOL_KEYS = ("retrieval_service_url", "topk", "timeout", "max_obs_chars")


def config_path(name: str) -> Path:
    """The path of a shipped verl config, to give verl as it is."""
    if name not in CONFIGS:
        raise ValueError(f"no verl config {name!r}; shipped: {', '.join(CONFIGS)}")
    return Path(__file__).with_name(name)


def write_config(name: str, path: str | Path, **values: Any) -> Path:
    """A copy of the shipped config `name` at `path` with `values` set: for `agent_loop.yaml` the
    `pvpo_search` loop's arguments (`retriever_url`, `anchors`, `reward`, ...), for
    `search_tool.yaml` the tool's config (`retrieval_service_url`, `topk`, ...). Unknown keys are
    refused, naming the known ones."""
    doc = yaml.safe_load(config_path(name).read_text())
    known, target = (
        (AGENT_LOOP_KEYS, doc[0]) if name == "agent_loop.yaml" else (SEARCH_TOOL_KEYS, doc["tools"][0]["config"])
    )
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"{name} has no setting {', '.join(unknown)}; known: {', '.join(known)}")
    target.update({k: str(v) if isinstance(v, Path) else v for k, v in values.items()})
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out
