"""NCCL's own bound on a waiting collective, from ``--comm-timeout``.

On a GPU, XLA's collectives (NCCL) wait inside the GPU program; XLA leaves
``--xla_gpu_nccl_termination_timeout_seconds`` off, so a stalled rank would
hold the others forever where the watchdog cannot end them.
``research.comm.dense.xla.start`` puts the flag into ``XLA_FLAGS`` before
JAX's GPU backend starts. What can be proved here, without a GPU: the flag is
a real XLA flag (XLA aborts at start-up on any other), XLA reads ``XLA_FLAGS``
when its backend starts (not at ``import jax``), and its value follows the
watchdog's setting.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from research.comm.dense.xla import NCCL_MARGIN_S, nccl_timeout_flag
from research.comm.faults.watchdog import DEFAULT_TIMEOUT_S


def test_the_flag_follows_the_watchdogs_setting():
    flag = "--xla_gpu_nccl_termination_timeout_seconds"
    assert nccl_timeout_flag(15.0) == f"{flag}={15 + NCCL_MARGIN_S}"
    assert (
        nccl_timeout_flag("auto") == f"{flag}={int(DEFAULT_TIMEOUT_S) + NCCL_MARGIN_S}"
    )
    assert nccl_timeout_flag(None) is None  # the watchdog off: XLA's default


def _compute_with(flags: str) -> subprocess.CompletedProcess:
    code = (
        "import os, jax\n"
        f"os.environ['XLA_FLAGS'] = {flags!r}  # after the import, as start() does\n"
        "print(float(jax.numpy.ones(2).sum()))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.parametrize("setting", [15.0, "auto"])
def test_xla_accepts_the_flag_set_after_import(setting):
    proc = _compute_with(nccl_timeout_flag(setting))
    assert proc.returncode == 0 and proc.stdout.strip() == "2.0", proc.stderr[-2000:]


def test_xla_reads_its_flags_when_its_backend_starts():
    # An unknown flag set after `import jax` still aborts: the flags are read
    # when the backend starts, so the one start() sets takes effect.
    proc = _compute_with("--xla_not_a_real_flag_for_this_test=1")
    assert proc.returncode != 0 and "Unknown flag in XLA_FLAGS" in proc.stderr
