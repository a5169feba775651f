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

from tests.tiny import tiny_flags

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "scripts" / "cluster" / "slurm_localhost.sh"
TINY = tiny_flags(n_train=256, n_test=64, batch=8)


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


SITE_VENV = ROOT / ".venv-openmpi"


def test_site_mpi_environment_under_srun_pmix(slurm, tmp_path):
    """The environment built against Open MPI (``make test-site-mpi``) runs the
    template under srun with PMIx, Open MPI's own launch interface: a world of
    three, every rank on the same allreduce."""
    py = SITE_VENV / "bin" / "python"
    if not (SITE_VENV / ".installed").exists():
        pytest.skip("no .venv-openmpi: run make test-site-mpi (make test-cluster does)")
    plugins = subprocess.run(
        ["srun", "--mpi=list"], env=slurm, capture_output=True, text=True
    )
    if "pmix" not in plugins.stdout + plugins.stderr:
        pytest.skip(f"this Slurm has no PMIx plugin: {plugins.stdout.strip()}")
    run = tmp_path / "run"
    env = dict(slurm, PYTHON=str(py), SRUN_MPI="pmix")
    proc = sbatch(
        env,
        tmp_path,
        "-n",
        "3",
        "--overcommit",  # three tasks on the node's two CPUs
        "scripts/slurm.sbatch",
        "experiments.train",
        *TINY,
        "--strategy",
        "fused",
        "--steps",
        "6",
        "--run-dir",
        str(run),
    )
    assert proc.returncode == 0, proc.stderr + logs(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 3 and summary["steps"] == 6, summary
    config = json.loads((run / "config.json").read_text())
    assert "Open MPI" in config["versions"]["mpi"], config["versions"]


def _job_state(env, job: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job],
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def _poll(cond, what: str, job_env=None, job: str | None = None, limit=300):
    import time

    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            state = _job_state(job_env, job) if job else {}
            pytest.fail(f"no {what} within {limit} s (job {state.get('JobState')})")
        time.sleep(0.2)


def test_usr1_checkpoints_requeues_and_resumes(slurm, tmp_path):
    """What a time limit does with the template's --signal=USR1@120, at once:
    ``scancel --signal=USR1`` -> the ranks checkpoint the step they agree on,
    exit 138, the template requeues the job, and the requeued job (the same
    command) resumes from that checkpoint."""
    from research.rundir import read_metrics

    run = tmp_path / "run"
    proc = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-o",
            str(tmp_path / "slurm-%j.out"),
            "-n",
            "2",
            "scripts/slurm.sbatch",
            "experiments.train",
            *TINY,
            "--steps",
            "100000",
            "--checkpoint",
            "deepfreeze",
            "--checkpoint-every",
            "100000",
            "--eval-every",
            "0",
            "--run-dir",
            str(run),
        ],
        cwd=ROOT,
        env=slurm,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    try:

        def trained(step: int) -> bool:
            rows = [r for r in read_metrics(run) if r.get("kind") != "eval"]
            return bool(rows) and rows[-1]["step"] > step

        _poll(lambda: trained(3), "steps trained", slurm, job)
        subprocess.run(["scancel", "--signal=USR1", job], env=slurm, check=True)
        summary_path = run / "summary.json"
        _poll(summary_path.exists, "summary.json after USR1", slurm, job)
        first = json.loads(summary_path.read_text())
        stop = first["stopped"]["step"]
        assert first["stopped"]["signal"] == "SIGUSR1" and stop == first["steps"]
        # Requeued by the template, run again, resumed from the stop step.
        _poll(
            lambda: int(_job_state(slurm, job).get("Restarts", 0)) >= 1,
            "requeue",
            slurm,
            job,
        )
        _poll(lambda: trained(stop + 3), "steps after the requeue", slurm, job)
        assert f"resumed from step {stop}" in logs(tmp_path)
        # Stop the requeued run the same way: its summary says where it began.
        summary_path.unlink()
        subprocess.run(["scancel", "--signal=USR1", job], env=slurm, check=True)
        _poll(summary_path.exists, "summary.json after the 2nd USR1", slurm, job)
        second = json.loads(summary_path.read_text())
        assert second["resumed_from"] == stop
        assert second["stopped"]["step"] > stop
    finally:
        subprocess.run(["scancel", job], env=slurm, check=False)


def test_a_killed_rank_is_restarted_within_the_allocation(slurm, tmp_path):
    """``--max-restarts 1``: one rank of the srun step is killed (SIGKILL, as a
    lost node takes its ranks); the template probes the allocation's nodes,
    records the restart and runs the step again, which resumes from the newest
    committed checkpoint and finishes (research/entry/restart.py)."""
    from research.checkpoint.manifest import committed_steps, read_manifest

    run = tmp_path / "run"
    proc = subprocess.run(
        ["sbatch", "--parsable", "-o", str(tmp_path / "slurm-%j.out"), "-n", "2",
         "scripts/slurm.sbatch", "experiments.train", *TINY, "--steps", "60",
         "--checkpoint", "deepfreeze", "--checkpoint-every", "5",
         "--eval-every", "0", "--max-restarts", "1", "--run-dir", str(run)],
        cwd=ROOT, env=slurm, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    try:
        _poll(
            lambda: bool(committed_steps(read_manifest(run / "checkpoints"))),
            "a committed checkpoint",
            slurm,
            job,
        )
        ranks = _ranks_of(run)
        assert ranks, "no rank process found"
        os.kill(ranks[-1], 9)
        _poll((run / "summary.json").exists, "summary.json after the restart",
              slurm, job)  # fmt: skip
        summary = json.loads((run / "summary.json").read_text())
        assert summary["steps"] == 60, summary
        (rec,) = summary["restarts"]
        assert rec["world_size_before"] == rec["world_size_after"] == 2, rec
        assert rec["step_resumed"] > 0 and rec["seconds_to_first_step"] > 0, rec
        assert "restart 1 of 1" in logs(tmp_path)
    finally:
        subprocess.run(["scancel", job], env=slurm, check=False)


def _ranks_of(run: Path) -> list[int]:
    """The ranks (``python -m experiments.train``) whose command line names
    ``run``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        rank = b"python" in cmd[0] and cmd[1:3] == [b"-m", b"experiments.train"]
        if rank and str(run).encode() in cmd:  # not srun, not the batch script
            found.append(int(pid))
    return sorted(found)
