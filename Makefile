# `make run` and `make test` install what is missing into .venv, then do the work.
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint bench
run: $(STAMP)
	$(PY) -m experiments.eager_sgd --seeds 0 1 2

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) -m scripts.bench_allreduce

$(STAMP): pyproject.toml scripts/install.sh
	bash scripts/install.sh
	touch $(STAMP)
