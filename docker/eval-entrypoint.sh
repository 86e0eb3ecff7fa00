#!/usr/bin/env bash
# The eval container: `pvpo eval` of a policy against the retriever service, into /runs/eval.
# The policy is PVPO_EVAL_MODEL, or by default the latest checkpoint of the training run in
# PVPO_RUN_DIR. Arguments are `pvpo eval` options, e.g. --dataset nq --dataset hotpotqa --limit 500;
# FlashRAG datasets are read from PVPO_DATA_DIR (default /data/flashrag, <name>/<split>.jsonl).
set -euo pipefail
RUN_DIR="${PVPO_RUN_DIR:-/runs/run}"
MODEL="${PVPO_EVAL_MODEL:-}"
if [ -z "$MODEL" ]; then
    [ -f "$RUN_DIR/checkpoints/latest" ] || { echo "no PVPO_EVAL_MODEL and no checkpoint in $RUN_DIR: train first, or set PVPO_EVAL_MODEL to a model folder" >&2; exit 2; }
    MODEL="$RUN_DIR/checkpoints/$(cat "$RUN_DIR/checkpoints/latest")/policy"
fi
URLS=()
IFS=',' read -r -a replicas <<<"${PVPO_RETRIEVER_URL:?PVPO_RETRIEVER_URL is not set: the retriever to search}"
for url in "${replicas[@]}"; do URLS+=(--retriever-url "$url"); done
export PVPO_DATA_DIR="${PVPO_DATA_DIR:-/data/flashrag}"
exec pvpo eval --model "$MODEL" "${URLS[@]}" --out "${PVPO_EVAL_OUT:-/runs/eval}" "$@"
