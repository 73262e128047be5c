# The README's two commands. Both set up the environment first (idempotent).
VENV ?= .venv
.PHONY: setup run demo test test-slow lint format bench

setup:
	bash scripts/setup.sh

run: setup
	$(VENV)/bin/mrtpo train --config configs/cpu-demo.yaml --overwrite

demo: setup
	$(VENV)/bin/mrtpo demo

test: setup
	$(VENV)/bin/python -m pytest -q

test-slow: setup
	$(VENV)/bin/python -m pytest -q -m slow

lint: setup
	$(VENV)/bin/ruff check src tests scripts examples
	$(VENV)/bin/ruff format --check src tests scripts examples

format: setup
	$(VENV)/bin/ruff format src tests scripts examples

bench: setup
	$(VENV)/bin/mrtpo bench relevance
