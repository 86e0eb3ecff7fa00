"""A run directory's files, each named here and nowhere else."""

from __future__ import annotations

from pathlib import Path

from pvpo.owned import FolderKind, users_entries

# What a run writes at its top level (RunDir's names below); anything else is a user's file.
RUN_ENTRIES = (
    "config.yaml",
    "metrics.jsonl",
    "tb",
    "checkpoints",
    "initial_policy",
    "warm_start.json",
    "anchor.json",
    "group_sampling.json",
    "gt_cache.json",
    "value_model.json",
    "corpus.jsonl",
    "index",
    "curves.png",
    "summary.md",
    "ranks",
    "held_out.jsonl",
    "held_out",
    "validation.jsonl",
    "held_out_em.json",
    "eval_before.json",
    "episodes.jsonl",
    "optimizer_spill.pt",
)


# A run dir under pvpo's one rule for the folders it writes (`pvpo.owned`): the entries its
# manifest names are the run's, anything else the user's. Its checkpoints/ has a manifest of its
# own, naming each step_NNNNNN as it is written (a user's `step_000002_good` is never pruned), and
# each checkpoint holds only these names: a user's NOTES.md in one is refused by --overwrite.
STEP_KIND = FolderKind(
    "checkpoint", "a checkpoint", frozenset({"policy", "trainer_state.pt", "run_state", "dcp"}), patterns=("rank_*",)
)
STEP_PATTERNS = tuple("step_" + "[0-9]" * n for n in (6, 7, 8))
CHECKPOINT_KIND = FolderKind(
    "checkpoints",
    "checkpoints",
    frozenset({"latest", "best.json"}),
    patterns=STEP_PATTERNS,
    nested=tuple((p, STEP_KIND) for p in STEP_PATTERNS),
)
RUN_KIND = FolderKind("run", "a training run", frozenset(RUN_ENTRIES), nested=(("checkpoints", CHECKPOINT_KIND),))


def foreign_entries(root: str | Path) -> list[str]:
    """Names in `root` that no run wrote (a user's files), sorted; a killed atomic write's
    `.name.*.tmp` / `name.tmp` counts as the run's. In a folder that is not a run, every name."""
    return users_entries(root, RUN_KIND)


class RunDir:
    """The files of a run under `root`. The state files (anchor, Group Sampling partition, GT
    cache, V0.5's value model) are copied into every checkpoint and restored on resume."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @property
    def config(self) -> Path:
        """The resolved config; `--resume` reloads it."""
        return self.root / "config.yaml"

    @property
    def metrics(self) -> Path:
        """One JSON line per step."""
        return self.root / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        """TensorBoard events."""
        return self.root / "tb"

    @property
    def checkpoints(self) -> Path:
        """The checkpoints: `step_NNNNNN/` folders and the `latest` pointer."""
        return self.root / "checkpoints"

    @property
    def initial_policy(self) -> Path:
        """The policy at step 0 (after the warm start): resumes and the reference reload it."""
        return self.root / "initial_policy"

    @property
    def warm_start(self) -> Path:
        """The warm start's losses and questions."""
        return self.root / "warm_start.json"

    @property
    def anchor(self) -> Path:
        """PVPO's reference anchor."""
        return self.root / "anchor.json"

    @property
    def group_sampling(self) -> Path:
        """Group Sampling's partition and its report."""
        return self.root / "group_sampling.json"

    @property
    def gt_cache(self) -> Path:
        """GT trajectories with their pi_gt."""
        return self.root / "gt_cache.json"

    @property
    def value_model(self) -> Path:
        """V0.5's learned prior."""
        return self.root / "value_model.json"

    @property
    def corpus(self) -> Path:
        """The synthetic world's corpus."""
        return self.root / "corpus.jsonl"

    @property
    def episodes(self) -> Path:
        """The episodes each step sampled (`run.keep_episodes` of them, whole groups) and every row's
        reward and advantage, one JSON line per step (`pvpo.trainer.state.episode_log`), for `pvpo view`."""
        return self.root / "episodes.jsonl"

    @property
    def held_out(self) -> Path:
        """The held-out questions of a QA-file run (FlashRAG jsonl), for `pvpo eval` of its policy."""
        return self.root / "held_out.jsonl"

    def held_out_dataset(self, name: str) -> Path:
        """The held-out questions of one dataset (a run over several), `held_out/<name>.jsonl`: `pvpo
        eval --dataset` of each gives the per-dataset columns of the run's table."""
        return self.root / "held_out" / f"{name}.jsonl"

    @property
    def validation(self) -> Path:
        """The validation questions (`data.validation_examples`, FlashRAG jsonl): settings are chosen
        on these, never on the held-out set."""
        return self.root / "validation.jsonl"

    @property
    def held_out_em(self) -> Path:
        """Each held-out question's EM at every evaluation (uids in `held_out.jsonl`'s order), for
        paired comparisons between runs on the same questions."""
        return self.root / "held_out_em.json"

    @property
    def eval_before(self) -> Path:
        """The held-out evaluation before RL's first step (after any warm start): its metrics and
        each question's EM, so a resumed run still compares RL against it."""
        return self.root / "eval_before.json"

    @property
    def optimizer_spill(self) -> Path:
        """The optimizer's state while the policy is evaluated (`optimizer_spill.py`); gone after."""
        return self.root / "optimizer_spill.pt"

    @property
    def index(self) -> Path:
        """The loopback retriever's index."""
        return self.root / "index"

    @property
    def curves(self) -> Path:
        """The demo's plot."""
        return self.root / "curves.png"

    @property
    def summary(self) -> Path:
        """The demo's table."""
        return self.root / "summary.md"

    @property
    def best(self) -> Path:
        """The validation evaluations so far and the best of them (`checkpoints/best.json`: step, EM,
        the checkpoint kept for it); written by a run with `run.eval_every` and a validation split."""
        return self.checkpoints / "best.json"

    def state_files(self) -> list[Path]:
        """The files checkpointed with the weights, so a resume sees them as they were."""
        return [self.anchor, self.group_sampling, self.gt_cache, self.value_model]

    def rank_dir(self, rank: int) -> Path:
        """Where a non-main torchrun rank logs its metrics."""
        return self.root / "ranks" / f"rank_{rank}"
