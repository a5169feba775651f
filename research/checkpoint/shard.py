"""One rank's shard as a standard Orbax item: write it, read it back.

A shard directory is an Orbax composite checkpoint with two items:

* ``state``: a PyTree checkpoint (OCDBT + Zarr) of this rank's leaves, nested by
  their path names (``{"params": {"Dense_0": {"kernel": ...}}}``);
* ``shard``: JSON with the step, the rank, each leaf's shape, dtype and CRC-32,
  and the caller's ``extra`` (data position).

orbax-checkpoint alone reads it (see the package README)::

    import orbax.checkpoint as ocp
    arrays = ocp.StandardCheckpointer().restore("ckpt/rank1/30/state")

Every process is Orbax "process 0" here (no ``jax.distributed``), which is why
each rank writes into its own directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from research.checkpoint.leaves import nest, unnest

if TYPE_CHECKING:
    import orbax.checkpoint as ocp

SHARD_FORMAT = "research.checkpoint.shard/1"


def alone() -> ocp.options.MultiprocessingOptions:
    """Orbax's options for a checkpointer that this process uses alone.

    Every rank writes its own shard into its own folder. Without JAX's
    distributed runtime each process is Orbax's process 0 anyway; with it
    (``allreduce=xla``: research.comm.dense.xla) Orbax would wait at its
    barriers for every process and leave the writing to process 0.
    """
    import jax
    import orbax.checkpoint as ocp

    if jax.process_count() == 1:
        return ocp.options.MultiprocessingOptions()
    me = jax.process_index()
    return ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})


def _registry(compress: bool) -> ocp.handlers.DefaultCheckpointHandlerRegistry:
    import orbax.checkpoint as ocp

    reg = ocp.handlers.DefaultCheckpointHandlerRegistry()
    options = alone()
    tree = ocp.PyTreeCheckpointHandler(
        use_compression=compress, multiprocessing_options=options
    )
    reg.add("state", ocp.args.PyTreeSave, tree)
    reg.add("state", ocp.args.PyTreeRestore, tree)
    js = ocp.JsonCheckpointHandler(multiprocessing_options=options)
    reg.add("shard", ocp.args.JsonSave, js)
    reg.add("shard", ocp.args.JsonRestore, js)
    return reg


def _composite(compress: bool) -> ocp.CompositeCheckpointHandler:
    import orbax.checkpoint as ocp

    return ocp.CompositeCheckpointHandler(
        handler_registry=_registry(compress),
        composite_options=ocp.CompositeOptions(multiprocessing_options=alone()),
    )


def new_checkpointer(*, use_async: bool, compress: bool = False):
    """An Orbax (async) checkpointer for shard items.

    Args:
      use_async: ``AsyncCheckpointer`` (serialization and writes in Orbax's
        background threads; ``wait_until_finished`` completes them) or the
        blocking ``Checkpointer``.
      compress: zstd-compress chunks. Off by default: trained float weights
        shrink by a few percent while compression costs CPU that training needs.
    """
    import orbax.checkpoint as ocp

    handler = _composite(compress)
    if use_async:
        return ocp.AsyncCheckpointer(handler, multiprocessing_options=alone())
    return ocp.Checkpointer(handler, multiprocessing_options=alone())


def shard_args(arrays: dict[str, Any], meta: dict[str, Any]) -> ocp.args.Composite:
    """Orbax save arguments for one shard (``arrays`` by leaf name)."""
    import orbax.checkpoint as ocp

    meta = {"format": SHARD_FORMAT, **meta}
    return ocp.args.Composite(
        state=ocp.args.PyTreeSave(nest(arrays)), shard=ocp.args.JsonSave(meta)
    )


def read_shard(
    path: str | Path, names: list[str]
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read a shard's arrays (as numpy, by leaf name) and its JSON metadata."""
    import orbax.checkpoint as ocp

    restore_args = nest({n: ocp.RestoreArgs(restore_type=np.ndarray) for n in names})
    ckptr = ocp.Checkpointer(_composite(False), multiprocessing_options=alone())
    out = ckptr.restore(
        Path(path),
        args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(restore_args=restore_args),
            shard=ocp.args.JsonRestore(),
        ),
    )
    arrays = {k: np.asarray(v) for k, v in unnest(dict(out["state"])).items()}
    return arrays, dict(out["shard"] or {})
