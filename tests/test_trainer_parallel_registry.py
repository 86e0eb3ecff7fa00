"""Every estimator in the registry and every config under configs/ under torchrun: each registered
estimator, its state built as the trainer builds it, gives on two gloo ranks (each holding whole
prompt groups of the batch, as `ddp.rank_share` deals them) the advantages one process gives on
the whole batch, for two steps (its extra rollouts, what it learns after a step, GT rows among
the policy's); one registered as not running sharded is refused in one line naming the key and
what runs instead; and every shipped config passes the torchrun checks at a world size of 2. A new
estimator or config is checked here without being named."""

from __future__ import annotations

import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from parallel_support import on_gloo_ranks, tiny_qwen2

from pvpo.trainer.algorithms.spec import NO_GT_ROWS, available_estimators, get_spec
from pvpo.trainer.rollout.trajectory import Trajectory, collate

WORLD = 2
REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.name for p in (REPO / "configs").glob("*.yaml"))
# what a config needs on the command line to validate here (its header's command gives it)
ARGS = {
    "first_agent.yaml": ["data.source=[hotpotqa/train.jsonl]"],
    "real_smollm2_hotpotqa_musique.yaml": ["data.source=[a/questions.json, b/questions.json]"],
    "real_smollm2_multihop.yaml": [
        "data.source=[hotpotqa_hard/questions.jsonl, 2wikimultihopqa/questions.jsonl, musique_dev/questions.jsonl]"
    ],
    "search_r1_nq_hotpotqa_qwen2.5_3b.yaml": ["rollout.engine=hf"],  # the vllm engine validates with vLLM installed
}
PROMPTS = 4  # per step; rank 0 holds prompts 0-2, rank 1 prompt 3 (whole groups, unevenly)
N = 2  # rollouts per prompt


def _unit(*parts: object) -> float:
    """A value in [0, 1) fixed by `parts` (the same in every process)."""
    return zlib.crc32(repr(parts).encode()) % 1000 / 1000


def _trajectory(uid: str, key: str, *, gt: bool = False) -> Trajectory:
    t = Trajectory(uid=uid, prompt_ids=[1, 2, 3], is_gt=gt, prediction=f"{uid}/{key}")  # its identity
    k = 2 + int(_unit("len", uid, key) * 8)
    t.append_model(
        [1 + int(_unit("tok", uid, key, i) * 60) for i in range(k)], [-_unit("lp", uid, key, i) for i in range(k)]
    )
    t.append_env([7, 8])
    t.append_model([9, 10], [-0.1, -0.2])
    t.reward_components = {"em": float(_unit("em", uid, key) > 0.5), "format": float(_unit("fmt", uid, key) > 0.3)}
    t.reward = t.reward_components["em"] + 0.1 * t.reward_components["format"]
    return t


def _embed(_encoder: str | None):
    def embed(texts):
        return np.stack([np.array([_unit("e", t, i) for i in range(4)], dtype=np.float32) for t in texts])

    return embed


def _steps(name: str, parallel, value_model_path: Path, prompts: list[int]) -> list[dict]:
    """Two steps of estimator `name` on `prompts` (indices into each step's PROMPTS): the first
    rollouts (prompt 1's group is one rollout and one GT row, as Group Sampling injects it, except
    for an estimator that takes no GT rows: `spec.NO_GT_ROWS`), the
    state's extra rollouts, the estimator call and what the state learns; each trajectory's
    advantages (its model tokens' for a token-level estimator) by its identity."""
    from pvpo.trainer.algorithms.estimator_state import EstimatorContext
    from pvpo.trainer.config.schema import load_config

    spec = get_spec(name)
    cfg = load_config(None, [f"algorithm.estimator={name}", "algorithm.ppo.critic.micro_batch_rows=3"]).algorithm
    context = EstimatorContext(
        algorithm=cfg,
        rollout_n=N,
        model=tiny_qwen2(),
        value_model_path=value_model_path,
        embed=_embed,
        parallel=parallel,
    )
    state = spec.make_state(context)
    out = []
    for step in (1, 2):
        examples = [SimpleNamespace(uid=f"s{step}p{i}", question=f"question {step} {i}") for i in prompts]
        first = [
            _trajectory(ex.uid, f"first/{j}", gt=ex.uid.endswith("p1") and j == N - 1 and name not in NO_GT_ROWS)
            for ex in examples
            for j in range(N)
        ]
        injected = [t for t in first if t.is_gt]
        anchors = {f"s{step}p{i}": _unit("anchor", step, i) for i in range(PROMPTS)}
        sampled = [t for t in first if not t.is_gt]
        extra = state.extra_rollouts(
            examples, sampled, lambda exs, rnd: [_trajectory(e.uid, f"extra/{rnd}") for e in exs], anchors
        )
        trajs = [*sampled, *extra, *injected]
        batch = collate(trajs, 0)
        kw = state.kwargs(trajs, batch)
        adv = spec(batch.rewards, batch.uids, anchors=anchors, policy_rows=~batch.is_gt, **kw)
        rows = {}
        for i, t in enumerate(trajs):
            mask = batch.loss_mask[i].bool()
            rows[t.prediction] = adv[i, : mask.shape[0]][mask].tolist() if adv.dim() == 2 else [float(adv[i])]
        state.after_step(batch, kw, seed=step)
        out.append({"adv": rows, "extra": len(extra)})
    return out


def _every_estimator(rank: int, scratch: str) -> dict:
    """Each sharded estimator's two steps in one process (the whole batch) and on this rank's share."""
    from pvpo.trainer.algorithms.data_parallel import SINGLE
    from pvpo.trainer.parallel.shared_state import data_parallel

    share = [0, 1, 2] if rank == 0 else [3]
    results = {}
    for name in (n for n in available_estimators() if get_spec(n).sharded):
        one = _steps(name, SINGLE, Path(scratch, f"{name}_one_{rank}.json"), list(range(PROMPTS)))
        two = _steps(name, data_parallel(), Path(scratch, f"{name}_two.json"), share)
        results[name] = {"one": one, "two": two}
    return results


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return on_gloo_ranks(_every_estimator, WORLD)


@pytest.mark.parametrize("name", available_estimators())
def test_every_registered_estimator_runs_on_two_ranks_as_one_process_or_is_refused(name, ranks, monkeypatch):
    from pvpo.trainer.config.preflight import check_estimator
    from pvpo.trainer.config.schema import load_config

    spec = get_spec(name)
    cfg = load_config(None, [f"algorithm.estimator={name}"])
    if not spec.sharded:
        with pytest.raises(ValueError) as refused:
            check_estimator(cfg, WORLD)
        msg = str(refused.value)
        assert "\n" not in msg and f"algorithm.estimator={name}" in msg and "--nproc 1" in msg
        return
    check_estimator(cfg, WORLD)
    for rank, r in enumerate(ranks):
        one, two = r[name]["one"], r[name]["two"]
        for step, (a, b) in enumerate(zip(one, two, strict=True), 1):
            assert b["adv"], (name, step, rank)
            for key, row in b["adv"].items():
                assert key in a["adv"], (name, step, rank, key)
                assert row == pytest.approx(a["adv"][key], rel=1e-5, abs=1e-6), (name, step, rank, key)
    # the ranks' shares together are the whole batch, extra rollouts included
    for step in range(2):
        whole = ranks[0][name]["one"][step]
        assert sum(r[name]["two"][step]["extra"] for r in ranks) == whole["extra"], (name, step)
        assert sorted(k for r in ranks for k in r[name]["two"][step]["adv"]) == sorted(whole["adv"]), (name, step)


def test_an_estimator_registered_as_unsharded_is_refused_in_one_line_naming_the_key(monkeypatch):
    import dataclasses

    from pvpo.trainer.algorithms import spec as specs
    from pvpo.trainer.config.preflight import check_estimator
    from pvpo.trainer.config.schema import load_config

    solo = dataclasses.replace(get_spec("grpo"), name="solo", sharded=False)
    monkeypatch.setattr(specs, "get_spec", lambda name: solo if name == "solo" else get_spec(name))
    cfg = load_config(None, [])  # with an estimator a user's module registered (no config names it at load)
    cfg = cfg.model_copy(update={"algorithm": cfg.algorithm.model_copy(update={"estimator": "solo"})})
    with pytest.raises(
        ValueError, match=r"^algorithm.estimator=solo does not run under torchrun.*--nproc 1.*pvpo[^\n]*$"
    ):
        check_estimator(cfg, WORLD)
    check_estimator(cfg, 1)  # a single process runs it


@pytest.mark.parametrize("config", CONFIGS)
def test_every_shipped_config_passes_the_torchrun_checks_at_two_ranks(config, monkeypatch):
    from pvpo.trainer.config.preflight import check_estimator
    from pvpo.trainer.config.schema import load_config

    cfg = load_config(str(REPO / "configs" / config), ARGS.get(config, []))
    check_estimator(cfg, WORLD)
