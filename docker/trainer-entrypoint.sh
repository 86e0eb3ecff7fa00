#!/usr/bin/env bash
# The trainer container: `pvpo train` with PVPO_CONFIG (a YAML file in the config volume, or a
# shipped preset's name) into PVPO_RUN_DIR, continuing it (--resume) when it holds a checkpoint,
# so a restarted container picks up where it stopped. PVPO_RETRIEVER_URL (comma-separated for
# replicas) points the run at the retriever service; its token comes from PVPO_RETRIEVER_TOKEN.
# Arguments are further `key=value` overrides (e.g. run.steps=200).
set -euo pipefail
CONFIG="${PVPO_CONFIG:-/config/train.yaml}"
RUN_DIR="${PVPO_RUN_DIR:-/runs/run}"
ARGS=(--config "$CONFIG" --run-dir "$RUN_DIR")
if [ -f "$RUN_DIR/checkpoints/latest" ]; then
    echo "$RUN_DIR holds checkpoint $(cat "$RUN_DIR/checkpoints/latest"): resuming"
    ARGS+=(--resume)
fi
if [ -n "${PVPO_RETRIEVER_URL:-}" ]; then
    if [[ "$PVPO_RETRIEVER_URL" == *,* ]]; then
        ARGS+=("retriever.url=[${PVPO_RETRIEVER_URL}]")
    else
        ARGS+=("retriever.url=${PVPO_RETRIEVER_URL}")
    fi
fi
exec pvpo train "${ARGS[@]}" "$@"
