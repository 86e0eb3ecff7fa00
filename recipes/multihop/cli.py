"""`pvpo recipe`: the multi-hop recipe's stages after its `pvpo demo` run (RL seeds from its warm
start, the compute-matched SFT arm, the held-out and per-type tables, the dataset GT's coverage), so
the recipe runs end to end from `pvpo` commands (docs/recipes/real-smollm2-multihop.md). Each command's work lives in its
own module; this file only reads the options. Heavy imports stay inside the commands."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

recipe_app = typer.Typer(
    name="recipe",
    help="The multi-hop recipe after `pvpo demo`: RL seeds from its warm start, the compute-matched SFT arm, "
    "the held-out and per-type tables, the dataset GT's coverage.",
    no_args_is_help=True,
    add_completion=False,
)

RecipeRun = Annotated[
    Path,
    typer.Option(
        "--recipe-run",
        help="a `pvpo demo --config real_smollm2_multihop` run (held-out or validation mode): its warm start "
        "(initial_policy), config and index",
    ),
]
ReportOnly = Annotated[bool, typer.Option("--report-only", help="train nothing: rewrite the report from finished runs")]


def _command(*words: str | Path | None) -> str:
    """The command line a report records: the words given, None left out."""
    return shlex.join(str(w) for w in words if w is not None)


@recipe_app.command("seeds")
def seeds_cmd(
    recipe_run: RecipeRun,
    seeds: Annotated[
        str, typer.Option("--seeds", help="the further RL seeds, comma-separated (the recipe run's own is the first)")
    ] = "1,2",
    out: Annotated[Path, typer.Option("--out", help="one folder per seed (seed_<k>) and results.md")] = Path(
        "runs/rl_seeds"
    ),
    report_only: ReportOnly = False,
    again: Annotated[
        bool,
        typer.Option(
            "--reproduce",
            help="then `pvpo eval` the warm start and each seed's final policy again (into OUT/eval) and count "
            "the questions whose EM differs from its run's",
        ),
    ] = False,
    held_out: Annotated[
        bool,
        typer.Option(
            "--held-out",
            help="a validation-mode recipe run, its setting chosen: evaluate the base model, the warm start and "
            "each seed's final policy on the held-out questions, once (kept under OUT/held_out), into "
            "OUT/held_out.md",
        ),
    ] = False,
) -> None:
    """RL seeds from the recipe run's warm start, and RL's gain over it with the seeds' spread.

    Each further seed is a `pvpo demo` into OUT/seed_<k> with `run.seed` changed and nothing else; then
    OUT/results.md: RL minus the warm start per seed and over the seeds (their spread in the s.e.), per
    dataset, and the validation EM by RL step. A finished seed is kept, a killed one resumes; the seeds
    may start while the recipe run's own RL still runs (the report waits for it)."""
    from pvpo.recipes.multihop.seeds import seeds_recipe

    command = _command(
        "pvpo",
        "recipe",
        "seeds",
        "--recipe-run",
        recipe_run,
        "--seeds",
        seeds,
        "--out",
        out,
        "--report-only" if report_only else None,
        "--reproduce" if again else None,
        "--held-out" if held_out else None,
    )
    seeds_recipe(recipe_run, seeds, out, report_only=report_only, again=again, held_out=held_out, command=command)


@recipe_app.command("sft-arm")
def sft_arm_cmd(
    recipe_run: RecipeRun,
    match_wall_of: Annotated[
        list[Path] | None,
        typer.Option(
            "--match-wall-of",
            help="a finished RL run from that warm start, once per run (the recipe run, each seed's): their mean "
            "RL phase sets the SFT steps, and the report compares with their evaluations",
        ),
    ] = None,
    seeds: Annotated[str, typer.Option("--seeds", help="the SFT arm's data-order seeds, comma-separated")] = "0,1,2",
    out: Annotated[Path, typer.Option("--out", help="plan.json, seed_<k>/, results.md")] = Path("runs/sft_arm"),
    report_only: ReportOnly = False,
    held_out: Annotated[
        bool,
        typer.Option(
            "--held-out",
            help="then evaluate each seed's policy on the held-out questions once, into OUT/held_out.md "
            "(needs --rl-seeds-out)",
        ),
    ] = False,
    rl_seeds_out: Annotated[
        Path | None,
        typer.Option("--rl-seeds-out", help="`pvpo recipe seeds`' --out, whose held_out/ evaluations it reads"),
    ] = None,
) -> None:
    """The compute-matched SFT arm: the warm start continued with SFT for RL's wall time, against RL.

    The steps are the RL runs' mean RL phase over one warm-start SFT step (OUT/plan.json, fixed once);
    one child process per data-order seed into OUT/seed_<k>; then `pvpo eval` of each and
    OUT/results.md: RL against SFT at equal compute, each minus the warm start, with the seeds' spread
    in the s.e."""
    from pvpo.recipes.multihop.sft_arm import sft_arm_recipe

    walls = [w for run in match_wall_of or [] for w in ("--match-wall-of", run)]
    command = _command(
        "pvpo",
        "recipe",
        "sft-arm",
        "--recipe-run",
        recipe_run,
        *walls,
        "--seeds",
        seeds,
        "--out",
        out,
        "--report-only" if report_only else None,
        "--held-out" if held_out else None,
        *(("--rl-seeds-out", rl_seeds_out) if rl_seeds_out else ()),
    )
    sft_arm_recipe(
        recipe_run,
        list(match_wall_of or []),
        seeds,
        out,
        report_only=report_only,
        held_out=held_out,
        rl_seeds_out=rl_seeds_out,
        command=command,
    )


@recipe_app.command("sft-seed", hidden=True)
def sft_seed_cmd(
    recipe_run: RecipeRun,
    out: Annotated[Path, typer.Option("--out", help="the arm's folder: the seed trains into OUT/seed_<k>")],
    seed: Annotated[int, typer.Option("--seed", help="the data-order seed")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="SFT steps (the arm's plan.json)")],
) -> None:
    """One SFT seed of `sft-arm`, in the child process `sft-arm` starts for it."""
    from pvpo.recipes.multihop.sft_train import seed_dir, train_seed

    train_seed(recipe_run, seed, steps, seed_dir(out, seed))


@recipe_app.command("table")
def table_cmd(
    base: Annotated[Path | None, typer.Option("--base", help="`pvpo eval --out` folder of the base model")] = None,
    warm: Annotated[
        Path | None, typer.Option("--warm", help="`pvpo eval --out` folder of the warm-started policy")
    ] = None,
    rl: Annotated[
        list[Path] | None,
        typer.Option("--rl", help="`pvpo eval --out` folder of the RL policy (with --by-type: once per RL seed)"),
    ] = None,
    sft: Annotated[
        list[Path] | None,
        typer.Option("--sft", help="with --by-type: a folder of the compute-matched SFT arm, once per seed"),
    ] = None,
    by_type: Annotated[
        bool, typer.Option("--by-type", help="the table by dataset and question type, seeds and the SFT arm included")
    ] = False,
    questions: Annotated[
        list[Path] | None,
        typer.Option(
            "--questions",
            help="with --by-type: a dataset's question file (its type field, MuSiQue's decomposition), once per file",
        ),
    ] = None,
) -> None:
    """The held-out table from `pvpo eval` folders: base model, warm start, RL (and SFT), per dataset.

    Per dataset and overall: EM (s.e.), F1, CEM, format ok and searches of each policy, the paired EM
    differences, and how often a golden answer was in the retrieved passages; questions are matched by
    id. `--by-type`: by question type, with RL and SFT over the warm start and RL minus SFT (the seeds'
    spread in the s.e.)."""
    from pvpo.recipes.multihop.table import table_text

    folders = [("--base", base), ("--warm", warm), *(("--rl", d) for d in rl or []), *(("--sft", d) for d in sft or [])]
    command = _command(
        "pvpo",
        "recipe",
        "table",
        "--by-type" if by_type else None,
        *(w for q in questions or [] for w in ("--questions", q)),
        *(w for pair in folders if pair[1] for w in pair),
    )
    text = table_text(
        base=base,
        warm=warm,
        rl=list(rl or []),
        sft=list(sft or []),
        by_type=by_type,
        questions=list(questions or []),
        command=command,
    )
    typer.echo(text)


@recipe_app.command("gt-coverage")
def gt_coverage_cmd(
    tokenizer: Annotated[
        str, typer.Option("--tokenizer", help="the policy's tokenizer folder (its chat template is used)")
    ],
    data: Annotated[
        Path, typer.Option("--data", help="folder holding the dataset folders (musique_mini/, hotpotqa_hard/, ...)")
    ] = Path("../shared/data"),
    datasets: Annotated[
        str,
        typer.Option(
            "--datasets",
            help="comma-separated folders of --data, e.g. "
            "hotpotqa_mini,musique_mini,hotpotqa_hard,2wikimultihopqa,musique_dev",
        ),
    ] = "musique_mini,hotpotqa_mini",
    topk: Annotated[int, typer.Option("--topk", min=1, help="passages a search returns")] = 3,
    max_turns: Annotated[int, typer.Option("--max-turns", min=1, help="the episode's turns")] = 5,
    max_obs_chars: Annotated[
        int, typer.Option("--max-obs-chars", min=1, help="character budget of one search result")
    ] = 2000,
    pooled: Annotated[
        bool, typer.Option("--pooled", help="one index over all the datasets' paragraphs, as the recipe builds")
    ] = False,
    index_dir: Annotated[
        Path | None, typer.Option("--index-dir", help="keep the index here and reuse it on the next call")
    ] = None,
    encoder_dtype: Annotated[
        str | None,
        typer.Option("--encoder-dtype", help="the encoder's torch dtype while building: float32 or bfloat16"),
    ] = None,
    supporting_only: Annotated[
        bool,
        typer.Option(
            "--supporting-only",
            help="only questions whose paragraphs hold their supporting ones (data.require_supporting_paragraphs)",
        ),
    ] = False,
) -> None:
    """How many questions of each dataset get a `dataset` GT trajectory for the warm start, and why not.

    Each annotation's plan is written as agent turns, every search checked to retrieve its gold
    paragraph with the quoted sentences inside --max-obs-chars, replayed through the env over a
    MiniLM + FAISS index of the questions' own paragraphs, and scored by the reward; one table row per
    dataset (written, no annotation, too many hops, search missed, evidence cut, reward 1, tokens)."""
    if encoder_dtype not in (None, "float32", "bfloat16"):
        raise ValueError(f"--encoder-dtype {encoder_dtype}: give float32 or bfloat16")
    names = [n for n in datasets.split(",") if n.strip()]
    if not names:
        raise ValueError("--datasets: name at least one folder of --data")
    from pvpo.recipes.multihop.gt_coverage import gt_coverage

    command = _command(
        "pvpo",
        "recipe",
        "gt-coverage",
        "--tokenizer",
        tokenizer,
        "--data",
        data,
        "--datasets",
        datasets,
        "--topk",
        str(topk),
        "--max-turns",
        str(max_turns),
        "--max-obs-chars",
        str(max_obs_chars),
        "--pooled" if pooled else None,
        *(("--index-dir", index_dir) if index_dir else ()),
        *(("--encoder-dtype", encoder_dtype) if encoder_dtype else ()),
        "--supporting-only" if supporting_only else None,
    )
    gt_coverage(
        tokenizer=tokenizer,
        data=data,
        datasets=names,
        topk=topk,
        max_turns=max_turns,
        max_obs_chars=max_obs_chars,
        pooled=pooled,
        index_dir=index_dir,
        encoder_dtype=encoder_dtype,
        supporting_only=supporting_only,
        command=command,
    )


def register(app: typer.Typer) -> None:
    """Add `recipe` (`seeds`, `sft-arm`, `table`, `gt-coverage`) to the `pvpo` CLI."""
    app.add_typer(recipe_app, name="recipe")
