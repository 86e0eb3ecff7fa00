"""pvpo.integrations.verl: our search environment and PVPO in verl.

- `pvpo_search` agent loop (`agent_loop.PVPOSearchAgentLoop`): the tag protocol, token-in/token-out,
  our episode rules, retriever client and reward (minus the anchor with `anchors=`);
- `search_tool.PVPOSearchTool`: a native tool for verl's `tool_agent` loop, backed by our retriever
  client (`search_tool.yaml` points it at `pvpo retriever serve`);
- `reward.compute_score`: our rewards (and the anchor) as verl's `custom_reward_function`;
- `estimator.pvpo_advantage`: the `pvpo` advantage estimator, registered by the `verl.plugins`
  entry point (`plugin`);
- `data.verl_rows` / `write_parquet`: our questions as verl's parquet rows, Group Sampling applied.

`config_path(name)` gives a shipped config (`agent_loop.yaml`, `search_tool.yaml`) and
`write_config(name, path, **values)` a copy with values set (the retriever URL, the anchor file).
Exports load on first use: `compute_score`, `verl_rows` and `pvpo_advantage` import no verl.
"""

from pvpo.lazy_exports import lazy_exports

_EXPORTS = {
    "compute_score": "reward",
    "golds_of": "reward",
    "pvpo_advantage": "estimator",
    "register": "estimator",
    "verl_rows": "data",
    "write_parquet": "data",
    "PVPOSearchAgentLoop": "agent_loop",
    "PVPOSearchTool": "search_tool",
    "config_path": "configs",
    "write_config": "configs",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
