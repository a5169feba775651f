"""What every checkpointing saver shares: records, errors, tiers, restore.

A saver implements ``save(step, state, extra)`` (returns after the blocking
part), ``wait()`` (until every requested checkpoint is committed or failed;
raises the failure) and inherits ``restore(target)``, ``summary()`` and
``close()``. Construction and ``restore`` are collective over the world.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from research.checkpoint.integrity import remove_tree
from research.checkpoint.manifest import committed_steps, read_manifest, update_manifest
from research.checkpoint.restore import Restored, restore_latest
from research.checkpoint.tiers import (
    Tier,
    agree_private,
    clean_rank_dir,
    open_fast_tier,
)

if TYPE_CHECKING:
    from mpi4py import MPI

    from research.comm.world import World

#: ``hook(event, step)``: called where a saver reaches ``event`` for ``step``
#: (fault-injection tests). Every saver calls it with ``"written"`` on each
#: rank once its data for the step is on disk and before the step is committed
#: (``tests/test_saver_contract.py`` kills the job there).
FaultHook = Callable[[str, int], None]


class CheckpointError(RuntimeError):
    """A checkpoint failed (on any rank); raised on the next ``save`` or ``wait``."""


@dataclasses.dataclass
class SaveRecord:
    """What one checkpoint request cost this rank, and when it was committed.

    Attributes:
      step: the step checkpointed.
      blocking_s: time the training thread spent in ``save``.
      wait_s: part of ``blocking_s`` spent waiting for checkpoints in flight.
      inflight: checkpoints still in flight when this one was requested.
      skipped: the request was dropped (``on_busy="skip"``) or failed.
      committed_s: request to global commit in the first tier (None: never).
      persisted_s: request to global commit in the persistent tier.
      bytes_written: bytes this rank wrote for it, all tiers.
      shard_bytes: bytes of this rank's checkpoint in one tier.
      writer_cpu_s: CPU seconds the writer spent on it, from the writer's own
        clock (``cpuclock.py`` says which clock each saver reads).
    """

    step: int
    blocking_s: float = 0.0
    wait_s: float = 0.0
    inflight: int = 0
    skipped: bool = False
    committed_s: float | None = None
    persisted_s: float | None = None
    bytes_written: int = 0
    shard_bytes: int = 0
    writer_cpu_s: float = 0.0


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


class Checkpointer:
    """Base class: tiers, the commit communicator, records, restore and summary.

    Args:
      world: the job's world; construction is collective.
      directory: persistent tier root (shared file system on a cluster).
      fast_dir: fast tier root; ``"auto"`` picks a node-local folder (see
        ``tiers.default_fast_root``), None uses the persistent tier only. It
        is created 0700, and refused (``CheckpointError`` on every rank, one
        line naming it) when it belongs to another user or others may write
        in it (``research/privdir.py``).
      fsync: make the persistent tier's files and manifests durable.
      fault_hook: see :data:`FaultHook` (tests only).
    """

    name = "base"

    def __init__(
        self,
        world: World,
        directory: str | Path,
        *,
        fast_dir: str | Path | None = None,
        fsync: bool = True,
        fault_hook: FaultHook | None = None,
    ) -> None:
        self._hook: FaultHook = fault_hook or (lambda event, step: None)
        self._hooked = fault_hook is not None
        self.world = world
        self.rank, self.size = world.rank, world.size
        # A private communicator per instance: two checkpointers alive in one
        # process (tests, the experiment's savers) never match each other.
        self.comm: MPI.Intracomm = world.dup("checkpoint").Dup()
        # Absolute once, here: Orbax refuses relative paths, users type them.
        persistent = Tier("persistent", Path(directory).absolute())
        fast, problem = open_fast_tier(fast_dir, persistent.root)
        self.tiers = ([fast] if fast else []) + [persistent]
        # Agreed before anything reads or cleans a tier: a refused fast tier
        # on any node stops every rank, none is left in the next collective.
        self._check_private(problem)
        self.fsync = fsync
        self.records: dict[int, SaveRecord] = {}
        self.restore_s: float | None = None
        self._committed: dict[str, list[int]] = {}
        self._load_committed_and_clean()

    # -- bookkeeping shared with subclasses ---------------------------------------
    def _check_private(self, problem: str | None = None) -> None:
        """Every rank checks its private (fast) tier; all raise if any fails.

        Collective; called before every collective use of the tiers
        (construction, restore, forgetting).
        """
        problem = agree_private(self.comm, self.tiers, problem)
        if problem is not None:
            raise CheckpointError(f"node-local checkpoint folder refused: {problem}")

    def _load_committed_and_clean(self) -> None:
        """Read what each tier has committed (rank 0) and drop every rank's leftovers.

        Leftovers are Orbax temporary folders of a crashed write and shards of
        steps that never became globally committed.
        """
        steps = None
        if self.rank == 0:
            steps = {
                t.name: sorted(committed_steps(read_manifest(t.root)))
                for t in self.tiers
            }
        steps = self.comm.bcast(steps, root=0)
        self._committed = {k: list(v) for k, v in steps.items()}
        for t in self.tiers:
            clean_rank_dir(t, self.rank, set(self._committed[t.name]))

    def committed_steps(self, tier: str | None = None) -> list[int]:
        """Globally committed steps known to this process (ascending)."""
        if tier is not None:
            return list(self._committed.get(tier, []))
        return sorted(set().union(*self._committed.values()))

    # -- the interface ------------------------------------------------------------
    def save(self, step: int, state: Any, extra: dict | None = None) -> SaveRecord:
        raise NotImplementedError

    def wait(self) -> None:
        """Block until every requested checkpoint is committed or failed."""

    def close(self) -> None:
        """Finish outstanding work and release the communicator. Collective.

        Subclasses call it whenever every rank reached their ``close``, and
        raise their own failures after it: which failures a rank still holds
        differs between ranks, so raising first would leave the others in this
        barrier. Only where a rank cannot know that the others reach it (its
        background thread broke off mid-round) does a subclass skip it.
        """
        from mpi4py import MPI  # started by the world this saver was given

        if self.comm != MPI.COMM_NULL:
            # After this barrier every manifest update of this instance is on disk.
            self.comm.Barrier()
            self.comm.Free()

    def forget_all(self) -> list[int]:
        """Forget every committed step in every tier (a run that starts over).

        Collective. Returns the steps forgotten.
        """
        self.wait()
        self._check_private()
        steps = self.committed_steps()
        if steps:
            self._forget_after(-1)
        return steps

    def restore(self, target: Any, step: int | None = None) -> Restored | None:
        """The newest globally committed step (or ``step``) that verifies, in any tier.

        Collective: every rank returns the identical full state, shaped like
        ``target``. Steps newer than the one restored are forgotten (manifest
        entries and shards), so the resumed run writes them afresh.
        """
        self.wait()
        self._check_private()  # a tier is read only once it passed the check
        t0 = time.perf_counter()
        out = restore_latest(self.comm, self.tiers, target, step=step)
        self.restore_s = time.perf_counter() - t0
        if out is not None and step is None:
            self._forget_after(out.step)
        return out

    def _forget_after(self, step: int) -> None:
        for t in self.tiers:
            newer = [s for s in self._committed[t.name] if s > step]
            if not newer:
                continue
            if self.rank == 0:
                update_manifest(
                    t.root,
                    tier=t.name,
                    remove=newer,
                    fsync=self.fsync,
                    private=t.private,
                )
            self._committed[t.name] = [s for s in self._committed[t.name] if s <= step]
        self.comm.Barrier()
        for t in self.tiers:
            clean_rank_dir(t, self.rank, set(self._committed[t.name]))

    def _stale(self, tier: Tier, step: int, keep: int) -> list[int]:
        """The committed steps of ``tier`` that committing ``step`` pushes out.

        All but the newest ``keep``. Rank 0 removes them from the manifest in
        the same atomic write that adds ``step`` (one manifest update per commit,
        not two), then :meth:`_note_committed` deletes their shards. Every rank
        computes the same list from the same committed steps.
        """
        return sorted({*self._committed.get(tier.name, []), step})[:-keep]

    def _commit(self, tier: Tier, step: int, keep: int, entry: dict | None) -> None:
        """Commit ``step`` in ``tier``, keeping the newest ``keep`` steps.

        ``entry`` is the step's manifest entry on the rank that writes the
        manifest (None elsewhere): it goes in, and the steps it pushes out go
        out, in one atomic update; then this rank's shards of those go.
        """
        drop = self._stale(tier, step, keep)
        if entry is not None:
            self._update_manifest(tier, entry, drop)
        self._note_committed(tier, step, drop)

    def _update_manifest(self, tier: Tier, entry: dict, drop: list[int]) -> None:
        """Rank 0: ``entry`` into ``tier``'s manifest and ``drop`` out of it, in
        one atomic update (synced to disk on the persistent tier)."""
        update_manifest(
            tier.root,
            tier=tier.name,
            add=[entry],
            remove=drop,
            fsync=self.fsync and tier.name == "persistent",
            private=tier.private,
        )

    def _note_committed(self, tier: Tier, step: int, dropped: list[int]) -> None:
        """Record ``step`` as committed in ``tier``; delete this rank's shards of
        ``dropped``, which the manifest no longer lists (:meth:`_stale`).

        With the rank-0 and Orbax baselines other ranks may delete before rank
        0 has written the manifest, which is harmless: only steps older than the
        newest committed one go, and restore tries the newest first.
        """
        kept = {*self._committed.get(tier.name, []), step} - set(dropped)
        self._committed[tier.name] = sorted(kept)
        for s in dropped:
            self._remove_step(tier, s)

    def _remove_step(self, tier: Tier, step: int) -> None:
        """Delete this rank's shard of a dropped step (savers may recycle)."""
        remove_tree(tier.step_dir(self.rank, step))

    def summary(self) -> dict[str, Any]:
        """This rank's numbers: blocking, waits, commit latency, bytes, restore."""
        recs = sorted(self.records.values(), key=lambda r: r.step)
        done = [r for r in recs if not r.skipped]
        return {
            "saver": self.name,
            "saves": len(recs),
            "skipped": sum(r.skipped for r in recs),
            "stalled": sum(r.wait_s > 0 for r in recs),
            "median_blocking_s": _median([r.blocking_s for r in recs]),
            "max_blocking_s": max((r.blocking_s for r in recs), default=None),
            "median_wait_s": _median([r.wait_s for r in recs]),
            "median_committed_s": _median(
                [r.committed_s for r in done if r.committed_s is not None]
            ),
            "median_persisted_s": _median(
                [r.persisted_s for r in done if r.persisted_s is not None]
            ),
            "bytes_written": sum(r.bytes_written for r in recs),
            "bytes_per_checkpoint": _median([r.bytes_written for r in done]),
            "restore_s": self.restore_s,
            "committed_steps": self.committed_steps(),
            "records": [dataclasses.asdict(r) for r in recs],
        }
