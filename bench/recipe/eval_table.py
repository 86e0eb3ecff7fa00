"""The recipe's held-out table from `pvpo eval` folders: per dataset and overall, EM (s.e.), F1, CEM,
format ok and searches of the base model, the warm start and the RL policy, then the paired EM
differences on the same questions (the table `pvpo demo` writes in `summary.md`, recomputed from
`pvpo eval` outputs of the saved policies).

    python bench/recipe/eval_table.py --base runs/heldout/base --warm runs/heldout/warm --rl runs/heldout/rl

Each folder is one `pvpo eval --out` with one sub-folder per dataset (`predictions.jsonl`);
questions are matched by id, so the three need not list them in the same order. CEM is FlashRAG's
`acc` (a golden answer contained in the prediction).

`--by-type` breaks the table down by dataset and question type, from the kept predictions joined
with the datasets' own question files (`--questions`: 2WikiMultihopQA's and HotpotQA's `type`,
MuSiQue's hop count from its decomposition): per type, each policy's EM, how often a golden answer
was in the passages it retrieved (answer in reach) and its EM where it was (written when in reach),
then RL and the compute-matched SFT arm (`bench/recipe/sft_arm.py`) over the warm start and RL minus SFT,
with standard errors that count the seeds' spread when `--rl` / `--sft` give one folder per seed:

    python bench/recipe/eval_table.py --by-type --questions DATA/2wikimultihopqa/questions.jsonl \
        DATA/hotpotqa_hard/questions.jsonl DATA/musique_dev/questions.jsonl --warm runs/C/rl_seeds/held_out/warm \
        --rl runs/C/rl_seeds/held_out/seed_{0,1,2} --sft runs/C/sft/held_out/seed_{0,1,2}
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pvpo.envs.data import QAExample
from pvpo.envs.loaders import iter_examples
from pvpo.recipes.heldout_table import STAGES, per_dataset_table
from pvpo.reward.metrics import as_golds
from pvpo.reward.normalize import normalize_answer
from pvpo.reward.protocol import TagProtocol, get_protocol
from pvpo.stats import mean, seeds_contrast, seeds_difference

Scores = dict[str, dict[str, float]]  # a `pvpo eval` folder's scores by question id (`read_scores`)


def answer_in_reach(response: str, golds: list[str], protocol: TagProtocol | None = None) -> bool:
    """Whether a golden answer (normalised as EM is, as a whole phrase) occurs in the passages the
    episode retrieved: the protocol's result blocks (Search-R1's `<information>` by default)."""
    protocol = protocol or get_protocol("search_r1")
    seen = normalize_answer(" ".join(seg.content for seg in protocol.segments(response) if seg.tag == protocol.result))
    return any(g and f" {g} " in f" {seen} " for g in (normalize_answer(x) for x in golds))


def read_scores(folder: Path) -> dict[str, dict[str, float]]:
    """Each question's scores in a `pvpo eval --out` folder, by question id."""
    scores: dict[str, dict[str, float]] = {}
    files = sorted(folder.glob("*/predictions.jsonl"))
    if not files:
        raise SystemExit(f"error: {folder} holds no <dataset>/predictions.jsonl: give a `pvpo eval --out` folder")
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            out, metric = row["output"], row["output"]["metric_score"]
            scores[row["id"]] = {
                "em": metric["em"],
                "f1": metric["f1"],
                "cem": metric["acc"],
                "format_ok": float(out.get("format_ok", False)),
                "searches": float(out.get("num_searches", 0)),
                "in_reach": float(answer_in_reach(out.get("final_response", ""), as_golds(row.get("golden_answers")))),
            }
    return scores


def question_type(example: QAExample) -> str:
    """A question's type: its dataset's own `type` field (2WikiMultihopQA: comparison, inference,
    compositional, bridge_comparison; HotpotQA: bridge, comparison), else its hop count from a
    MuSiQue decomposition (`2-hop`...), else `untyped`."""
    kind = example.metadata.get("type")
    if kind:
        return str(kind)
    steps = example.metadata.get("question_decomposition")
    return f"{len(steps)}-hop" if steps else "untyped"


def question_types(paths: Sequence[Path]) -> dict[str, tuple[str, str]]:
    """(dataset, type) of every question of the question files `paths`, by the id `pvpo eval`
    writes for it (`<dataset>/<the dataset's own id>`, the run's uid)."""
    types: dict[str, tuple[str, str]] = {}
    for path in paths:
        for ex in iter_examples(path):
            types[ex.uid] = (ex.uid.split("/", 1)[0], question_type(ex))
    return types


def type_groups(ids: Sequence[str], types: Mapping[str, tuple[str, str]]) -> list[tuple[str, str, list[str]]]:
    """(dataset, type, question ids) for each type of each dataset, then each dataset's `all`
    (where it has more than one type), then `all` of `all` (over more than one dataset)."""
    missing = [i for i in ids if i not in types]
    if missing:
        raise ValueError(f"question {missing[0]!r} (and {len(missing) - 1} more) is in none of the --questions files")
    by: dict[tuple[str, str], list[str]] = {}
    for i in ids:
        by.setdefault(types[i], []).append(i)
    groups = []
    for ds in sorted({d for d, _ in by}):
        kinds = sorted(t for d, t in by if d == ds)
        groups += [(ds, t, by[(ds, t)]) for t in kinds]
        if len(kinds) > 1:
            groups.append((ds, "all", [i for i in ids if types[i][0] == ds]))
    if len({d for d, _ in by}) > 1:
        groups.append(("all", "all", list(ids)))
    return groups


def _cols(seeds: Sequence[Scores], qs: Sequence[str], key: str) -> list[list[float]]:
    return [[s[q][key] for q in qs] for s in seeds]


def by_type_table(
    ids: Sequence[str], types: Mapping[str, tuple[str, str]], policies: Mapping[str, Sequence[Scores]]
) -> str:
    """Markdown: per (dataset, type) and policy, EM, answer in reach, EM where in reach and format
    ok, each the mean over the policy's seeds (`policies`: label -> one `read_scores` a seed; the
    labels `warm start`, `RL`, `SFT` are compared); then per (dataset, type) the EM and answer-in-reach
    differences RL - warm start and SFT - warm start (`seeds_difference`) and RL - SFT
    (`seeds_contrast`), each with its s.e. counting the seeds' spread."""
    groups = type_groups(ids, types)
    lines = [
        "| dataset | type | n | policy | EM | answer in reach | EM where in reach (summed over seeds) | format ok |",
        "|---|---|---:|---|---:|---:|---|---:|",
    ]
    for ds, kind, qs in groups:
        for label, seeds in policies.items():
            em, reach = _cols(seeds, qs, "em"), _cols(seeds, qs, "in_reach")
            hits = sum(e for se, sr in zip(em, reach) for e, r in zip(se, sr) if r)
            n_reach = sum(sum(sr) for sr in reach)
            where = f"{hits / n_reach:.3f} ({hits:.0f}/{n_reach:.0f})" if n_reach else "n/a (0/0)"
            fmt = _cols(seeds, qs, "format_ok")
            lines.append(
                f"| {ds} | {kind} | {len(qs)} | {label}{f' ({len(seeds)} seeds)' if len(seeds) > 1 else ''} "
                f"| {mean([mean(x) for x in em]):.3f} | {mean([mean(x) for x in reach]):.3f} | {where} "
                f"| {mean([mean(x) for x in fmt]):.3f} |"
            )
    comparisons = [
        (f"{a} - {b}", a, b)
        for a, b in (("RL", "warm start"), ("SFT", "warm start"), ("RL", "SFT"))
        if a in policies and b in policies
    ]
    if comparisons:
        head = " | ".join(f"{name}: {what}" for name, _, _ in comparisons for what in ("EM", "answer in reach"))
        lines += ["", f"| dataset | type | n | {head} |", "|---|---|---:|" + "---|" * (2 * len(comparisons))]
        for ds, kind, qs in groups:
            cells = []
            for _, a, b in comparisons:
                for key in ("em", "in_reach"):
                    x, y = _cols(policies[a], qs, key), _cols(policies[b], qs, key)
                    d = seeds_contrast(x, y) if len(policies[b]) > 1 else seeds_difference(y[0], x)
                    z = f", {d['mean'] / d['se']:+.1f} s.e." if d["se"] > 0 else ""
                    cells.append(f"{d['mean']:+.3f} ({d['se']:.3f}{z})")
            lines.append(f"| {ds} | {kind} | {len(qs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, help="pvpo eval folder of the base model")
    ap.add_argument("--warm", type=Path, help="pvpo eval folder of the warm-started policy")
    ap.add_argument(
        "--rl", type=Path, nargs="+", help="pvpo eval folder of the RL policy (with --by-type: one folder per RL seed)"
    )
    ap.add_argument(
        "--sft",
        type=Path,
        nargs="+",
        help="with --by-type: pvpo eval folders of the compute-matched SFT arm, one per data-order seed",
    )
    ap.add_argument("--by-type", action="store_true", help="the table by dataset and question type (module docstring)")
    ap.add_argument(
        "--questions",
        type=Path,
        nargs="+",
        help="with --by-type: the datasets' question files (their type fields, MuSiQue's decomposition)",
    )
    args = ap.parse_args(argv)
    if args.by_type:
        return main_by_type(ap, args, argv)
    if args.sft or (args.rl and len(args.rl) > 1):
        ap.error("several --rl folders (seeds) and --sft are read by --by-type")
    rl = args.rl[0] if args.rl else None
    runs = {tag: read_scores(d) for tag, d in (("base", args.base), ("before", args.warm), ("after", rl)) if d}
    if not runs:
        ap.error("give at least one of --base, --warm, --rl")
    ids = sorted(set.intersection(*(set(s) for s in runs.values())))
    missing = {tag: len(s) - len(ids) for tag, s in runs.items() if len(s) != len(ids)}
    if missing:
        print(f"note: compared on the {len(ids)} questions all folders answered; extra per folder: {missing}")
    print("command: python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]))
    print()
    print(per_dataset_table(ids, {tag: [s[i] for i in ids] for tag, s in runs.items()}))
    print()
    print("| policy | answer in its retrieved passages | EM where it was | EM where it was not |")
    print("|---|---:|---:|---:|")
    for tag, s in runs.items():
        reach = [s[i] for i in ids if s[i]["in_reach"]]
        miss = [s[i] for i in ids if not s[i]["in_reach"]]
        em_reach = sum(r["em"] for r in reach) / len(reach) if reach else float("nan")
        em_miss = sum(r["em"] for r in miss) / len(miss) if miss else float("nan")
        print(f"| {dict(STAGES)[tag]} | {len(reach)} of {len(ids)} | {em_reach:.3f} | {em_miss:.3f} |")
    return 0


def main_by_type(ap: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str] | None) -> int:
    """`--by-type`: the folders' questions in common, joined with --questions' types."""
    if not args.questions:
        ap.error(
            "--by-type needs --questions: the datasets' question files (e.g. DATA/2wikimultihopqa/questions.jsonl)"
        )
    missing = [str(p) for p in args.questions if not p.is_file()]
    if missing:
        ap.error(f"--questions: no such file: {', '.join(missing)}")
    given = (("base model", [args.base]), ("warm start", [args.warm]), ("RL", args.rl or []), ("SFT", args.sft or []))
    policies = {label: [read_scores(d) for d in dirs if d] for label, dirs in given if any(dirs)}
    if not policies:
        ap.error("give at least one of --base, --warm, --rl, --sft")
    folders = [s for seeds in policies.values() for s in seeds]
    ids = sorted(set.intersection(*(set(s) for s in folders)))
    if any(len(s) != len(ids) for s in folders):
        print(f"note: compared on the {len(ids)} questions every folder answered")
    try:
        table = by_type_table(ids, question_types(args.questions), policies)
    except ValueError as e:
        ap.error(str(e))
    print("command: python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]))
    print()
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
