"""Sharded asynchronous multi-level checkpointing on Orbax (DeepFreeze), baselines.

    from research.checkpoint import CheckpointConfig
    ckpt = CheckpointConfig(strategy="deepfreeze", every=10).create(world, run_dir)
    restored = ckpt.restore(state)            # None when nothing is committed
    ...
    ckpt.save(step, state, extra={"data": loader.position})   # returns quickly
    ckpt.wait(); ckpt.close()

Modules: ``deepfreeze`` (the checkpointer), ``baselines``, ``restore``,
``snapshot`` (donation-proof capture), ``partition`` (size-balanced shards),
``agreement`` (MPI commit rounds), ``manifest``, ``tiers``, ``shard`` (Orbax
items), ``integrity`` (CRC-32s), ``leaves`` (named leaves), ``callback`` (the
training-loop hook), ``config``.
"""

from research.checkpoint.base import Checkpointer, CheckpointError, SaveRecord
from research.checkpoint.config import STRATEGIES, CheckpointConfig
from research.checkpoint.integrity import CorruptShardError
from research.checkpoint.manifest import CheckpointWarning
from research.checkpoint.restore import Restored, restore_latest

__all__ = [
    "STRATEGIES",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointWarning",
    "Checkpointer",
    "CorruptShardError",
    "Restored",
    "SaveRecord",
    "restore_latest",
]
