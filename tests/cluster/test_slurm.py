"""The batch templates under a real one-node Slurm on localhost (``make test-cluster``).

``scripts/cluster/slurm_localhost.sh`` starts munged, slurmctld and slurmd with a
configuration of their own; the tests submit ``scripts/slurm.sbatch`` and
``scripts/slurm_array.sbatch`` with ``sbatch --wait`` and read the run folders.
Skipped, with the reason, where Slurm cannot start (no packages, not root).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "scripts" / "cluster" / "slurm_localhost.sh"
TINY = [
    "--model",
    "candle_p1b2_tiny",
    "--dataset",
    "synthetic_tabular",
    "--data-opt",
    "features=256",
    "--data-opt",
    "n_train=256",
    "--data-opt",
    "n_test=64",
    "--batch-size",
    "8",
    "--no-progress",
]


@pytest.fixture(scope="module")
def slurm():
    proc = subprocess.run(
        ["bash", str(SCRIPT), "start"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(proc.stderr.strip() or "Slurm did not start")
    env = dict(os.environ, SLURM_CONF=proc.stdout.strip(), SRUN_CPU_BIND="none")
    for var in ("PMI_RANK", "PMI_SIZE", "RESEARCH_UNDER_MPI"):
        env.pop(var, None)
    yield env
    subprocess.run(["bash", str(SCRIPT), "stop"], check=False)


def sbatch(env, tmp_path, *args: str, timeout: float = 300):
    out = tmp_path / "slurm-%A_%a.out"
    return subprocess.run(
        ["sbatch", "--wait", "-o", str(out), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def logs(tmp_path) -> str:
    return "\n".join(p.read_text() for p in sorted(tmp_path.glob("slurm-*.out")))


def test_template_runs_one_world_of_two(slurm, tmp_path):
    run = tmp_path / "run"
    proc = sbatch(
        slurm,
        tmp_path,
        "-n",
        "2",
        "scripts/slurm.sbatch",
        "experiments.train",
        *TINY,
        "--steps",
        "4",
        "--run-dir",
        str(run),
    )
    assert proc.returncode == 0, proc.stderr + logs(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 4


def test_array_runs_one_configuration_per_task(slurm, tmp_path):
    listing = tmp_path / "sweep.txt"
    listing.write_text(
        "# batch size sweep\n"
        f"--batch-size 8 --run-dir {tmp_path}/bs8\n"
        "\n"
        f"--batch-size 16 --run-dir {tmp_path}/bs16\n"
    )
    args = [a for a in TINY if a not in ("--batch-size", "8")]
    proc = sbatch(
        slurm,
        tmp_path,
        "--array=0-1",
        "-n",
        "2",
        "scripts/slurm_array.sbatch",
        "experiments.train",
        str(listing),
        *args,
        "--steps",
        "3",
    )
    assert proc.returncode == 0, proc.stderr + logs(tmp_path)
    for bs in (8, 16):
        summary = json.loads((tmp_path / f"bs{bs}" / "summary.json").read_text())
        assert summary["world_size"] == 2
        assert summary["global_batch"] == 2 * bs


def test_srun_without_pmi_stops_with_one_line(slurm, tmp_path):
    proc = sbatch(
        dict(slurm, SRUN_MPI="none"),
        tmp_path,
        "-n",
        "2",
        "scripts/slurm.sbatch",
        "experiments.train",
        *TINY,
        "--steps",
        "2",
        "--run-dir",
        str(tmp_path / "run"),
    )
    assert proc.returncode != 0
    assert "MPI sees a world of 1: under srun pass --mpi=pmi2" in logs(tmp_path)
    assert not (tmp_path / "run" / "summary.json").exists()
