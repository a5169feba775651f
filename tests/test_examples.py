"""The examples/ scripts, as a user runs them: ``mpiexec -n 2 python examples/X.py``.

Each uses one primitive from a plain Flax/optax loop (no Trainer, no CLI); these
tests run them for real and check what each promises.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.harness import run_under_mpiexec

pytestmark = pytest.mark.launches  # MPI jobs: not in make test-fast


def run(script: str, *args: str) -> str:
    proc = run_under_mpiexec(2, [f"examples/{script}", *args], timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("allreduce", ["auto", "xla"])
def test_dense_trains_identical_replicas(allreduce):
    out = run("dense.py", "--steps", "120", "--allreduce", allreduce)
    acc = float(re.search(r"2 ranks, 120 steps: test accuracy ([\d.]+)", out)[1])
    assert acc > 0.8, out  # replicas identical: the script asserts it


@pytest.mark.parametrize("mode", ["solo", "majority"])
def test_partial_with_a_straggler_keeps_replicas_identical(mode):
    out = run("partial.py", "--mode", mode, "--steps", "60", "--delay", "0.01")
    assert f"r0 | {mode}: 60 steps in" in out, out


def test_checkpoint_resumes_bit_identically(tmp_path):
    def digest(out: str) -> str:
        return re.search(r"step 40: .* parameters (\w+)", out)[1]

    run(
        "checkpoint.py",
        "--run-dir",
        str(tmp_path / "a"),
        "--steps",
        "20",
        "--every",
        "10",
    )
    resumed = run(
        "checkpoint.py",
        "--run-dir",
        str(tmp_path / "a"),
        "--steps",
        "40",
        "--every",
        "10",
    )
    assert "resumed from step 20" in resumed
    straight = run(
        "checkpoint.py",
        "--run-dir",
        str(tmp_path / "b"),
        "--steps",
        "40",
        "--every",
        "10",
    )
    assert digest(resumed) == digest(straight)


def test_timeline_has_every_ranks_phases(tmp_path):
    run("timeline.py", "--run-dir", str(tmp_path), "--steps", "6")
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    spans = {(e["pid"], e["name"]) for e in events if e.get("ph") == "X"}
    for rank in (0, 1):
        for name in ("forward+backward", "update", "allreduce-host"):
            assert any(p == rank and n == name for p, n in spans), (rank, name)


def test_sparse_topk_trains_identical_replicas_on_few_bytes():
    out = run("sparse.py", "--density", "0.01", "--steps", "150")
    m = re.search(
        r"density 0.01: 150 steps, test accuracy ([\d.]+), ([\d.]+) KB sent per "
        r"step \(dense: ([\d.]+) KB\)",
        out,
    )
    assert m, out  # replicas identical: the script asserts it
    acc, sent, dense = (float(v) for v in m.groups())
    assert acc > 0.6, out
    assert sent < dense / 10, out
