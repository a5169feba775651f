"""Trains every registered strategy a few steps and writes what it ended with.

Run under MPI by tests/test_multinode.py, once on one node and once across the
nodes of a local cluster, so the two can be compared:

    mpiexec -n 4 python tests/multinode_driver.py OUT.npz FOLDER

Rank 0 writes ``OUT.npz``: for every strategy its final parameters (flattened)
and every rank's CRC of them (replicas must agree).
"""

from __future__ import annotations

import sys
import zlib

import jax
import numpy as np

from research.comm.world import get_world
from research.strategies.registry import names as list_strategies
from research.train.loop import Trainer
from tests.tiny import tiny_config


def main(out: str, folder: str) -> None:
    world = get_world()
    found = {}
    for name in list_strategies():
        cfg = tiny_config(
            f"{folder}/{name}", steps=6, log_every=100, strategy=name, warmup_steps=2
        )
        trainer = Trainer(cfg, world)
        trainer.run()
        flat = np.concatenate(
            [
                np.asarray(x, np.float64).ravel()
                for x in jax.tree.leaves(trainer.state.params)
            ]
        )
        crcs = world.allgather(zlib.crc32(flat.tobytes()))
        found[f"{name}.params"] = flat
        found[f"{name}.crcs"] = np.asarray(crcs)
    if world.rank == 0:
        np.savez(out, **found)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
