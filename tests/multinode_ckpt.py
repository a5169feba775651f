"""DeepFreeze across layouts of nodes, run by tests/test_multinode.py:

    ... multinode_ckpt.py save DIR      # on one layout: step 4, fast tier kept
    ... multinode_ckpt.py restore DIR   # on another: every value back

``restore`` writes ``DIR/restored-<rank>.json``: the step and the tier each shard
this rank read came from (node-local shards are gone on other nodes, so the
persistent tier serves those).
"""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np

from research.checkpoint import CheckpointConfig
from research.comm.world import get_world


def state() -> dict:
    """A replica's state (the same on every rank: data-parallel replicas)."""
    return {
        f"layer{i}": np.arange(1000, dtype=np.float32) * (i + 1) for i in range(6)
    }


def main(mode: str, folder: str) -> None:
    world = get_world()
    cfg = CheckpointConfig(
        saver="deepfreeze", directory=folder, fsync=False, keep_fast_tier=True
    )
    ck = cfg.create(world, folder)
    if mode == "save":
        ck.save(4, state())
        ck.wait()
        assert ck.committed_steps() == [4]
        ck.close()
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        target = {k: np.zeros_like(v) for k, v in state().items()}
        restored = ck.restore(target)
    assert restored is not None and restored.step == 4
    for key, value in state().items():
        np.testing.assert_array_equal(restored.state[key], value)
    record = {
        "step": restored.step,
        "tiers": restored.tiers,
        "warnings": [str(w.message) for w in caught],
        "host": world.topology.hostnames[world.rank],
    }
    with open(f"{folder}/restored-{world.rank}.json", "w") as f:
        json.dump(record, f)
    ck.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
