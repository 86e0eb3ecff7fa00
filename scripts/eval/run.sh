#!/usr/bin/env bash
# Evaluate one policy on one or more of the seven QA benchmarks with `pvpo eval`.
#   scripts/eval/run.sh MODEL OUT DATASET [DATASET...] [-- extra pvpo eval options]
# MODEL: a local HF folder (ENGINE=hf or vllm), or the served model's name (ENGINE=openai, with BASE_URL).
# Environment (defaults in brackets):
#   PVPO_DATA_DIR   FlashRAG datasets, <name>/<split>.jsonl or <name>.<split>.jsonl    (required)
#   RETRIEVER_URL   Search-R1 /retrieve server                                         [http://127.0.0.1:8000]
#   ENGINE          hf | vllm | openai                                                  [vllm when importable, else hf]
#   BASE_URL        OpenAI-compatible endpoint for ENGINE=openai, e.g. http://127.0.0.1:8001/v1
#   TEMPLATE        prompt template / tag protocol                                      [search_r1]
#   LIMIT, SAMPLE_SEED   evaluate a seeded random subset (e.g. LIMIT=500 SAMPLE_SEED=42) [full split]
#   TEMPERATURE, TOP_P   sampling (greedy by default; PVPO used 0.6 / 0.95)             [0 / 1]
#   JUDGE_BASE_URL, JUDGE_MODEL   LLM-as-judge endpoint and model (both or neither)
#   PVPO            the pvpo command                                                    [pvpo]
set -euo pipefail
if [ $# -lt 3 ]; then
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
MODEL="$1"; OUT="$2"; shift 2
DATASETS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do DATASETS+=(--dataset "$1"); shift; done
[ "${1:-}" = "--" ] && shift
PVPO="${PVPO:-pvpo}"
PY="$(dirname "$(command -v "$PVPO")")/python"
if [ -z "${ENGINE:-}" ]; then
    if "$PY" -c "import vllm" >/dev/null 2>&1; then ENGINE=vllm; else ENGINE=hf; fi
fi
ARGS=(--retriever-url "${RETRIEVER_URL:-http://127.0.0.1:8000}" --out "$OUT" --engine "$ENGINE" --template "${TEMPLATE:-search_r1}"
      --temperature "${TEMPERATURE:-0}" --top-p "${TOP_P:-1}")
if [ "$ENGINE" = openai ]; then
    ARGS+=(--base-url "${BASE_URL:?ENGINE=openai needs BASE_URL}" --model-name "$MODEL")
else
    ARGS+=(--model "$MODEL")
fi
[ -n "${LIMIT:-}" ] && ARGS+=(--limit "$LIMIT")
[ -n "${SAMPLE_SEED:-}" ] && ARGS+=(--sample-seed "$SAMPLE_SEED")
[ -n "${JUDGE_BASE_URL:-}" ] && ARGS+=(--judge-base-url "$JUDGE_BASE_URL" --judge-model "${JUDGE_MODEL:?JUDGE_BASE_URL needs JUDGE_MODEL}")
exec "$PVPO" eval "${DATASETS[@]}" "${ARGS[@]}" "$@"
