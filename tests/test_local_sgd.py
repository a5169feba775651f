"""Local SGD (``research/strategies/local_sgd.py``), the strategy that is one
module and this one test: it trains at 2 and 3 ranks under the Trainer and
from ``examples/local_sgd.py``, averages exactly every H steps, and a run
checkpointed and resumed ends bit for bit as one that never stopped.

Its options (``--list``, ranges checked before launch), its place in the
registry and every strategy's contract (replicas agree, two drains change
nothing, one metrics schema, resume) reach it with every other strategy, by
name from the registry: tests/test_options.py, tests/test_train_cli.py,
tests/mpi/test_contract.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from research.rundir import read_metrics
from tests.harness import python, run_under_mpiexec
from tests.tiny import PLAIN_SGD, tiny_flags

pytestmark = pytest.mark.launches  # MPI jobs: not in make test-fast

H = 4


def _train(run: Path, np_: int, *extra: str) -> dict:
    """``python -m experiments.train`` with local SGD on the tiny task."""
    sgd = [f"--{k.replace('_', '-')}={v}" for k, v in PLAIN_SGD.items()]
    args = [
        *("-m", "experiments.train", "--np", str(np_), *tiny_flags()),
        *("--strategy", "local_sgd", "--strategy-opt", f"local_steps={H}"),
        # One allreduce for both runs compared (auto may time another one).
        *("--strategy-opt", "allreduce=ring"),
        *("--eval-every", "0", "--log-every", "1", "--run-dir", str(run)),
        *sgd,
        *extra,
    ]
    proc = python(args, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((run / "summary.json").read_text())


@pytest.mark.parametrize("np_", [2, 3])
def test_from_a_plain_loop_replicas_end_identical(np_):
    proc = run_under_mpiexec(
        np_, ["examples/local_sgd.py", "--steps", "121", "--local-steps", "8"]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # 15 averages in 121 steps, and the drain's one for the last step; the
    # script asserts every rank ends with the same parameters.
    found = re.search(r"121 steps, (\d+) averages \(H=8\), test accuracy ([\d.]+)",
                      proc.stdout)  # fmt: skip
    assert found, proc.stdout[-3000:]
    assert int(found[1]) == 16 and float(found[2]) > 0.8, found[0]


def test_under_the_trainer_it_averages_every_h_steps(tmp_path):
    """At 2 ranks: a step's record says it averaged exactly where (step + 1)
    is a multiple of H; the others are one rank's own step (1 contributor)."""
    summary = _train(tmp_path / "run", 2, "--steps", "10")
    assert summary["steps"] == 10 and summary["strategy"] == "local_sgd"
    rows = [r for r in read_metrics(tmp_path / "run") if not r.get("kind")]
    assert [r["step"] for r in rows] == list(range(1, 11))
    averaged = [r["step"] for r in rows if r["comm_averaged"]]
    assert averaged == [4, 8], averaged
    assert all(r["comm_contributors"] == 1 for r in rows if not r["comm_averaged"])
    assert all(r["comm_contributors"] == 2 for r in rows if r["comm_averaged"])


def test_under_the_trainer_a_resumed_run_ends_bit_for_bit(tmp_path):
    """At 3 ranks, checkpointed every 3 steps (a checkpoint averages first:
    the snapshot is one model): 6 steps, then the same command to 11 resumes
    at 6 and ends as an 11-step run that never stopped."""
    flags = ("--checkpoint", "deepfreeze", "--checkpoint-every", "3")
    whole = _train(tmp_path / "whole", 3, "--steps", "11", *flags)
    first = _train(tmp_path / "cut", 3, "--steps", "6", *flags)
    assert first["steps"] == 6
    resumed = _train(tmp_path / "cut", 3, "--steps", "11", *flags)
    assert resumed["resumed_from"] == 6 and resumed["steps"] == 11
    assert resumed["params_sha256"] == whole["params_sha256"]
    assert resumed["final_test_loss"] == whole["final_test_loss"]
