"""GT trajectories under torchrun: a GT source whose `generate` is a collective (each rank writes
its share, every rank gets them all), so the ranks share one GT set."""

from __future__ import annotations

from collections.abc import Sequence

from pvpo.envs.data import QAExample
from pvpo.trainer.parallel import distributed as ddp
from pvpo.trainer.reference.gt_registry import GTSource
from pvpo.trainer.rollout.trajectory import Trajectory


class ShardedGTSource:
    """A GT source whose `generate` is a collective: each rank writes the trajectories of its
    contiguous share of `examples` and every rank returns all of them, in `examples`' order."""

    def __init__(self, inner: GTSource) -> None:
        self.inner = inner
        self.deterministic = inner.deterministic

    def generate(self, examples: Sequence[QAExample], *, attempt: int) -> list[Trajectory | None]:
        mine = ddp.rank_share(examples)
        got = list(self.inner.generate(mine, attempt=attempt)) if mine else []
        return [t for part in ddp.all_gather_objects(got) for t in part]

    def close(self) -> None:
        self.inner.close()


def shared_gt_source(source: GTSource) -> GTSource:
    """`source` itself in a single process; under torchrun its `ShardedGTSource`."""
    return ShardedGTSource(source) if ddp.is_distributed() else source
