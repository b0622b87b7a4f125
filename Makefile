# make demo / make test: each creates .venv and installs on a fresh machine, and does nothing twice.
PYTHON ?= python3
# Python keeps what it compiles (__pycache__/), even where the environment says not to: the suite starts hundreds
# of Python processes, and with PYTHONDONTWRITEBYTECODE set (this project's machines) each compiled torch's and
# the project's modules again (pytest's collection alone: 19 s a process, 11 cached).
export PYTHONDONTWRITEBYTECODE :=
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-vllm docs lint install clean

install: $(STAMP)

# torch first, pinned: from this exact line pip takes the CPU build on a CPU machine and the CUDA build on
# a GPU machine; installing the project first could pull a multi-GB CUDA build where none is wanted.
# --no-compile: pip compiles every file of every package, one at a time (74 of 167 s here); Python compiles what
# is imported, once, on first use.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile torch==2.13.0
	$(PY) -m pip install --quiet --no-compile -e '.[test]'
	touch $(STAMP)

# The headline jobs on embedded defaults: tune llama-3-8b against a TTFT SLA (simulated on a stated GPU when
# this machine has none), then measure the stall-free effect of chunked prefill for real on `small`.
demo: $(STAMP)
	$(VENV)/bin/chunkbench tune --model llama-3-8b --sla-ttft 300ms --study demo --out results/tune/demo
	$(VENV)/bin/chunkbench compare continuous chunked:budget=64 --model small --workload rag-mix \
		--num-requests 12 --rate 0.5 --out results/runs/demo

# The suite in two parts: first every test on one process per core (pytest-xdist, handing tests out one at a
# time to whichever process is free: --dist loadgroup, with no groups; plain -n auto split them up front and ran
# 4 minutes longer), then those that hold a measured time to a margin (marked timing) alone.
test: $(STAMP)
	$(PY) -m pytest -q -m "not vllm and not timing" -n auto --dist loadgroup
	$(PY) -m pytest -q -m "timing and not vllm"

# The vLLM tier: vLLM 0.32.0's CPU build in its own venv (.venv-vllm, installed once by scripts/vllm_env.sh,
# with the tiny model it serves), vLLM 0.34.0's scheduler (.venv-vllm034, scripts/vllm034_env.sh: the wheel without
# its CUDA dependencies, about three minutes) and SGLang 0.5.23's command-line parser (.venv-sglang,
# scripts/sglang_env.sh: about a minute), then the tests that hold chunkbench against them (tests/vllm/), in two
# parts as `make test`: those that time nothing on one process per core, a module to a process (--dist loadfile:
# a module's oracle, parser or servers start once, and the tests that launch vLLM, all in test_vllm_configs.py,
# one at a time), then those that hold measured figures to a margin (marked timing) alone.
test-vllm: $(STAMP)
	PYTHON=$(PYTHON) bash scripts/vllm_env.sh
	PYTHON=$(PYTHON) bash scripts/vllm034_env.sh
	PYTHON=$(PYTHON) bash scripts/sglang_env.sh
	$(PY) -m pytest -q -m "vllm and not timing" -n auto --dist loadfile tests
	$(PY) -m pytest -q -m "vllm and timing" tests

# The documentation site (mkdocs-material) into build/site/; --strict: a broken link or page fails. The CLI
# reference and the knob table are generated from the code by scripts/docs_hooks.py.
docs: $(VENV)/.installed-docs
	$(VENV)/bin/mkdocs build --strict

$(VENV)/.installed-docs: $(STAMP)
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $@

# Lint and types: ruff (rules and format in pyproject.toml) over the repository, mypy over the engine and the
# simulator (the torch-free core every simulated trial runs).
lint: $(VENV)/.installed-lint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

$(VENV)/.installed-lint: $(STAMP)
	$(PY) -m pip install --quiet -e '.[lint]'
	touch $@

clean:
	rm -rf $(VENV) results/runs
