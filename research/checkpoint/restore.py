"""Restore: the newest globally committed step that verifies, from any tier.

Collective. Rank 0 reads the manifests of every tier and broadcasts the
candidate steps, newest first. For a candidate, shard ``i`` is read by rank
``i % size`` (its writer when the world size is unchanged, so a node reads
its own fast tier), from the fast tier if there and sound, else from the
persistent tier. The fast tier is node-local: a shard written on another node
(the ranks now sit on other nodes, or its node was lost) is not there, and the
persistent tier serves it. A shard is sound when every file has its recorded size and
CRC-32, Orbax reads it, and every leaf has its recorded CRC-32. The ranks then
agree (allgather): if any shard of the step failed everywhere, all ranks move
on to the previous committed step, each problem reported with the file it
names. Otherwise each reader broadcasts its shards' leaves as one buffer, so
every rank ends with the complete, identical state: each byte is read from
storage once, and fast-tier shards on other nodes are reachable. Rank-local
leaves (``partition.LOCAL``: BatchNorm statistics, which differ between
data-parallel ranks) come back to the rank that wrote them, so a resumed run
continues exactly; with another world size every rank gets rank 0's copy.

The broadcasts are blocking MPI calls (they spin): restore runs before
training, when there is nothing to overlap.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from research.checkpoint.integrity import CorruptShardError
from research.checkpoint.leaves import Flattener, check_compatible, rebuild
from research.checkpoint.manifest import CheckpointWarning, read_manifest
from research.checkpoint.partition import LOCAL
from research.checkpoint.read import assemble as _assemble
from research.checkpoint.read import load_shard as _load
from research.checkpoint.read import unit_nbytes as _nbytes
from research.checkpoint.tiers import Tier

if TYPE_CHECKING:
    from mpi4py import MPI


@dataclasses.dataclass
class Restored:
    """A restored checkpoint.

    Attributes:
      step: the global step restored.
      state: the full state, shaped like the target (identical on every rank).
      extras: each shard's ``extra`` (by writer rank); see :meth:`extra_for`.
      tiers: the tier each shard read by this rank came from.
      seconds: wall time of the restore on this rank.
      problems: why newer steps (or other tiers) were passed over.
    """

    step: int
    state: Any
    extras: list[dict]
    tiers: list[str]
    seconds: float
    problems: list[str]

    def extra_for(self, rank: int) -> dict:
        """The ``extra`` saved by ``rank`` (rank 0's when that rank wrote none)."""
        if 0 <= rank < len(self.extras) and self.extras[rank]:
            return self.extras[rank]
        return self.extras[0] if self.extras else {}


def _candidates(comm: MPI.Intracomm, tiers: list[Tier]) -> list[tuple[int, dict]]:
    """``[(step, {tier name: entry})]``, newest first, identical on every rank."""
    cands: dict[int, dict[str, dict]] = {}
    if comm.Get_rank() == 0:
        for tier in tiers:
            for s, entry in read_manifest(tier.root).get("steps", {}).items():
                cands.setdefault(int(s), {})[tier.name] = entry
    return comm.bcast(sorted(cands.items(), reverse=True), root=0)


def _exchange(
    comm: MPI.Intracomm, entry: dict, loaded: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Broadcast each shard's units from its reader; every rank gets all units."""
    size = comm.Get_size()
    out: dict[str, np.ndarray] = {}
    for i, shard in enumerate(entry["shards"]):
        units = [u for u in entry["units"] if u["shard"] == shard["shard"]]
        root = i % size
        if comm.Get_rank() == root:
            parts = [
                np.ascontiguousarray(loaded[u["name"]]).reshape(-1).view(np.uint8)
                for u in units
            ]
            buf = np.concatenate(parts) if parts else np.empty(0, np.uint8)
        else:
            buf = np.empty(sum(_nbytes(u) for u in units), np.uint8)
        if size > 1 and buf.size:
            comm.Bcast(buf, root=root)
        off = 0
        for u in units:
            n = _nbytes(u)
            out[u["name"]] = (
                buf[off : off + n].view(np.dtype(u["dtype"])).reshape(u["shape"])
            )
            off += n
    return out


def _read_mine(
    s: int,
    entry: dict,
    by_tier: dict,
    tiers: list[Tier],
    rank: int,
    size: int,
    verify: bool,
):
    """Read the shards this rank is responsible for, each from the first sound tier."""
    loaded: dict[str, np.ndarray] = {}
    own_local: dict[int, dict[str, np.ndarray]] = {}  # shard -> rank-local units
    used: list[str] = []
    ok, problems = True, []
    for i, shard in enumerate(entry["shards"]):
        if i % size != rank:
            continue
        owned = [u for u in entry["units"] if u["shard"] == shard["shard"]]
        for tier in tiers:
            if tier.name not in by_tier:
                continue
            tshard = by_tier[tier.name]["shards"][i]
            if tier.private and not (tier.root / tshard["path"]).exists():
                # Node-local: the shard was written on another node (another
                # layout of ranks on nodes, or a node since lost), not broken.
                continue
            crcs = tshard.get("local_crc32") or {}
            local = [
                {**u, "crc32": crcs.get(u["name"])}
                for u in entry["units"]
                if u["shard"] == LOCAL
            ]
            try:
                got = _load(tier.root / tshard["path"], tshard, owned + local, verify)
            except CorruptShardError as e:
                msg = f"step {s}, {tier.name} tier: {e}"
                problems.append(msg)
                warnings.warn(
                    f"r{rank} | checkpoint unusable: {msg}",
                    CheckpointWarning,
                    stacklevel=3,
                )
                continue
            loaded.update({u["name"]: got[u["name"]] for u in owned})
            own_local[i] = {u["name"]: got[u["name"]] for u in local}
            used.append(tier.name)
            break
        else:
            ok = False
    return loaded, own_local, used, ok, problems


def restore_latest(
    comm: MPI.Intracomm,
    tiers: list[Tier],
    target: Any,
    *,
    step: int | None = None,
    verify: bool = True,
) -> Restored | None:
    """Restore the newest usable committed step (or exactly ``step``); collective.

    Args:
      comm: communicator of the job (every rank calls).
      tiers: tiers to look in, fastest first.
      target: a state of the right structure (the freshly initialised one);
        leaves are placed like its leaves (device, sharding, key type).
      step: restore only this step (None: newest usable).
      verify: check file and unit CRC-32s (on by default).

    Returns:
      The restored checkpoint, or None when no committed step is usable.

    Raises:
      ValueError: the checkpoint's leaves do not match ``target``'s.
    """
    t0 = time.perf_counter()
    rank, size = comm.Get_rank(), comm.Get_size()
    flat = Flattener()
    flat.flatten(target)
    problems: list[str] = []
    for s, by_tier in _candidates(comm, tiers):
        if step is not None and s != step:
            continue
        entry = next(iter(by_tier.values()))
        check_compatible(flat.specs, entry["leaves"])
        loaded, own_local, used, ok, mine = _read_mine(
            s, entry, by_tier, tiers, rank, size, verify
        )
        reports = comm.allgather((ok, mine))
        for _, probs in reports:
            problems.extend(probs)
        if not all(ok for ok, _ in reports):
            if rank == 0:
                warnings.warn(
                    f"r0 | checkpoint step {s} is unusable on some rank; "
                    "falling back to the previous committed step",
                    CheckpointWarning,
                    stacklevel=2,
                )
            continue
        units = _exchange(comm, entry, loaded)
        if len(entry["shards"]) == size:
            units.update(own_local.get(rank, {}))  # this rank wrote shard ``rank``
        else:
            units.update(comm.bcast(own_local.get(0), root=0) or {})
        state = rebuild(target, _assemble(entry, units))
        return Restored(
            step=s,
            state=state,
            extras=[sh.get("extra") or {} for sh in entry["shards"]],
            tiers=used,
            seconds=time.perf_counter() - t0,
            problems=problems,
        )
    return None
