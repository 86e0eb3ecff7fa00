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

from pvpo.trainer.heldout_table import per_dataset_table


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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
