"""scripts.bench_first_round runs under a real mpiexec and prints its three ways."""

from __future__ import annotations

import re

import pytest

from tests.harness import python


@pytest.mark.launches  # an MPI job: not in make test-fast
def test_one_quick_run():
    args = ["-m", "scripts.bench_first_round", "--ranks", "3", "--bytes", "400000"]
    args += ["--small-bytes", "4000", "--small", "2", "--gap", "0", "--warm", "1"]
    args += ["--after", "3", "--trials", "2"]
    proc = python(args, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 ranks" in proc.stdout
    for way in ("fresh", "reused", "partial"):
        (m,) = re.findall(
            rf"^r0 \| +{way} +([\d.]+)ms +([\d.]+)ms +([\d.]+)x$", proc.stdout, re.M
        )
        assert all(float(x) > 0 for x in m), (way, m)
