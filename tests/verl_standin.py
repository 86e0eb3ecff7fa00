"""A minimal stand-in for the part of verl 0.9.1's interface our adapter uses, for machines where
verl cannot be installed beside our pins (it needs transformers < 5.11; see docs/guides/integrations.md). It
holds what the adapter relies on and nothing more, written from verl's documented contract:

- `verl.trainer.ppo.core_algos`: `register_adv_est(name)` (a decorator; re-registering the same
  function is a no-op, another one under a taken name a ValueError), `get_adv_estimator_fn(name)`
  (ValueError for an unknown name), `ADV_ESTIMATOR_REGISTRY`;
- `verl.experimental.agent_loop.agent_loop`: `AgentLoopBase` (constructed with `trainer_config`,
  `server_manager`, `tokenizer`, `processor`, `dataset_cls`, `data_config`; `config`,
  `rollout_config`; `ct_build_initial_tokens(messages)`: the chat template with the generation
  prompt, capped at `rollout.prompt_length`), `AgentLoopOutput`, `AgentLoopMetrics`,
  `register(name)` and `_agent_loop_registry`;
- `verl.tools.base_tool.BaseTool(config, tool_schema)` and `verl.tools.schemas`
  (`OpenAIFunctionToolSchema`, `ToolResponse`).

The tests that use it run unchanged against the real verl where it is importable
(`tests/test_integrations_verl.py`, fixture `verl_api`; `make test-verl`).
"""

from __future__ import annotations

import asyncio
import types
from typing import Any

from pydantic import BaseModel


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


def core_algos() -> types.ModuleType:
    registry: dict[str, Any] = {}

    def register_adv_est(name: Any) -> Any:
        key = getattr(name, "value", name)

        def decorator(fn: Any) -> Any:
            if key in registry and registry[key] is not fn:
                raise ValueError(f"Adv estimator {key} has already been registered")
            registry[key] = fn
            return fn

        return decorator

    def get_adv_estimator_fn(name: Any) -> Any:
        key = getattr(name, "value", name)
        if key not in registry:
            raise ValueError(f"Unknown advantage estimator: {key}")
        return registry[key]

    return _module(
        "verl.trainer.ppo.core_algos",
        ADV_ESTIMATOR_REGISTRY=registry,
        register_adv_est=register_adv_est,
        get_adv_estimator_fn=get_adv_estimator_fn,
    )


class AgentLoopMetrics(BaseModel):
    generate_sequences: float = 0.0
    tool_calls: float = 0.0
    compute_score: float = 0.0
    num_preempted: int = -1


class AgentLoopOutput(BaseModel):
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    reward_score: float | None = None
    num_turns: int = 0
    metrics: AgentLoopMetrics
    extra_fields: dict[str, Any] = {}


class AgentLoopBase:
    def __init__(
        self,
        trainer_config: Any,
        server_manager: Any,
        tokenizer: Any,
        processor: Any,
        dataset_cls: Any,
        data_config: Any,
        **kwargs: Any,
    ) -> None:
        self.config = trainer_config.config
        self.rollout_config = self.config.actor_rollout_ref.rollout
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor
        self.data_config = data_config.config
        self.loop = asyncio.get_event_loop()  # as verl's base: a subclass must not reuse the name

    async def ct_build_initial_tokens(self, messages: list[dict], tools: Any = None, **kwargs: Any) -> list[int]:
        def build() -> list[int]:
            text = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
            return self.tokenizer.encode(text, add_special_tokens=False)[-self.rollout_config.prompt_length :]

        return await self.loop.run_in_executor(None, build)  # verl builds the prompt off the event loop


def agent_loop_module() -> types.ModuleType:
    registry: dict[str, dict] = {}

    def register(agent_name: str) -> Any:
        def decorator(cls: type) -> type:
            registry[agent_name] = {"_target_": f"{cls.__module__}.{cls.__qualname__}"}
            return cls

        return decorator

    return _module(
        "verl.experimental.agent_loop.agent_loop",
        AgentLoopBase=AgentLoopBase,
        AgentLoopOutput=AgentLoopOutput,
        AgentLoopMetrics=AgentLoopMetrics,
        register=register,
        _agent_loop_registry=registry,
    )


class FunctionSchema(BaseModel):
    name: str
    description: str = ""
    parameters: dict[str, Any] = {}


class OpenAIFunctionToolSchema(BaseModel):
    type: str
    function: FunctionSchema


class ToolResponse(BaseModel):
    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None


class BaseTool:
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema) -> None:
        self.config = config
        self.tool_schema = tool_schema
        self.name = tool_schema.function.name


PACKAGES = (
    "verl",
    "verl.trainer",
    "verl.trainer.ppo",
    "verl.experimental",
    "verl.experimental.agent_loop",
    "verl.tools",
)


def modules() -> dict[str, types.ModuleType]:
    """The stand-in modules by name, to put in sys.modules."""
    out = {name: _module(name, __path__=[]) for name in PACKAGES}
    out["verl.trainer.ppo.core_algos"] = core_algos()
    out["verl.experimental.agent_loop.agent_loop"] = agent_loop_module()
    out["verl.tools.base_tool"] = _module("verl.tools.base_tool", BaseTool=BaseTool)
    out["verl.tools.schemas"] = _module(
        "verl.tools.schemas", OpenAIFunctionToolSchema=OpenAIFunctionToolSchema, ToolResponse=ToolResponse
    )
    for name, mod in out.items():  # each submodule an attribute of its package, as import makes it
        parent, _, child = name.rpartition(".")
        if parent in out:
            setattr(out[parent], child, mod)
    return out
