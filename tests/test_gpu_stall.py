"""The GPU check's stall stage rehearsed on the CPU (``scripts/gpu_stall.py``).

On a lent GPU the same script stops one of 2 ranks of a real training job on
each allreduce path; here it runs on the CPU (``JAX_PLATFORMS=cpu``), where the
watchdog's ending of the job is the same code: exit 124 within the bound, the
collective named, no process of the job left.
"""

from __future__ import annotations

import json

import pytest

from tests.harness import python, run_env


@pytest.mark.launches
def test_a_stopped_rank_of_a_training_job_ends_it(tmp_path):
    out = tmp_path / "rows.json"
    proc = python(
        ["-m", "scripts.gpu_stall", "--paths", "fused-mpi", "--comm-timeout", "6"]
        + ["--out", str(tmp_path / "jobs"), "--json", str(out)],
        timeout=300,
        env={**run_env(), "JAX_PLATFORMS": "cpu"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())
    assert row["platform"] == "cpu" and row["rc"] == 124, row
    assert row["end_s"] < 6 + 15 and row["left"] == [], row
    assert "mpi4jax MPI_Allreduce in jit" in row["watchdog_line"], row
    assert "waits for r1 (no answer)" in row["watchdog_line"], row


def test_unknown_paths_are_one_line():
    from scripts.gpu_stall import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(["--paths", "fused-mpi,nccl"])
    assert e.value.code == 2
