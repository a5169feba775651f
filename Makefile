# `make run` and `make test` install what is missing into .venv, then do the work.
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-cluster lint bench
run: $(STAMP)
	$(PY) -m experiments.eager_sgd --seeds 0 1 2

test: $(STAMP)
	$(PY) -m pytest

# The batch templates under a one-node Slurm on localhost (Debian's slurm-wlm,
# installed here when missing; skipped with the reason where it cannot start).
test-cluster: $(STAMP)
	command -v slurmctld >/dev/null || (apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge) || true
	RESEARCH_CLUSTER_TESTS=1 $(PY) -m pytest tests/cluster -rs

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) -m scripts.bench_allreduce

$(STAMP): pyproject.toml scripts/install.sh
	bash scripts/install.sh
	touch $(STAMP)
