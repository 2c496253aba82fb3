# One-command entry points for a fresh machine (see README.md).
#   make demo   – set up .venv and run the whole DAG on the offline default (config/demo.yaml)
#   make test   – set up .venv and run the test suite (unit tests + an end-to-end CI-sized DAG)
#   make study  – run the full study (config/config.yaml; needs the Hugging Face Hub or local copies)
PYTHON ?= python3
VENV   ?= .venv
CORES  ?= 8
BIN    := $(VENV)/bin

.PHONY: setup demo study test lint format clean-demo

$(BIN)/snakemake: requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

setup: $(BIN)/snakemake

demo: setup
	$(BIN)/snakemake --cores $(CORES) --configfile config/demo.yaml

study: setup
	$(BIN)/snakemake --cores $(CORES)

test: setup
	$(BIN)/python -m pytest -q -ra

lint: setup
	$(BIN)/snakemake --lint --configfile config/demo.yaml
	$(BIN)/snakefmt --check workflow

format: setup
	$(BIN)/snakefmt workflow
