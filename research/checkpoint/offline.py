"""A checkpoint as a pytree in one plain process: no mpiexec, no template needed.

    from research.checkpoint import load
    state = load("runs/train-<time>")             # newest committed step
    state = load("runs/train-<time>/checkpoints", step=30)
    state = load(run_dir, target=fresh_state)     # typed leaves: keys, devices

What a notebook or an export needs after training: the state that
:meth:`Checkpointer.restore` would give a job, without starting MPI (nothing
here imports mpi4py). It reads the persistent tier's ``manifest.json``, takes
the newest committed step (or ``step``) whose shards verify (file sizes and
CRC-32s, every unit's CRC-32), falling back to the previous step with a
:class:`CheckpointWarning` naming what was wrong, reassembles row blocks into
whole leaves, and returns

* without ``target``: nested dicts of numpy arrays keyed by the state's path
  names (``state["params"]["Dense_0"]["kernel"]``; tuple positions become
  ``"0"``, ``"1"``, ...; a typed PRNG key comes back as its ``uint32`` key
  data). Rank-local leaves (BatchNorm statistics, a strategy's per-rank state)
  are rank 0's copy;
* with ``target``: a state shaped like ``target`` (as ``restore`` builds it).

``python -m scripts.export_checkpoint`` writes the same tree as a standard
Orbax checkpoint.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from research.checkpoint.integrity import CorruptShardError
from research.checkpoint.manifest import (
    NAME as MANIFEST,
)
from research.checkpoint.manifest import (
    CheckpointWarning,
    committed_steps,
    read_manifest,
)
from research.checkpoint.partition import LOCAL
from research.checkpoint.read import assemble, load_shard


class NoCheckpointError(FileNotFoundError):
    """No committed step that can be read at the given place; the message says why."""


def checkpoint_dir(path: str | Path) -> Path:
    """The tier folder holding ``manifest.json``: ``path`` itself, or a run
    folder's ``checkpoints/``.

    Raises:
      NoCheckpointError: neither holds a manifest.
    """
    path = Path(path)
    for cand in (path, path / "checkpoints"):
        if (cand / MANIFEST).is_file():
            return cand
    raise NoCheckpointError(
        f"{path}: no {MANIFEST} here or in {path / 'checkpoints'} (pass a run "
        "folder written with --checkpoint, or its checkpoints/ folder)"
    )


def steps(path: str | Path) -> list[int]:
    """The committed steps of the checkpoint at ``path``, oldest first."""
    return sorted(committed_steps(read_manifest(checkpoint_dir(path))))


def _read_step(root: Path, entry: dict, verify: bool) -> dict[str, np.ndarray]:
    units: dict[str, np.ndarray] = {}
    for i, shard in enumerate(entry["shards"]):
        owned = [u for u in entry["units"] if u["shard"] == shard["shard"]]
        wanted = list(owned)
        if i == 0:  # rank-local leaves: rank 0's copy, with its own CRC-32s
            crcs = shard.get("local_crc32") or {}
            wanted += [
                {**u, "crc32": crcs.get(u["name"])}
                for u in entry["units"]
                if u["shard"] == LOCAL
            ]
        got = load_shard(root / shard["path"], shard, wanted, verify)
        units.update({u["name"]: got[u["name"]] for u in wanted})
    return assemble(entry, units)


def load(
    path: str | Path,
    step: int | None = None,
    *,
    target: Any = None,
    verify: bool = True,
) -> Any:
    """The newest committed state at ``path`` (or ``step``), in this process.

    The same as ``load_step(...)[1]``; see :func:`load_step`.
    """
    return load_step(path, step, target=target, verify=verify)[1]


def load_step(
    path: str | Path,
    step: int | None = None,
    *,
    target: Any = None,
    verify: bool = True,
) -> tuple[int, Any]:
    """``(step, state)``: the newest committed step at ``path`` that verifies.

    Args:
      path: a run folder, or the checkpoint folder holding ``manifest.json``.
      step: this committed step only (None: the newest one that verifies).
      target: a state of the checkpoint's structure (e.g. freshly initialised);
        the result is shaped like it. None: nested dicts of numpy arrays.
      verify: check the recorded CRC-32s (on by default).

    Returns:
      The step read and its state (see the module docstring for its form).

    Raises:
      NoCheckpointError: no manifest, no committed step, ``step`` not
        committed, or every committed step is damaged (each problem named).
      ValueError: ``target``'s leaves do not match the checkpoint's.
    """
    root = checkpoint_dir(path)
    manifest = read_manifest(root)
    entries = {int(s): e for s, e in manifest.get("steps", {}).items()}
    if step is not None:
        if step not in entries:
            have = sorted(entries) or "none"
            raise NoCheckpointError(f"{root}: step {step} is not committed ({have})")
        entries = {step: entries[step]}
    problems = []
    for s in sorted(entries, reverse=True):
        entry = entries[s]
        try:
            leaves = _read_step(root, entry, verify)
        except CorruptShardError as e:
            problems.append(f"step {s}: {e}")
            warnings.warn(
                f"checkpoint step {s} is unusable ({e}); trying an older one",
                CheckpointWarning,
                stacklevel=2,
            )
            continue
        if target is None:
            from research.checkpoint.leaves import nest

            return s, nest({name: leaves[name] for name in sorted(leaves)})
        from research.checkpoint.leaves import Flattener, check_compatible, rebuild

        flat = Flattener()
        flat.flatten(target)
        check_compatible(flat.specs, entry["leaves"])
        return s, rebuild(target, leaves)
    if not problems:
        raise NoCheckpointError(f"{root}: no committed step yet")
    raise NoCheckpointError(
        f"{root}: no committed step can be read: " + "; ".join(problems)
    )
