"""Per-rank sharding of research.data: disjoint shards that cover each epoch,
batches that pair inputs with labels, resumable positions, evaluation slices."""

from __future__ import annotations

import json

import numpy as np
import pytest

from research.data import ShardedLoader, eval_batches


def epoch_indices(loader: ShardedLoader) -> np.ndarray:
    return np.concatenate(
        [loader.next_batch()[0] for _ in range(loader.steps_per_epoch)]
    )


def make(n=103, **kw) -> ShardedLoader:
    x = np.arange(n)
    kw = {"batch_size": 5, "rank": 0, "size": 4, "seed": 7} | kw
    return ShardedLoader(x, x * 10, **kw)


@pytest.mark.parametrize("size, batch_size", [(1, 8), (2, 5), (3, 4), (4, 7)])
def test_shards_are_disjoint_and_cover_the_epoch(size, batch_size):
    n = 103
    seen = [epoch_indices(make(n, size=size, rank=r, batch_size=batch_size))
            for r in range(size)]  # fmt: skip
    per_rank = n // size
    steps = per_rank // batch_size
    for s in seen:
        assert len(s) == steps * batch_size
    flat = np.concatenate(seen)
    assert len(np.unique(flat)) == len(flat)  # disjoint
    # Up to the trimmed remainder and the dropped partial batch, all are covered.
    assert len(flat) >= n - (size - 1) - size * (batch_size - 1)


def test_batches_pair_x_with_y_and_drop_last_false_gives_short_batch():
    loader = make(n=23, size=2, batch_size=5, drop_last=False)
    assert loader.shard_size == 11 and loader.steps_per_epoch == 3
    sizes = []
    for _ in range(3):
        x, y = loader.next_batch()
        np.testing.assert_array_equal(y, x * 10)
        sizes.append(len(x))
    assert sizes == [5, 5, 1]
    assert loader.position == {"epoch": 1, "index": 0}


def test_epochs_differ_and_seed_fixes_order():
    a, b, c = make(seed=1), make(seed=1), make(seed=2)
    e0, e1 = epoch_indices(a), epoch_indices(a)
    assert not np.array_equal(e0, e1)
    np.testing.assert_array_equal(epoch_indices(b), e0)
    np.testing.assert_array_equal(epoch_indices(b), e1)
    assert not np.array_equal(epoch_indices(c), e0)


def test_resume_from_position_repeats_the_batch_sequence():
    loader = make(batch_size=6)  # 4 steps per epoch: 7 batches cross an epoch
    for _ in range(7):
        loader.next_batch()
    saved = json.loads(json.dumps(loader.position))
    assert saved == {"epoch": 1, "index": 3}
    expected = [loader.next_batch()[0] for _ in range(5)]
    for resumed in (make(batch_size=6, position=saved), make(batch_size=6)):
        resumed.set_position(saved)
        got = [resumed.next_batch()[0] for _ in range(5)]
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(g, e)


def test_loader_rejects_bad_arguments():
    with pytest.raises(ValueError, match="batch_size 30 exceeds this rank's shard"):
        make(n=103, size=4, batch_size=30)
    with pytest.raises(ValueError, match="rank"):
        make(rank=4, size=4)
    loader = make()
    with pytest.raises(ValueError, match="does not fit"):
        loader.set_position({"epoch": 0, "index": 99})
    with pytest.raises(ValueError, match="must look like"):
        loader.set_position({"step": 3})


@pytest.mark.parametrize("n, size", [(10, 1), (10, 3), (17, 4), (2, 4)])
def test_eval_batches_cover_each_example_once(n, size):
    x = np.arange(n)
    parts = [list(eval_batches(x, x * 10, 3, r, size)) for r in range(size)]
    flat = [v for part in parts for xb, yb in part for v in xb]
    assert flat == list(range(n))
    for part in parts:
        for xb, yb in part:
            assert 1 <= len(xb) <= 3
            np.testing.assert_array_equal(yb, xb * 10)
    with pytest.raises(ValueError):
        eval_batches(x, x, 0, 0, 1)
