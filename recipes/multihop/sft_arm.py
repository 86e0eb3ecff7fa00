"""`pvpo recipe sft-arm`: the compute-matched SFT arm end to end. The recipe's warm start continued
for as many SFT steps as fit the wall time of the RL phase it is compared with (`sft_plan`), from
the same warm start, over several data-order seeds (`sft_train`); then RL against it on the split
the RL runs evaluated, and on the held-out set once (`sft_report`).

The recipe run is a finished `pvpo demo --config real_smollm2_multihop ...` (validation mode for
choosing; its `initial_policy` is the warm start every arm starts from); `--match-wall-of` names the
RL arm's finished seed runs from that warm start (the recipe run and `pvpo recipe seeds`' ones)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pvpo.machine import machine_line
from pvpo.recipes.multihop.runs import recipe_config, split_of
from pvpo.recipes.multihop.sft_plan import fixed_plan, plan
from pvpo.recipes.multihop.sft_report import held_out_report, split_report
from pvpo.recipes.multihop.sft_train import run_seeds, seed_dir, seed_finished

PACKAGES = ("torch", "transformers", "vllm")  # the versions each report's machine line gives


def parse_seeds(text: str) -> list[int]:
    """The data-order seeds of `--seeds` ("0,1,2"): at least one, each once."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds {text}: give whole numbers, comma-separated (e.g. 0,1,2)") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text}: give each data-order seed once")
    return seeds


def sft_arm_recipe(
    recipe_run: Path,
    match_wall_of: Sequence[Path],
    seeds_text: str,
    out: Path,
    *,
    report_only: bool,
    held_out: bool,
    rl_seeds_out: Path | None,
    command: str,
) -> int:
    """Plan the step count (OUT/plan.json, fixed once), train the unfinished seeds (unless
    `report_only`), evaluate them and write OUT/results.md; with `held_out`, OUT/held_out.md
    against `rl_seeds_out`'s kept held-out evaluations. Every refusal comes before any training."""
    if not match_wall_of:
        raise ValueError(
            "--match-wall-of: name the RL arm's finished seed runs (e.g. the recipe run and pvpo recipe seeds' seed_<k>)"
        )
    if held_out and rl_seeds_out is None:
        raise ValueError("--held-out needs --rl-seeds-out (pvpo recipe seeds' --out, with its held_out/ evaluations)")
    seeds = parse_seeds(seeds_text)
    if split_of(recipe_config(recipe_run)) != "validation" and held_out:
        raise ValueError(f"--held-out: {recipe_run} is a held-out-mode run; its own evaluations are the held-out ones")
    out.mkdir(parents=True, exist_ok=True)
    p = fixed_plan(out, plan(recipe_run, match_wall_of))
    print(f"SFT arm: {p['steps']} steps (RL phase {p['rl_phase_mean_s']:.0f} s / {p['sft_step_s']:.1f} s a step)")
    if not report_only:
        run_seeds(recipe_run, seeds, p["steps"], out)
    unfinished = [str(seed_dir(out, s)) for s in seeds if not seed_finished(seed_dir(out, s))]
    if unfinished:
        raise ValueError(f"unfinished SFT seeds: {', '.join(unfinished)}; run without --report-only")
    head = [f"machine: {machine_line(PACKAGES)}", f"command: `{command}`", ""]
    body = split_report(recipe_run, match_wall_of, seeds, out, p)
    text = "\n".join([body[0], "", *head, *body[2:]]) + "\n"
    (out / "results.md").write_text(text)
    print(text)
    if held_out:
        assert rl_seeds_out is not None  # refused above
        body = held_out_report(recipe_run, rl_seeds_out, seeds, out, p)
        text = "\n".join([body[0], "", *head, *body[2:]]) + "\n"
        (out / "held_out.md").write_text(text)
        print(text)
    return 0
