"""Checkpointing across ranks: commit agreement, sharding, restore, policies.

Runs on every rank of ``mpiexec -n 2`` and ``-n 4``; expectations are written in
terms of the world size.
"""

from __future__ import annotations

import errno
import json
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

from research.checkpoint import CheckpointConfig, CheckpointError, CheckpointWarning
from research.checkpoint.deepfreeze import DeepFreeze
from research.checkpoint.restore import restore_latest
from research.checkpoint.tiers import Tier
from tests.checkpoint_state import advance, host, identical, initial, state_at
from tests.tiny import PLAIN_SGD, tiny_config


@pytest.fixture
def shared(world):
    """A folder every rank sees (rank 0 makes it), removed after the test."""
    path = world.bcast(
        tempfile.mkdtemp(prefix="ckpt-mpi-") if world.rank == 0 else None
    )
    yield Path(path)
    world.barrier()
    if world.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def _train(ckpt, steps, every, extra_of=None):
    """Run donated steps, checkpoint every ``every``; returns host copies by step."""
    s, saved = initial(), {}
    for k in range(1, steps + 1):
        s = advance(s)
        if k % every == 0:
            saved[k] = host(s)
            ckpt.save(k, s, extra=extra_of(k) if extra_of else None)
    ckpt.wait()
    return s, saved


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_deepfreeze_roundtrip_identical_on_every_rank(world, shared, writer):
    ckpt = DeepFreeze(
        world, shared / "p", fast_dir=shared / "f", fsync=False, writer=writer
    )
    _, saved = _train(ckpt, 9, 3, lambda k: {"data": {"rank": world.rank, "k": k}})
    assert ckpt.committed_steps("fast")[-1] == 9
    assert ckpt.committed_steps("persistent") == [3, 6, 9]
    r = ckpt.restore(state_at(0))
    ckpt.close()
    assert r.step == 9 and r.tiers and set(r.tiers) == {"fast"}
    assert identical(r.state, saved[9])
    assert r.extra_for(world.rank) == {"data": {"rank": world.rank, "k": 9}}
    digests = world.allgather(
        [x.tobytes() for x in __import__("jax").tree.leaves(host(r.state))]
    )
    assert all(d == digests[0] for d in digests)


def test_each_rank_writes_only_its_balanced_shard(world, shared):
    ckpt = DeepFreeze(world, shared / "p", fast_dir=None, fsync=False)
    _train(ckpt, 2, 2)
    ckpt.close()
    m = json.loads((shared / "p" / "manifest.json").read_text())
    entry = m["steps"]["2"]
    assert [s["shard"] for s in entry["shards"]] == list(range(world.size))
    owned = [
        sum(
            np.prod(u["shape"], dtype=np.int64) * 4
            for u in entry["units"]
            if u["shard"] == r
        )
        for r in range(world.size)
    ]
    # The big leaf is cut into row blocks: shards within 25% of the mean.
    assert max(owned) <= 1.25 * sum(owned) / world.size
    assert any(u["rows"] for u in entry["units"])
    mine = Path(shared / "p" / f"rank{world.rank}" / "2")
    # A raw shard (research/checkpoint/rawshard.py): one data file and its JSON.
    assert sorted(p.name for p in mine.iterdir()) == ["data.bin", "shard.json"]


@pytest.mark.parametrize("mode", ["view", "host", "device"])
def test_donation_does_not_corrupt_a_snapshot(world, shared, mode):
    ckpt = DeepFreeze(world, shared / mode, fast_dir=None, snapshot=mode)
    s = state_at(3)
    expected = host(s)
    ckpt.save(3, s)
    for _ in range(5):  # donated steps right after the snapshot
        s = advance(s)
    ckpt.wait()
    r = ckpt.restore(state_at(0))
    ckpt.close()
    assert r.step == 3 and identical(r.state, expected)


# Every saver's round trip (and crash, and resume at another world size):
# tests/test_saver_contract.py, over list_savers().


def test_wait_policy_blocks_and_records_the_wait(world, shared):
    ckpt = DeepFreeze(world, shared / "p", fast_dir=shared / "f", max_inflight=1)
    s = initial()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = [ckpt.save(k, s) for k in (1, 2, 3)]
    ckpt.wait()
    assert recs[0].wait_s == 0
    # Each later request found one in flight and waited for it; nothing dropped.
    assert all(r.inflight <= 1 and not r.skipped for r in recs)
    assert sum(r.wait_s > 0 for r in recs[1:]) >= 1
    assert any(issubclass(w.category, CheckpointWarning) for w in caught)
    assert ckpt.committed_steps("persistent")[-2:] == [2, 3]
    ckpt.close()


def test_skip_policy_commits_a_step_on_all_ranks_or_none(world, shared):
    ckpt = DeepFreeze(
        world, shared / "p", fast_dir=None, max_inflight=1, on_busy="skip"
    )
    s = state_at(1, scale=8)
    recs = [ckpt.save(k, s) for k in range(1, 7)]
    ckpt.wait()
    committed = ckpt.committed_steps()
    every = world.allgather(committed)
    assert all(c == committed for c in every)
    skipped = [r.step for r in recs if r.skipped]
    assert not set(skipped) & set(committed)
    assert committed  # the first request always goes through
    ckpt.close()


def test_restore_from_persistent_when_the_fast_tier_is_gone(world, shared):
    ckpt = DeepFreeze(world, shared / "p", fast_dir=shared / "f", fsync=False)
    _, saved = _train(ckpt, 4, 2)
    ckpt.close()  # a normal close removes the fast tier (memory, on /dev/shm)
    world.barrier()
    assert not (shared / "f").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        ckpt = DeepFreeze(world, shared / "p", fast_dir=shared / "f", fsync=False)
        r = ckpt.restore(state_at(0))
    ckpt.close()
    assert r.step == 4 and r.tiers == ["persistent"]
    assert identical(r.state, saved[4])


def test_retention_keeps_the_newest(world, shared):
    ckpt = DeepFreeze(world, shared / "p", fast_dir=shared / "f", keep=2, keep_fast=1)
    _train(ckpt, 8, 2)
    world.barrier()
    p = json.loads((shared / "p" / "manifest.json").read_text())
    f = json.loads((shared / "f" / "manifest.json").read_text())
    assert sorted(map(int, p["steps"])) == [6, 8]
    assert sorted(map(int, f["steps"])) == [8]
    from research.checkpoint.rawshard import SPARE

    mine = shared / "p" / f"rank{world.rank}"

    def steps(folder):  # a retired step's data file is kept for reuse meanwhile
        return sorted(x.name for x in folder.iterdir() if x.name != SPARE)

    assert steps(mine) == ["6", "8"]
    assert steps(shared / "f" / f"rank{world.rank}") == ["8"]
    world.barrier()
    ckpt.close()
    assert sorted(x.name for x in mine.iterdir()) == ["6", "8"]  # no spare left


def test_a_failure_on_one_rank_surfaces_on_every_rank(world, shared):
    last = world.size - 1

    def hook(event, step):
        if event == "write-begin" and step == 2 and world.rank == last:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

    ckpt = DeepFreeze(world, shared / "p", fast_dir=shared / "f", fault_hook=hook)
    s = initial()
    ckpt.save(1, s)
    ckpt.save(2, s)
    with pytest.raises(CheckpointError, match=rf"rank {last}: OSError.*No space"):
        ckpt.wait()
    assert ckpt.committed_steps() == [1]
    ckpt.close()


def test_rank_local_leaves_come_back_to_their_rank(world, shared):
    ckpt = DeepFreeze(
        world, shared / "p", fast_dir=None, fsync=False, rank_local=("batch_stats",)
    )
    s = state_at(2)
    s["batch_stats"]["mean"] = s["batch_stats"]["mean"] + world.rank  # per-rank
    expected = host(s)
    ckpt.save(2, s)
    r = ckpt.restore(state_at(0))
    ckpt.close()
    assert identical(r.state, expected)  # replicated leaves and this rank's stats


def test_restore_with_another_world_size(world, shared):
    """Each rank alone (a world of 1) restores everything from the persistent tier."""
    ckpt = DeepFreeze(world, shared / "p", fast_dir=None, fsync=False)
    _, saved = _train(ckpt, 2, 2)
    ckpt.close()
    alone = world.comm.Split(color=world.rank, key=0)
    r = restore_latest(alone, [Tier("persistent", shared / "p")], state_at(0))
    alone.Free()
    assert r.step == 2 and identical(r.state, saved[2])


def _trainer_parts(state) -> dict:
    """The TrainState's leaves without its static fields (apply_fn, tx)."""
    return {
        "params": state.params,
        "opt_state": state.opt_state,
        "batch_stats": state.batch_stats,
        "step": state.step,
        "rng": state.rng,
    }


def test_a_resumed_run_continues_exactly_like_one_that_never_stopped(world, shared):
    """The first run checkpoints at step 5 and goes on to 8 without stopping; a
    second run restores step 5 and trains to 8: both end bit for bit alike.
    (Stopping by kill -9 is covered with real processes in test_checkpoint_faults.)
    """
    from research.train.checkpointing import CheckpointCallback
    from research.train.loop import Trainer

    def cfg(name):
        # Staged averaging: its jitted steps are module-level, compiled once. An
        # MLP with dropout: the RNG key and step decide the masks. (BatchNorm's
        # rank-local statistics: test_rank_local_leaves_come_back_to_their_rank.)
        return tiny_config(
            str(shared / name), steps=8, log_every=100, strategy="host", warmup_steps=2
        )

    ck = CheckpointConfig(
        every=5,
        directory=str(shared / "ck"),
        fast_dir=str(shared / "fast"),
        fsync=False,
    )
    first = CheckpointCallback(ck)
    never_stopped = Trainer(cfg("a"), world, callbacks=[first])
    never_stopped.run()
    assert first.ckpt.committed_steps() == [5]
    second = CheckpointCallback(ck)
    resumed = Trainer(cfg("b"), world, callbacks=[second])
    resumed.run()
    assert second.resumed_from == 5
    assert identical(_trainer_parts(resumed.state), _trainer_parts(never_stopped.state))
    assert resumed.loader.position == never_stopped.loader.position


def test_a_solo_restart_applies_every_gradient_exactly_once(world, shared):
    """eager-SGD's carried gradients across a checkpoint and a restart.

    Solo rounds leave late gradients carried to a later round. The loop drains
    (a full drain round) before each checkpoint snapshot, so a
    checkpoint holds every gradient computed up to its step and nothing is
    carried past it. With plain SGD the parameters are the initial ones minus
    lr times every applied round result, and P times those results sum to every
    gradient computed: checked for a run, then for its resumed continuation.
    """
    import jax

    from research.imbalance import parse_imbalance
    from research.strategies.partial import Partial, SoloOptions
    from research.train.checkpointing import CheckpointCallback
    from research.train.loop import Trainer

    def flat(tree):
        leaves = jax.tree_util.tree_leaves(tree)
        return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in leaves])

    class Recording(Partial):
        """The real solo strategy, recording what goes in and what comes out."""

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.own, self.applied, self.contributors = [], [], []

        def reduce(self, grads):
            self.own.append(flat(grads))
            tree, info = super().reduce(grads)
            self.applied.append(flat(tree))
            self.contributors.append(info.contributors)
            return tree, info

        def carried(self):
            out = super().carried()
            if out is not None:
                self.applied.append(flat(out[0]))
            return out

    def run(steps):
        cfg = tiny_config(
            str(shared / f"run{steps}"),
            steps=steps,
            log_every=100,
            strategy="solo",
            **PLAIN_SGD,
        )
        ck = CheckpointConfig(
            every=5,
            directory=str(shared / "ck"),
            fast_dir=str(shared / "fast"),
            fsync=False,
        )
        avg = Recording(world, SoloOptions(seed=1, full_every=None))
        # One rank at a time sleeps 20 ms: solo rounds go without it.
        late = parse_imbalance("random:k=1:seconds=0.02", size=world.size, seed=3)
        callback = CheckpointCallback(ck)
        t = Trainer(cfg, world, strategy=avg, imbalance=late, callbacks=[callback])
        start = flat(t.state.params)
        t.run()
        if callback.resumed_from is not None:
            start = None  # the restored state's, read below from run one's end
        return t, avg, start, callback

    def check_segment(avg, before, after, lr, steps):
        assert len(avg.own) == steps  # each step computed once, none re-run
        applied = np.sum(avg.applied, axis=0)
        computed = world.comm.allreduce(np.sum(avg.own, axis=0))
        np.testing.assert_allclose(world.size * applied, computed, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(after, before - lr * applied, rtol=1e-5, atol=1e-6)

    first, avg1, p0, cb1 = run(10)
    lr = float(first.schedule(0))
    p10 = flat(first.state.params)
    check_segment(avg1, p0, p10, lr, 10)
    if world.size > 1:  # some rounds really went without a rank
        assert min(avg1.contributors) < world.size
    second, avg2, _, cb2 = run(15)
    assert cb2.resumed_from == 10
    check_segment(avg2, p10, flat(second.state.params), lr, 5)
    assert len(set(world.allgather(flat(second.state.params).tobytes()))) == 1
