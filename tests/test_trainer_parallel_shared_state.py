"""The pieces of the method's shared state under torchrun, each on two gloo ranks in one spawned
group (seconds, not a training run): rank 0's object on every rank, the GT set each rank writes a
share of, metrics reduced as one process would compute them, cost counters that hold the run's
totals on every rank, PPO's sharded critic and whitened advantages equal to one process's on the
whole batch, GDPO's batch normalisation over all ranks, V0.5's rounds in lockstep; and, in one
process, the LoRA merge from a gathered state dict, the files only rank 0 writes and the batches a
rank's share is cut into (every registered estimator: `test_trainer_parallel_registry.py`)."""

from __future__ import annotations

import pytest
import torch
from parallel_support import on_gloo_ranks, tiny_qwen2

from pvpo.trainer.parallel.distributed import aligned_batches

WORLD = 2


def _checks(rank: int, _scratch: str) -> dict:
    from trainer_support import random_trajectories

    from pvpo.trainer.algorithms.adaptive_budget import extend_groups
    from pvpo.trainer.algorithms.estimator_state import EstimatorContext
    from pvpo.trainer.algorithms.gae import PPOState, ppo
    from pvpo.trainer.algorithms.gdpo import gdpo
    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.parallel import distributed as ddp
    from pvpo.trainer.parallel.shared_state import data_parallel
    from pvpo.trainer.reference.sharded_gt import ShardedGTSource
    from pvpo.trainer.rollout.trajectory import Trajectory, collate
    from pvpo.trainer.state.cost import CostCounter

    out: dict = {"broadcast": ddp.broadcast_object({"from": rank})}

    # the GT source: each rank writes its share, every rank gets all, in order
    class Fake:
        deterministic = True
        asked: list[str] = []

        def generate(self, examples, *, attempt):
            self.asked += [e.uid for e in examples]
            return [Trajectory(e.uid, [1], reward=float(rank)) for e in examples]

        def close(self):
            pass

    from types import SimpleNamespace

    inner = Fake()
    got = ShardedGTSource(inner).generate([SimpleNamespace(uid=f"q{i}") for i in range(5)], attempt=0)
    out["gt"] = {"asked": inner.asked, "got": [(t.uid, t.reward) for t in got]}

    # metrics: per-rank values reduced to what one process computes over the union
    vals = [torch.tensor([0.5, -1.0, 2.0]), torch.tensor([3.0, 0.25])][rank]
    m = {"adv/mean": float(vals.mean()), "adv/std": float(vals.std()), "adv/min": float(vals.min())}
    m |= {"adv/max": float(vals.max()), "adv/num_groups": 1.0 + rank, "time/x_s": float(rank)}
    out["metrics"] = ddp.reduce_metrics(m, len(vals))

    # cost: each rank counts what it generated, every rank then holds the totals
    cost = CostCounter()
    cost.add("train", [Trajectory("u", [1], [3] * 4, [1] * 4, [0.0] * 4, num_tool_calls=1)] * (3 if rank == 0 else 1))
    cost.add("gt", [Trajectory("u", [1], [3] * 2, [1] * 2, [0.0] * 2)] * rank, policy_tokens=False)
    out["cost"] = cost.step_metrics(reduce=ddp.all_reduce_sums)
    out["cost_state"] = cost.state_dict()

    # PPO: one critic sharded over the ranks against one process's on the whole batch; rank 0 has
    # two micro-batches of 3 rows, rank 1 one (its second forward is an empty, weight-0 one)
    cfg = load_config(None, ["algorithm.ppo.critic.micro_batch_rows=3", "algorithm.ppo.critic.epochs=2"]).algorithm
    model = tiny_qwen2()
    trajs = random_trajectories(8, 64, seed=3)
    rows = [list(range(0, 5)), list(range(5, 8))][rank]

    def ppo_step(state, ts, parallel):
        batch = collate(ts, 0)
        kw = state.kwargs(ts, batch)
        adv = ppo(batch.rewards, batch.uids, **kw)
        stats = state.after_step(batch, kw, seed=7)
        return adv, stats, state.critic.values(batch, 3, parallel)

    one = PPOState(EstimatorContext(algorithm=cfg, rollout_n=2, model=model))
    adv1, stats1, after1 = ppo_step(one, trajs, one.parallel)
    dp = data_parallel()
    two = PPOState(EstimatorContext(algorithm=cfg, rollout_n=2, model=model, parallel=dp))
    adv2, stats2, after2 = ppo_step(two, [trajs[i] for i in rows], dp)
    width = adv2.shape[1]
    out["ppo"] = {
        "adv": float((adv2 - adv1[rows, :width]).abs().max()),
        "adv_beyond": float(adv1[rows, width:].abs().max()) if adv1.shape[1] > width else 0.0,
        "values_after": float((after2 - after1[rows, :width]).abs().max()),
        "stats": {k: (stats1[k], stats2[k]) for k in stats1},
        "sharded": type(two.critic).__name__,
        "modules": sorted(two.sharded_modules()),
    }

    # GDPO: the batch normalisation of Eq. 6 over every rank's rows
    comps = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    uids = ["a", "a", "b", "b", "c", "c"]
    full = gdpo(comps[:, 0] + comps[:, 1], uids, components=comps, component_names=["x", "y"])
    mine = slice(0, 4) if rank == 0 else slice(4, 6)
    part = gdpo(
        (comps[:, 0] + comps[:, 1])[mine],
        uids[mine],
        components=comps[mine],
        component_names=["x", "y"],
        all_sum=dp.all_sum,
    )
    out["gdpo"] = float((part - full[mine]).abs().max())

    # V0.5's rounds: rank 0's prompt wants more rounds than rank 1's; both go through every round
    calls: list[int] = []

    def rollout(exs, rnd):
        calls.append(len(exs))
        return [SimpleNamespace(uid=e.uid, reward=float(rnd % 2)) for e in exs]

    ex = SimpleNamespace(uid=f"p{rank}")
    first = [SimpleNamespace(uid=ex.uid, reward=r) for r in ([0.0, 1.0] if rank == 0 else [1.0, 1.0])]
    _, report = extend_groups(
        [ex], first, {ex.uid: 1.0 if rank else None}, rollout, k_max=6, cost=0.0, any_rank=dp.any_rank
    )
    out["v05"] = {"calls": calls, "rounds": report["v05/rounds"]}
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return on_gloo_ranks(_checks, WORLD)


def test_rank_zeros_object_reaches_every_rank(ranks):
    assert [r["broadcast"] for r in ranks] == [{"from": 0}, {"from": 0}]


def test_each_rank_writes_its_share_of_the_gt_set_and_every_rank_gets_all_in_order(ranks):
    assert [r["gt"]["asked"] for r in ranks] == [["q0", "q1"], ["q2", "q3", "q4"]]
    expected = [["q0", 0.0], ["q1", 0.0], ["q2", 1.0], ["q3", 1.0], ["q4", 1.0]]
    assert ranks[0]["gt"]["got"] == ranks[1]["gt"]["got"] == expected


def test_metrics_reduce_to_what_one_process_computes_over_all_ranks(ranks):
    union = torch.tensor([0.5, -1.0, 2.0, 3.0, 0.25])
    for r in ranks:
        m = r["metrics"]
        assert m["adv/mean"] == pytest.approx(float(union.mean()))
        assert m["adv/std"] == pytest.approx(float(union.std()))
        assert (m["adv/min"], m["adv/max"], m["adv/num_groups"], m["time/x_s"]) == (-1.0, 3.0, 3.0, 1.0)


def test_cost_counters_hold_the_runs_totals_on_every_rank(ranks):
    for r in ranks:
        c = r["cost"]
        assert (c["cost/rollouts"], c["cost/cum_rollouts"], c["cost/policy_tokens"]) == (5.0, 5.0, 16.0)
        assert (c["cost/cum_gt_rollouts"], c["cost/cum_gt_tokens"]) == (1.0, 2.0)
    assert ranks[0]["cost_state"] == ranks[1]["cost_state"]


def test_ppo_critic_sharded_over_two_ranks_learns_what_one_process_learns_on_the_whole_batch(ranks):
    for r in ranks:
        p = r["ppo"]
        assert p["sharded"].startswith("FSDP") and p["modules"] == ["critic"]
        assert p["adv"] < 1e-5 and p["adv_beyond"] == 0.0  # advantages whitened over both ranks' tokens
        assert p["values_after"] < 1e-5  # the critic after two epochs of updates
        for k, (one, two) in p["stats"].items():
            assert two == pytest.approx(one, rel=1e-5, abs=1e-6), k
        assert p["stats"]["critic/grad_norm"][0] > 0


def test_gdpo_normalises_over_every_ranks_rows(ranks):
    assert all(r["gdpo"] < 1e-6 for r in ranks)


def test_v05_ranks_go_through_the_extra_rounds_together(ranks):
    # rank 1 (its prior equals its uniform rewards) wants nothing more: it joins each round with no prompt
    assert ranks[0]["v05"]["rounds"] == ranks[1]["v05"]["rounds"] == len(ranks[0]["v05"]["calls"]) > 0
    assert set(ranks[1]["v05"]["calls"]) == {0} and len(ranks[1]["v05"]["calls"]) == len(ranks[0]["v05"]["calls"])


# ---- one process -------------------------------------------------------------------------------
def test_a_ranks_share_is_cut_where_one_process_cuts_its_batches():
    assert aligned_batches(0, 5, 2) == [(0, 2, 0), (2, 4, 2), (4, 5, 4)]  # one process: plain batches
    # items 3..6 of a list cut in batches of 2: [3] ends batch 2-3, [4, 5] is batch 4-5, [6] starts 6-7
    assert aligned_batches(3, 4, 2) == [(0, 1, 2), (1, 3, 4), (3, 4, 6)]
    assert aligned_batches(4, 0, 2) == []


def test_lora_merged_from_a_gathered_state_dict_equals_peft_merge():
    from trainer_support import SMALL_MODEL

    from pvpo.trainer.model.lora import add_lora, lora_scalings, merge_lora_state, merged_state_dict
    from pvpo.trainer.model.policy import build_tiny_model, train_tokenizer

    tok = train_tokenizer(["the quick brown fox jumps over the lazy dog " * 4], vocab_size=300)
    peft_model = add_lora(
        build_tiny_model(tok, SMALL_MODEL, seed=1), r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "down_proj"]
    )
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    by_peft = merged_state_dict(peft_model)
    gathered = merge_lora_state(dict(peft_model.state_dict()), lora_scalings(peft_model))
    assert sorted(gathered) == sorted(by_peft)
    assert all(torch.allclose(gathered[k], by_peft[k], atol=1e-7) for k in by_peft)
    assert any(
        not torch.equal(by_peft[k], v) for k, v in build_tiny_model(tok, SMALL_MODEL, seed=1).state_dict().items()
    )


def test_only_the_main_rank_writes_the_gt_cache_and_the_value_model(tmp_path):
    import numpy as np

    from pvpo.trainer.algorithms.value_model import PromptValueModel
    from pvpo.trainer.reference.gt_cache import GTCache

    main, other = GTCache(tmp_path / "gt.json"), GTCache(tmp_path / "gt_other.json", read_only=True)
    main.failed["u"] = other.failed["u"] = 1
    main.save(), other.save()
    assert (tmp_path / "gt.json").exists() and not (tmp_path / "gt_other.json").exists()
    assert GTCache(tmp_path / "gt.json", read_only=True).failed == {"u": 1}  # every rank reads it

    def embed(texts):
        return np.ones((len(texts), 3), dtype=np.float32)

    vm = PromptValueModel(embed, path=tmp_path / "vm.json", read_only=True)
    vm.update(["a"], ["q"], [0.5], vectors=[np.ones(3)])
    assert vm.predict(["b"], ["q2"]) == {"b": 0.5} and not (tmp_path / "vm.json").exists()
