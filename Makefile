# One venv for everything; torch is pinned to the CPU build that lies on this
# machine's disk so a fresh setup never pulls a multi-GB CUDA wheel. On a GPU
# machine override it: make setup TORCH_SPEC="torch"  (pyproject states the range).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
OUT ?= out
PYTEST_ARGS ?=

.PHONY: setup lab notebooks demo test test-fast bench lint clean gpu-wheels gpu-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[test,dev,bench]"
	touch $@

setup: $(VENV)/.installed

## main job: the tutorials in JupyterLab (http://127.0.0.1:8888, token printed below)
lab: setup
	$(BIN)/jupyter lab --ip 127.0.0.1 --no-browser --allow-root notebooks/

## execute every tutorial notebook headless and write HTML copies to $(OUT)/notebooks
notebooks: setup
	mkdir -p $(OUT)/notebooks
	cd notebooks && ../$(BIN)/jupyter nbconvert --to html --execute --ExecutePreprocessor.timeout=900 \
		--output-dir ../$(OUT)/notebooks [0-9][0-9]_*.ipynb

## headless demo: run a forward/backward cell under %%memtrace, write the HTML report, print the text form
demo: setup
	$(BIN)/python -m gpumagic demo --out $(OUT)

## the whole test suite (browser tests need /usr/bin/chromium; .ci/run installs it)
test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## everything but the browser, notebook and slow (build and install the package) tests
test-fast: setup
	$(BIN)/python -m pytest -m "not browser and not notebooks and not slow" $(PYTEST_ARGS)

## speed and memory targets, as ratios measured in one run
bench: setup
	$(BIN)/python benchmarks/run.py

## ruff, mypy, and the import contracts in pyproject.toml (cores never import the front end)
lint: setup
	$(BIN)/ruff check gpumagic tests benchmarks tools
	$(BIN)/mypy gpumagic
	$(BIN)/lint-imports

## here: download the cp312 wheels the GPU machine lacks (IPython, msgspec, nbclient, ...) and check the set
GPU_WHEELS ?= .gpu-wheels
gpu-wheels:
	rm -rf $(GPU_WHEELS)
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--abi cp312 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
		--platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		--platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d $(GPU_WHEELS) -r tools/gpu_wheels.txt
	$(PYTHON) tools/check_wheels.py $(GPU_WHEELS)

## on the GPU machine: verify every CUDA/NVML path (tools/gpu_check.py; stops at once without CUDA)
gpu-check:
	bash tools/gpu-check.sh

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache *.egg-info
