"""Threshold top-k under MPI: exact k, exact residual, same result on every rank."""

from __future__ import annotations

import os
import zlib

import jax
import numpy as np
from jax.flatten_util import ravel_pytree

from research.comm.sparse import sparse_allreduce
from research.comm.sparse.select import TopKSelector
from research.comm.sparse.vector import SparseVector
from research.train.loop import Trainer
from tests.tiny import PLAIN_SGD, tiny_config


def test_select_then_allreduce_every_rank(world):
    """Each rank its own gradients; k exactly, sent + kept == acc bit for bit,
    and the summed result the same bytes everywhere, equal to the dense sum."""
    # The size mpiexec launched (MPICH's PMI_SIZE), not merely one rank.
    assert world.size == int(os.environ.get("PMI_SIZE", world.size))
    rng = np.random.default_rng([7, world.rank])
    sizes = [150_000, 33, 120_001]
    dim, k = sum(sizes), 2_700
    sel = TopKSelector(sizes, [k], seed=1)
    R = np.zeros(dim, np.float32)
    for step in range(3):
        g = [
            rng.standard_normal(n).astype(np.float32) * (1 + world.rank) for n in sizes
        ]
        acc = R + np.concatenate(g)
        idx, vals = sel.select(R, g, None, step)
        assert idx.size == k
        sent = np.zeros(dim, np.float32)
        sent[idx] = vals
        assert np.array_equal((sent + R).view(np.uint32), acc.view(np.uint32))
        mag = np.abs(acc)
        assert mag[idx].min() >= np.delete(mag, idx).max()  # the top k
        out = sparse_allreduce(world.comm, SparseVector(idx, vals, dim), "ssar_sag")
        total = out.to_dense()
        crcs = world.allgather(zlib.crc32(total.tobytes()))
        assert len(set(crcs)) == 1, crcs
        dense = world.comm.allreduce(sent.astype(np.float64))
        np.testing.assert_allclose(total, dense, rtol=1e-6, atol=1e-6)


def _train(world, tmp_path_factory, select: str) -> np.ndarray:
    run_dir = world.bcast(
        str(tmp_path_factory.mktemp(f"sel-{select}")) if world.rank == 0 else None
    )
    cfg = tiny_config(
        run_dir,
        batch_size=8,
        steps=5,
        strategy="sparse",
        strategy_options={"density": 0.05, "select": select, "algorithm": "ssar_sag"},
        **{**PLAIN_SGD, "momentum": 0.9},
    )
    trainer = Trainer(cfg, world)
    trainer.run()
    flat = np.asarray(ravel_pytree(jax.tree.map(np.asarray, trainer.state.params))[0])
    assert len(set(world.allgather(zlib.crc32(flat.tobytes())))) == 1
    res = np.asarray(trainer.state.strategy["residual"])
    return flat, res


def test_threshold_trains_exactly_like_lax_top_k(world, tmp_path_factory):
    """Same top-k set, same residual: the two selections give the same bytes."""
    p_t, r_t = _train(world, tmp_path_factory, "threshold")
    p_e, r_e = _train(world, tmp_path_factory, "exact")
    assert np.any(r_t != 0)
    np.testing.assert_array_equal(r_t, r_e)
    np.testing.assert_array_equal(p_t, p_e)
