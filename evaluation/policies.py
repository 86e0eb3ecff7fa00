"""The policies `pvpo eval` runs: a local model through a token engine and the token-exact agent
loop (`TokenPolicy`), or an OpenAI-compatible endpoint with the same loop run on text, client side
(`OpenAIPolicy`).

Both run the one agent loop (`pvpo.trainer.rollout.agent_loop`), asynchronous per trajectory.
`OpenAIPolicy`: each turn the conversation so far is sent with the protocol's stop strings
(`</search>`, `</answer>`); the returned text, with its stop string put back (OpenAI servers strip
it; vLLM also says which one matched in `stop_reason`), is the agent's turn; its episode steps
(the searches of concurrent trajectories meet in one retriever call) and the observation is
appended. Two APIs:

- `completions`: the prompt is plain text, prompt + response so far (for a local checkpoint
  served by vLLM this is the token loop's context as text; there is no chat template);
- `chat`: the question is the user message, each agent turn an assistant message and each
  observation a user message (any chat endpoint, e.g. a hosted model).

Token counts come from the server's `usage`; the response budget counts model tokens only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pvpo.envs.data import QAExample
from pvpo.envs.episode import EpisodeConfig
from pvpo.evaluation.run import EvalError, EvalSettings, Outcome, search_queries
from pvpo.model_catalog import resolve_model_path
from pvpo.retriever.types import Searcher
from pvpo.reward import TagProtocol
from pvpo.trainer.rollout.engine import DEFAULT_ENGINE
from pvpo.trainer.rollout.openai_client import APIS, OpenAIClient

if TYPE_CHECKING:
    from pvpo.trainer.rollout.trajectory import Trajectory


class TokenPolicy:
    """A local model through a rollout engine and the token-exact agent loop."""

    def __init__(self, engine: Any, tokenizer: Any) -> None:
        self.engine, self.tokenizer = engine, tokenizer

    def sampled_tokens(self) -> int:
        """The tokens the engine has sampled so far (read by the progress meter mid-turn)."""
        return int(getattr(self.engine, "sampled_tokens", 0))

    def rollout(
        self,
        examples: Sequence[QAExample],
        searcher: Searcher,
        episode: EpisodeConfig,
        settings: EvalSettings,
        *,
        seed: int,
        indices: Sequence[int] | None = None,
        on_done: Callable[[int, Outcome], None] | None = None,
        on_start: Callable[[int, Any], None] | None = None,
    ) -> list[Outcome]:
        """The token-exact agent loop, at most `settings.batch_size` questions in flight;
        `indices` / `on_done` / `on_start` as in `run_episodes_async`, with each question's Outcome."""
        from pvpo.trainer.rollout.agent_loop import run_agent_loop

        loop = settings.loop(self.tokenizer)
        protocol: TagProtocol = episode.protocol  # type: ignore[assignment]

        def outcome(t: Trajectory) -> Outcome:
            return _outcome(self.tokenizer.decode(t.prompt_ids, skip_special_tokens=False), t, protocol)

        trajs = run_agent_loop(
            self.engine,
            self.tokenizer,
            examples,
            searcher,
            episode,
            loop,
            seed=seed,
            indices=indices,
            on_done=None if on_done is None else lambda i, t: on_done(i, outcome(t)),
            on_start=on_start,
        )
        return [outcome(t) for t in trajs]


def _outcome(prompt: str, t: Trajectory, protocol: TagProtocol) -> Outcome:
    """An evaluation record of trajectory `t`. Prediction and format are the env's (it judges the
    response without its correction messages, as in training)."""
    return Outcome(
        prompt=prompt,
        response=t.response_text,
        prediction=t.prediction,
        format_ok=t.format_ok,
        num_searches=t.num_tool_calls,
        num_queries_cut=int(t.info.get("num_queries_cut", 0)),
        num_turns=t.num_turns,
        prompt_tokens=t.prompt_tokens,
        completion_tokens=t.completion_tokens,
        stop_reason=t.finish_reason,
        queries=search_queries(t.response_text, protocol, t.num_tool_calls),
        passages=[list(found) for found in t.info.get("passages", [])],
    )


def token_policy(
    model: str | Path,
    engine: str = DEFAULT_ENGINE,
    *,
    dtype: str = "auto",
    device: str | None = None,
    batch_size: int = 32,
    engine_options: Mapping[str, Any] | None = None,
) -> TokenPolicy:
    """A local HF folder (ours or any published checkpoint) behind a registered rollout engine,
    built as its `EngineSpec` says (from the folder, or over the loaded module). `dtype="auto"`:
    bfloat16 on CUDA, float32 on CPU."""
    import torch

    from pvpo.registry import UnknownNameError
    from pvpo.trainer.rollout.engine import available_engines, build_engine, engine_spec

    model = resolve_model_path(str(model))  # a catalog name or *.gguf file: its converted folder
    if not Path(model).exists():
        raise EvalError(f"--model {model}: no such folder (a local HF model directory)")
    try:
        spec = engine_spec(engine)
    except UnknownNameError:
        raise EvalError(f"unknown engine {engine!r}; known: {[*available_engines(), 'openai']}") from None
    cuda = torch.cuda.is_available()
    if dtype == "auto":
        dtype = "bfloat16" if cuda else "float32"
    options = dict(engine_options or {})
    if spec.loads_folder:
        from transformers import AutoTokenizer

        from pvpo.trainer.model.policy import check_model_folder

        check_model_folder(model)
        tokenizer = AutoTokenizer.from_pretrained(str(model))
        return TokenPolicy(build_engine(engine, model=str(model), dtype=dtype, **options), tokenizer)
    from pvpo.trainer.model.policy import load_policy

    policy = load_policy(model, dtype=dtype)
    target = device or ("cuda" if cuda else "cpu")
    module: torch.nn.Module = policy.model
    module.to(target)
    eng = build_engine(engine, model=policy.model, tokenizer=policy.tokenizer, micro_batch_size=batch_size, **options)
    return TokenPolicy(eng, policy.tokenizer)


class OpenAIPolicy:
    """An `EvalPolicy` (see `pvpo.evaluation.run`) over an OpenAI-compatible endpoint: the agent
    loop with text turns (`pvpo.trainer.rollout.endpoint_turns`), at most `concurrency` requests
    in flight."""

    def __init__(self, client: OpenAIClient, *, api: str = "completions", concurrency: int = 16) -> None:
        if api not in APIS:
            raise ValueError(f"unknown api {api!r}; known: {list(APIS)}")
        self.client, self.api, self.concurrency = client, api, concurrency

    def rollout(
        self,
        examples: Sequence[QAExample],
        searcher: Searcher,
        episode: EpisodeConfig,
        settings: EvalSettings,
        *,
        seed: int,
        indices: Sequence[int] | None = None,
        on_done: Callable[[int, Outcome], None] | None = None,
        on_start: Callable[[int, Any], None] | None = None,
    ) -> list[Outcome]:
        """The agent loop of `pvpo.trainer.rollout.agent_loop`, on text: the same env, turn limits
        and endings (answer, max turns, EOS without an answer, token budget); `indices` /
        `on_done` / `on_start` as in `run_episodes_async`."""
        from pvpo.trainer.rollout.agent_loop import run_episodes
        from pvpo.trainer.rollout.endpoint_turns import EndpointTurns

        protocol: TagProtocol = episode.protocol  # type: ignore[assignment]
        loop = settings.loop(None)
        trajs = run_episodes(
            lambda _: EndpointTurns(self.client, protocol, api=self.api, concurrency=self.concurrency),
            examples,
            searcher,
            episode,
            loop,
            seed=seed,
            indices=indices,
            on_done=None
            if on_done is None
            else lambda i, t: on_done(i, _outcome(episode.prompt(examples[i]), t, protocol)),
            on_start=on_start,
        )
        return [_outcome(episode.prompt(ex), t, protocol) for ex, t in zip(examples, trajs, strict=True)]
