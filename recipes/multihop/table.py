"""`pvpo recipe table`: the multi-hop recipe's held-out table from `pvpo eval` folders. Per dataset
and overall, EM (s.e.), F1, CEM, format ok and searches of the base model, the warm start and the
RL policy, then the paired EM differences on the same questions (the table `pvpo demo` writes in
`summary.md`, `pvpo.recipes.heldout_table`, recomputed from `pvpo eval` outputs of the saved
policies), and how often each policy's retrieved passages held a golden answer. With `--by-type`,
the table by dataset and question type (`by_type`), seeds and the SFT arm included.

Each folder is one `pvpo eval --out` with one sub-folder per dataset (`predictions.jsonl`);
questions are matched by id, so the folders need not list them in the same order. Each question is
read through the one scoring layer (`pvpo.reward.scoring`: its names, CEM for FlashRAG's `acc`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from pvpo.recipes.heldout_table import STAGES, per_dataset_table
from pvpo.recipes.multihop.by_type import Scores, by_type_table, question_types
from pvpo.reward import scoring
from pvpo.reward.metrics import as_golds
from pvpo.reward.protocol import TagProtocol, get_protocol


def retrieved_passages(response: str, protocol: TagProtocol | None = None) -> list[str]:
    """The passages an episode's searches returned: the protocol's result blocks of its response
    (Search-R1's `<information>` by default)."""
    protocol = protocol or get_protocol("search_r1")
    return [seg.content for seg in protocol.segments(response) if seg.tag == protocol.result]


def answer_in_reach(response: str, golds: list[str], protocol: TagProtocol | None = None) -> bool:
    """Whether a golden answer (normalised as EM is, as a whole phrase) occurs in the passages the
    episode retrieved (`pvpo.reward.scoring.answer_in_reach` over `retrieved_passages`)."""
    return scoring.answer_in_reach(retrieved_passages(response, protocol), golds)


def read_scores(folder: Path) -> Scores:
    """Each question's scores in a `pvpo eval --out` folder, by question id, under the scoring
    layer's names (`pvpo.reward.scoring.item_score`: em, f1, cem, format_ok, searches; the last two
    0 where an item lacks them) and whether the answer was in reach."""
    scores: Scores = {}
    files = sorted(folder.glob("*/predictions.jsonl"))
    if not files:
        raise ValueError(f"{folder} holds no <dataset>/predictions.jsonl: give a `pvpo eval --out` folder")
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            reach = answer_in_reach(row["output"].get("final_response", ""), as_golds(row.get("golden_answers")))
            score = replace(scoring.item_score(row), in_reach=float(reach))
            scores[row["id"]] = {"format_ok": 0.0, "searches": 0.0, **score.as_dict()}
    return scores


def stage_table(base: Path | None, warm: Path | None, rl: Path | None) -> str:
    """The per-dataset table of the given folders (base model, warm start, RL) on the questions all
    of them answered, then the answer-in-reach table; a note first where a folder answered more."""
    runs = {tag: read_scores(d) for tag, d in (("base", base), ("before", warm), ("after", rl)) if d}
    if not runs:
        raise ValueError("give at least one of --base, --warm, --rl")
    ids = sorted(set.intersection(*(set(s) for s in runs.values())))
    missing = {tag: len(s) - len(ids) for tag, s in runs.items() if len(s) != len(ids)}
    lines = [f"note: compared on the {len(ids)} questions all folders answered; extra per folder: {missing}"]
    lines = lines if missing else []
    lines += ["", per_dataset_table(ids, {tag: [s[i] for i in ids] for tag, s in runs.items()}), ""]
    lines += [
        "| policy | answer in its retrieved passages | EM where it was | EM where it was not |",
        "|---|---:|---:|---:|",
    ]
    for tag, s in runs.items():
        reach = [s[i] for i in ids if s[i]["in_reach"]]
        miss = [s[i] for i in ids if not s[i]["in_reach"]]
        em_reach = sum(r["em"] for r in reach) / len(reach) if reach else float("nan")
        em_miss = sum(r["em"] for r in miss) / len(miss) if miss else float("nan")
        lines.append(f"| {dict(STAGES)[tag]} | {len(reach)} of {len(ids)} | {em_reach:.3f} | {em_miss:.3f} |")
    return "\n".join(lines)


def type_table(
    questions: Sequence[Path],
    base: Path | None,
    warm: Path | None,
    rl: Sequence[Path],
    sft: Sequence[Path],
) -> str:
    """`by_type_table` of the given folders (one per seed for RL and SFT) on the questions every
    folder answered, joined with `questions`' types; a note first where a folder answered more."""
    if not questions:
        raise ValueError(
            "--by-type needs --questions: the datasets' question files (e.g. DATA/2wikimultihopqa/questions.jsonl)"
        )
    missing = [str(p) for p in questions if not p.is_file()]
    if missing:
        raise ValueError(f"--questions: no such file: {', '.join(missing)}")
    given = (("base model", [base]), ("warm start", [warm]), ("RL", list(rl)), ("SFT", list(sft)))
    policies = {label: [read_scores(d) for d in dirs if d] for label, dirs in given if any(dirs)}
    if not policies:
        raise ValueError("give at least one of --base, --warm, --rl, --sft")
    folders = [s for seeds in policies.values() for s in seeds]
    ids = sorted(set.intersection(*(set(s) for s in folders)))
    note = [f"note: compared on the {len(ids)} questions every folder answered", ""]
    table = by_type_table(ids, question_types(questions), policies)
    return "\n".join([*(note if any(len(s) != len(ids) for s in folders) else []), table])


def table_text(
    *,
    base: Path | None,
    warm: Path | None,
    rl: Sequence[Path],
    sft: Sequence[Path],
    by_type: bool,
    questions: Sequence[Path],
    command: str,
) -> str:
    """What `pvpo recipe table` prints: the command, then the per-dataset table (one RL folder, no
    SFT) or, `by_type`, the table by dataset and question type."""
    if by_type:
        return f"command: {command}\n\n" + type_table(questions, base, warm, rl, sft)
    if sft or len(rl) > 1:
        raise ValueError("several --rl folders (seeds) and --sft are read by --by-type")
    return f"command: {command}\n" + stage_table(base, warm, rl[0] if rl else None)
