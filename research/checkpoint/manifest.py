"""The manifest: which global steps are committed in a tier, and what they hold.

``<tier root>/manifest.json`` is written by rank 0 only, and only after every
rank reported its shard of a step committed, so a step listed there is
globally committed; it is the last thing written for a step. The write is
atomic (temporary file, fsync, rename), so a reader sees the old or the new
manifest, never half of one. Layout::

    {"format": "research.checkpoint/1", "tier": "persistent",
     "steps": {"30": {"step": 30, "time": ..., "world_size": 4,
                      "saver": "deepfreeze",
                      "leaves": [{"name": "params/Dense_0/kernel",
                                  "shape": [4096, 1024], "dtype": "float32",
                                  "kind": "array"}, ...],
                      "units": [{"name": "params/Dense_0/kernel/rows_0_512",
                                 "leaf": "params/Dense_0/kernel", "rows": [0, 512],
                                 "shape": [512, 1024], "dtype": "float32",
                                 "shard": 1, "crc32": 123}, ...],
                      "shards": [{"shard": 1, "path": "rank1/30", "bytes": ..,
                                  "files": {"state/...": [size, crc32]},
                                  "local_crc32": {...}, "extra": {...}}, ...]}}}

A unit is what one rank wrote: a whole leaf, or a block of rows of a large one
(``partition.py``); ``shard`` is its writer (-1: every rank wrote its own copy,
with the CRCs under the shard's ``local_crc32``). ``path`` is relative to the
tier root, and each shard directory is a standard Orbax checkpoint.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from pathlib import Path
from typing import Any

from research import privdir

FORMAT = "research.checkpoint/1"
NAME = "manifest.json"

# One process writes a tier's manifest from more than one thread (commit and
# retention); read-modify-write must not interleave.
_lock = threading.Lock()


class CheckpointWarning(UserWarning):
    """A checkpoint was unusable (restore fell back) or a manifest unreadable."""


def manifest_path(root: str | os.PathLike) -> Path:
    return Path(root) / NAME


def read_manifest(root: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a tier; an empty one when there is none (or it is unreadable)."""
    path = manifest_path(root)
    empty: dict[str, Any] = {"format": FORMAT, "steps": {}}
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return empty
    except (OSError, json.JSONDecodeError) as e:
        warnings.warn(
            f"checkpoint manifest {path} is unreadable ({e}); ignoring it",
            CheckpointWarning,
            stacklevel=2,
        )
        return empty
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        warnings.warn(
            f"checkpoint manifest {path} has an unknown format; ignoring it",
            CheckpointWarning,
            stacklevel=2,
        )
        return empty
    return data


def write_manifest(
    root: str | os.PathLike,
    manifest: dict[str, Any],
    fsync: bool = True,
    private: bool = False,
) -> None:
    """Replace the manifest atomically (tmp file, fsync, rename, fsync dir).

    ``private`` (a node-local tier): the file is created 0600 and never
    through a link (``privdir.create_file``).
    """
    path = manifest_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{NAME}.tmp{os.getpid()}")
    # dumps, not dump: json.dump streams through the pure-Python encoder. A
    # 7 KB manifest's update took 0.85 ms of CPU with it, 0.45 ms with dumps.
    text = json.dumps(manifest, separators=(",", ":"))
    if private:
        tmp.unlink(missing_ok=True)  # a crashed write's, with a reused pid
        opened = os.fdopen(privdir.create_file(tmp), "w")
    else:
        opened = open(tmp, "w")  # noqa: SIM115 - closed by the with below
    with opened as f:
        f.write(text)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if fsync:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def update_manifest(
    root: str | os.PathLike,
    *,
    tier: str,
    add: list[dict[str, Any]] = (),
    remove: list[int] = (),
    fsync: bool = True,
    private: bool = False,
) -> dict[str, Any]:
    """Add step entries and drop steps, then write; returns the new manifest."""
    with _lock:
        m = read_manifest(root)
        m["tier"] = tier
        for step in remove:
            m["steps"].pop(str(step), None)
        for entry in add:
            m["steps"][str(entry["step"])] = entry
        write_manifest(root, m, fsync=fsync, private=private)
        return m


def committed_steps(manifest: dict[str, Any]) -> list[int]:
    """Globally committed steps, newest first."""
    return sorted((int(s) for s in manifest.get("steps", {})), reverse=True)


def make_entry(
    step: int,
    saver: str,
    world_size: int,
    specs: list[dict],
    units: list[dict],
    crcs: dict[str, int | None],
    shards: list[dict[str, Any]],
    time_s: float,
) -> dict[str, Any]:
    """One step's manifest entry: leaves, units (who wrote what), shard reports."""
    return {
        "step": int(step),
        "time": time_s,
        "world_size": world_size,
        "saver": saver,
        "leaves": list(specs),
        "units": [{**u, "crc32": crcs.get(u["name"])} for u in units],
        "shards": sorted(shards, key=lambda s: s["shard"]),
    }
