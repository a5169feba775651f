"""The MPI test files and every strategy under Open MPI, the stand-in site MPI.

Runs in the environment ``scripts/install.sh --site-mpi`` builds against
Debian's Open MPI (``make test-site-mpi``): no mpich wheel, mpi4py and mpi4jax
compiled against Open MPI, the native ring against Open MPI's ``mpicxx``.
Every launch goes through ``RESEARCH_MPIEXEC`` (Open MPI's ``mpirun``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from research.strategies.registry import names as known_strategies
from tests.harness import MPI_FILES, launcher, run_under_mpiexec
from tests.tiny import tiny_flags


def _library() -> str:
    from mpi4py import MPI

    return MPI.Get_library_version()


pytestmark = pytest.mark.skipif(
    "Open MPI" not in _library(),
    reason="needs an environment built against Open MPI: make test-site-mpi",
)

TINY = tiny_flags(n_train=512, n_test=256, batch=8)


def test_environment_is_open_mpi_only():
    """No second MPI: no mpich wheel, mpi4py, mpi4jax and mpiexec all Open MPI."""
    from importlib import metadata

    import mpi4jax  # noqa: F401  (refuses an MPI it was not built for)

    from research.entry.launch import mpiexec_path

    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("mpich")
    assert not (Path(sys.prefix) / "include" / "mpi.h").exists()
    exe = mpiexec_path()  # the venv has none: the PATH's
    out = subprocess.run([exe, "--version"], capture_output=True, text=True)
    assert "open-mpi.org" in out.stdout + out.stderr, (exe, out.stdout, out.stderr)
    assert "mpirun" in " ".join(launcher())


def _fail(what: str, proc: subprocess.CompletedProcess) -> None:
    pytest.fail(
        f"{what} exited {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n"
        f"--- stderr\n{proc.stderr[-6000:]}"
    )


@pytest.mark.parametrize("np_", [2, 3])
@pytest.mark.parametrize("name", MPI_FILES)
def test_mpi_file_under_open_mpi(name: str, np_: int) -> None:
    proc = run_under_mpiexec(np_, ["-m", "pytest", f"tests/mpi/{name}", "-x"])
    if proc.returncode != 0:
        _fail(f"mpirun -n {np_} pytest tests/mpi/{name}", proc)


def _train(tmp_path, strategy: str, np_: int, steps: int) -> dict:
    run_dir = tmp_path / f"{strategy}-{np_}"
    args = ["-m", "experiments.train", "--strategy", strategy, *TINY]
    args += ["--steps", str(steps), "--run-dir", str(run_dir)]
    proc = run_under_mpiexec(np_, args, timeout=400)
    if proc.returncode != 0:
        _fail(f"mpirun -n {np_} experiments.train --strategy {strategy}", proc)
    summary = json.loads((run_dir / "summary.json").read_text())
    config = json.loads((run_dir / "config.json").read_text())
    assert summary["world_size"] == np_, summary
    assert summary["steps"] == steps, summary
    return {"summary": summary, "config": config}


@pytest.mark.parametrize("np_", [2, 3])
@pytest.mark.parametrize("strategy", known_strategies())
def test_each_strategy_trains(tmp_path, strategy: str, np_: int) -> None:
    run = _train(tmp_path, strategy, np_, steps=6)
    acc = run["summary"]["final_test_acc"]
    assert acc is not None and 0.0 <= acc <= 1.0, run["summary"]


def test_fused_and_host_agree_at_three_ranks(tmp_path):
    """The exact strategies train to the same model under Open MPI at 3 ranks.

    ``fused`` averages inside the jitted step, ``host`` on the host, each with
    the allreduce its ``allreduce=auto`` measured faster (the native ring
    compiled with Open MPI's mpicxx, or Open MPI's own): the same sums in
    another order, so the same accuracy and a test loss equal to rounding.
    """
    runs = {s: _train(tmp_path, s, 3, steps=120) for s in ("fused", "host")}
    fused, host = runs["fused"]["summary"], runs["host"]["summary"]
    # Learned something: 10 classes, chance 0.1 (0.70 after 120 steps under the
    # mpich wheel's mpiexec at 3 ranks, where fused and host were bit-identical).
    assert fused["final_test_acc"] > 0.4, fused
    assert abs(fused["final_test_acc"] - host["final_test_acc"]) <= 2 / 256, runs
    assert fused["final_test_loss"] == pytest.approx(
        host["final_test_loss"], rel=1e-3
    ), runs


def test_train_across_local_nodes_under_open_mpi(tmp_path):
    """``--hosts`` on the local cluster's nodes with Open MPI's mpirun: its rsh
    launcher through node-ssh, TCP over the nodes' eth0 (research/localnet.py,
    Cluster.openmpi_args); skipped with one line where nodes cannot be made."""
    import os

    from research.localnet import LocalnetError, check_can_run, down, up

    try:
        check_can_run()
    except LocalnetError as e:
        pytest.skip(f"local nodes: {e}")
    name = f"to{os.getpid() % 10000}"
    cluster = up(2, rate="10gbit", name=name)
    try:
        run_dir = tmp_path / "nodes"
        args = [sys.executable, "-m", "experiments.train", *TINY, "--steps", "4"]
        args += ["--hosts", "n1,n2", "--np", "3", "--run-dir", str(run_dir)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PMI")}
        env.update(cluster.env())
        proc = subprocess.run(args, env=env, capture_output=True, text=True,
                              timeout=400, cwd=Path(__file__).parents[2])  # fmt: skip
        if proc.returncode != 0:
            _fail("experiments.train --hosts n1,n2 --np 3 under Open MPI", proc)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["nodes"]["hosts"] == ["n1", "n2"]
        assert summary["nodes"]["ranks_per_node"] == [2, 1]
        assert summary["steps"] == 4 and summary["world_size"] == 3
    finally:
        down(name)
