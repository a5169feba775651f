"""DeepFreeze: asynchronous, fine-grain, rank-sharded, multi-level checkpoints.

``save(step, state)`` holds the training thread only for the snapshot of this
rank's shard (``snapshot.py``: zero-copy views on CPU, leaf by leaf), then
returns. A background thread per rank takes the checkpoints in request order:

1. copies the snapshot into a transfer file in this user's private folder
   (``privdir.base()``: ``/dev/shm/research-<user>``, 0700; the file 0600,
   never opened through a link) (one memcpy, no GIL) and releases it, so the
   next step can reuse the buffers;
2. has the writer (``writer.py``; by default a niced helper process per rank,
   so its work competes neither for the GIL nor for priority with the
   training) compute each unit's CRC-32C and write the buffer as one file into
   the first tier (``rawshard.py``: ``<step>.raw-tmp`` renamed to ``<step>``),
   recording the size and CRC-32C of every file written; with ``compress``
   the shard is an Orbax item instead (``shard.py``, zstd, CRC-32);
3. agrees with every rank (``agreement.allgather_json``, a private
   communicator, sleeping waits); when all shards are in, rank 0 adds the step
   to that tier's manifest, last, and every rank waits for it (one more small
   agreement) before it flushes, so a rank that dies while flushing step s
   cannot take step s's commit with it. The same manifest write drops the
   steps the new one pushes out (the newest ``keep_fast`` fast steps stay),
   whose shards every rank then deletes;
4. has the writer flush the shard to the persistent tier (``O_DIRECT`` from
   the fast tier's pages, else a kernel copy, into
   ``<step>.flush-tmp``, sizes checked, fsync, renamed), agrees again, rank 0
   updates that manifest (and drops all but the newest ``keep`` steps).

Checkpoints in flight: up to ``max_inflight`` requests may be outstanding (one
being written, the next queued with its snapshot held). A request beyond that
either waits in ``save`` until one finishes (``on_busy="wait"``, the default:
the wait is part of the blocking time, recorded as ``wait_s``, drawn on the
timeline and warned about once) or is dropped (``on_busy="skip"``: recorded as
skipped and reported by every rank's commit round, so no rank commits it). A
new checkpoint never replaces or interleaves with one being written.

Failures (a full disk, a permission error, a corrupt fast-tier file, a fast
tier or private folder that fails its check, made before every write and
flush) are reported in the commit round, so every rank raises
``CheckpointError`` on its next ``save`` or ``wait``.

The training thread's half is here; the background thread's (steps 1-4)
is ``background.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from research import privdir
from research.checkpoint.background import Background, _Job
from research.checkpoint.base import (
    Checkpointer,
    CheckpointError,
    FaultHook,
    SaveRecord,
)
from research.checkpoint.integrity import remove_tree
from research.checkpoint.leaves import Flattener
from research.checkpoint.manifest import (
    CheckpointWarning,
    manifest_path,
)
from research.checkpoint.partition import LOCAL, Unit, plan
from research.checkpoint.rawshard import SPARE
from research.checkpoint.registry import Range, SaverOptions, option, register_saver
from research.checkpoint.snapshot import Snapshotter
from research.checkpoint.writer import Writer, WriterProcess
from research.trace import get_tracer

if TYPE_CHECKING:
    from research.comm.world import World

#: Transfer files: ``xfer-<pid>-<id>-r<rank>`` in ``privdir.base()``; before
#: that, ``research-xfer-...`` right in ``/dev/shm`` or ``$TMPDIR`` (still swept).
_XFER, _LEGACY_XFER = "xfer-", "research-xfer-"


def _legacy_transfer_dirs() -> list[Path]:
    return [d for d in (privdir.SHM, Path(tempfile.gettempdir())) if d.is_dir()]


def remove_stale_transfer_files() -> list[Path]:
    """Remove this user's transfer files of ranks that died (a killed rank
    cannot); other users' files are never touched. Returns those removed."""
    removed = []
    places = [(d, _XFER) for d in privdir.existing_bases()]
    places += [(d, _LEGACY_XFER) for d in _legacy_transfer_dirs()]
    for folder, prefix in places:
        for old in folder.glob(f"{prefix}*"):
            pid = old.name[len(prefix) :].split("-")[0]
            if pid.isdigit() and not _alive(int(pid)) and privdir.owned(old):
                old.unlink(missing_ok=True)
                removed.append(old)
    return removed


def _transfer_path(rank: int, key: object) -> Path:
    """Where snapshots go for the writer: this user's private folder (memory,
    ``/dev/shm``, where there is one), created and checked now."""
    folder = privdir.base()
    remove_stale_transfer_files()  # whoever comes next cleans up after the killed
    return folder / f"{_XFER}{os.getpid()}-{id(key):x}-r{rank}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


@dataclasses.dataclass(frozen=True)
class DeepFreezeOptions(SaverOptions):
    """DeepFreeze's options (:class:`DeepFreeze`'s arguments of the same name)."""

    fast_dir: str | Path | None = "auto"
    keep: int = option(3, Range(ge=1))
    keep_fast: int = option(2, Range(ge=1))
    max_inflight: int = option(2, Range(ge=1))
    on_busy: Literal["wait", "skip"] = "wait"
    snapshot: Literal["auto", "view", "host", "device"] = "auto"
    compress: bool = False
    fsync: bool = True
    rank_local: tuple[str, ...] = ()
    writer: Literal["process", "thread"] = "process"
    nice: int = option(10, Range(ge=-20, le=19))
    idle: bool = False
    verify_flush: bool = False
    keep_fast_tier: bool = False


@register_saver("deepfreeze", DeepFreezeOptions)
class DeepFreeze(Background, Checkpointer):
    """The DeepFreeze checkpointer (see the module docstring).

    Args:
      world: the job's world; construction, ``restore`` and ``close`` are collective.
      directory: persistent tier root.
      fast_dir: fast tier root (``"auto"``: ``ckpt-<hash>`` in this user's
        private folder, ``/dev/shm/research-<user>``; None: none). Created
        0700; refused when another user owns it or others may write in it.
      keep: committed steps kept in the persistent tier.
      keep_fast: committed steps kept in the fast tier.
      max_inflight: checkpoints that may be outstanding at once (>= 1).
      on_busy: ``"wait"`` or ``"skip"`` when ``max_inflight`` are outstanding.
      snapshot: ``"auto"``, ``"view"``, ``"host"`` or ``"device"`` (``snapshot.py``).
      compress: zstd-compress shard chunks.
      fsync: make persistent files and manifests durable.
      rank_local: name prefixes of leaves that differ between ranks (e.g.
        ``"batch_stats"``): every rank writes its own copy and gets it back on
        restore (with the same world size; otherwise rank 0's copy).
      writer: ``"process"`` (a niced helper process per rank writes) or
        ``"thread"`` (the background thread writes, in this process).
      nice: niceness of the helper process.
      idle: run the helper process under ``SCHED_IDLE`` (Linux): it then
        takes only cores nothing else wants (``writer.py``), and starves on a
        machine saturated by other jobs.
      verify_flush: check each fast-tier file's CRC-32 before flushing it (one
        more read of the shard; restore verifies the flushed files anyway).
      keep_fast_tier: keep the fast tier after a normal ``close`` (e.g. for a
        next job on the same nodes); by default it is removed, as every
        committed step is in the persistent tier and ``/dev/shm`` is memory
        (of a folder given as ``fast_dir``, only what DeepFreeze put there:
        the folder itself goes when nothing else is in it).
      fault_hook: ``hook(event, step)`` called by the background thread at
        ``write-begin``, ``write-started``, ``written``, ``committed``,
        ``flush-file`` and ``flushed`` (fault-injection tests).
    """

    def __init__(
        self,
        world: World,
        directory: str | Path,
        *,
        fast_dir: str | Path | None = "auto",
        keep: int = 3,
        keep_fast: int = 2,
        max_inflight: int = 2,
        on_busy: Literal["wait", "skip"] = "wait",
        snapshot: Literal["auto", "view", "host", "device"] = "auto",
        compress: bool = False,
        fsync: bool = True,
        rank_local: tuple[str, ...] = (),
        writer: Literal["process", "thread"] = "process",
        nice: int = 10,
        idle: bool = False,
        verify_flush: bool = False,
        keep_fast_tier: bool = False,
        fault_hook: FaultHook | None = None,
    ) -> None:
        if on_busy not in ("wait", "skip"):
            raise ValueError(f"on_busy must be 'wait' or 'skip', got {on_busy!r}")
        if max_inflight < 1 or keep < 1 or keep_fast < 1:
            raise ValueError("max_inflight, keep and keep_fast must be >= 1")
        if writer not in ("process", "thread"):
            raise ValueError(f"writer must be 'process' or 'thread', got {writer!r}")
        super().__init__(
            world, directory, fast_dir=fast_dir, fsync=fsync, fault_hook=fault_hook
        )
        self._fast_auto = fast_dir == "auto"
        self.keep, self.keep_fast = keep, keep_fast
        self.keep_fast_tier = keep_fast_tier
        self.max_inflight, self.on_busy = max_inflight, on_busy
        self.compress = compress
        self.rank_local = tuple(rank_local)
        self.writer = writer
        self.verify_flush = verify_flush
        # Started now, so its start-up overlaps the training's (numpy only: jax
        # and Orbax load with the first compressed shard).
        self._proc = WriterProcess.shared(nice, idle) if writer == "process" else None
        self._local = Writer() if writer == "thread" else None
        try:
            self._xfer = _transfer_path(self.rank, self)
            problem = None
        except OSError as e:  # no private folder can be had on this node
            problem = str(e)
        self._check_private(problem)  # collective: all ranks raise, or none
        self._buf: np.memmap | None = None
        self._snap = Snapshotter(snapshot)
        self._flat = Flattener()
        self._units: list[Unit] = []
        self._mine: list[Unit] = []
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._cv = threading.Condition()
        self._inflight = 0
        self._errors: list[CheckpointError] = []
        self._broken: BaseException | None = None
        self._warned_wait = False
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, daemon=True, name=f"deepfreeze-r{self.rank}"
        )
        self._thread.start()

    @property
    def snapshot_mode(self) -> str:
        return self._snap.mode

    # -- training thread ------------------------------------------------------------
    def save(self, step: int, state: Any, extra: dict | None = None) -> SaveRecord:
        """Snapshot this rank's shard and hand it to the background; see class doc."""
        t0 = time.perf_counter()
        tr = get_tracer()
        rec = SaveRecord(step=int(step))
        with tr.span("checkpoint", "checkpoint", step=step, saver=self.name) as span:
            skip = self._admit(rec, step)
            job = _Job(
                step=int(step),
                record=rec,
                t_request=t0,
                extra=dict(extra or {}),
                skipped=skip,
            )
            if not skip:
                leaves, changed = self._flat.flatten(state)
                if changed or not self._units:
                    self._plan(self._flat)
                with tr.span(
                    "snapshot",
                    "checkpoint",
                    step=step,
                    units=len(self._mine),
                    mode=self._snap.mode,
                ):
                    job.taken = self._snap.take(
                        [leaves[self._index[u.leaf]] for u in self._mine],
                        [u.rows for u in self._mine],
                    )
                job.names = [u.name for u in self._mine]
                job.specs = self._specs
                job.units = self._unit_dicts
            self.records[rec.step] = rec
            self._queue.put(job)
            rec.blocking_s = time.perf_counter() - t0
            span.set(wait_s=rec.wait_s, skipped=skip, inflight=rec.inflight)
        # An earlier failure surfaces only after this request is queued: every
        # rank then queues the same number of jobs whichever save call the error
        # reaches first on each rank, so the background commit rounds (one
        # collective per job) stay matched and a caller that goes on can't hang.
        self._raise_errors()
        return rec

    def _plan(self, flat: Flattener) -> None:
        """Partition a new state structure into units and keep this rank's."""
        self._units = plan(flat.specs, self.size, self.rank_local)
        self._mine = [u for u in self._units if u.owner in (self.rank, LOCAL)]
        self._index = {n: i for i, n in enumerate(flat.names)}
        self._specs = [s.as_dict() for s in flat.specs]
        self._unit_dicts = [u.as_dict() for u in self._units]

    def _admit(self, rec: SaveRecord, step: int) -> bool:
        """Reserve an in-flight slot; True when the request is to be skipped."""
        with self._cv:
            rec.inflight = self._inflight
            if self._inflight >= self.max_inflight:
                if self.on_busy == "skip":
                    rec.skipped = True
                else:
                    t = time.perf_counter()
                    with get_tracer().span(
                        "wait for checkpoints in flight",
                        "checkpoint",
                        step=step,
                        inflight=self._inflight,
                    ):
                        while self._inflight >= self.max_inflight and not self._broken:
                            self._cv.wait(0.5)
                    rec.wait_s = time.perf_counter() - t
                    if not self._warned_wait:
                        self._warned_wait = True
                        warnings.warn(
                            f"r{self.rank} | checkpoint at step {step} waited "
                            f"{rec.wait_s:.3f} s for {rec.inflight} checkpoint(s) "
                            "still being written; lengthen the interval or raise "
                            "max_inflight",
                            CheckpointWarning,
                            stacklevel=3,
                        )
            if self._broken is not None:
                raise CheckpointError("the checkpoint thread stopped") from self._broken
            # A skipped request still takes a slot: its commit round must run.
            self._inflight += 1
            return rec.skipped

    def _raise_errors(self) -> None:
        with self._cv:
            if self._errors:
                err = self._errors.pop(0)
                raise err
            if self._broken is not None:
                raise CheckpointError("the checkpoint thread stopped") from self._broken

    def _drain(self) -> None:
        """Block until no checkpoint is in flight (or the thread broke off)."""
        with get_tracer().span("wait for checkpoints", "checkpoint"), self._cv:
            while self._inflight > 0 and self._broken is None:
                self._cv.wait(0.5)

    def wait(self) -> None:
        """Block until every requested checkpoint is committed or failed; raise."""
        self._drain()
        self._raise_errors()

    def close(self) -> None:
        """Finish outstanding checkpoints, stop, then raise failures. Collective.

        Every rank runs the same collective part whatever failed: a failure
        travels in the commit round, so once nothing is in flight every rank
        knows the same committed steps. Which failures a rank has already
        raised depends on timing (one per ``save``/``wait`` call), so those
        not yet raised here are raised after the collective part, never
        instead of it. Only a background thread that broke off mid-round
        makes ``close`` raise at once with nothing collective run: the other
        ranks may be blocked in a round it never joins.

        The fast tier is removed (it is memory when it is ``/dev/shm``) unless
        it is the only tier, ``keep_fast_tier`` is set, or it holds committed
        steps the persistent tier lacks (a flush failed): then it stays, so a
        restart finds them.
        """
        if self._closed:
            return
        self._closed = True
        self._drain()
        self._queue.put(None)
        if self._broken is not None:
            raise CheckpointError("the checkpoint thread stopped") from self._broken
        self._thread.join()
        for tier in self.tiers:  # recycled files are no checkpoint: never left
            remove_tree(tier.rank_dir(self.rank) / SPARE)
        unflushed = self._only_in_fast()
        if unflushed and self.rank == 0:
            warnings.warn(
                f"the fast tier ({self.tiers[0].root}) is kept: steps {unflushed} "
                "are committed there but not to the persistent tier (their flush "
                "failed); a restart restores them from it",
                CheckpointWarning,
                stacklevel=2,
            )
        fast = (
            self.tiers[0]
            if len(self.tiers) > 1 and not self.keep_fast_tier and not unflushed
            else None
        )
        if fast is not None:
            remove_tree(fast.rank_dir(self.rank))
        super().close()  # its barrier: every rank's shards are gone
        if fast is not None and self.rank == 0:
            if self._fast_auto:  # a folder of ours, named by us: all of it
                remove_tree(fast.root)
            else:  # the user's folder may hold more than this: only ours goes
                manifest_path(fast.root).unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    fast.root.rmdir()  # when nothing else is in it
        # Again at the end: ranks killed just before this run started may
        # have been alive (dying) when it swept at its start.
        remove_stale_transfer_files()
        self._raise_errors()  # failures not yet raised on this rank

    def _only_in_fast(self) -> list[int]:
        """Committed fast-tier steps newer than the newest persisted one: their
        flush failed (the same list on every rank: both come from the commit
        rounds). Older fast steps the persistent tier dropped do not count;
        with one tier, both are the same list and none is."""
        persisted = self.committed_steps(self.tiers[-1].name)
        newest = max(persisted, default=-1)
        return [s for s in self.committed_steps(self.tiers[0].name) if s > newest]
