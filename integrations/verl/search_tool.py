"""`PVPOSearchTool`: a native verl tool (`verl.tools.base_tool.BaseTool`) searching our retriever,
for verl's `tool_agent` loop. verl 0.9.1 ships no search tool of its own (0.4-0.7's
`verl.tools.search_tool.SearchTool` is gone); this one takes the same config keys and schema
(`retrieval_service_url`, `topk`, `timeout`; a `query_list` argument), so its `search_tool.yaml`
reads like verl's former one, and answers in our passage format (`Doc i(Title: t) text`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pvpo.integrations.verl.requirement import verl_missing

try:
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
except ModuleNotFoundError as err:
    raise verl_missing(err, __name__) from err

from pvpo.envs import format_passages
from pvpo.integrations.verl.clients import shared_client

SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Searches the corpus for passages relevant to each query.",
        "parameters": {
            "type": "object",
            "properties": {
                "query_list": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "A list of fully-formed search queries; the tool returns the top passages of each.",
                }
            },
            "required": ["query_list"],
        },
    },
}


class PVPOSearchTool(BaseTool):
    """`config`: `retrieval_service_url` (our server, one URL or a comma-separated list; default
    $PVPO_RETRIEVER_URL), `topk` (3), `timeout` (30 s), `max_obs_chars` (per query, 2000)."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        self.topk = int(config.get("topk", 3))
        self.max_obs_chars = config.get("max_obs_chars", 2000)
        self.client = shared_client(
            config.get("retrieval_service_url"), topk=self.topk, timeout=float(config.get("timeout", 30.0))
        )
        super().__init__(config, tool_schema or OpenAIFunctionToolSchema.model_validate(SCHEMA))

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        """One retriever call for all the queries; the passages of each query, queries separated by `---`."""
        queries = parameters.get("query_list", parameters.get("query", []))
        queries = [queries] if isinstance(queries, str) else [str(q).strip() for q in queries or []]
        queries = [q for q in queries if q]
        if not queries:
            return (
                ToolResponse(text="No query given: pass query_list, a list of search queries."),
                0.0,
                {"num_queries": 0},
            )
        results = await asyncio.to_thread(self.client.search, queries, self.topk)
        text = "\n---\n".join(format_passages(passages, self.max_obs_chars) for passages in results)
        return ToolResponse(text=text), 0.0, {"num_queries": len(queries), "total_results": sum(map(len, results))}
