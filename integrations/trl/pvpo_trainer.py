"""PVPO's static anchor in TRL: `PVPOGRPOTrainer`, a `GRPOTrainer` whose advantages are
`r - anchor[uid]` (Feng et al. 2025, arXiv:2508.21104), computed by `pvpo.trainer`'s `pvpo`
estimator from TRL's own rewards.

TRL 1.16 has no hook for a custom advantage: `GRPOTrainer._generate_and_score_completions`
computes `(r - group mean) / std` inline (`scale_rewards` only picks the std). So this subclass
overrides two private methods, checked against TRL 1.16 (hence the `trl>=1.16,<1.17` bound):
`_calculate_rewards` (to keep the gathered per-function rewards) and
`_generate_and_score_completions` (to replace the `advantages` it returns). (Rejected: shaping
the reward as `r - anchor` and setting `scale_rewards="none"`: TRL still subtracts the group mean,
and `(r - a) - mean(r - a) = r - mean(r)`, so the anchor would cancel out.)

The anchor: per prompt uid, the mean reward of M rollouts of the reference policy, which in PVPO
is the initial policy. Give one (`anchors=`: an `anchor.json` of a `pvpo train` run, an
`AnchorStore` or a mapping), or let the trainer build it before its first step
(`anchor_rollouts=M`): it rolls out every training prompt M times through TRL's own generation,
environment and reward path with the untouched initial weights, and saves the result to the
`anchors` path after every batch (an interrupted build resumes). Accuracy per rollout (what Group
Sampling reads) is the episode's exact match with `SearchToolEnv` or `SearchRollout`, else the
reward itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from pvpo.integrations.reference import AnchorSource, Missing, load_anchors, uid_of
from pvpo.integrations.trl.rollout import EM_FIELD
from pvpo.trainer import get_estimator
from pvpo.trainer.reference.anchor import AnchorStore, build_anchor


@dataclass(frozen=True)
class _Prompt:
    """A training row under its uid (what `build_anchor` iterates)."""

    uid: str
    row: Mapping[str, Any]


class PVPOGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` with PVPO's advantage `r - anchor[uid]`, where `r` is the weighted sum of the
    reward sources TRL computed (reward functions and the environment's `get_reward`) and `uid` is
    the row's `uid_column`. Keyword arguments beyond GRPOTrainer's:

    - `anchors`: where the anchor comes from (a file path, an `AnchorStore`, a mapping uid -> value);
      with `anchor_rollouts`, a path is also where the built anchor is saved.
    - `anchor_rollouts`: M > 0 builds the missing anchors before training (see the module doc).
    - `missing`: a uid without an anchor raises (`"error"`) or falls back to its in-batch group
      mean (`"group_mean"`, Dr.GRPO's baseline).

    Training metrics gain `pvpo/anchor_mean` and `pvpo/advantage_mean`. Evaluation keeps TRL's
    advantages (they train nothing)."""

    def __init__(
        self,
        *args: Any,
        anchors: AnchorSource | None = None,
        anchor_rollouts: int = 0,
        uid_column: str = "uid",
        missing: Missing = "error",
        **kwargs: Any,
    ) -> None:
        if missing not in ("error", "group_mean"):
            raise ValueError(f"missing must be 'error' or 'group_mean', got {missing!r}")
        if anchor_rollouts < 0:
            raise ValueError(f"anchor_rollouts must be >= 0, got {anchor_rollouts}")
        if anchors is None and not anchor_rollouts:
            raise ValueError("PVPO needs an anchor: pass anchors=PATH|mapping, or anchor_rollouts=M to build it")
        super().__init__(*args, **kwargs)
        self.uid_column = uid_column
        self.missing: Missing = missing
        self.anchor_rollouts = anchor_rollouts
        self.anchor_store: AnchorStore | None = None
        if anchor_rollouts:
            if isinstance(anchors, Mapping):
                raise ValueError("anchor_rollouts builds into an anchor file or AnchorStore, not a mapping")
            self.anchor_store = anchors if isinstance(anchors, AnchorStore) else AnchorStore(anchors)
            self.anchors = self.anchor_store.values()
        else:
            assert anchors is not None
            self.anchors = load_anchors(anchors)
        self._estimate = get_estimator("pvpo")
        self._last_rewards_per_func: torch.Tensor | None = None
        self._building_anchor = False

    @property
    def _policy(self) -> torch.nn.Module:
        model = self.model
        assert model is not None
        return model

    # ---- the anchor ------------------------------------------------------------------------------
    def train(self, *args: Any, **kwargs: Any) -> Any:
        if self.anchor_rollouts:
            self.build_anchor()
        return super().train(*args, **kwargs)

    def build_anchor(self, *, batch_prompts: int | None = None, show_progress: bool = True) -> AnchorStore:
        """Complete the anchor over the training prompts with M=`anchor_rollouts` rollouts each of
        the current (before training: the initial) policy; `batch_prompts` prompts per generation
        call (default: one generation batch's worth). Returns the store, also kept in `anchors`."""
        if not self.anchor_rollouts or self.anchor_store is None:
            raise ValueError("build_anchor needs PVPOGRPOTrainer(anchor_rollouts=M)")
        if self.accelerator.num_processes > 1:
            raise ValueError(
                "the anchor is built in one process: build it once (e.g. a one-GPU run of this trainer with "
                "max_steps=0 and anchor_rollouts=M), then pass anchors=PATH to the multi-process run"
            )
        dataset: Any = self.train_dataset  # (TRL's annotations are wider than what GRPOTrainer holds)
        if dataset is None:
            raise ValueError("build_anchor needs a train_dataset with a uid column")
        prompts = [_Prompt(uid_of({"uid": row.get(self.uid_column)}), row) for row in dataset]
        args: Any = self.args  # a GRPOConfig
        per_call = batch_prompts or max(1, args.generation_batch_size // self.anchor_rollouts)
        model = self._policy
        was_training = model.training
        model.train()  # the mode TRL samples training rollouts in (and whose metrics we drop after)
        tokens_seen = self.state.num_input_tokens_seen
        self._building_anchor = True
        try:
            build_anchor(
                prompts,
                self._reference_rollouts,
                num_rollouts=self.anchor_rollouts,
                batch_size=per_call,
                store=self.anchor_store,
                source="initial",
                show_progress=show_progress,
            )
        finally:
            self._building_anchor = False
            model.train(was_training)
            self.state.num_input_tokens_seen = tokens_seen
            self._forget_logs()
        self.anchors = self.anchor_store.values()
        return self.anchor_store

    def _reference_rollouts(self, requests: Sequence[_Prompt]) -> list[tuple[str, float, float]]:
        """`build_anchor`'s rollout_fn: one (uid, reward, accuracy) per request, through TRL's own
        generation, environment and reward path."""
        rows = [dict(p.row) for p in requests]
        pad = (-len(rows)) % int(self.num_generations or 1)  # TRL groups its batch by num_generations
        rows += [dict(rows[-1]) for _ in range(pad)]
        with torch.no_grad():
            self._generate_and_score_completions(rows)
        assert self._last_rewards_per_func is not None
        rewards = self._total_rewards(self._last_rewards_per_func)
        envs = self.environments or [None] * len(rows)
        out = []
        for i, p in enumerate(requests):
            reward = float(rewards[i])
            info = getattr(envs[i], "info", None) or {}
            if "metrics" in info:  # a SearchToolEnv's episode
                accuracy = float(info["metrics"]["em"])
            else:  # SearchRollout's field (TRL merged it into the row), else the reward itself
                accuracy = float(rows[i].get(EM_FIELD, reward))
            out.append((p.uid, reward, accuracy))
        return out

    def _forget_logs(self) -> None:
        """Drop the metrics and completion logs the anchor rollouts left (they trained nothing)."""
        self._metrics["train"].clear()
        logs: Any = self._logs  # deques, and defaultdicts of deques
        for value in logs.values():
            if isinstance(value, Mapping):
                for column in value.values():
                    column.clear()
            else:
                value.clear()

    # ---- the advantage ---------------------------------------------------------------------------
    def _calculate_rewards(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        rewards_per_func = super()._calculate_rewards(*args, **kwargs)
        self._last_rewards_per_func = rewards_per_func  # gathered over processes, [B_all, n_funcs]
        return rewards_per_func

    def _total_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """TRL's scalar reward per completion: the weighted sum of its reward sources (NaN = not
        applicable); NaN where no source applied."""
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        total = (rewards_per_func * weights).nansum(dim=1)
        total[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        return total

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        if self._building_anchor or not self._policy.training:
            return output
        assert self._last_rewards_per_func is not None
        rewards = self._total_rewards(self._last_rewards_per_func).double()
        uids = gather_object([uid_of({"uid": x.get(self.uid_column)}) for x in inputs])
        scorable = ~torch.isnan(rewards)
        adv = torch.zeros_like(rewards)
        if bool(scorable.any()):
            keep = scorable.nonzero().flatten().tolist()
            adv[scorable] = self._estimate(
                rewards[scorable], [uids[i] for i in keep], anchors=self.anchors, missing=self.missing
            )
        local = slice(self.accelerator.process_index * len(inputs), (self.accelerator.process_index + 1) * len(inputs))
        output["advantages"] = adv[local].to(dtype=output["advantages"].dtype, device=output["advantages"].device)
        self._replace_logged_advantages(adv)
        present = [self.anchors[u] for u in uids if u in self.anchors]
        metrics = self._metrics["train"]
        metrics["pvpo/anchor_mean"].append(sum(present) / len(present) if present else float("nan"))
        metrics["pvpo/advantage_mean"].append(float(adv.mean()))
        return output

    def _replace_logged_advantages(self, adv: torch.Tensor) -> None:
        """The completions table shows the advantages that trained: PVPO's, not the GRPO ones TRL
        logged for this batch."""
        logged: Any = self._logs["advantages"]  # a deque
        for _ in range(min(len(adv), len(logged))):
            logged.pop()
        logged.extend(adv.tolist())
