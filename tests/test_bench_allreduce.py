"""scripts.bench_allreduce runs under a real mpiexec and prints its targets.

Timings are not judged here (a shared machine); the benchmark itself prints them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_malloc_default_reaches_the_ranks(monkeypatch):
    """``--malloc default`` puts RESEARCH_MALLOC=default into the jobs'
    environment, which the ranks report as ``default (RESEARCH_MALLOC)``
    (tests/test_malloc.py); the launch that carries it is the quick run's."""
    from scripts.bench_allreduce import job_env, parse_args

    monkeypatch.delenv("RESEARCH_MALLOC", raising=False)
    assert job_env(parse_args(["--malloc", "default"]))["RESEARCH_MALLOC"] == "default"
    assert "RESEARCH_MALLOC" not in job_env(parse_args([]))


#: One benchmark run (the default ``--malloc kept``), not one per malloc: the
#: two runs took 12-16 CPU-s each beside the suite, and differed only in the
#: variable test_malloc_default_reaches_the_ranks checks.
@pytest.mark.launches  # an MPI job: not in make test-fast
def test_one_quick_run(tmp_path):
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.bench_allreduce",
            "--ranks",
            "2",
            "--reps",
            "1",
            "--warmup",
            "1",
            "--synthetic",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = json.loads(out.read_text())["runs"]
    assert run["ranks"] == 2 and run["params"] == 25_557_032
    assert run["malloc"] == "kept"
    names = set(run["variants"])
    assert {"mpi4py-flat", "fused", "host", "fused-mpi4jax"} <= names
    assert {"fused-ring", "host-ring", "host-mpi", "fused-again", "host-again"} <= names
    for name in ("fused", "host"):  # allreduce=auto measured and chose
        m = run["auto"][name]["measured"]
        assert m["ring_s"] > 0 and m["mpi_s"] > 0
        assert run["auto"][name]["ring"] == (m["ring_s"] <= m["mpi_s"])
        assert "hierarchical_s" not in m  # one node: no candidate of its own
        assert f"auto: {name} chose " in proc.stdout
    assert all(v["median_s"] > 0 for v in run["variants"].values())
    assert run["variants"]["mpi4py-flat"]["ratio"] == 1.0
    for name in ("fused", "host"):
        assert f"target: {name} " in proc.stdout
