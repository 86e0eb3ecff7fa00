"""The recipe's held-out table from `pvpo eval` folders: per dataset and overall, EM (s.e.), F1, CEM,
format ok and searches of the base model, the warm start and the RL policy, then the paired EM
differences on the same questions (the table `pvpo demo` writes in `summary.md`, recomputed from
`pvpo eval` outputs of the saved policies).

    python bench/eval_table.py --base runs/heldout/base --warm runs/heldout/warm --rl runs/heldout/rl

Each folder is one `pvpo eval --out` with one sub-folder per dataset (`predictions.jsonl`);
questions are matched by id, so the three need not list them in the same order. CEM is FlashRAG's
`acc` (a golden answer contained in the prediction).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pvpo.reward.metrics import as_golds
from pvpo.reward.normalize import normalize_answer
from pvpo.reward.protocol import TagProtocol, get_protocol
from pvpo.trainer.heldout_table import STAGES, per_dataset_table


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, help="pvpo eval folder of the base model")
    ap.add_argument("--warm", type=Path, help="pvpo eval folder of the warm-started policy")
    ap.add_argument("--rl", type=Path, help="pvpo eval folder of the RL policy")
    args = ap.parse_args(argv)
    runs = {tag: read_scores(d) for tag, d in (("base", args.base), ("before", args.warm), ("after", args.rl)) if d}
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


if __name__ == "__main__":
    raise SystemExit(main())
