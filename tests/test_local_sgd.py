"""Local SGD (``research/strategies/local_sgd.py``), the strategy that is one
module and this one test: it trains at 2 and 3 ranks from
``examples/local_sgd.py`` (replicas identical at the end), and under the
Trainer it averages exactly every H steps.

What every strategy is held to reaches it by name from the registry, with
nothing naming it: its options (``--list``, every range refused before launch:
tests/test_options.py), one module that registers it (tests/test_train_cli.py)
and the contract at 3 ranks under the Trainer (tests/mpi/test_contract.py:
replicas agree, two drains change nothing, one metrics schema, and a run
checkpointed at step 5 and resumed ends bit for bit as one that never
stopped, its options saying it is deterministic).
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
