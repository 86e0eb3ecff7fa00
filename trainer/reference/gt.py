"""Ground-truth (GT) trajectories for Group Sampling's never-solved prompts (PVPO, arXiv:2508.21104).

A GT source writes a correct trajectory for a prompt; the trainer injects it into that prompt's
groups with its own per-token probabilities, pi_gt, as the PPO ratio's denominator. Sources are
registered by name (`algorithm.gt.source`):

- `oracle`: the synthetic world's oracle trajectory, replayed through the env (offline). The
  oracle is deterministic, so under it every token it wrote has probability 1: pi_gt = 1 (log 0)
  with `gt.logprobs: source`. The ratio pi_theta / pi_gt is then pi_theta itself, never above 1,
  so the clip never stops a GT token from being pushed up; `gt.logprobs: reference` uses the frozen
  initial policy instead (ratio 1 at the start, clipped once the policy exceeds it by 1+eps).
- `model`: PVPO's "larger model" (the paper used Qwen2.5-72B-Instruct). A local HF folder runs the
  agent loop through our engines, token-exact, its sampled log-probs are pi_gt (its tokenizer must
  be the policy's); an OpenAI-compatible chat endpoint runs the same turns as text, which are
  tokenized with the policy's tokenizer, so pi_gt must be the reference policy's
  (`gt.logprobs: reference`): the endpoint's own log-probs are over another tokenization.

Only trajectories whose reward reaches `gt.min_reward` (correct and well formed under the run's
reward) are kept; a source gets `gt.attempts` tries per prompt. Trajectories are cached in the run
dir (`gt_cache.json`: token ids, loss mask, pi_gt log-probs, reward), so a resumed run recomputes
nothing, and a prompt that exhausted its attempts is remembered as failed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pvpo.envs.data import QAExample
from pvpo.envs.episode import EpisodeConfig
from pvpo.envs.vector import info_at
from pvpo.registry import Registry
from pvpo.retriever.types import Searcher
from pvpo.trainer.rollout.agent_loop import LoopConfig, prompt_ids, run_agent_loop, vector_env
from pvpo.trainer.rollout.trajectory import Trajectory

FORMAT_VERSION = 1


@dataclass
class GTContext:
    """What a source needs from the run: the policy's tokenizer, the env's rules and retriever,
    the loop limits, and the synthetic world (for `oracle`)."""

    tokenizer: Any
    searcher: Searcher
    episode_config: EpisodeConfig
    loop: LoopConfig
    world: Any = None


class GTSource(Protocol):
    """Writes one trajectory per example (None where it produced nothing), `attempt` 0, 1, ...;
    a `deterministic` source writes the same every time, so it gets one attempt."""

    deterministic: bool

    def generate(self, examples: Sequence[QAExample], *, attempt: int) -> list[Trajectory | None]: ...

    def close(self) -> None: ...


SourceFactory = Callable[[Any, GTContext], GTSource]
GT_SOURCES: Registry[SourceFactory] = Registry("GT source")


def register_gt_source(name: str) -> Callable[[SourceFactory], SourceFactory]:
    """Make a GT source factory `(gt_config, context) -> GTSource` available by name."""
    return GT_SOURCES.register(name)


def available_gt_sources() -> list[str]:
    return GT_SOURCES.names()


def build_gt_source(name: str, gt_config: Any, context: GTContext) -> GTSource:
    """The registered source `name`; UnknownNameError listing the known ones otherwise."""
    return GT_SOURCES.get(name)(gt_config, context)


# ---------------------------------------------------------------------------------------------
# Sources


class OracleSource:
    """The synthetic world's oracle, replayed through the env: observations are the env's own."""

    deterministic = True

    def __init__(self, context: GTContext) -> None:
        if context.world is None:
            raise ValueError("algorithm.gt.source=oracle needs the synthetic world (data.source: synthetic); "
                             "use gt.source=model for a real dataset")  # fmt: skip
        self.ctx = context

    def generate(self, examples: Sequence[QAExample], *, attempt: int) -> list[Trajectory | None]:
        from pvpo.trainer.model.warmstart import oracle_trajectories

        c = self.ctx
        protocol = c.episode_config.tag_protocol
        return list(oracle_trajectories(examples, lambda ex: c.world.oracle_trajectory(ex, protocol), c.tokenizer,
                                        c.searcher, c.episode_config, chat_template=c.loop.chat_template, eos=False))  # fmt: skip

    def close(self) -> None:
        return None


class LocalModelSource:
    """A local HF causal LM running our agent loop (token-exact); its log-probs are pi_gt."""

    deterministic = False

    def __init__(self, gt_config: Any, context: GTContext) -> None:
        from pvpo.trainer.model.policy import load_policy
        from pvpo.trainer.rollout.engine import build_engine

        m = gt_config.model
        policy = load_policy(m.path)
        if policy.tokenizer.get_vocab() != context.tokenizer.get_vocab():
            raise ValueError(f"gt.model.path={m.path}: its tokenizer differs from the policy's, so its trajectories "
                             "cannot be replayed token-exact; use a model of the same family, or an endpoint "
                             "(gt.model.base_url) with gt.logprobs=reference")  # fmt: skip
        self.ctx, self.temperature = context, m.temperature
        self.engine = build_engine(m.engine, model=policy.model, tokenizer=policy.tokenizer)

    def generate(self, examples: Sequence[QAExample], *, attempt: int) -> list[Trajectory | None]:
        from dataclasses import replace

        c = self.ctx
        loop = replace(c.loop, temperature=self.temperature, top_p=1.0)
        return list(run_agent_loop(self.engine, c.tokenizer, examples, c.searcher, c.episode_config, loop,
                                   seed=1_000_003 * (attempt + 1)))  # fmt: skip

    def close(self) -> None:
        self.engine.close()


class EndpointSource:
    """An OpenAI-compatible chat endpoint running the turns as text, client side: each turn stops
    at the protocol's stop strings (which the server strips and we put back), the env's reply goes
    back as the next user message. The text is tokenized with the policy's tokenizer."""

    deterministic = False

    def __init__(self, gt_config: Any, context: GTContext) -> None:
        from pvpo.trainer.rollout.openai_client import OpenAIClient

        m = gt_config.model
        if gt_config.logprobs != "reference":
            raise ValueError("gt.model.base_url: an endpoint's log-probs are over its own tokenization; "
                             "set algorithm.gt.logprobs=reference")  # fmt: skip
        self.ctx, self.cfg = context, m
        self.client = OpenAIClient(
            m.base_url, m.model, api_key=os.environ.get(m.api_key_env) or None, timeout=m.timeout_s
        )

    def _chat(self, messages: list[dict[str, str]], seed: int) -> str:
        from pvpo.trainer.rollout.openai_client import restore_stop

        c, p = self.cfg, self.ctx.episode_config.tag_protocol
        body = {"messages": messages, "temperature": c.temperature, "seed": seed,
                "max_tokens": self.ctx.loop.max_new_tokens, "stop": list(p.stop_strings)}  # fmt: skip
        choice = self.client.post("chat/completions", body)["choices"][0]
        text, _ = restore_stop(
            choice["message"]["content"] or "", choice.get("finish_reason"), choice.get("stop_reason"), p
        )
        return text

    def generate(self, examples: Sequence[QAExample], *, attempt: int) -> list[Trajectory | None]:
        c = self.ctx
        env = vector_env(c.searcher, c.episode_config, 1)
        out: list[Trajectory | None] = []
        try:
            for k, ex in enumerate(examples):
                prompts, _ = env.reset(options={"questions": [ex]})
                traj = Trajectory(ex.uid, prompt_ids(c.tokenizer, prompts[0], chat_template=c.loop.chat_template))
                messages = [{"role": "user", "content": prompts[0]}]
                for _ in range(c.loop.max_turns):
                    text = self._chat(messages, seed=attempt * 100_003 + k)
                    ids = list(c.tokenizer.encode(text, add_special_tokens=False))
                    traj.append_model(ids, [0.0] * len(ids))
                    traj.response_text += text
                    traj.num_turns += 1
                    obs, rewards, terminated, truncated, infos = env.step([text])
                    info = info_at(infos, 0)
                    traj.num_tool_calls = int(info.get("num_searches", 0))
                    if terminated[0] or truncated[0]:
                        traj.reward, traj.prediction = float(rewards[0]), info.get("prediction")
                        traj.accuracy = float(info.get("metrics", {}).get("em", 0.0))
                        break
                    traj.append_env(list(c.tokenizer.encode(obs[0], add_special_tokens=False)))
                    traj.response_text += obs[0]
                    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": obs[0]}]
                out.append(traj)
        finally:
            env.close()
        return out

    def close(self) -> None:
        self.client.close()


@register_gt_source("oracle")
def _oracle(gt_config: Any, context: GTContext) -> GTSource:
    return OracleSource(context)


@register_gt_source("model")
def _model(gt_config: Any, context: GTContext) -> GTSource:
    if gt_config.model.path:
        return LocalModelSource(gt_config, context)
    if gt_config.model.base_url:
        return EndpointSource(gt_config, context)
    raise ValueError("algorithm.gt.source=model needs gt.model.path (a local HF folder) or gt.model.base_url")


# ---------------------------------------------------------------------------------------------
# Cache


@dataclass
class GTRecord:
    """One cached GT trajectory: ids, loss mask and pi_gt per response token, and its outcome."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    gt_logprobs: list[float]
    reward: float
    accuracy: float
    prediction: str | None
    num_tool_calls: int
    num_turns: int
    reward_components: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_trajectory(cls, t: Trajectory) -> GTRecord:
        return cls(list(t.prompt_ids), list(t.response_ids), list(t.loss_mask), list(t.old_logprobs), t.reward,
                   t.accuracy, t.prediction, t.num_tool_calls, t.num_turns, dict(t.reward_components))  # fmt: skip

    def trajectory(self, uid: str) -> Trajectory:
        """A fresh injected trajectory: `is_gt`, with pi_gt as its ratio denominator."""
        return Trajectory(uid, list(self.prompt_ids), list(self.response_ids), list(self.loss_mask), list(self.gt_logprobs),
                          self.reward, dict(self.reward_components), self.accuracy, self.prediction, self.num_tool_calls,
                          self.num_turns, "gt", is_gt=True, gt_logprobs=list(self.gt_logprobs))  # fmt: skip


class GTCache:
    """uid -> GTRecord, plus the uids a source failed on, in a JSON file written atomically."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.records: dict[str, GTRecord] = {}
        self.failed: dict[str, int] = {}  # uid -> attempts spent
        if self.path is not None and self.path.exists():
            doc = json.loads(self.path.read_text())
            if doc.get("version") != FORMAT_VERSION:
                raise ValueError(f"{self.path}: GT cache version {doc.get('version')!r}, expected {FORMAT_VERSION}")
            self.records = {u: GTRecord(**r) for u, r in doc["records"].items()}
            self.failed = {u: int(n) for u, n in doc.get("failed", {}).items()}

    def __contains__(self, uid: object) -> bool:
        return uid in self.records

    def __len__(self) -> int:
        return len(self.records)

    def save(self) -> None:
        from pvpo.trainer.state.checkpoint import atomic_write_text

        if self.path is None:
            return
        doc = {
            "version": FORMAT_VERSION,
            "records": {u: asdict(r) for u, r in self.records.items()},
            "failed": self.failed,
        }
        atomic_write_text(self.path, json.dumps(doc))


def fetch_gt(
    examples: Sequence[QAExample],
    source: GTSource,
    cache: GTCache,
    *,
    attempts: int,
    min_reward: float,
    on_generated: Callable[[list[Trajectory]], None] | None = None,
    set_logprobs: Callable[[list[Trajectory]], None] | None = None,
) -> dict[str, float]:
    """Fill `cache` for every example that has no GT trajectory yet (and has not failed before):
    up to `attempts` tries each, keeping the first whose reward reaches `min_reward`.
    `on_generated` sees every trajectory the source wrote (cost accounting); `set_logprobs`
    replaces the kept ones' `old_logprobs` with pi_gt when pi_gt is not the source's own.
    Returns `gt/*` counts of this call."""
    pending = [
        ex for ex in dict((e.uid, e) for e in examples).values() if ex.uid not in cache and ex.uid not in cache.failed
    ]
    asked = len(pending)
    kept: list[tuple[str, Trajectory]] = []
    tries = 0
    attempts = 1 if getattr(source, "deterministic", False) else attempts
    for attempt in range(attempts):
        if not pending:
            break
        trajs = source.generate(pending, attempt=attempt)
        tries += len(pending)
        made = [t for t in trajs if t is not None]
        if on_generated is not None:
            on_generated(made)
        good = {
            ex.uid: t for ex, t in zip(pending, trajs, strict=True) if t is not None and t.reward >= min_reward - 1e-9
        }
        kept += list(good.items())
        pending = [ex for ex in pending if ex.uid not in good]
    if set_logprobs is not None and kept:
        set_logprobs([t for _, t in kept])
    for uid, t in kept:
        t.check()
        cache.records[uid] = GTRecord.from_trajectory(t)
    for ex in pending:
        cache.failed[ex.uid] = attempts
    cache.save()
    return {"gt/asked": float(asked), "gt/generated": float(len(kept)), "gt/failed": float(len(pending)), "gt/attempts": float(tries),
            "gt/cached": float(len(cache))}  # fmt: skip
