#!/usr/bin/env bash
# The retriever container: serve the index in PVPO_INDEX_DIR, making it first when it is missing.
# An index is there when its meta.json is (a build writes it last). Missing, it is made from what
# the data volume holds, in this order:
#   PVPO_FAISS_INDEX set  -> `pvpo retriever link` that prebuilt FAISS file with PVPO_CORPUS
#                            (Search-R1's e5_Flat.index + wiki-18.jsonl: nothing is re-encoded)
#   PVPO_CORPUS exists    -> `pvpo retriever build` (PVPO_ENCODER, PVPO_INDEX_TYPE; progress in the log)
#   PVPO_SYNTHETIC_WORLD  -> `pvpo data synthetic` writes that world's corpus to PVPO_CORPUS first
#                            (the CPU demo; the value is the command's options, e.g. "--seed 0")
# Arguments are passed to `pvpo retriever serve` (e.g. --max-batch-size 128); the token comes from
# PVPO_RETRIEVER_TOKEN (compose: the env file).
set -euo pipefail
INDEX_DIR="${PVPO_INDEX_DIR:-/data/index}"
CORPUS="${PVPO_CORPUS:-/data/corpus.jsonl}"
ENCODER_ARGS=(${PVPO_ENCODER:+--model "$PVPO_ENCODER"})

if [ ! -f "$INDEX_DIR/meta.json" ]; then
    if [ -n "${PVPO_FAISS_INDEX:-}" ]; then
        echo "no index in $INDEX_DIR: linking $PVPO_FAISS_INDEX with $CORPUS"
        pvpo retriever link --faiss-index "$PVPO_FAISS_INDEX" --corpus "$CORPUS" --out "$INDEX_DIR" "${ENCODER_ARGS[@]}"
    else
        if [ ! -f "$CORPUS" ] && [ -n "${PVPO_SYNTHETIC_WORLD:-}" ]; then
            world="$(dirname "$CORPUS")"
            echo "no corpus at $CORPUS: writing the synthetic world ($PVPO_SYNTHETIC_WORLD) to $world"
            # shellcheck disable=SC2086  # the value is a list of options
            pvpo data synthetic "$world" $PVPO_SYNTHETIC_WORLD
            [ "$world/corpus.jsonl" = "$CORPUS" ] || mv "$world/corpus.jsonl" "$CORPUS"
        fi
        if [ ! -f "$CORPUS" ]; then
            echo "no index in $INDEX_DIR and no corpus at $CORPUS: put a corpus (jsonl) there, or set PVPO_FAISS_INDEX to a prebuilt FAISS index" >&2
            exit 2
        fi
        echo "no index in $INDEX_DIR: building it from $CORPUS"
        pvpo retriever build --corpus "$CORPUS" --out "$INDEX_DIR" "${ENCODER_ARGS[@]}" --index-type "${PVPO_INDEX_TYPE:-Flat}"
    fi
fi
exec pvpo retriever serve --index "$INDEX_DIR" --host "${PVPO_SERVE_HOST:-0.0.0.0}" --port "${PVPO_SERVE_PORT:-8000}" "$@"
