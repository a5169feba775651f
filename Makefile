# `make run` and `make test` install what is missing into .venv, then do the work.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-fast test-cluster test-faults test-site-mpi lint bench
run: $(STAMP)
	$(PY) -m experiments.eager_sgd --seeds 0 1 2

# Two pytest-xdist workers: a third of the suite's time is waiting (timeouts,
# signals, processes starting) that the other worker fills (tests/conftest.py).
# More cores: `make test WORKERS=4`; one process: `make test WORKERS=0`.
WORKERS ?= 2
XDIST   := -n $(WORKERS) --dist loadgroup

test: $(STAMP)
	$(PY) -m pytest $(XDIST)

# The edit-test loop: every test that starts no MPI job. A test that tries to
# (through research.entry.launch or tests/harness.py) fails instead: mark it
# @pytest.mark.launches and it runs in `make test` only.
test-fast: $(STAMP)
	RESEARCH_NO_MPIEXEC=1 $(PY) -m pytest $(XDIST) -m "not launches"

# The batch templates under a one-node Slurm on localhost (Debian's slurm-wlm,
# installed here when missing; skipped with the reason where it cannot start),
# after the site-MPI tier, whose Open MPI environment srun then also runs.
test-cluster: $(STAMP) test-site-mpi
	command -v slurmctld >/dev/null || (apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge) || true
	RESEARCH_CLUSTER_TESTS=1 $(PY) -m pytest tests/cluster -rs

# The communication watchdog's fault matrix: every stall case on one machine
# (tests/faults/), and on local nodes (tests/test_node_faults.py: network
# namespaces, scripts/cluster/localnet.sh) where root can make them (skipped
# with the reason elsewhere).
test-faults: $(STAMP)
	RESEARCH_FAULT_TESTS=1 $(PY) -m pytest tests/faults tests/test_node_faults.py -rs

# A second MPI for real: Debian's Open MPI (installed here when missing) as the
# site MPI, .venv-openmpi built the way the README tells a cluster user, the MPI
# test files at 2 and 3 ranks and every strategy under Open MPI's mpirun.
SITE_VENV := .venv-openmpi
test-site-mpi:
	command -v mpicc.openmpi >/dev/null || (apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev) || true
	@if ! command -v mpicc.openmpi >/dev/null; then \
	  echo "test-site-mpi: SKIPPED: Debian's Open MPI (openmpi-bin, libopenmpi-dev) could not be installed"; \
	else \
	  $(MAKE) --no-print-directory $(SITE_VENV)/.installed && \
	  RESEARCH_SITE_MPI_TESTS=1 $(SITE_VENV)/bin/python -m pytest tests/site_mpi -rs; \
	fi

# Two MPIs at once, as on a login node with a module left loaded: the mpich
# wheel's mpicc comes first on PATH, MPICC names Open MPI's, and everything
# must be built with MPICC (tests/site_mpi/test_install_mpicc.py reads the log).
$(SITE_VENV)/.installed: pyproject.toml scripts/install.sh $(STAMP)
	mkdir -p $(SITE_VENV)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" VENV=$(SITE_VENV) MPICC=mpicc.openmpi \
	  bash scripts/install.sh --site-mpi 2>&1 | tee $(SITE_VENV)/install.log; \
	  test $${PIPESTATUS[0]} -eq 0
	touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) -m scripts.bench_allreduce
	$(PY) -m scripts.bench_watchdog

$(STAMP): pyproject.toml scripts/install.sh
	bash scripts/install.sh
	touch $(STAMP)
