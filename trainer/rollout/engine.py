"""The rollout engine interface and its registry.

An engine samples continuations of token-id prompts and reports the log-probability of every
token it sampled. The agent loop owns the turns; an engine only generates one turn at a time, so
the transformers (CPU) and vLLM (GPU) engines are interchangeable through config
(`rollout.engine: hf | vllm`).
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pvpo.registry import Registry

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How one turn is sampled. `stop` strings end a turn and are kept in the output (the model
    produced them); `max_new_tokens` bounds the turn; `repetition_stop` > 0 ends it (finish
    "repetition") once its last that many tokens repeat in a loop (`repetition.ends_in_loop`;
    the transformers engine stops there, the others leave it to the agent loop)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    repetition_stop: int = 0


@dataclass
class Completion:
    """One sampled turn: the token ids exactly as sampled and their log-probs under the sampler;
    `version`: the policy version (optimizer steps behind the weights) that sampled it, set by
    whoever syncs weights while episodes run (`weight_gate.WeightGate`), 0 otherwise."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop string), "eos", "length", or "repetition" (`SamplingConfig.repetition_stop`)
    stop_string: str | None = None
    text: str = field(default="", repr=False)
    version: int = 0

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} tokens but {len(self.logprobs)} logprobs")


@dataclass
class AsyncGenerate:
    """An engine's asynchronous side for one agent-loop run: `await generate(prompt, sampling)`
    samples one turn of one trajectory; `close()` ends the session (stops its scheduler);
    `reset()` drops what the session keeps that the weights computed (a scheduler's saved KV
    prefixes), called after new weights arrive while no turn is in flight."""

    generate: Callable[[Sequence[int], SamplingConfig], Any]
    close: Callable[[], None] = lambda: None
    reset: Callable[[], None] = lambda: None


END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")


def stop_token_ids(tokenizer: Any, model: Any = None) -> frozenset[int]:
    """The ids that end a turn like EOS: the tokenizer's EOS, the model's generation-config EOS
    ids, and the chat template's end-of-turn token where the template writes one."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, (list, tuple)):
        ids.update(int(t) for t in gen_eos)
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        vocab = tokenizer.get_vocab()
        ids.update(int(vocab[t]) for t in END_OF_TURN_TOKENS if t in template and t in vocab)
    return frozenset(ids)


class RolloutEngine(ABC):
    """Generates turns for a batch of prompts; receives the trainer's weights after each step.
    `sampled_tokens` counts the tokens it has sampled, as they come, where the engine counts them
    (the transformers engine): a progress meter reads it while turns are still generating."""

    sampled_tokens: int = 0

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
        from pvpo.trainer.rollout.tick_batching import TickBatcher

        batcher: TickBatcher[tuple[Sequence[int], SamplingConfig], Completion] = TickBatcher(
            lambda reqs: self.generate_each([p for p, _ in reqs], [s for _, s in reqs]), executor
        )

        async def generate(prompt: Sequence[int], sampling: SamplingConfig) -> Completion:
            return await batcher.submit((prompt, sampling))

        return AsyncGenerate(generate)

    @abstractmethod
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the engine sample from `model`'s current weights (in place, no disk round-trip)."""

    def weights_for_sync(self, model: torch.nn.Module) -> Callable[[], None]:
        """`sync_weights(model)` in two parts: what must run in the caller's thread now (a
        collective gathering sharded weights), and the returned call that loads them into the
        engine later, from the thread that runs its turns, between two turns. By default the
        whole sync is the returned call: `model` must keep its weights until it has run."""
        return lambda: self.sync_weights(model)

    def sleep(self) -> None:  # noqa: B027 - optional hook, a no-op for engines that hold no cache
        """Release generation memory (KV cache) while the trainer runs; `wake_up` restores it."""

    def wake_up(self) -> None:  # noqa: B027
        """Re-acquire what `sleep` released."""

    def close(self) -> None:  # noqa: B027
        """Free the engine's resources."""


class WeightsSnapshot:
    """A state dict taken once, read as a module's by `sync_weights` (its `state_dict()`)."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.state


class ViewSyncEngine(RolloutEngine):
    """An engine with its own copy of the weights, fed `view(model)` at each `sync_weights(model)`:
    whole weights gathered from FSDP shards, LoRA adapters merged into the base, ... Everything
    else is the inner engine's."""

    def __init__(self, inner: RolloutEngine, view: Callable[[torch.nn.Module], torch.nn.Module]) -> None:
        self.inner, self.view = inner, view

    @property
    def sampled_tokens(self) -> int:  # type: ignore[override]
        return self.inner.sampled_tokens

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[Completion]:
        return self.inner.generate(prompts, sampling)

    def generate_each(self, prompts: Sequence[Sequence[int]], samplings: Sequence[SamplingConfig]) -> list[Completion]:
        return self.inner.generate_each(prompts, samplings)

    def async_session(self, executor: Executor) -> AsyncGenerate:
        return self.inner.async_session(executor)

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.inner.sync_weights(self.view(model))

    def weights_for_sync(self, model: torch.nn.Module) -> Callable[[], None]:
        """The view's whole state gathered now (a collective under torchrun), loaded later."""
        weights = WeightsSnapshot(self.view(model).state_dict())
        return lambda: self.inner.sync_weights(weights)  # type: ignore[arg-type]

    def sleep(self) -> None:
        self.inner.sleep()

    def wake_up(self) -> None:
        self.inner.wake_up()

    def close(self) -> None:
        self.inner.close()


EngineFactory = Callable[..., RolloutEngine]


@dataclass(frozen=True)
class EngineSpec:
    """One rollout engine: its factory and what it needs from whoever builds it (the trainer's
    setup, `pvpo eval`, torchrun's ranks), so no caller checks an engine's name:

    - `factory`: `(model=..., tokenizer=..., **options) -> RolloutEngine`;
    - `own_weights`: the engine holds its own copy of the weights (loaded from a model folder, or
      copied from the module it is given) and `sync_weights` copies the trainer's into it; False:
      it samples from the module it is given, so a sharded policy gives it an unsharded copy;
    - `loads_folder`: given a model folder, the engine loads the weights itself and the caller
      loads only the tokenizer; False: it is given the loaded module and its tokenizer;
    - `run_dtype`: its `dtype: auto` is the run's compute dtype (a float32 master copy would double
      its memory);
    - `launcher_options`: `llm_kwargs` set under torchrun (each rank's engine joins the ranks'
      launcher instead of starting its own workers);
    - `partial_rollouts`: it takes new weights between two turns while episodes are in flight
      (`rollout.max_staleness > 0`); False: a sync waits until no episode is in flight (one step
      off, `weight_gate`);
    - `copy_options`: the options that make it sample from its own copy of the module it is
      given, which rollouts running beside the update need (the update writes the module);
    - `package` / `install_hint`: the package it needs beyond ours and the fix when it is missing
      (checked at config load with importlib's finder, without importing it)."""

    name: str
    factory: EngineFactory
    own_weights: bool = False
    loads_folder: bool = False
    run_dtype: bool = False
    launcher_options: Mapping[str, Any] = field(default_factory=dict)
    partial_rollouts: bool = False
    copy_options: Mapping[str, Any] = field(default_factory=dict)
    package: str = ""
    install_hint: str = ""

    def __post_init__(self) -> None:
        if self.package and not self.install_hint:
            raise ValueError(
                f"rollout engine {self.name!r} needs {self.package!r}: give the install line (install_hint)"
            )

    def __call__(self, **kwargs: Any) -> RolloutEngine:
        """A new engine from the factory."""
        return self.factory(**kwargs)

    def options(self, options: Mapping[str, Any], *, dtype: str, distributed: bool) -> dict[str, Any]:
        """`options` (a `rollout.<engine>` section) with what the run decides: the dtype when it is
        `auto` and `run_dtype`, the launcher's `llm_kwargs` under torchrun."""
        opts = dict(options)
        if self.run_dtype and opts.get("dtype", "auto") == "auto":
            opts["dtype"] = dtype
        if distributed and self.launcher_options:
            opts["llm_kwargs"] = {**self.launcher_options, **dict(opts.get("llm_kwargs") or {})}
        return opts


# The built-in engines register in their own modules, imported when an engine is first asked for:
# at config load too (`check_engine` reads the spec), so such a module imports neither torch nor
# the engine's package at its top (the vLLM engine's imports vllm when it builds an engine; the
# transformers engine, whose module imports torch, registers from `hf_factory`). A test imports
# each one and checks.
_MODULE = "pvpo.trainer.rollout."
ENGINES: Registry[EngineSpec] = Registry(
    "rollout engine", lazy={"hf": _MODULE + "hf_factory", "vllm": _MODULE + "vllm_engine"}
)


def register_engine(
    name: str,
    *,
    own_weights: bool = False,
    loads_folder: bool = False,
    run_dtype: bool = False,
    launcher_options: Mapping[str, Any] | None = None,
    partial_rollouts: bool = False,
    copy_options: Mapping[str, Any] | None = None,
    package: str = "",
    install_hint: str = "",
) -> Callable[[EngineFactory], EngineFactory]:
    """Decorator: register the decorated factory as the engine `name` with its spec (`EngineSpec`
    says what each argument asks of the caller), so `build_engine(name, ...)` builds it and a
    config naming it is checked at load; the factory itself is returned unchanged."""

    def decorate(factory: EngineFactory) -> EngineFactory:
        spec = EngineSpec(
            name,
            factory,
            own_weights=own_weights,
            loads_folder=loads_folder,
            run_dtype=run_dtype,
            launcher_options=dict(launcher_options or {}),
            partial_rollouts=partial_rollouts,
            copy_options=dict(copy_options or {}),
            package=package,
            install_hint=install_hint,
        )
        ENGINES.register(name, spec)
        return factory

    return decorate


def engine_spec(name: str) -> EngineSpec:
    """The spec registered as `name` (importing the module that registers it, which imports
    neither torch nor the engine's package); UnknownNameError listing the engines otherwise."""
    return ENGINES.get(name)


def available_engines() -> list[str]:
    return ENGINES.names()


AUTO_ENGINE = "auto"  # vllm where the vllm package is installed, hf otherwise
DEFAULT_ENGINE = "hf"  # runs wherever torch does


def check_engine(name: str) -> str:
    """`name` if it is a registered engine whose package is installed (`auto`: `vllm` where vllm
    is installed, else `hf`); UnknownNameError listing the engines, or a ValueError naming the
    install, otherwise. Imports the module that registers the engine (neither torch nor the
    engine's package: `ENGINES`) and builds nothing."""
    if name == AUTO_ENGINE:
        return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    spec = engine_spec(name)
    if spec.package and importlib.util.find_spec(spec.package) is None:
        raise ValueError(spec.install_hint)
    return name


def build_engine(name: str, **kwargs: Any) -> RolloutEngine:
    """Construct a registered engine; unknown names raise UnknownNameError listing the known ones."""
    return ENGINES.get(name).factory(**kwargs)
