# Two commands for a fresh clone: `make run` (the default pipeline) and `make test` (the test suite).
# Both create .venv on first use; a later call reinstalls only when pyproject.toml changed.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CORES ?= all
CONFIG ?= config/config.yaml
# The Snakefile already loads config/config.yaml; naming it again would only make Snakemake merge it twice.
CONFIG_ARG := $(if $(filter config/config.yaml,$(CONFIG)),,--configfile $(CONFIG))

.PHONY: setup run test smoke lint dag ship-toy readme-figures

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/snakemake --cores $(CORES) $(CONFIG_ARG)
	$(BIN)/snakemake --cores 1 $(CONFIG_ARG) --report results/report.html

# Two workers: run alone, the suite keeps one core of two busy. Each test file runs on one worker, and the three
# files sharing the smoke DAG's session fixture on the same one (tests/conftest.py), so nothing is built twice.
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

smoke: setup
	$(BIN)/snakemake --cores $(CORES) --configfile config/smoke.yaml

lint: setup
	$(BIN)/snakemake --lint $(CONFIG_ARG)

dag: setup
	$(BIN)/snakemake $(CONFIG_ARG) --dag mermaid-js > results/dag.mmd

# Retrain the toy world with the rules and ship its checkpoints into models/toy/ (with MANIFEST.json).
ship-toy: setup
	$(BIN)/snakemake --cores $(CORES) --config toy='{"checkpoints": "train"}' outdir=results/train --until train_drafter train_clip train_classifier ambiguity
	$(BIN)/python workflow/scripts/ship_toy.py results/train models/toy

# Copy the default run's trade-off figure and sample grid, shrunk, into docs/img/ for the README (after `make run`).
readme-figures: setup
	$(BIN)/python workflow/scripts/readme_figures.py results docs/img
