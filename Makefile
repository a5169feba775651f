# `make run` and `make test` install what is missing into .venv, then do the work.
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-cluster test-site-mpi lint bench
run: $(STAMP)
	$(PY) -m experiments.eager_sgd --seeds 0 1 2

test: $(STAMP)
	$(PY) -m pytest

# The batch templates under a one-node Slurm on localhost (Debian's slurm-wlm,
# installed here when missing; skipped with the reason where it cannot start).
# Also the site-MPI tier below (tests/cluster/test_site_mpi.py).
test-cluster: $(STAMP) openmpi
	command -v slurmctld >/dev/null || (apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge) || true
	RESEARCH_CLUSTER_TESTS=1 $(PY) -m pytest tests/cluster -rs

# A real second MPI: Debian's Open MPI, .venv-openmpi built by the README's cluster
# command, the MPI test files and a training run per strategy under its mpirun
# (skipped with the reason where Open MPI cannot be installed).
test-site-mpi: $(STAMP) openmpi
	RESEARCH_CLUSTER_TESTS=1 $(PY) -m pytest tests/cluster/test_site_mpi.py -rs

.PHONY: openmpi
openmpi:
	command -v mpicc.openmpi >/dev/null || (apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev) || true

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) -m scripts.bench_allreduce

$(STAMP): pyproject.toml scripts/install.sh
	bash scripts/install.sh
	touch $(STAMP)
