# One venv for everything; torch is pinned to the CPU build that lies on this
# machine's disk so a fresh setup never pulls a multi-GB CUDA wheel. On a GPU
# machine override it: make setup TORCH_SPEC="torch"  (pyproject states the range).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
OUT ?= out
PYTEST_ARGS ?=

.PHONY: setup lab notebooks demo test test-fast bench lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[test,bench]"
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

## everything but the browser and notebook tests
test-fast: setup
	$(BIN)/python -m pytest -m "not browser and not notebooks" $(PYTEST_ARGS)

## speed and memory targets, as ratios measured in one run
bench: setup
	$(BIN)/python benchmarks/run.py

## ruff, mypy, and the import contracts in pyproject.toml (cores never import the front end)
lint: setup
	$(BIN)/ruff check gpumagic tests benchmarks
	$(BIN)/mypy gpumagic
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache *.egg-info
