"""Reading committed shards without MPI: one shard's units, and whole leaves.

Shared by the collective restore (:mod:`research.checkpoint.restore`) and the
single-process :func:`research.checkpoint.load`; nothing here imports mpi4py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from research.checkpoint.integrity import (
    LEGACY_CHECKSUM,
    CorruptShardError,
    array_crc32,
    verify_dir,
)
from research.checkpoint.rawshard import RAW_FORMAT, read_raw


def load_shard(
    path: Any, shard: dict, units: list[dict], verify: bool
) -> dict[str, np.ndarray]:
    """Read and check one shard's units; ``CorruptShardError`` says what is wrong."""
    # Entries written before the keys existed: Orbax items checksummed with CRC-32.
    algo = shard.get("checksum") or LEGACY_CHECKSUM
    raw = shard.get("format") == RAW_FORMAT
    if verify and shard.get("files"):
        verify_dir(path, shard["files"], algo)
    try:
        names = [u["name"] for u in units]
        if raw:
            arrays, _ = read_raw(path, names)
        else:  # an Orbax item (compressed, baselines, older runs)
            from research.checkpoint.shard import read_shard

            arrays, _ = read_shard(path, names)
    except Exception as e:  # noqa: BLE001 - any reader failure means "unusable"
        who = "the raw reader" if raw else "Orbax"
        raise CorruptShardError(
            path, f"{who} cannot read it: {type(e).__name__}: {str(e)[:300]}"
        ) from e
    for u in units:
        a = arrays.get(u["name"])
        if a is None:
            raise CorruptShardError(path, f"{u['name']} is missing")
        if list(a.shape) != list(u["shape"]) or np.dtype(a.dtype).name != u["dtype"]:
            raise CorruptShardError(
                path,
                f"{u['name']} is {a.dtype}{list(a.shape)}, expected "
                f"{u['dtype']}{u['shape']}",
            )
        crc = u.get("crc32")
        if verify and crc is not None and array_crc32(a, algo) != crc:
            raise CorruptShardError(path, f"{u['name']}: crc32 mismatch")
    return arrays


def unit_nbytes(u: dict) -> int:
    """Bytes of one unit as the manifest describes it."""
    return int(np.prod(u["shape"], dtype=np.int64)) * np.dtype(u["dtype"]).itemsize


def assemble(entry: dict, units: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Whole leaves from their units (row blocks concatenated in order)."""
    pieces: dict[str, list[tuple[int, np.ndarray]]] = {}
    for u in entry["units"]:
        if u["name"] in units:
            start = u["rows"][0] if u.get("rows") else 0
            pieces.setdefault(u["leaf"], []).append((start, units[u["name"]]))
    out = {}
    for leaf, parts in pieces.items():
        parts.sort(key=lambda p: p[0])
        out[leaf] = (
            parts[0][1]
            if len(parts) == 1
            else np.concatenate([p for _, p in parts], axis=0)
        )
    return out
