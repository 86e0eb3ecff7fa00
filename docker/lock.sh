#!/usr/bin/env bash
# Write the images' pinned versions: docker/constraints-cpu.txt and docker/constraints-cuda.txt,
# every package an image installs at one exact version (pip's resolver, --dry-run, nothing installed).
#   docker/lock.sh [cpu|cuda ...]     (default: both; run it with the images' Python minor version)
# cpu:  the project with its `models` extra (gguf) plus the CPU torch, pinned to the versions of the
#       tested venv (.venv) where it has them.
# cuda: the project with its `gpu` and `models` extras (faiss-gpu-cu12, vLLM, gguf) plus the vLLM release below, resolved
#       against PyPI alone (pip's own config, e.g. a local CPU torch wheel, is set aside).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
TORCH_CPU_SPEC="${TORCH_CPU_SPEC:-torch==2.13.0}"
# vllm 0.33.0 needs certifi>=2026.10.19, which PyPI does not have (2026-11-22); 0.32.0 is the newest that resolves
VLLM_SPEC="${VLLM_SPEC:-vllm==0.32.0}"
REPORT="$(mktemp)"
trap 'rm -f "$REPORT" "$REPORT.tested" "$REPORT.log"' EXIT

pins() {  # the report's packages as name==version, the project itself left out
    "$PY" - "$REPORT" <<'PY'
import json, sys
items = json.load(open(sys.argv[1]))["install"]
for name, version in sorted((i["metadata"]["name"], i["metadata"]["version"]) for i in items):
    if name.lower() != "pvpo-search":
        print(f"{name}=={version}")
PY
}

write() {  # write(variant): docker/constraints-<variant>.txt from the report
    local out="docker/constraints-$1.txt"
    { echo "# Written by docker/lock.sh $1 with $("$PY" -V) on $(date -u +%F); do not edit by hand."; pins; } >"$out"
    echo "$out: $(grep -vc '^#' "$out") packages"
}

resolve() {  # resolve(pip args...): the dry run, its warnings shown only when it fails
    "$PY" -m pip install --dry-run --ignore-installed --quiet --report "$REPORT" "$@" 2>"$REPORT.log" \
        || { grep -E "^ERROR" "$REPORT.log" >&2 || tail -5 "$REPORT.log" >&2; echo "lock.sh: pip could not resolve $*" >&2; exit 1; }
}

variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(cpu cuda)
for variant in "${variants[@]}"; do
    case "$variant" in
        cpu)
            "$PY" -m pip freeze --exclude-editable | grep -v '^#' >"$REPORT.tested"
            resolve -c "$REPORT.tested" "$TORCH_CPU_SPEC" ".[models]"
            write cpu ;;
        cuda)
            PIP_FIND_LINKS= PIP_CONSTRAINT= PIP_CONFIG_FILE=/dev/null resolve ".[gpu,models]" "$VLLM_SPEC"
            write cuda ;;
        *) echo "unknown variant $variant: cpu or cuda" >&2; exit 2 ;;
    esac
done
