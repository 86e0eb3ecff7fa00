"""The report of `bench/algorithms/algorithms.py`: the learning rate each (algorithm, N) keeps, paired
comparisons on the same test questions, the three cost measures, the answer to the PVPO paper's
Fig. 4 question, `results.md` and `em_vs_cost.png`. Pure functions of the runs' `result.json`
summaries and the warm phase's `summary.json`; nothing here trains.

Statistics (`compare`). A run's score is its per-question test EM; an algorithm's is, per question,
the mean over its seeds. The difference of two algorithms is the mean over questions of the
per-question differences; its standard error has two parts: over questions (paired, the
`pvpo.stats.paired_difference` of the seed-averaged scores: how much another draw of questions
would move it) and over seeds (`pvpo.stats.standard_error` of each algorithm's per-seed EM, summed
in quadrature: how much other RL seeds would move it, for these questions). The s.e. used for
every verdict is both together, sqrt(se_q^2 + se_s^2) (conservative: the seed-by-question noise is
counted in both). A difference is resolved when it is at least 2 s.e.; that 2 s.e. is the power.

Cost, always in tool calls, at every evaluation of a run:
- paper: the PVPO paper's Fig. 4 measure, policy rollouts x mean tool calls per rollout, i.e. the
  training rollouts' tool calls (`cost/cum_train_tool_calls`), no anchor or GT term;
- all-in: paper + the one-off anchor's tool calls (runs that use the anchor) + the GT generation's
  (runs with Group Sampling), all charged to this run;
- amortised: paper + that one-off cost x (this run's epochs over the RL prompts / E): the share a
  run of E epochs over the same prompts would charge to this many epochs (E = `--amortise-epochs`).

The Fig. 4 question (arXiv:2508.21104 Fig. 4: PVPO at N=2 reaches 55.0 vs GRPO's 56.8 at N=5, 97%,
for a cost of 4.3 vs 11.7, 37%): both train the same steps, so PVPO+GS at N=2 is compared with GRPO
at N=5 at the end of their runs. The accuracy side holds when EM(PVPO) - 0.97 EM(GRPO) is at least
0 by 2 s.e. (a non-inferiority test with the paper's 3% margin), fails when it is below 0 by 2 s.e.,
and is not decided otherwise. The cost side, under each measure, is the ratio of the mean costs
(its s.e. over seeds by the delta method): it holds when the ratio is <= `COST_RATIO` by 2 s.e.,
fails when it is above by 2 s.e., and is not decided otherwise. Reproduced: both sides hold;
refuted: either fails; otherwise not decidable at this power.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pvpo.stats import mean, paired_difference, standard_error

ACCURACY_RATIO = 0.97  # Fig. 4: 55.0 / 56.8
COST_RATIO = 0.40  # Fig. 4: 4.3 / 11.7 = 0.37, read as "at most 40% of the cost"
SE_BAR = 0.05  # the headline comparison's s.e. must stay under this, so that a 0.1 difference is visible
HEADLINE = (("pvpo+gs", 2), ("grpo", 5))
MEASURES = {
    "paper": "paper's Fig. 4 cost (training rollouts' tool calls)",
    "amortised": "amortised cost (training + one-off x epochs / E)",
    "all-in": "all-in cost (training + the whole anchor and GT generation)",
}

Key = tuple[str, int]  # (algorithm, N)


@dataclass(frozen=True)
class Comparison:
    """A - B over the same questions: the difference and its standard errors (module docstring)."""

    diff: float
    se_questions: float
    se_seeds: float

    @property
    def se(self) -> float:
        return math.sqrt(self.se_questions**2 + self.se_seeds**2)

    def verdict(self) -> str:
        """'A > B', 'A < B' (resolved at 2 s.e.) or 'not resolved'."""
        if self.diff - 2 * self.se > 0:
            return "A > B"
        if self.diff + 2 * self.se < 0:
            return "A < B"
        return "not resolved"


def compare(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], *, scale_b: float = 1.0) -> Comparison:
    """mean(A) - scale_b mean(B), where `a` and `b` hold one list of per-question EM per seed, every
    list over the same questions in the same order; a single list is a fixed score (s.e. over seeds
    0), e.g. the shared start."""
    if not a or not b:
        raise ValueError("a comparison needs at least one run on each side")
    n = len(a[0])
    if any(len(x) != n for x in (*a, *b)):
        raise ValueError(f"a paired comparison needs the same questions: {sorted({len(x) for x in (*a, *b)})} scores")
    qa = [mean([r[i] for r in a]) for i in range(n)]
    qb = [scale_b * mean([r[i] for r in b]) for i in range(n)]
    diff, se_q = paired_difference(qb, qa)
    se_s = math.sqrt(standard_error([mean(r) for r in a]) ** 2 + (scale_b * standard_error([mean(r) for r in b])) ** 2)
    return Comparison(diff, se_q, se_s)


def pick_lr(val_em: dict[float, list[float]]) -> float:
    """The learning rate with the highest validation EM (mean over its sweep seeds); a tie goes to
    the smaller one."""
    if not val_em:
        raise ValueError("no finished sweep run to pick a learning rate from")
    return max(sorted(val_em), key=lambda lr: (mean(val_em[lr]), -lr))


def one_off(run: dict[str, Any], warm: dict[str, Any]) -> float:
    """The tool calls of the one-off reference work `run` uses: the anchor's, and GT generation's
    with Group Sampling."""
    o = warm["one_off"]
    return (o["anchor"]["tool_calls"] if run["uses_anchor"] else 0.0) + (
        o["gt"]["tool_calls"] if run["group_sampling"] else 0.0
    )


def cost(run: dict[str, Any], point: dict[str, Any], warm: dict[str, Any], measure: str, epochs: float) -> float:
    """The cumulative cost of `run` at its curve `point` under `measure` (module docstring);
    `epochs` is E of the amortised measure."""
    paper = float(point["train_tool_calls"])
    if measure == "paper":
        return paper
    if measure == "all-in":
        return paper + one_off(run, warm)
    if measure == "amortised":
        done = point["step"] * warm["prompts_per_step"] / warm["n_rl"]
        return paper + one_off(run, warm) * done / epochs
    raise ValueError(f"unknown cost measure {measure!r}; known: {', '.join(MEASURES)}")


def final_em(runs: Sequence[dict[str, Any]]) -> list[list[float]]:
    """Each run's per-question EM at its end."""
    return [r["curve"][-1]["em_q"] for r in runs]


def _f(x: float, digits: int = 3) -> str:
    return "nan" if math.isnan(x) else f"{x:.{digits}f}"


def _cmp_cell(c: Comparison) -> str:
    return f"{c.diff:+.3f} +- {c.se:.3f} ({c.se_questions:.3f} / {c.se_seeds:.3f})"


def sweep_table(sweep: dict[Key, dict[float, list[float]]], grid: Sequence[float]) -> str:
    """Validation EM per (algorithm, N) and learning rate, the pick marked (and flagged when it is
    at an edge of the grid: the best may lie outside it)."""
    head = "| algorithm | N | " + " | ".join(f"lr {lr:g}" for lr in grid) + " | picked |"
    rows = [head, "|---|---|" + "---|" * len(grid) + "---|"]
    for (alg, n), by_lr in sorted(sweep.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        best = pick_lr(by_lr)
        cells = [
            (f"**{_f(mean(by_lr[lr]))}**" if lr == best else _f(mean(by_lr[lr]))) if lr in by_lr else "-" for lr in grid
        ]
        edge = " (grid edge)" if len(grid) > 1 and best in (min(grid), max(grid)) else ""
        rows.append(f"| {alg} | {n} | " + " | ".join(cells) + f" | {best:g}{edge} |")
    return "\n".join(rows)


def main_table(final: dict[Key, list[dict[str, Any]]], start: list[float], warm: dict[str, Any], epochs: float) -> str:
    """One row per (algorithm, N) at its picked learning rate: test EM, its gain over the shared
    start, and the cost under the three measures (means over seeds)."""
    rows = [
        "| algorithm | N | lr | seeds | test EM | gain over start +- s.e. (questions / seeds) | steps | training rollouts "
        f"| cost: paper's Fig. 4 | cost: amortised over E={epochs:g} epochs | cost: all-in | tool calls per rollout "
        "| adv. variance | wall s per run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (alg, n), runs in sorted(final.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        em = final_em(runs)
        gain = compare(em, [start])
        last = [r["curve"][-1] for r in runs]
        c = {m: mean([cost(r, p, warm, m, epochs) for r, p in zip(runs, last)]) for m in MEASURES}
        rollouts = mean([p["train_rollouts"] for p in last])
        calls = mean([p["train_tool_calls"] for p in last])
        rows.append(
            f"| {alg} | {n} | {runs[0]['lr']:g} | {len(runs)} | {_f(mean([mean(x) for x in em]))} | {_cmp_cell(gain)} "
            f"| {mean([r['steps'] for r in runs]):.0f} | {rollouts:.0f} | {c['paper']:.0f} | {c['amortised']:.0f} "
            f"| {c['all-in']:.0f} | {calls / rollouts if rollouts else float('nan'):.2f} "
            f"| {mean([r['adv_var'] for r in runs]):.4f} | {mean([r['wall_s'] for r in runs]):.0f} |"
        )
    return "\n".join(rows)


def comparison_pairs(keys: Sequence[Key]) -> list[tuple[Key, Key]]:
    """The headline pair, PVPO at N=2 against GRPO at N=5, each algorithm against GRPO at its N,
    and each algorithm at N=2 against itself at N=5 (those of them that ran)."""
    have = set(keys)
    pairs: list[tuple[Key, Key]] = [(a, HEADLINE[1]) for a in (HEADLINE[0], ("pvpo", 2))]
    pairs += [((alg, n), ("grpo", n)) for alg, n in sorted(have, key=lambda k: (k[1], k[0])) if alg != "grpo"]
    pairs += [((alg, 2), (alg, 5)) for alg in sorted({a for a, _ in have})]
    out: list[tuple[Key, Key]] = []
    for p in pairs:
        if p[0] in have and p[1] in have and p[0] != p[1] and p not in out:
            out.append(p)
    return out


def pairs_table(final: dict[Key, list[dict[str, Any]]]) -> str:
    rows = [
        "| A | B | EM(A) - EM(B) | s.e. | s.e. questions (paired) | s.e. seeds | at 2 s.e. |",
        "|---|---|---|---|---|---|---|",
    ]
    for a, b in comparison_pairs(list(final)):
        c = compare(final_em(final[a]), final_em(final[b]))
        rows.append(
            f"| {a[0]} N={a[1]} | {b[0]} N={b[1]} | {c.diff:+.3f} | {c.se:.3f} | {c.se_questions:.3f} | {c.se_seeds:.3f} "
            f"| {c.verdict()} |"
        )
    return "\n".join(rows)


def fig4_verdict(
    final: dict[Key, list[dict[str, Any]]], start: list[float], warm: dict[str, Any], epochs: float
) -> str:
    """The answer to the Fig. 4 question under each cost measure (module docstring), written from
    the numbers, with the power of the comparison."""
    pv_key, gr_key = HEADLINE
    if pv_key not in final or gr_key not in final:
        return "Fig. 4 question: not answerable here: it needs pvpo+gs at N=2 and grpo at N=5 among the final runs."
    pv, gr = final[pv_key], final[gr_key]
    head = compare(final_em(pv), final_em(gr))
    margin = compare(final_em(pv), final_em(gr), scale_b=ACCURACY_RATIO)
    em_p, em_g = mean([mean(x) for x in final_em(pv)]), mean([mean(x) for x in final_em(gr)])
    g_gain = compare(final_em(gr), [start])
    if margin.diff - 2 * margin.se >= 0:
        acc, acc_words = "holds", "at least 97% of GRPO N=5's, by more than 2 s.e."
    elif margin.diff + 2 * margin.se < 0:
        acc, acc_words = "fails", "below 97% of GRPO N=5's by more than 2 s.e."
    else:
        acc, acc_words = "undecided", "within 2 s.e. of 97% of GRPO N=5's"
    lines = [
        f"**Fig. 4 question** (PVPO at N=2 reaching >= 97% of GRPO at N=5's accuracy at <= {COST_RATIO:.0%} of its cost; "
        f"both trained {mean([r['steps'] for r in gr]):.0f} steps from the same start): test EM PVPO+GS N=2 {em_p:.3f} "
        f"({len(pv)} seeds) vs GRPO N=5 {em_g:.3f} ({len(gr)} seeds), difference {head.diff:+.3f} +- {head.se:.3f} "
        f"(s.e. over questions, paired, {head.se_questions:.3f}; over seeds {head.se_seeds:.3f}); "
        f"EM(PVPO) - 0.97 EM(GRPO) = {margin.diff:+.3f} +- {margin.se:.3f}: PVPO's accuracy is {acc_words}. "
        f"Power: differences smaller than 2 s.e. = {2 * head.se:.3f} EM are not resolved. The issue's bar, s.e. <= "
        f"{SE_BAR}, is {'met' if head.se <= SE_BAR else 'not met'} by the s.e. over questions and seeds ({head.se:.3f}), "
        f"{'met' if head.se_questions <= SE_BAR else 'not met'} by the paired s.e. over questions alone "
        f"({head.se_questions:.3f}, which leaves out how much other RL seeds would move the result).",
    ]
    if g_gain.diff - 2 * g_gain.se <= 0:
        lines.append(
            f"Caveat: GRPO N=5 did not gain over the start by 2 s.e. ({g_gain.diff:+.3f} +- {g_gain.se:.3f}), so matching it "
            "says little about sample efficiency."
        )
    for m, words in MEASURES.items():
        ratio, r_se = cost_ratio(
            [cost(r, r["curve"][-1], warm, m, epochs) for r in pv],
            [cost(r, r["curve"][-1], warm, m, epochs) for r in gr],
        )
        if ratio + 2 * r_se <= COST_RATIO:
            side = "holds"
        elif ratio - 2 * r_se > COST_RATIO:
            side = "fails"
        else:
            side = "undecided"
        if side == "holds" and acc == "holds":
            v = "reproduced"
        elif "fails" in (side, acc):
            v = "refuted"
        else:
            v = f"not decidable at this power (2 s.e. = {2 * margin.se:.3f} EM, {2 * r_se:.2f} in the cost ratio)"
        c_p = mean([cost(r, r["curve"][-1], warm, m, epochs) for r in pv])
        c_g = mean([cost(r, r["curve"][-1], warm, m, epochs) for r in gr])
        lines.append(
            f"- By the {words}: PVPO N=2 {c_p:.0f} vs GRPO N=5 {c_g:.0f}, ratio {ratio:.2f} +- {r_se:.2f} "
            f"(cost side {side} at {COST_RATIO:.0%}); accuracy side {acc}: **{v}**."
        )
    return "\n".join(lines)


def cost_ratio(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """mean(a) / mean(b) over seeds and its standard error (delta method: the ratio times the root
    of the squared relative standard errors of the two means)."""
    ma, mb = mean(a), mean(b)
    if not mb:
        return float("nan"), float("nan")
    r = ma / mb
    rel = math.hypot(standard_error(a) / ma if ma else 0.0, standard_error(b) / mb)
    return r, abs(r) * rel


def plot_curves(
    final: dict[Key, list[dict[str, Any]]], start: list[float], warm: dict[str, Any], epochs: float, path: Path
) -> None:
    """Test EM gain over the shared start against cumulative cost, one panel per cost measure: mean
    over seeds at each evaluation, band = +- s.e. (questions and seeds, `compare`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(MEASURES), figsize=(6 * len(MEASURES), 4.6), sharey=True)
    keys = sorted(final, key=lambda k: (k[1], k[0]))
    for i, key in enumerate(keys):
        runs = final[key]
        k = min(len(r["curve"]) for r in runs)
        gains = [compare([r["curve"][j]["em_q"] for r in runs], [start]) for j in range(k)]
        y = [g.diff for g in gains]
        lo = [g.diff - g.se for g in gains]
        hi = [g.diff + g.se for g in gains]
        for ax, m in zip(axes, MEASURES):
            x = [mean([cost(r, r["curve"][j], warm, m, epochs) for r in runs]) for j in range(k)]
            ls = "-" if key[1] == min(n for _, n in keys) else "--"
            ax.plot(x, y, ls, marker="o", ms=3, color=f"C{i % 10}", label=f"{key[0]} N={key[1]}")
            ax.fill_between(x, lo, hi, color=f"C{i % 10}", alpha=0.15)
    for ax, words in zip(axes, MEASURES.values()):
        ax.set_xlabel(f"cumulative tool calls: {words}".replace("E)", f"E={epochs:g})"), fontsize=8)
        ax.axhline(0, color="0.6", lw=0.8)
    axes[0].set_ylabel("test EM - EM of the shared warm start")
    axes[0].legend(fontsize=8, ncol=2)
    fig.suptitle(
        "one shared warm start; each (algorithm, N) at its lr (picked on validation when swept); band: +- s.e. (questions and seeds)"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})  # the same bytes from the same results
    plt.close(fig)


def report(
    *,
    header: str,
    warm: dict[str, Any],
    sweep: dict[Key, dict[float, list[float]]],
    grid: Sequence[float],
    final: dict[Key, list[dict[str, Any]]],
    epochs: float,
    out: Path,
    plot: Path | None = None,
) -> str:
    """results.md's text (also written into `out`), and the plot when there are final runs (at
    `plot`, default `out`/em_vs_cost.png)."""
    start_val, start_test = warm["start"]["validation"]["em_q"], warm["start"]["test"]["em_q"]
    o, gs = warm["one_off"], warm.get("group_sampling", {})
    parts = [
        header,
        f"Shared warm start: {warm['warm_steps']} SFT steps (seed {warm['warm_seed']}, {warm['warm_s']:.0f} s), "
        f"{'the first' if warm['in_band'] else 'none in the band; the closest to its centre'} of the lengths tried whose "
        f"validation EM lies in [{warm['warm_band'][0]:g}, {warm['warm_band'][1]:g}] (tried: "
        + ", ".join(f"{t['steps']} steps {t['validation_em']:.3f}" for t in warm["tries"])
        + f"): EM "
        f"{mean(start_val):.3f} on validation ({len(start_val)} questions), {mean(start_test):.3f} on test "
        f"({len(start_test)}); {warm['n_rl']} RL prompts, {warm['prompts_per_step']} per step. One-off reference work "
        f"(charged by the all-in and amortised measures): anchor M={warm['anchor_m']}, {o['anchor']['rollouts']:.0f} "
        f"rollouts / {o['anchor']['tool_calls']:.0f} tool calls; GT generation {o['gt']['rollouts']:.0f} / "
        f"{o['gt']['tool_calls']:.0f}; Group Sampling dropped {gs.get('gs/dropped_frac', 0):.1%} / kept "
        f"{gs.get('gs/kept_frac', 0):.1%} / gave GT to {gs.get('gs/gt_frac', 0):.1%} of the prompts.",
    ]
    if sweep:
        parts += [
            "## Learning-rate sweep (validation EM at the end of the run, mean over the sweep seeds)",
            sweep_table(sweep, grid),
        ]
    if final:
        parts += [
            "## Test (each row at its picked lr; means over seeds)",
            "Cost columns are cumulative tool calls at the end of the run: the paper's Fig. 4 measure (training "
            "rollouts only), amortised (plus the one-off anchor and GT cost x this run's epochs / E) and all-in "
            "(plus all of it).",
            main_table(final, start_test, warm, epochs),
            "## Paired comparisons on the same test questions (s.e. = questions and seeds together)",
            pairs_table(final),
            "## Verdict",
            fig4_verdict(final, start_test, warm, epochs),
        ]
        plot_curves(final, start_test, warm, epochs, plot if plot is not None else out / "em_vs_cost.png")
    else:
        parts.append("No final run has finished yet.")
    text = "\n\n".join(parts) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(text)
    return text


def readme_table(
    final: dict[Key, list[dict[str, Any]]],
    start: list[float],
    warm: dict[str, Any],
    sweep: dict[Key, dict[float, list[float]]],
    grid: Sequence[float],
    epochs: float,
    lr_from: str | None = None,
) -> str:
    """The benchmark page's table (docs/benchmarks/algorithms.md): per (algorithm, N) its lr, test EM (the best of each N in bold), gain
    over the shared start and the three costs, means over seeds."""
    seeds = "/".join(str(k) for k in sorted({len(r) for r in final.values()}))
    where = f"the sweep of {lr_from}" if lr_from else "picked on validation"
    rows = [
        f"| algorithm | N | lr ({where}) | test EM ({seeds} seeds) | gain over the start +- s.e. (questions / seeds) "
        f"| cost: paper's Fig. 4 | amortised, E={epochs:g} | all-in |",
        "|---|---|---|---|---|---:|---:|---:|",
    ]
    em = {k: mean([mean(x) for x in final_em(runs)]) for k, runs in final.items()}
    for (alg, n), runs in sorted(final.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        lr = runs[0]["lr"]
        edge = " (grid edge)" if sweep and len(grid) > 1 and lr in (min(grid), max(grid)) else ""
        best = em[(alg, n)] == max(v for (_, m), v in em.items() if m == n)
        cell = f"**{em[(alg, n)]:.3f}**" if best else f"{em[(alg, n)]:.3f}"
        last = [r["curve"][-1] for r in runs]
        c = {m: mean([cost(r, p, warm, m, epochs) for r, p in zip(runs, last)]) for m in MEASURES}
        rows.append(
            f"| {alg} | {n} | {lr:g}{edge} | {cell} | {_cmp_cell(compare(final_em(runs), [start]))} "
            f"| {c['paper']:,.0f} | {c['amortised']:,.0f} | {c['all-in']:,.0f} |"
        )
    return "\n".join(rows)


def headline_lines(final: dict[Key, list[dict[str, Any]]], warm: dict[str, Any]) -> str:
    """PVPO at N=2 against GRPO at N=5, with Group Sampling (its GT rows are oracle trajectories)
    and without it (the anchor alone), side by side; empty when those arms did not run."""
    base = HEADLINE[1]
    if base not in final:
        return ""
    gt = warm.get("group_sampling", {}).get("gs/gt_frac", 0.0)
    arms = (
        (
            HEADLINE[0],
            "PVPO with Group Sampling, N=2 (its GT rows are the synthetic world's oracle trajectories, on the "
            f"{gt:.1%} of the RL prompts the reference never solves)",
        ),
        (("pvpo", 2), "PVPO without Group Sampling (the anchor alone), N=2"),
    )
    words = {
        "A > B": f"above {base[0].upper()} N={base[1]} by more than 2 s.e.",
        "A < B": f"below {base[0].upper()} N={base[1]} by more than 2 s.e.",
        "not resolved": "not resolved at 2 s.e.",
    }
    lines = []
    for key, label in arms:
        if key in final:
            c = compare(final_em(final[key]), final_em(final[base]))
            lines.append(
                f"- **{label} - {base[0].upper()} N={base[1]}: {c.diff:+.3f} +- {c.se:.3f}**, {words[c.verdict()]}"
            )
    return "\n".join(lines)


def readme_block(
    final: dict[Key, list[dict[str, Any]]],
    warm: dict[str, Any],
    sweep: dict[Key, dict[float, list[float]]],
    grid: Sequence[float],
    epochs: float,
    lr_from: str | None = None,
    record: Sequence[str] = (),
) -> str:
    """What the benchmark page shows of a benchmark, all of it computed here: the record of the runs,
    `readme_table`, the headline comparisons (`headline_lines`), all paired comparisons and the
    Fig. 4 verdict."""
    start = warm["start"]["test"]["em_q"]
    parts = [
        "\n".join(f"- {line}" for line in record),
        readme_table(final, start, warm, sweep, grid, epochs, lr_from),
        headline_lines(final, warm),
        f"Paired on the same {len(start)} test questions (s.e. over questions and seeds together; a difference is "
        "resolved beyond 2 s.e.):",
        pairs_table(final),
        fig4_verdict(final, start, warm, epochs),
    ]
    return "\n\n".join(p for p in parts if p) + "\n"
