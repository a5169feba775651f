"""``--threads N`` really sizes XLA:CPU's compute pool, and XLA_FLAGS stays valid.

XLA has no flag for its intra-op threads: the PJRT CPU client sizes its Eigen
pool from ``PJRT_NPROC``/``NPROC`` (else the schedulable CPUs), and a bare token
such as ``intra_op_parallelism_threads=2`` in XLA_FLAGS makes XLA abort at
start-up (read as a flag-file name). The pool's threads are named
``tf_XLAEigen``, so their number is a deterministic check.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models import xla_cpu
from research.threads import check_xla_flags, thread_env, xla_thread_flags
from tests.harness import python, run_env
from tests.tiny import tiny_flags

ROOT = Path(__file__).resolve().parent.parent
PROBE = (
    "import jax, jax.numpy as jnp\n"
    "from research.threads import xla_compute_threads\n"
    "jax.jit(lambda a: a @ a)(jnp.ones((256, 256))).block_until_ready()\n"
    "print('eigen', xla_compute_threads())\n"
)


@pytest.mark.parametrize("threads", [1, 2])
def test_jax_starts_with_the_flags_threads_builds(threads, monkeypatch):
    # As inherited from a user's shell, including a stale token of old versions.
    monkeypatch.setenv("XLA_FLAGS", "intra_op_parallelism_threads=4")
    env = run_env(**thread_env(threads))
    assert check_xla_flags(env["XLA_FLAGS"]) is None
    proc = python(["-c", PROBE], env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == str(threads)


def test_threads_zero_leaves_xla_default(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    monkeypatch.setenv(xla_cpu.OPT_OUT, "0")
    env = thread_env(0)
    assert env == {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}
    assert xla_thread_flags(1).split() == [
        "--xla_cpu_enable_fast_math=false",
        "--xla_cpu_multi_thread_eigen=false",
    ]


def test_thread_flags_carry_the_models_xla_defaults(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    monkeypatch.delenv(xla_cpu.OPT_OUT, raising=False)
    assert thread_env(0)["XLA_FLAGS"].split() == [
        "--xla_cpu_enable_fast_math=false",
        xla_cpu.FLAG,
    ]
    assert xla_thread_flags(1).split()[-2:] == [
        "--xla_cpu_multi_thread_eigen=false",
        xla_cpu.FLAG,
    ]
    assert check_xla_flags(xla_thread_flags(2)) is None


def test_a_bare_token_in_xla_flags_is_named():
    problem = check_xla_flags("--xla_cpu_enable_fast_math=false oops=1")
    assert problem is not None and "'oops=1'" in problem


@pytest.mark.launches
def test_threads_2_recorded_in_config(tmp_path):
    env = {k: v for k, v in run_env().items() if k not in ("NPROC", "PJRT_NPROC")}
    cmd = ["-m", "experiments.train", "--np", "2", "--threads", "2"]
    cmd += [*tiny_flags(n_train=128, batch=8), "--steps", "2", "--run-dir", "run"]
    proc = python(cmd, cwd=tmp_path, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["config"]["threads"] == 2
    assert config["compute_threads"]["NPROC"] == "2"
    assert config["compute_threads"]["xla_eigen_threads"] == 2
    assert "intra_op" not in (config["compute_threads"]["XLA_FLAGS"] or "")


def test_bind_args_know_hydra_and_nothing_else(tmp_path):
    from research.entry.launch import bind_args, mpiexec_path

    assert bind_args(mpiexec_path(), 2) == ["-bind-to", "core:2"]  # the mpich wheel's
    assert bind_args(mpiexec_path(), 0) == ["-bind-to", "core:1"]
    other = tmp_path / "mpirun"
    other.write_text("#!/bin/sh\necho 'mpirun (Open MPI) 5.0.5'\n")
    other.chmod(0o755)
    assert bind_args(str(other), 1) is None
    assert bind_args(str(tmp_path / "missing"), 1) is None
