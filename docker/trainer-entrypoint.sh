#!/usr/bin/env bash
# The trainer container: `pvpo train` with PVPO_CONFIG (a YAML file in the config volume, or a
# shipped preset's name) into PVPO_RUN_DIR, continuing it (--resume) when it holds a checkpoint,
# so a restarted container picks up where it stopped. PVPO_RETRIEVER_URL (comma-separated for
# replicas) points the run at the retriever service; its token comes from PVPO_RETRIEVER_TOKEN.
# PVPO_NPROC > 1 trains on that many GPUs (`pvpo train --nproc`, FSDP2). Arguments are further
# `key=value` overrides (e.g. run.steps=200). The working directory is /, so a config's relative
# `data/...` paths (as in configs/) read the data volume mounted at /data.
set -euo pipefail
CONFIG="${PVPO_CONFIG:-/config/train.yaml}"
RUN_DIR="${PVPO_RUN_DIR:-/runs/run}"
ARGS=(--config "$CONFIG" --run-dir "$RUN_DIR")
[ "${PVPO_NPROC:-1}" -le 1 ] || ARGS+=(--nproc "$PVPO_NPROC")
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
