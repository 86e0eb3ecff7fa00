#!/usr/bin/env bash
# All seven benchmarks of Search-R1's Table 2, then the table (markdown + CSV) of every run under OUT's parent.
#   scripts/eval/all.sh MODEL OUT [-- extra pvpo eval options]     (environment: see scripts/eval/run.sh)
# Writes OUT/<dataset>/{predictions.jsonl,metrics.json} and OUT/table.md, OUT/table.csv (EM; LasJ tables too
# when a judge was given). Interrupted? Run the same command again: finished questions are not redone.
set -euo pipefail
if [ $# -lt 2 ]; then sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
MODEL="$1"; OUT="$2"; shift 2
HERE="$(cd "$(dirname "$0")" && pwd)"
"$HERE/run.sh" "$MODEL" "$OUT" nq triviaqa popqa hotpotqa 2wikimultihopqa musique bamboogle "$@"
PVPO="${PVPO:-pvpo}"
# --overwrite: the tables are this script's own output, refreshed by a re-run (a report refuses an existing file without it)
"$PVPO" eval report "$OUT" --metric em --md "$OUT/table.md" --csv "$OUT/table.csv" --overwrite
if [ -n "${JUDGE_BASE_URL:-}" ]; then
    "$PVPO" eval report "$OUT" --metric lasj --md "$OUT/table_lasj.md" --csv "$OUT/table_lasj.csv" --overwrite
fi
