"""`pvpo data ...`: inspect QA datasets, build retriever corpora from their paragraphs, write the
synthetic world."""

from __future__ import annotations

import json
from pathlib import Path

import typer

data_app = typer.Typer(
    name="data",
    help="QA datasets: named question sets fetched, corpora from their paragraphs, the synthetic world.",
    no_args_is_help=True,
)


@data_app.command("get")
def get(
    name: str | None = typer.Argument(
        None,
        help="A question set: nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa (2wiki), musique, bamboogle.",
        show_default=False,
    ),
    out: Path = typer.Option(Path("runs/data"), "--out", help="Folder to write NAME/SPLIT.jsonl into."),
    folder: str | None = typer.Option(
        None,
        "--name",
        help="Write OUT/THIS/SPLIT.jsonl instead of OUT/NAME/...: the folder names the questions "
        "(their uid prefix and table column; e.g. hotpotqa_hard as the multi-hop recipe's config does).",
    ),
    split: str | None = typer.Option(
        None, "--split", help="train, dev or test, as the set has them (default: its evaluation split: dev or test)."
    ),
    source: Path | None = typer.Option(
        None,
        "--from",
        help="A local copy instead of the hub: a download of RUC-NLPIR/FlashRAG_datasets (DIR/NAME/SPLIT.jsonl), "
        "a flat folder of NAME.SPLIT.jsonl files, or for musique a folder holding musique_ans_v1.0_SPLIT.jsonl.",
    ),
    limit: int | None = typer.Option(None, "--limit", help="Keep N questions, a draw with --seed kept in file order."),
    seed: int = typer.Option(0, "--seed", help="Seed of --limit's draw (the same subset on every machine)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a file an earlier `pvpo data get` wrote."),
    list_sets: bool = typer.Option(False, "--list", help="Print the names, their splits and the source, and exit."),
) -> None:
    """Fetch a question set the recipes use onto this machine, as OUT/NAME/SPLIT.jsonl (FlashRAG's
    jsonl; `pvpo eval --dataset NAME --data-dir OUT` finds it by name).

    The source is the Hugging Face dataset RUC-NLPIR/FlashRAG_datasets (MuSiQue as released, with its
    paragraphs: dgslibisey/MuSiQue), through huggingface_hub (the whole split is downloaded into its
    cache, then --limit applies); --list shows each file. Where the hub cannot be
    reached the command ends with one line saying so: copy the file to this machine and pass --from.

    Example: pvpo data get hotpotqa --split train --limit 100 --out runs/data (a seeded draw of 100
    training questions, for the real-data recipe's data.source).
    """
    from pvpo.envs.fetch import SPLITS, get
    from pvpo.envs.fetch import source as source_of

    if list_sets:
        for bench, splits in SPLITS.items():
            typer.echo(f"{bench}\t{', '.join(splits)}\t{'/'.join(source_of(bench, '<split>'))}")
        return
    if name is None:
        raise typer.BadParameter("give a question set's name (pvpo data get --list shows them)", param_hint="NAME")
    if source is None:
        typer.echo(f"fetching {name} from the Hugging Face hub ...")
    got = get(name, out, split=split, folder=folder, source_dir=source, limit=limit, seed=seed, overwrite=overwrite)
    typer.echo(
        f"{got.questions} of {got.of} questions ({got.with_paragraphs} with paragraphs) from {got.source} -> {got.path}"
    )
    if got.with_paragraphs == 0:
        typer.echo(
            "note: no question carries paragraphs, so `pvpo data corpus` (data.corpus: questions) has nothing to "
            "index: give these questions a corpus file of their own (data.corpus FILE, --index)"
        )


@data_app.command("corpus")
def corpus(
    dataset: str = typer.Argument(
        ..., help="Questions file (format detected from its content) or a registered dataset name."
    ),
    out: Path = typer.Argument(..., help="Corpus jsonl to write ({id, contents}, title on the first line)."),
    name: str | None = typer.Option(None, help="Dataset name used as uid prefix (default: from the file name)."),
    format: str | None = typer.Option(None, "--format", help="Force a format instead of detecting it."),
) -> None:
    """Write the distinct paragraphs a dataset ships with its questions as a retriever corpus."""
    from pvpo.envs.corpus import corpus_from_examples, write_corpus
    from pvpo.envs.loaders import load_dataset

    examples = load_dataset(dataset, name=name, format=format)
    passages = corpus_from_examples(examples)
    if not passages:
        raise typer.BadParameter(f"{dataset} has no paragraphs to build a corpus from", param_hint="dataset")
    write_corpus(passages, out)
    typer.echo(f"{len(passages)} passages from {len(examples)} questions -> {out}")


@data_app.command("synthetic")
def synthetic(
    out_dir: Path = typer.Argument(..., help="Folder for corpus.jsonl, train.jsonl and test.jsonl."),
    seed: int = typer.Option(0, help="World seed."),
    n_entities: int = typer.Option(60, help="Number of made-up people."),
    n_relations: int = typer.Option(4, help="Relations per person (1-6)."),
    max_hops: int = typer.Option(4, help="Longest question chain (1-4)."),
    questions_per_hop: int = typer.Option(150, help="Questions per hop count, before the split."),
) -> None:
    """Write the synthetic world: its corpus and its train/test questions (FlashRAG jsonl; load them
    with `name="synthetic-s<seed>"` to get the same uids as the built-in `synthetic` dataset)."""
    from pvpo.envs.synthetic import SyntheticWorld

    world = SyntheticWorld.generate(
        seed, n_entities, n_relations=n_relations, max_hops=max_hops, questions_per_hop=questions_per_hop
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    world.write_corpus(out_dir / "corpus.jsonl")
    for split in ("train", "test"):
        with (out_dir / f"{split}.jsonl").open("w", encoding="utf-8") as f:
            for ex in world.questions(split):
                f.write(
                    json.dumps(
                        {
                            "id": ex.uid.split("/", 1)[1],
                            "question": ex.question,
                            "golden_answers": list(ex.golden_answers),
                            "metadata": {k: list(v) if isinstance(v, tuple) else v for k, v in ex.metadata.items()},
                        }
                    )
                    + "\n"
                )
    typer.echo(
        f"{len(world.passages)} passages, {len(world.questions('train'))} train / {len(world.questions('test'))} test questions -> {out_dir}"
    )


@data_app.command("show")
def show(
    dataset: str = typer.Argument(..., help="Questions file or registered dataset name."),
    n: int = typer.Option(3, help="How many questions to print."),
) -> None:
    """Print the detected format's first questions as the environment sees them."""
    from pvpo.envs.loaders import load_dataset

    examples = load_dataset(dataset)
    typer.echo(f"{len(examples)} questions")
    for ex in examples[:n]:
        typer.echo(
            json.dumps(
                {
                    "uid": ex.uid,
                    "question": ex.question,
                    "golden_answers": list(ex.golden_answers),
                    "paragraphs": len(ex.paragraphs),
                    "supporting": len(ex.supporting),
                },
                ensure_ascii=False,
            )
        )


def register(app: typer.Typer) -> None:
    """Add the `data` sub-command group to the `pvpo` CLI."""
    app.add_typer(data_app, name="data")
