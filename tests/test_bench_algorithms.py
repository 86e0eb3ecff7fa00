"""bench/algorithms/algorithms.py: its statistics, cost measures, learning-rate pick, Fig. 4 verdict
and question splits on made-up runs (fast), and one tiny benchmark end to end (slow)."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH.parent) not in sys.path:  # bench.* from the repo root (bench/README.md)
    sys.path.insert(0, str(BENCH.parent))

from bench.algorithms import algorithms as algorithms  # noqa: E402
from bench.algorithms import algorithms_report as rep  # noqa: E402
from bench.algorithms import algorithms_runs as runs  # noqa: E402
from pvpo.envs.data import QAExample  # noqa: E402

WARM: dict[str, Any] = {
    "one_off": {"anchor": {"rollouts": 400.0, "tool_calls": 600.0}, "gt": {"rollouts": 50.0, "tool_calls": 100.0}},
    "prompts_per_step": 8,
    "n_rl": 80,
}


def _run(em_q: list[float], calls: float, *, anchor: bool = False, gs: bool = False, steps: int = 20, lr: float = 3e-4):
    start = {"step": 0, "em_q": [0.0] * len(em_q), "train_rollouts": 0.0, "train_tool_calls": 0.0}
    end = {"step": steps, "em_q": em_q, "train_rollouts": calls / 2, "train_tool_calls": calls}
    return {
        "uses_anchor": anchor,
        "group_sampling": gs,
        "steps": steps,
        "lr": lr,
        "adv_var": 0.1,
        "wall_s": 1.0,
        "curve": [start, end],
    }


def test_compare_pairs_questions_and_adds_the_seed_spread():
    a = [[1, 1, 0, 0], [1, 0, 0, 0]]  # two seeds, per-seed EM 0.5 and 0.25
    b = [[0, 1, 0, 0]]  # one fixed score (the shared start): no seed term
    c = rep.compare(a, b)
    # per question: A = (1, .5, 0, 0), B = (0, 1, 0, 0); differences (1, -.5, 0, 0)
    assert c.diff == pytest.approx(0.125)
    d = [1, -0.5, 0, 0]
    sd = math.sqrt(sum((x - 0.125) ** 2 for x in d) / 3)
    assert c.se_questions == pytest.approx(sd / 2)
    assert c.se_seeds == pytest.approx(0.125)  # std of (0.5, 0.25) / sqrt(2)
    assert c.se == pytest.approx(math.hypot(sd / 2, 0.125))
    assert rep.compare(a, b, scale_b=0.5).diff == pytest.approx(0.375 - 0.5 * 0.25)
    with pytest.raises(ValueError, match="same questions"):
        rep.compare(a, [[0, 1, 0]])
    with pytest.raises(ValueError, match="at least one run"):
        rep.compare(a, [])


def test_a_difference_is_resolved_only_beyond_two_standard_errors():
    assert rep.Comparison(0.21, 0.06, 0.08).verdict() == "A > B"  # s.e. 0.1
    assert rep.Comparison(0.19, 0.06, 0.08).verdict() == "not resolved"
    assert rep.Comparison(-0.21, 0.06, 0.08).verdict() == "A < B"


def test_the_lr_pick_is_the_best_validation_mean_and_a_tie_goes_to_the_smaller_lr():
    assert rep.pick_lr({1e-4: [0.3, 0.5], 3e-4: [0.45], 1e-3: [0.1]}) == 3e-4
    assert rep.pick_lr({1e-3: [0.4], 1e-4: [0.4], 3e-4: [0.2]}) == 1e-4
    with pytest.raises(ValueError, match="no finished sweep run"):
        rep.pick_lr({})


def test_the_three_cost_measures_charge_the_one_off_work_as_stated():
    pvpo_gs, grpo = _run([1.0], 200, anchor=True, gs=True), _run([1.0], 200)
    end = pvpo_gs["curve"][-1]  # 20 steps x 8 prompts over 80 RL prompts: 2 epochs
    assert rep.cost(pvpo_gs, end, WARM, "paper", 10) == 200
    assert rep.cost(pvpo_gs, end, WARM, "all-in", 10) == 200 + 600 + 100
    assert rep.cost(pvpo_gs, end, WARM, "amortised", 10) == pytest.approx(200 + 700 * 2 / 10)
    assert rep.cost(_run([1.0], 200, anchor=True), end, WARM, "all-in", 10) == 800  # plain PVPO: no GT
    for m in rep.MEASURES:
        assert rep.cost(grpo, grpo["curve"][-1], WARM, m, 10) == 200  # nothing one-off
    assert rep.cost(pvpo_gs, pvpo_gs["curve"][0], WARM, "amortised", 10) == 0  # nothing charged before a step
    with pytest.raises(ValueError, match="unknown cost measure"):
        rep.cost(grpo, end, WARM, "tokens", 10)


def test_the_cost_ratio_carries_the_seeds_spread_of_both_costs():
    r, se = rep.cost_ratio([1.0, 1.2], [2.0, 2.0])
    assert r == pytest.approx(0.55) and se == pytest.approx(0.55 * 0.1 / 1.1)
    assert rep.cost_ratio([1.0], [2.0]) == (0.5, 0.0)
    assert all(math.isnan(x) for x in rep.cost_ratio([1.0], [0.0]))


def _fig4(pv_em: list[list[float]], gr_em: list[list[float]], pv_calls: float | list[float], gr_calls: float) -> str:
    calls = pv_calls if isinstance(pv_calls, list) else [pv_calls] * len(pv_em)
    final = {
        ("pvpo+gs", 2): [_run(e, c, anchor=True, gs=True) for e, c in zip(pv_em, calls)],
        ("grpo", 5): [_run(e, gr_calls) for e in gr_em],
    }
    return rep.fig4_verdict(final, [0.0] * len(pv_em[0]), WARM, 10)


def test_the_fig4_verdict_is_written_from_the_numbers_under_each_cost_measure():
    q = 200
    good = [[1.0] * 180 + [0.0] * 20] * 5  # EM 0.9 on every seed
    half = [[1.0] * 100 + [0.0] * 100] * 5  # EM 0.5
    # PVPO far above 97% of GRPO; training cost 20% of GRPO's, amortised 34%, all-in (+700) 90%
    text = _fig4(good, half, 200, 1000)
    lines = text.splitlines()
    assert "at least 97% of GRPO N=5's" in lines[0] and "differences smaller than 2 s.e." in lines[0]
    paper, amortised, all_in = lines[-3:]
    assert "paper's Fig. 4" in paper and "ratio 0.20" in paper and "**reproduced**" in paper
    assert (
        "amortised" in amortised and "ratio 0.34" in amortised and "**reproduced**" in amortised
    )  # 200 + 700 x 2 / 10
    assert "all-in" in all_in and "ratio 0.90" in all_in and "**refuted**" in all_in
    # PVPO well below: refuted whatever the cost
    assert all("**refuted**" in line for line in _fig4(half, good, 300, 1000).splitlines()[-3:])
    # a difference inside the noise: not decidable under the paper's measure, with the power
    rng = random.Random(0)
    coin = [[float(rng.random() < 0.5) for _ in range(q)] for _ in range(10)]
    text = _fig4(coin[:5], coin[5:], 100, 1000)
    assert "**not decidable at this power (2 s.e. = " in text.splitlines()[-3]
    # accuracy holds, but the cost ratio's spread over seeds straddles 40%: not decidable by the paper's measure
    text = _fig4(good, half, [300.0, 500.0, 300.0, 500.0, 400.0], 1000)
    assert "ratio 0.40 +- 0.04 (cost side undecided at 40%)" in text and "**not decidable" in text.splitlines()[-3]
    assert "needs pvpo+gs at N=2" in rep.fig4_verdict({("grpo", 5): []}, [0.0], WARM, 10)


def test_the_comparisons_are_the_headline_then_each_against_grpo_then_n2_against_n5():
    keys = [("pvpo+gs", 2), ("grpo", 2), ("grpo", 5), ("rloo", 5), ("pvpo+gs", 5)]
    pairs = rep.comparison_pairs(keys)
    assert pairs[0] == (("pvpo+gs", 2), ("grpo", 5))
    assert (("pvpo+gs", 2), ("grpo", 2)) in pairs and (("rloo", 5), ("grpo", 5)) in pairs
    assert (("pvpo+gs", 2), ("pvpo+gs", 5)) in pairs and (("grpo", 2), ("grpo", 5)) in pairs
    assert (("pvpo", 2), ("grpo", 5)) not in pairs and len(set(pairs)) == len(pairs)


def _q(uid: str) -> QAExample:
    return QAExample(uid=uid, question=f"Who is {uid}?", golden_answers=("x",))


def test_validation_and_test_split_the_held_out_questions_and_share_none_with_training():
    held = [_q(f"t{i}") for i in range(7)]
    val, test = runs.split_held_out(held, 3, others=[[_q("a")], [_q("b")]])
    assert [q.uid for q in val] == ["t0", "t1", "t2"] and len(test) == 4
    with pytest.raises(ValueError, match="overlap"):
        runs.split_held_out(held, 3, others=[[_q("t5")]])
    with pytest.raises(ValueError, match="non-empty"):
        runs.split_held_out(held, 7, others=[])


def test_bad_algorithm_and_number_lists_fail_in_one_line():
    with pytest.raises(SystemExit, match="only suffix is '\\+gs'"):
        algorithms.parse_algorithms("pvpo+xx")
    with pytest.raises(SystemExit, match="unknown estimator; known: .*grpo"):
        algorithms.parse_algorithms("grpo,nope")
    assert algorithms.parse_algorithms("all")[:2] == ["pvpo+gs", "dr_grpo"]
    assert set(algorithms.parse_algorithms("all")) >= {"pvpo", "grpo", "rloo", "gdpo", "v05", "ppo"}
    with pytest.raises(SystemExit, match="--lr-grid: expected a comma-separated list"):
        algorithms.parse_numbers("1e-4,x", "--lr-grid", float)
    with pytest.raises(SystemExit, match="--seeds: give at least one"):
        algorithms.parse_numbers(",", "--seeds", int)
    with pytest.raises(SystemExit, match="--steps must be >= 1"):
        algorithms.main(["--steps", "0", "--out", "unused"])


def test_the_lr_of_a_pair_is_picked_only_once_its_whole_sweep_has_finished():
    sweep = algorithms.sweep_jobs(["grpo", "rloo"], [2], [1e-4, 3e-4], [100])
    done = {j: {"em": 0.5 if j.lr == 3e-4 else 0.4} for j in sweep if j.alg == "grpo"}
    done[next(j for j in sweep if j.alg == "rloo")] = {"em": 0.9}
    assert algorithms.picks_from(["grpo", "rloo"], [2], [1e-4, 3e-4], sweep, done) == {("grpo", 2): 3e-4}
    assert algorithms.sweep_jobs(["grpo"], [2], [3e-4], [100]) == []  # one lr: nothing to sweep
    assert algorithms.picks_from(["grpo"], [2, 5], [3e-4], [], {}) == {("grpo", 2): 3e-4, ("grpo", 5): 3e-4}
    finals = algorithms.final_jobs({("grpo", 2): 3e-4}, [0, 1])
    assert [(j.stage, j.seed, j.lr) for j in finals] == [("final", 0, 3e-4), ("final", 1, 3e-4)]
    assert finals[0].run_dir(Path("o")) == Path("o/final/grpo_n2_lr0.0003_s0")


def test_the_report_writes_results_and_the_plot(tmp_path: Path):
    warm = {
        **WARM,
        "warm_steps": 362,
        "warm_seed": 0,
        "warm_s": 1.0,
        "warm_band": [0.3, 0.6],
        "in_band": True,
        "tries": [{"steps": 362, "validation_em": 0.5}],
        "anchor_m": 4,
        "group_sampling": {"gs/gt_frac": 0.5},
        "start": {"validation": {"em_q": [0.0, 1.0]}, "test": {"em_q": [0.0] * 4}},
    }
    final = {
        ("pvpo+gs", 2): [_run([1.0, 1.0, 0.0, 1.0], 100, anchor=True, gs=True) for _ in range(2)],
        ("grpo", 5): [_run([1.0, 0.0, 0.0, 1.0], 400), _run([1.0, 1.0, 0.0, 0.0], 400)],
    }
    sweep = {("grpo", 5): {1e-4: [0.2], 3e-4: [0.5], 1e-3: [0.1]}, ("pvpo+gs", 2): {1e-4: [0.6], 3e-4: [0.5]}}
    text = rep.report(
        header="machine: x\ncommand: y\n",
        warm=warm,
        sweep=sweep,
        grid=[1e-4, 3e-4, 1e-3],
        final=final,
        epochs=10,
        out=tmp_path,
    )
    assert (tmp_path / "results.md").read_text() == text and (tmp_path / "em_vs_cost.png").stat().st_size > 0
    assert "| grpo | 5 | 0.200 | **0.500** | 0.100 | 0.0003 |" in text
    assert "| pvpo+gs | 2 | **0.600** | 0.500 | - | 0.0001 (grid edge) |" in text
    assert "| pvpo+gs | 2 | 0.0003 | 2 | 0.750 | +0.750" in text
    assert "| pvpo+gs N=2 | grpo N=5 | +0.250 |" in text and "**Fig. 4 question**" in text
    assert "Shared warm start: 362 SFT steps" in text and "(tried: 362 steps 0.500)" in text


# a small world and short episodes: a benchmark run in seconds
TINY_WORLD = [
    "data.synthetic.n_entities=12",
    "data.synthetic.questions_per_hop=30",
    "data.max_train_examples=16",
    "data.warm_start_examples=8",
    "data.prompts_per_step=4",
    "algorithm.anchor.num_rollouts=2",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=16",
    "rollout.max_response_tokens=96",
]


@pytest.mark.slow
def test_a_tiny_benchmark_runs_resumes_and_reports(tmp_path: Path):
    """Two algorithms, a 2-value sweep and two final seeds on a small world, two processes; run
    again it redoes nothing, and --report-only writes the same report."""
    out, results = tmp_path / "b", tmp_path / "results"
    argv = "--algorithms pvpo+gs,grpo --n 2 --seeds 0,1 --sweep-seeds 7 --lr-grid 1e-4,1e-3 --steps 2 --evals 2"
    argv = [*argv.split(), *"--warm-steps 4,6 --warm-band 0.99,1 --jobs 2".split(), "--out", str(out), *TINY_WORLD]
    argv += ["--results", str(results)]
    algorithms.main(argv)
    warm = json.loads((out / "warm" / "summary.json").read_text())
    assert set(warm["uids"]) == {"rl", "sft", "val", "test"}
    # no length reaches the band: both are tried and the closer one kept
    assert [t["steps"] for t in warm["tries"]] in ([4, 6], [6, 4]) and not warm["in_band"]
    assert warm["warm_steps"] == warm["tries"][-1]["steps"] and warm["policy_dir"] == f"steps{warm['warm_steps']}"
    assert sum(map(len, warm["uids"].values())) == len({u for v in warm["uids"].values() for u in v})
    results_of = lambda d: sorted(d.glob("*/*/result.json"))  # noqa: E731
    run_files = results_of(out)
    assert len(run_files) == 4 + 4  # 2 algorithms x 2 lrs x 1 sweep seed, then 2 algorithms x 2 seeds
    sweep = [json.loads(p.read_text()) for p in run_files if p.parts[-3] == "sweep"]
    final = [json.loads(p.read_text()) for p in run_files if p.parts[-3] == "final"]
    assert {r["split"] for r in sweep} == {"validation"} and {r["split"] for r in final} == {"test"}
    assert all(len(r["curve"][-1]["em_q"]) == len(warm["uids"]["test"]) for r in final)
    assert all(len(r["curve"]) == 3 for r in final)  # the start, step 1, the end
    assert all(r["curve"][0]["em_q"] == warm["start"]["test"]["em_q"] for r in final)
    gs = next(r for r in final if r["alg"] == "pvpo+gs")
    assert gs["uses_anchor"] and gs["group_sampling"]
    mtimes = {p: p.stat().st_mtime_ns for p in run_files}
    text = (out / "results.md").read_text()
    plot = (results / "em_vs_cost.png").read_bytes()
    assert "## Verdict" in text and plot
    # the shipped results: one file a run, per evaluation the per-question EM and the cost by kind
    shipped = sorted(p.relative_to(results).as_posix() for p in results.glob("*/*.json"))
    assert shipped == sorted(f"{p.parts[-3]}/{p.parts[-2]}.json" for p in results_of(out))
    gs_run = json.loads((results / "final" / f"{gs['alg']}_n2_lr{gs['lr']:g}_s0.json").read_text())
    assert set(gs_run["curve"][-1]["cost"]) == {"train", "anchor", "gt"} and set(gs_run["curve"][-1]["em_q"]) <= {
        "0",
        "1",
    }
    bench = json.loads((results / "bench.json").read_text())
    assert [i["runs_trained"] for i in bench["invocations"]] == [8]
    algorithms.main(argv)  # resumes: nothing to redo, and no invocation recorded
    assert {p: p.stat().st_mtime_ns for p in results_of(out)} == mtimes
    assert json.loads((results / "bench.json").read_text())["invocations"] == bench["invocations"]
    # the report from the shipped results alone, without the runs' folders: the same text and plot
    fresh = tmp_path / "fresh"
    algorithms.main(["--report-only", "--results", str(results), "--out", str(fresh)])
    assert (fresh / "results.md").read_text() == text and (results / "em_vs_cost.png").read_bytes() == plot


def test_an_out_dir_refuses_settings_its_runs_were_not_trained_with(tmp_path: Path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("run: {steps: 3}\n")
    s = runs.Settings(cfg, ("a=1",), tmp_path / "out", 60, 3, (360,), 0)
    runs.check_settings(s)
    runs.check_settings(s)  # the same settings: fine
    with pytest.raises(SystemExit, match="other steps, warm_steps .*give another --out"):
        runs.check_settings(runs.Settings(cfg, ("a=1",), tmp_path / "out", 80, 3, (370,), 0))
    cfg.write_text("run: {steps: 4}\n")
    with pytest.raises(SystemExit, match="other config_text"):
        runs.check_settings(s)


@pytest.mark.slow
def test_every_registered_estimator_runs_in_the_benchmark(tmp_path: Path):
    """`--algorithms all` (pvpo+gs and every estimator of the registry), 2 steps each on a small
    world, without a sweep (one lr); each ends with a test evaluation and its cost."""
    from pvpo.trainer.algorithms.spec import available_estimators

    out = tmp_path / "b"
    argv = ["--algorithms", "all", "--n", "2", "--seeds", "0", "--lr-grid", "3e-4", "--steps", "2", "--evals", "1"]
    argv += [
        "--warm-steps",
        "4",
        "--warm-band",
        "0,1",
        "--jobs",
        "1",
        "--out",
        str(out),
        "--results",
        str(tmp_path / "r"),
    ]
    algorithms.main([*argv, *TINY_WORLD])
    final = {json.loads(p.read_text())["alg"]: json.loads(p.read_text()) for p in out.glob("final/*/result.json")}
    assert set(final) == {"pvpo+gs", *available_estimators()} and not list(out.glob("sweep/*"))
    assert all(r["steps"] == 2 and r["split"] == "test" and len(r["curve"]) == 2 for r in final.values())
    assert final["pvpo"]["uses_anchor"] and not final["pvpo"]["group_sampling"] and not final["grpo"]["uses_anchor"]
    text = (out / "results.md").read_text()
    assert all(f"| {a} | 2 | 0.0003 | 1 |" in text for a in final)


SHIPPED = sorted(p.parent for p in (BENCH / "results").glob("algorithms*/bench.json"))


@pytest.mark.parametrize("results", SHIPPED, ids=[p.name for p in SHIPPED])
def test_the_readme_block_and_the_plot_are_recomputed_from_the_shipped_results_alone(results: Path, tmp_path: Path):
    """`--report-only` on the committed per-run JSON (no run folder) prints the benchmark page's block
    exactly, and draws the committed plot byte for byte (with the matplotlib it was drawn with)."""
    import matplotlib

    from bench.algorithms.algorithms_results import REPO, read_bench

    readme = (REPO / "docs" / "benchmarks" / "algorithms.md").read_text(encoding="utf-8")
    source = results.relative_to(REPO).as_posix()
    shipped = algorithms.readme_block_of(readme, source)
    assert shipped is not None, f"docs/benchmarks/algorithms.md has no block generated from {source}"
    plot = tmp_path / "plot.png"
    text = algorithms.report_from(results, tmp_path / "out", plot=plot)
    assert text.endswith("\n" + shipped)
    doc = read_bench(results)
    drawn_with = {inv["machine"]["matplotlib"] for inv in doc["invocations"]}
    if drawn_with == {matplotlib.__version__}:
        assert plot.read_bytes() == (REPO / doc["plan"]["plot"]).read_bytes()
    # the page shows the plot from a copy under docs/ (the site serves only that folder): the same bytes
    if results.name == "algorithms":
        assert (REPO / "docs" / "bench_algorithms_em_vs_cost.png").read_bytes() == (
            REPO / doc["plan"]["plot"]
        ).read_bytes()
