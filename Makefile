# make demo / make test: each creates .venv and installs on a fresh machine, and does nothing twice.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

install: $(STAMP)

# torch first, pinned: from this exact line pip takes the CPU build on a CPU machine and the CUDA build on
# a GPU machine; installing the project first could pull a multi-GB CUDA build where none is wanted.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The headline job on embedded defaults: the stall-free effect of chunked prefill, measured on this machine.
demo: $(STAMP)
	$(VENV)/bin/chunkbench compare continuous chunked:budget=256 --model small --workload rag-mix \
		--num-requests 16 --rate 1 --out results/runs/demo

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) results/runs
