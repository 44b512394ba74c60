# Everything the README asks of a fresh machine goes through here.
#   make demo   set up and run the main job (`gpu-loader demo`)
#   make test   set up and run the whole suite: lint, format, types, tests
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# A CPU build of torch: an unpinned `torch` would pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: test demo lint setup clean

setup: $(STAMP)

# setup.py builds the native CPU fast path (C, needs gcc and libjpeg's headers), so a
# change to its source reinstalls too.
$(STAMP): pyproject.toml setup.py gpu_loader/ops/_native.c Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[dev,cuda12]" "$(TORCH)"
	touch $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check gpu_loader tests benchmarks examples
	$(PY) -m ruff format --check gpu_loader tests benchmarks examples
	$(PY) -m mypy

test: lint
	$(PY) -m pytest

demo: $(STAMP)
	$(VENV)/bin/gpu-loader demo

clean:
	rm -rf $(VENV) build dist *.egg-info
