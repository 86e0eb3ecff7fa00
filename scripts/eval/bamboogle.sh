#!/usr/bin/env bash
# bamboogle, its evaluation split (test for NQ/TriviaQA/PopQA/Bamboogle, dev for HotpotQA/2Wiki/MuSiQue).
#   scripts/eval/bamboogle.sh MODEL OUT [-- extra pvpo eval options]      (environment: see scripts/eval/run.sh)
set -euo pipefail
if [ $# -lt 2 ]; then sed -n '2,3p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
MODEL="$1"; OUT="$2"; shift 2
exec "$(cd "$(dirname "$0")" && pwd)/run.sh" "$MODEL" "$OUT" bamboogle "$@"
