"""Every registered strategy through the same checks, under MPI.

For each name the registry knows (a new strategy is checked without being
named here), a short Trainer run with DeepFreeze checkpoints:

* replicas agree: every rank ends with the same parameters;
* ``drain`` twice is harmless: a second drain right after the first changes
  nothing;
* one metrics schema: every step row has the strategies' common timing keys
  (``research.strategies.base.PHASES``), so studies read any strategy alike;
* resume: a second run of the same configuration restores the checkpoint of
  step 5 and trains to step 8; where the strategy is deterministic (its
  options say so: all but eager-SGD's partial rounds, the asynchronous
  parameter server and the adaptive choice, which depend on timing) it ends
  bit for bit as the run that never stopped.
"""

from __future__ import annotations

import shutil
import tempfile
import zlib
from pathlib import Path

import jax
import numpy as np
import pytest

from research.strategies import registry
from research.train.callback import Callback
from tests.checkpoint_state import identical
from tests.tiny import tiny_config

#: Strategies whose result depends on timing (their options say so, none named
#: here): which gradients make a round, or (adaptive) which method the model
#: fitted to measured times picks at a step. Adaptive's resume with its
#: switches fixed (``plan``) is checked bit for bit in tests/mpi/test_adaptive.py.
TIMING_DEPENDENT = {
    n for n in registry.names() if not registry.options_class(n).deterministic
}


@pytest.fixture
def shared(world):
    path = world.bcast(tempfile.mkdtemp(prefix="contract-") if world.rank == 0 else 0)
    yield Path(path)
    world.barrier()
    if world.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def _parts(state) -> dict:
    return {
        "params": state.params,
        "opt_state": state.opt_state,
        "batch_stats": state.batch_stats,
        "step": np.asarray(int(state.step), np.int64),  # int or int32 array
    }


def _checksum(tree) -> int:
    leaves = [np.asarray(x) for x in jax.tree.leaves(tree)]
    return zlib.crc32(b"".join(a.tobytes() for a in leaves))


class _DrainTwice(Callback):
    """At step 3: drain, remember the state, drain again, compare."""

    def __init__(self):
        self.same = None

    def on_step_end(self, trainer, step):
        if step == 3:
            trainer.drain()
            first = jax.tree.map(np.array, _parts(trainer.state))
            trainer.drain()
            self.same = identical(_parts(trainer.state), first)


def _check_phases(name: str, run_dir: Path) -> None:
    from research.rundir import read_metrics
    from research.strategies.base import PHASES

    # Step rows: evaluations and a strategy's own rows (adaptive's model and
    # change rows) have a "kind" (as research.rundir.step_medians reads them).
    rows = [r for r in read_metrics(run_dir) if not r.get("kind")]
    assert rows, f"{name}: no step rows"
    for row in rows:
        assert set(PHASES) <= set(row), f"{name}: {sorted(row)} lacks {PHASES}"
        assert row["compute_s"] > 0, (name, row)
        for key in PHASES:
            assert row[key] is None or row[key] >= 0, (name, key, row[key])
        # Communication is either separated in both keys or in neither.
        assert (row["comm_busy_s"] is None) == (row["comm_exposed_s"] is None), row


@pytest.mark.parametrize("name", registry.names())
def test_every_strategy_keeps_the_contract(world, shared, name):
    from research.checkpoint import CheckpointConfig
    from research.train.checkpointing import CheckpointCallback
    from research.train.loop import Trainer

    def run(folder: str):
        cfg = tiny_config(
            str(shared / folder), steps=8, log_every=100, strategy=name, warmup_steps=2
        )
        ck = CheckpointConfig(
            every=5, directory=str(shared / "ck"), fast_dir=None, fsync=False
        )
        checkpoint, drain = CheckpointCallback(ck), _DrainTwice()
        trainer = Trainer(cfg, world, callbacks=[checkpoint, drain])
        trainer.run()
        return trainer, checkpoint, drain

    first, ck1, drain1 = run("a")
    assert ck1.ckpt.committed_steps() == [5], name
    sums = world.allgather(_checksum(first.state.params))
    assert len(set(sums)) == 1, f"{name}: replicas differ {sums}"
    assert drain1.same, f"{name}: a second drain changed the state"
    if world.rank == 0:
        _check_phases(name, shared / "a")
    second, ck2, _ = run("b")
    assert ck2.resumed_from == 5 and second.step == 8, name
    sums = world.allgather(_checksum(second.state.params))
    assert len(set(sums)) == 1, f"{name}: resumed replicas differ {sums}"
    if name not in TIMING_DEPENDENT:
        assert identical(_parts(second.state), _parts(first.state)), (
            f"{name}: the resumed run does not end as the one that never stopped"
        )
