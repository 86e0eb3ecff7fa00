"""Token-exact multi-turn trajectories and their collation into padded training tensors.

A trajectory's response interleaves the tokens the policy sampled (loss mask 1, with the
sampler's log-probs) and the environment's observation tokens (loss mask 0, log-prob 0), in the
order they entered the context. The sampled ids are kept exactly as sampled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

# where a model turn's log-probs come from: the engine that sampled it ("sampler"), an endpoint
# that reported them over the policy's tokenization ("endpoint"), a deterministic script (the
# oracle or a dataset's GT: "script", pi = 1), the reference policy's ("reference"), or none ("":
# 0.0 placeholders from an endpoint whose tokens do not line up with the policy's tokenizer)
SOURCES = frozenset({"sampler", "endpoint", "script", "reference", ""})


@dataclass
class Trajectory:
    """One rollout of one prompt: prompt and response token ids, the loss mask (1 = model token,
    0 = env token), the sampler's log-probs, the group uid, the reward and its components, tool
    calls, and whether it is an injected GT trajectory (ratio denominator pi_gt)."""

    uid: str
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    old_logprobs: list[float] = field(default_factory=list)
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    accuracy: float = 0.0
    prediction: str | None = None
    num_tool_calls: int = 0
    num_turns: int = 0
    finish_reason: str = ""
    is_gt: bool = False
    gt_logprobs: list[float] | None = None  # pi_gt of an injected GT trajectory's tokens
    response_text: str = ""
    format_ok: bool = False  # the env's verdict on the response's format
    prompt_tokens: int = 0  # as the sampler counted them (an endpoint's `usage`)
    completion_tokens: int = 0
    # each model turn's response positions [start, end) and the source of its log-probs (SOURCES)
    model_turns: list[tuple[int, int, str]] = field(default_factory=list)
    # per response token, the policy version that sampled it (-1 on env tokens); empty where none
    # was recorded (a trajectory built from stored lists: a GT record)
    versions: list[int] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict, repr=False)  # the env's info at the episode's end

    def append_model(
        self, ids: Sequence[int], logprobs: Sequence[float], source: str = "sampler", *, version: int = 0
    ) -> None:
        """Tokens the policy sampled (trained on), as one model turn whose log-probs come from
        `source` (`SOURCES`), sampled by policy version `version`."""
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} ids but {len(logprobs)} logprobs")
        if source not in SOURCES:
            raise ValueError(f"unknown log-prob source {source!r}; known: {sorted(SOURCES)}")
        start = len(self.response_ids)
        self._pad_versions()
        self.response_ids.extend(int(t) for t in ids)
        self.old_logprobs.extend(float(x) for x in logprobs)
        self.loss_mask.extend([1] * len(ids))
        self.versions.extend([int(version)] * len(ids))
        if ids:
            self.model_turns.append((start, start + len(ids), source))

    @property
    def logprobs_source(self) -> str:
        """The source of every model turn's log-probs when they share one, "mixed" when they
        differ, "" without a recorded turn."""
        sources = {s for _, _, s in self.model_turns}
        return sources.pop() if len(sources) == 1 else ("mixed" if sources else "")

    def append_env(self, ids: Sequence[int]) -> None:
        """Observation tokens from the environment (never trained on)."""
        self._pad_versions()
        self.response_ids.extend(int(t) for t in ids)
        self.old_logprobs.extend([0.0] * len(ids))
        self.loss_mask.extend([0] * len(ids))
        self.versions.extend([-1] * len(ids))

    def _pad_versions(self) -> None:
        """Versions for tokens stored without one (version 0 for model tokens, -1 for env tokens)."""
        missing = len(self.response_ids) - len(self.versions)
        if missing > 0:
            self.versions.extend(0 if m else -1 for m in self.loss_mask[len(self.versions) :])

    @property
    def num_model_tokens(self) -> int:
        return sum(self.loss_mask)

    def check(self) -> None:
        """Raise if the per-token lists disagree in length."""
        n = len(self.response_ids)
        if not (len(self.loss_mask) == len(self.old_logprobs) == n) or len(self.versions) not in (0, n):
            raise ValueError(
                f"{self.uid}: {n} ids, {len(self.loss_mask)} mask, {len(self.old_logprobs)} logprobs, "
                f"{len(self.versions)} versions"
            )


@dataclass
class Batch:
    """Padded tensors for a list of trajectories. `input_ids = prompt + response`, left-padded
    prompts and right-padded responses, so the response always starts at column `prompt_len`."""

    input_ids: torch.Tensor  # [B, P + R]
    attention_mask: torch.Tensor  # [B, P + R]
    position_ids: torch.Tensor  # [B, P + R]
    response_ids: torch.Tensor  # [B, R]
    loss_mask: torch.Tensor  # [B, R] float, 1 = model token
    old_logprobs: torch.Tensor  # [B, R]
    rewards: torch.Tensor  # [B]
    uids: list[str]
    is_gt: torch.Tensor  # [B] bool
    prompt_len: int

    def __len__(self) -> int:
        return len(self.uids)

    def select(self, idx: Sequence[int]) -> Batch:
        """Rows `idx` (a mini-batch); columns keep their meaning."""
        ix = torch.as_tensor(list(idx), dtype=torch.long)
        return Batch(
            self.input_ids[ix],
            self.attention_mask[ix],
            self.position_ids[ix],
            self.response_ids[ix],
            self.loss_mask[ix],
            self.old_logprobs[ix],
            self.rewards[ix],
            [self.uids[i] for i in idx],
            self.is_gt[ix],
            self.prompt_len,
        )

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.position_ids.to(device),
            self.response_ids.to(device),
            self.loss_mask.to(device),
            self.old_logprobs.to(device),
            self.rewards.to(device),
            self.uids,
            self.is_gt.to(device),
            self.prompt_len,
        )


def collate(trajs: Sequence[Trajectory], pad_id: int) -> Batch:
    """Pad a list of trajectories into one Batch (prompt left-padded, response right-padded)."""
    if not trajs:
        raise ValueError("cannot collate an empty list of trajectories")
    for t in trajs:
        t.check()
    p = max(len(t.prompt_ids) for t in trajs)
    r = max(1, max(len(t.response_ids) for t in trajs))
    b = len(trajs)
    input_ids = torch.full((b, p + r), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p + r), dtype=torch.long)
    resp = torch.full((b, r), pad_id, dtype=torch.long)
    mask = torch.zeros((b, r), dtype=torch.float32)
    old = torch.zeros((b, r), dtype=torch.float32)
    for i, t in enumerate(trajs):
        lp, lr = len(t.prompt_ids), len(t.response_ids)
        input_ids[i, p - lp : p] = torch.tensor(t.prompt_ids, dtype=torch.long)
        attn[i, p - lp : p] = 1
        if lr:
            input_ids[i, p : p + lr] = torch.tensor(t.response_ids, dtype=torch.long)
            attn[i, p : p + lr] = 1
            resp[i, :lr] = torch.tensor(t.response_ids, dtype=torch.long)
            mask[i, :lr] = torch.tensor(t.loss_mask, dtype=torch.float32)
            old[i, :lr] = torch.tensor(t.old_logprobs, dtype=torch.float32)
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    return Batch(
        input_ids,
        attn,
        positions,
        resp,
        mask,
        old,
        torch.tensor([t.reward for t in trajs], dtype=torch.float32),
        [t.uid for t in trajs],
        torch.tensor([t.is_gt for t in trajs], dtype=torch.bool),
        p,
    )


def _takes_logits_to_keep(model: torch.nn.Module) -> bool:
    import inspect

    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def response_logits(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Logits `[B, R, V]` that predict each response token (the position before it). Models that
    take `logits_to_keep` (transformers' causal LMs) project only those R positions onto the
    vocabulary: with a 49k-150k vocabulary the prompt's logits would otherwise cost as much as
    the response's (measured: SmolLM2, 2 x 1,024 tokens, prompt 512)."""
    r = batch.input_ids.shape[1] - batch.prompt_len
    extra = {"logits_to_keep": r + 1} if _takes_logits_to_keep(model) else {}
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        **extra,
    )
    logits = out.logits
    return logits[:, -(r + 1) : -1, :]


def summarize(trajs: Sequence[Trajectory]) -> Mapping[str, float]:
    """Rollout metrics: reward, accuracy, lengths, searches, format rate."""
    n = max(1, len(trajs))
    return {
        "reward/mean": sum(t.reward for t in trajs) / n,
        "accuracy": sum(t.accuracy for t in trajs) / n,
        "format_ok": sum(t.reward_components.get("format", 0.0) for t in trajs) / n,
        "response_length": sum(len(t.response_ids) for t in trajs) / n,
        "model_tokens": sum(t.num_model_tokens for t in trajs) / n,
        "searches_per_traj": sum(t.num_tool_calls for t in trajs) / n,
        "turns_per_traj": sum(t.num_turns for t in trajs) / n,
    }
