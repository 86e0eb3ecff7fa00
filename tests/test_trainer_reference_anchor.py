"""Reference anchor store: stats, atomic persistence, resumable build, refresh schedule."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from pvpo import atomic
from pvpo.trainer.algorithms.spec import get_estimator
from pvpo.trainer.reference import anchor as anchor_mod
from pvpo.trainer.reference.anchor import AnchorStat, AnchorStore, build_anchor, needs_refresh


@dataclass(frozen=True)
class Ex:
    uid: str
    p_solve: float  # probability the fake reference policy answers correctly


class FakeRollouts:
    """A seeded stand-in for the reference agent loop; records every call. Reward = accuracy
    (0/1) plus a 0.1 format bonus, so mean reward and accuracy differ."""

    def __init__(self, seed: int = 0, fail_on_call: int | None = None):
        self.rng = random.Random(seed)
        self.calls: list[list[str]] = []
        self.fail_on_call = fail_on_call

    def __call__(self, batch: list[Ex]) -> list[tuple[str, float, float]]:
        self.calls.append([ex.uid for ex in batch])
        if self.fail_on_call is not None and len(self.calls) == self.fail_on_call:
            raise RuntimeError("simulated crash in the middle of the anchor build")
        out = []
        for ex in reversed(batch):  # any order is allowed
            acc = 1.0 if self.rng.random() < ex.p_solve else 0.0
            out.append((ex.uid, acc + 0.1, acc))
        return out

    @property
    def rollouts(self) -> int:
        return sum(len(c) for c in self.calls)


EXAMPLES = [Ex(f"q{i}", p) for i, p in enumerate([0.0, 1.0, 0.5, 0.3, 0.8, 0.0, 1.0])]


def test_update_merges_rollouts_into_running_means():
    s = AnchorStore()
    s.update("q", [1.0, 0.0], [1.0, 0.0])
    # + one more success: rewards [1, 0, 1] -> 2/3, accuracies the same, n = 3
    assert s.update("q", [1.0], [1.0]) == AnchorStat(mean_reward=2 / 3, accuracy=2 / 3, n=3)
    assert "q" in s and "r" not in s
    assert s.get("r") is None
    assert s.values() == {"q": pytest.approx(2 / 3)}
    with pytest.raises(ValueError):
        s.update("q", [1.0], [])


def test_save_load_round_trip_records_step_and_source(tmp_path: Path):
    path = tmp_path / "sub" / "anchor.json"
    s = AnchorStore(path, source="current", computed_at_step=40)
    s.update("a", [0.1, 1.1, 1.1], [0.0, 1.0, 1.0])
    s.update("b", [0.3], [0.0])
    s.save()
    doc = json.loads(path.read_text())
    assert doc["version"] == anchor_mod.FORMAT_VERSION
    assert doc["computed_at_step"] == 40 and doc["source"] == "current"
    loaded = AnchorStore.load(path)
    assert loaded.stats() == s.stats()
    assert loaded.computed_at_step == 40 and loaded.source == "current"
    assert [p.name for p in path.parent.iterdir()] == ["anchor.json"]  # no temp file left behind


def test_save_is_atomic_when_writing_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "anchor.json"
    s = AnchorStore(path)
    s.update("a", [1.0], [1.0])
    s.save()
    before = path.read_bytes()
    s.update("b", [0.0], [0.0])

    def full_disk(fd: int) -> None:  # the new text is in the temporary file, not yet on disk
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "fsync", full_disk)
    with pytest.raises(OSError, match="disk full"):
        s.save()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["anchor.json"]


def test_load_missing_file_and_pathless_save_fail_clearly(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        AnchorStore.load(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="path"):
        AnchorStore().save()


def test_load_rejects_unknown_version(tmp_path: Path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"version": 99, "computed_at_step": 0, "source": "x", "stats": {}}))
    with pytest.raises(ValueError, match="version"):
        AnchorStore.load(path)


@pytest.mark.parametrize(
    ("step", "every", "last", "due"),
    [(100, 0, 0, False), (10, 10, 0, True), (9, 10, 0, False), (25, 10, 10, True), (19, 10, 10, False)],
)
def test_needs_refresh_schedule(step: int, every: int, last: int, due: bool):
    assert needs_refresh(step, every, last) is due


def test_needs_refresh_rejects_negative_interval():
    with pytest.raises(ValueError):
        needs_refresh(5, -1, 0)


def test_build_anchor_runs_m_rollouts_per_prompt_in_batches(tmp_path: Path):
    fake = FakeRollouts(seed=1)
    store = build_anchor(
        EXAMPLES, fake, num_rollouts=4, batch_size=3, store=AnchorStore(tmp_path / "a.json"), show_progress=False
    )
    # 7 prompts in batches of 3 -> 3 calls of 12, 12, 4 rollouts
    assert [len(c) for c in fake.calls] == [12, 12, 4]
    assert all(store[e.uid].n == 4 for e in EXAMPLES)
    assert store["q0"].accuracy == 0.0 and store["q1"].accuracy == 1.0
    assert store["q1"].mean_reward == pytest.approx(1.1)
    assert AnchorStore.load(tmp_path / "a.json").stats() == store.stats()


def test_build_anchor_resumes_after_a_crash_without_redoing_finished_prompts(tmp_path: Path):
    path = tmp_path / "a.json"
    crashing = FakeRollouts(seed=2, fail_on_call=2)
    with pytest.raises(RuntimeError, match="simulated crash"):
        build_anchor(EXAMPLES, crashing, num_rollouts=4, batch_size=3, store=AnchorStore(path), show_progress=False)
    saved = AnchorStore(path)
    assert set(saved) == {"q0", "q1", "q2"}  # the first batch reached disk

    resumed = FakeRollouts(seed=3)
    store = build_anchor(EXAMPLES, resumed, num_rollouts=4, batch_size=3, store=AnchorStore(path), show_progress=False)
    assert resumed.rollouts == 4 * 4  # only q3..q6
    assert not {"q0", "q1", "q2"} & {u for c in resumed.calls for u in c}
    assert store.stats()["q0"] == saved["q0"]
    assert len(store) == 7

    again = FakeRollouts(seed=4)
    build_anchor(EXAMPLES, again, num_rollouts=4, batch_size=3, store=AnchorStore(path), show_progress=False)
    assert again.calls == []


def test_build_anchor_tops_up_prompts_with_too_few_rollouts():
    store = AnchorStore()
    store.update("q2", [1.1], [1.0])
    fake = FakeRollouts(seed=5)
    build_anchor([EXAMPLES[2]], fake, num_rollouts=3, batch_size=8, store=store, show_progress=False)
    assert fake.calls == [["q2", "q2"]]
    assert store["q2"].n == 3


def test_build_anchor_for_a_new_step_or_source_starts_over(tmp_path: Path):
    path = tmp_path / "a.json"
    build_anchor(
        EXAMPLES[:2], FakeRollouts(), num_rollouts=2, batch_size=4, store=AnchorStore(path), step=0, show_progress=False
    )
    refresh = FakeRollouts(seed=9)
    store = build_anchor(
        EXAMPLES[:2],
        refresh,
        num_rollouts=2,
        batch_size=4,
        store=AnchorStore(path),
        step=50,
        source="current",
        show_progress=False,
    )
    assert refresh.rollouts == 4
    assert store.computed_at_step == 50 and store.source == "current"
    on_disk = AnchorStore.load(path)
    assert on_disk.computed_at_step == 50 and on_disk.source == "current" and len(on_disk) == 2


def test_build_anchor_rejects_uids_outside_the_batch():
    def wrong(batch: list[Ex]) -> list[tuple[str, float, float]]:
        return [("stranger", 1.0, 1.0)]

    with pytest.raises(ValueError, match="stranger"):
        build_anchor(EXAMPLES[:1], wrong, num_rollouts=1, batch_size=1, store=AnchorStore(), show_progress=False)


def test_built_anchor_feeds_the_pvpo_estimator():
    store = build_anchor(
        EXAMPLES, FakeRollouts(seed=6), num_rollouts=8, batch_size=4, store=AnchorStore(), show_progress=False
    )
    uids = ["q0", "q0", "q1", "q1"]
    adv = get_estimator("pvpo")(torch.tensor([0.1, 1.1, 1.1, 0.1]), uids, anchors=store.values())
    # q0 never solved (anchor 0.1), q1 always solved (anchor 1.1)
    torch.testing.assert_close(adv, torch.tensor([0.0, 1.0, 0.0, -1.0]))
