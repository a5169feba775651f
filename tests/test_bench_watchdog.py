"""scripts.bench_watchdog runs under a real mpiexec and prints its verdicts.

Timings are not judged here (a shared machine); the benchmark prints them.
"""

from __future__ import annotations

import json

import pytest

from tests.harness import python

pytestmark = pytest.mark.launches  # MPI jobs: not in make test-fast


def test_one_quick_run(tmp_path):
    """Of ResNet-tiny's gradient: compiling ResNet-50's 161-leaf averages was
    two thirds of the run from an empty compile cache (the default tree is
    tests/test_bench_allreduce.py's)."""
    out = tmp_path / "bench.json"
    proc = python(
        ["-m", "scripts.bench_watchdog", "--model", "resnet_tiny"]
        + ["--blocks", "2", "--calls", "1", "--warmup", "1", "--json", str(out)]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = json.loads(out.read_text())["runs"]
    import models

    tiny = models.count_params(models.get_model("resnet_tiny"))
    assert run["ranks"] == 2 and run["bytes"] == 4 * tiny
    rows = run["variants"]
    assert set(rows) == {"fused-on", "fused-off", "host-on", "host-off"}
    assert all(r["median_s"] > 0 and r["calls"] == 2 for r in rows.values())
    for name in ("fused", "host"):
        o = run["overhead"][name]
        assert o["ratio"] > 0 and o["noise"] >= 0.02
        assert f"watchdog: {name} " in proc.stdout
    tick = run["tick_us"]
    assert tick["nothing_watched"] > 0 and tick["reading_tcp"] > 0
    assert "one look of the watchdog thread" in proc.stdout
