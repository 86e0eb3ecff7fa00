"""What an advantage estimator is and what it needs, registered once per estimator.

Every estimator maps one scalar reward per trajectory to advantages with one keyword-only
signature, so the training loop never branches on the algorithm:

    estimate(rewards: Tensor[B], uids: Sequence[str], *, anchors=None, eps=1e-6, **kwargs) -> Tensor[B] or [B, T]

Groups are formed by `uid` (the prompt id), never by position. Extra keywords are accepted and
ignored by estimators that do not use them. Beside the function, an estimator's `EstimatorSpec`
says what the trainer must build for it (reference anchors, a critic, extra rollouts, a per-run
state), the loss aggregation its paper pairs it with, and whether it runs sharded under torchrun.
The trainer asks the spec, never the name.

This module imports nothing heavy: the config validates `algorithm.estimator` against the names
below without importing torch; each estimator's module registers its spec when imported (the
registry imports it on first `get`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pvpo.registry import Registry

if TYPE_CHECKING:
    import torch

    from pvpo.trainer.algorithms.estimator_state import EstimatorContext, EstimatorState


class Estimator(Protocol):
    """An advantage estimator: per-trajectory rewards and group ids in, advantages out."""

    def __call__(
        self,
        rewards: torch.Tensor,
        uids: Sequence[str],
        *,
        anchors: Mapping[str, float] | None = None,
        eps: float = 1e-6,
        **kwargs: Any,
    ) -> torch.Tensor: ...


# The loss aggregation modes (`pvpo.trainer.algorithms.losses` implements them): token-mean (all
# model tokens of the batch weigh the same: DAPO, verl's default), seq-mean-token-mean (each
# sequence weighs the same: the GRPO and PVPO objectives), seq-mean-token-sum-norm (Dr.GRPO:
# each sequence's token sum over a constant length).
AGGREGATION_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


# An estimator's own loss aggregation where its paper pairs it with one other than token-mean; read
# without torch by the config (a preset's aggregation must not silently replace it) and by the
# registration, so the two never disagree.
OWN_AGGREGATION: dict[str, str] = {"dr_grpo": "seq-mean-token-sum-norm"}


# Estimators that take no injected GT rows (Group Sampling), each with the reason; read without
# torch by the config, which refuses `algorithm.group_sampling.enabled` with them before any work.
# Every other estimator defines a GT row's advantage against its group's policy rows
# (docs/deviations.md).
NO_GT_ROWS: dict[str, str] = {
    "ppo": "its critic learns the policy's value and its whitening spans the batch's tokens; a GT "
    "trajectory is no sample of the policy and no paper defines its credit there",
}


# The shipped estimators that sample more rollouts after seeing a prompt's first ones (their spec's
# `extra_rollouts`), read without torch by the config, which refuses them with rows sampled ahead
# of the update (`rollout.max_staleness > 0`): asking the spec imported torch and the estimator's
# module, 9.3 s of the refusal on a loaded 2-core machine. A test holds it equal to the specs.
EXTRA_ROLLOUTS: frozenset[str] = frozenset({"v05", "v05_value"})


def own_aggregation(name: str) -> str:
    """The loss aggregation the estimator `name` is paired with by its paper (`OWN_AGGREGATION`,
    token-mean otherwise)."""
    return OWN_AGGREGATION.get(name, "token-mean")


def check_aggregation(mode: str) -> str:
    """`mode` if it is a loss aggregation mode; a ValueError listing the modes otherwise."""
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; known: {', '.join(AGGREGATION_MODES)}")
    return mode


@dataclass(frozen=True)
class EstimatorSpec:
    """One estimator and everything the trainer needs to know about it.

    - `fn`: the estimator (module docstring's signature).
    - `level`: `outcome` returns `[B]`, `token` returns `[B, T]` (PPO's GAE).
    - `needs_anchors`: the trainer builds PVPO's reference anchor store before step 1 and passes
      `anchors=` (uid -> mean reference reward).
    - `needs_critic` / `extra_rollouts`: informational flags for docs and reports; the per-run
      `state` builds the critic, or samples the extra rollouts, itself.
    - `loss_agg`: the loss aggregation its paper pairs it with (used unless `optim.loss_agg` is set).
    - `sharded`: whether it runs under torchrun (state learned by one process cannot).
    - `state`: `(EstimatorContext) -> EstimatorState`, what the estimator keeps across steps and
      passes beyond rewards, uids and anchors; None = no state (`state.EstimatorState`).
    """

    name: str
    fn: Estimator
    level: Literal["outcome", "token"] = "outcome"
    needs_anchors: bool = False
    needs_critic: bool = False
    extra_rollouts: bool = False
    loss_agg: str = "token-mean"
    sharded: bool = True
    state: Callable[[EstimatorContext], EstimatorState] | None = None

    def __post_init__(self) -> None:
        check_aggregation(self.loss_agg)

    def make_state(self, context: EstimatorContext) -> EstimatorState:
        """This run's state of the estimator (a no-op state when it keeps none)."""
        from pvpo.trainer.algorithms.estimator_state import EstimatorState

        return self.state(context) if self.state is not None else EstimatorState()

    def __call__(self, rewards: torch.Tensor, uids: Sequence[str], **kwargs: Any) -> torch.Tensor:
        return self.fn(rewards, uids, **kwargs)


_MODULE = "pvpo.trainer.algorithms."
_SHIPPED = {
    "grpo": _MODULE + "baselines",
    "dr_grpo": _MODULE + "baselines",
    "rloo": _MODULE + "baselines",
    "pvpo": _MODULE + "baselines",
    "gdpo": _MODULE + "gdpo",
    "v05": _MODULE + "v05",
    "v05_value": _MODULE + "v05",
    "ppo": _MODULE + "gae",
}
ESTIMATORS: Registry[EstimatorSpec] = Registry("advantage estimator", lazy=_SHIPPED)


def register_estimator(
    name: str,
    *,
    level: Literal["outcome", "token"] = "outcome",
    needs_anchors: bool = False,
    needs_critic: bool = False,
    extra_rollouts: bool = False,
    sharded: bool = True,
    state: Callable[[EstimatorContext], EstimatorState] | None = None,
) -> Callable[[Estimator], Estimator]:
    """Decorator: register the decorated estimator under `name` with its spec (`EstimatorSpec`;
    its loss aggregation is `own_aggregation(name)`); the function itself is returned unchanged."""

    def decorate(fn: Estimator) -> Estimator:
        spec = EstimatorSpec(
            name,
            fn,
            level=level,
            needs_anchors=needs_anchors,
            needs_critic=needs_critic,
            extra_rollouts=extra_rollouts,
            loss_agg=own_aggregation(name),
            sharded=sharded,
            state=state,
        )
        ESTIMATORS.register(name, spec)
        return fn

    return decorate


def get_spec(name: str) -> EstimatorSpec:
    """The spec registered as `name`; UnknownNameError listing the known names otherwise."""
    return ESTIMATORS.get(name)


def get_estimator(name: str) -> Estimator:
    """The estimator function registered as `name` (its spec's `fn`)."""
    return ESTIMATORS.get(name).fn


def available_estimators() -> list[str]:
    """Names of all registered estimators, sorted (lazily registered ones included)."""
    return ESTIMATORS.names()


def samples_extra_rollouts(name: str) -> bool:
    """Whether the estimator `name` samples more rollouts after seeing a prompt's first ones: a
    shipped one by `EXTRA_ROLLOUTS` (nothing imported), any other by its registered spec."""
    return name in EXTRA_ROLLOUTS if name in _SHIPPED else get_spec(name).extra_rollouts
