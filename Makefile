# Everything the README asks of a fresh machine goes through here.
#   make demo   set up and run the main job (`gpu-loader demo`)
#   make test   set up and run the whole suite: lint, format, types, tests
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch pinned: an unpinned `torch` would pull the newest, multi-GB CUDA build. Which
# build the pin gets is the package index's choice: this project's machines have the
# CPU wheel on local disk; on plain PyPI (Linux) it is the CUDA one, and
# `make TORCH_INDEX=https://download.pytorch.org/whl/cpu setup` takes the CPU one.
TORCH  ?= torch==2.13.0
TORCH_INDEX ?=
TORCH_FROM := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
STAMP  := $(VENV)/.installed

.PHONY: test demo lint setup clean

setup: $(STAMP)

# setup.py builds the native CPU fast path (C, needs gcc and libjpeg's headers), so a
# change to its source reinstalls too.
$(STAMP): pyproject.toml setup.py gpu_loader/ops/_native.c Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_FROM) "$(TORCH)"
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
	rm -rf $(VENV) build dist *.egg-info gpu_loader/ops/_native.*.so
