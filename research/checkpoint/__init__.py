"""Sharded asynchronous multi-level checkpointing on Orbax (DeepFreeze), baselines.

    from research.checkpoint import CheckpointConfig
    ckpt = CheckpointConfig(saver="deepfreeze", every=10).create(world, run_dir)
    restored = ckpt.restore(state)            # None when nothing is committed
    ...
    ckpt.save(step, state, extra={"data": loader.position})   # returns quickly
    ckpt.wait(); ckpt.close()

    state = load(run_dir)   # in any single process later: no mpiexec, no template

Modules: ``deepfreeze`` (the checkpointer), ``baselines``, ``restore``,
``offline`` (``load``: one process, no MPI), ``read`` (shards without MPI),
``snapshot`` (donation-proof capture), ``partition`` (size-balanced shards),
``agreement`` (MPI commit rounds), ``manifest``, ``tiers``, ``shard`` (Orbax
items), ``writer`` (the helper process that writes and flushes shards),
``integrity`` (CRC-32s), ``leaves`` (named leaves), ``config``, ``registry``
(a saver's options and ``register_saver``), ``savers`` (every saver by name:
``list_savers``),
``overhead`` (the interleaved measurement's estimator). A library below
training (``research/import_rules.py``): the Trainer's hook is
``research.train.checkpointing``, the interleaved saver benchmark
``research.studies.checkpoint_bench``.
"""

from typing import Any

# Lazy exports: ``research.checkpoint.writer`` runs in a helper process that must
# not import mpi4py (under mpiexec that would start a second MPI rank).
_EXPORTS = {
    "Checkpointer": "base",
    "CheckpointError": "base",
    "SaveRecord": "base",
    "CheckpointConfig": "config",
    "list_savers": "savers",
    "register_saver": "registry",
    "CorruptShardError": "integrity",
    "CheckpointWarning": "manifest",
    "Restored": "restore",
    "restore_latest": "restore",
    "load": "offline",
    "NoCheckpointError": "offline",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'research.checkpoint' has no attribute {name!r}")
    from research.checkpoint import (
        base,
        config,
        integrity,
        manifest,
        offline,
        registry,
        restore,
        savers,
    )

    modules = {"base": base, "config": config, "integrity": integrity}
    modules |= {"manifest": manifest, "offline": offline, "registry": registry}
    modules |= {"restore": restore, "savers": savers}
    return getattr(modules[_EXPORTS[name]], name)
