#!/usr/bin/env bash
# Fill docker/wheelhouse/ with every wheel an image installs, so the images build with no network
# (air-gapped clusters, or machines whose containers cannot reach a package index): then build
# with PVPO_PIP_OFFLINE=1 (compose) or --build-arg PIP_OFFLINE=1, and pip installs with
# --no-index --find-links from this folder.
#   docker/wheelhouse.sh [cpu|cuda]      (default cpu)
# pip picks wheels for the interpreter that runs it, so run it with the images' Python minor version
# on x86-64 Linux (PYTHON=..., default .venv/bin/python); it records that version for the build to check.
# cpu: the CPU torch comes from TORCH_INDEX (default PyTorch's CPU index; set it empty where pip's
# own config already finds the CPU wheel, as on the machines `make test-docker` runs on).
set -euo pipefail
cd "$(dirname "$0")/.."
VARIANT="${1:-cpu}"
PY="${PYTHON:-.venv/bin/python}"
OUT="docker/wheelhouse"
CONSTRAINTS="docker/constraints-$VARIANT.txt"
test -f "$CONSTRAINTS" || { echo "no $CONSTRAINTS: variant is cpu or cuda" >&2; exit 2; }
mkdir -p "$OUT"
PIP=("$PY" -m pip)
case "$VARIANT" in
    cpu)
        TORCH_INDEX="${TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
        "${PIP[@]}" wheel -q -w "$OUT" -c "$CONSTRAINTS" ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} torch ".[models]"
        ;;
    cuda)
        # PyPI alone: a CPU torch wheel that pip's config points at must not stand in for the CUDA one
        env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
            "${PIP[@]}" wheel -q -w "$OUT" -c "$CONSTRAINTS" ".[gpu,models]" vllm
        ;;
    *) echo "unknown variant $VARIANT: cpu or cuda" >&2; exit 2 ;;
esac
# the model catalog's packages, which the image installs with --no-deps (docker/install.sh models)
mapfile -t reqs < <(PYTHONPATH=. "$PY" -m pvpo.model_catalog requirements)
"${PIP[@]}" download -q -d "$OUT" --no-deps --only-binary=:all: "${reqs[@]}"
# the build backend the image needs to install the project from its source
"${PIP[@]}" download -q -d "$OUT" --only-binary=:all: -c "$CONSTRAINTS" setuptools wheel
rm -f "$OUT"/pvpo_search-*.whl  # the image builds the project from the source it copies
"$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' >"$OUT/python-version"
echo "$OUT: $(ls "$OUT"/*.whl | wc -l) wheels, $(du -sh "$OUT" | cut -f1), for Python $(cat "$OUT/python-version")"
