"""The baselines DeepFreeze is measured against, in the same format.

* ``rank0-blocking``: rank 0 writes the whole state and training waits for it (the
  Horovod/Keras norm: ``if hvd.rank() == 0: model.save(...)``); the other ranks
  wait for rank 0 in the next step's allreduce.
* ``orbax-blocking``: every rank writes its size-balanced shard with Orbax's
  blocking ``Checkpointer``, then the ranks agree before training resumes.
* ``orbax-async-rank0``: rank 0 writes the whole state with Orbax's
  ``AsyncCheckpointer``; the blocking part is Orbax's device-to-host copy of
  the state, and a save waits behind the previous one (Orbax's own policy).

All three write manifests and shards as DeepFreeze does, so one ``restore``
serves every saver, but they record no checksums (as their models do not),
so restore cannot detect a corrupt file of theirs beyond what Orbax notices.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from research.checkpoint.agreement import allgather_json
from research.checkpoint.base import (
    Checkpointer,
    CheckpointError,
    FaultHook,
    SaveRecord,
)
from research.checkpoint.cpuclock import OffThread, process_cpu
from research.checkpoint.integrity import remove_tree
from research.checkpoint.leaves import Flattener, is_key
from research.checkpoint.manifest import make_entry
from research.checkpoint.partition import Unit, plan
from research.checkpoint.registry import Range, SaverOptions, option, register_saver
from research.checkpoint.shard import new_checkpointer, shard_args
from research.checkpoint.snapshot import cut
from research.checkpoint.tiers import Tier, dir_bytes
from research.trace import get_tracer

if TYPE_CHECKING:
    from research.comm.world import World


def _host(x: Any) -> Any:
    """A leaf as Orbax takes it: key data for typed keys, the array otherwise."""
    import jax

    return jax.random.key_data(x) if is_key(x) else x


@dataclasses.dataclass(frozen=True)
class BaselineOptions(SaverOptions):
    """A baseline's options: ``keep`` newest steps, ``compress`` (zstd),
    ``fsync`` (durable files)."""

    keep: int = option(3, Range(ge=1))
    compress: bool = False
    fsync: bool = True


@dataclasses.dataclass(frozen=True)
class Rank0BlockingOptions(BaselineOptions):
    """``rank0-blocking``'s options."""


@dataclasses.dataclass(frozen=True)
class OrbaxBlockingOptions(BaselineOptions):
    """``orbax-blocking``'s options (Orbax writes in the rank's process)."""

    beside_xla_runtime: ClassVar[bool] = False


@dataclasses.dataclass(frozen=True)
class OrbaxAsyncRank0Options(BaselineOptions):
    """``orbax-async-rank0``'s options (Orbax writes in the rank's process)."""

    beside_xla_runtime: ClassVar[bool] = False


class _Base(Checkpointer):
    """Persistent tier only; ``keep`` newest steps."""

    def __init__(
        self,
        world: World,
        directory: str | Path,
        *,
        keep: int = 3,
        compress: bool = False,
        fsync: bool = True,
        fault_hook: FaultHook | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        super().__init__(
            world, directory, fast_dir=None, fsync=fsync, fault_hook=fault_hook
        )
        self.keep, self.compress = keep, compress
        self._flat = Flattener()
        self.tier = self.tiers[0]

    def _entry(self, step: int, units: list[Unit], shards: list[dict]) -> dict:
        specs = [s.as_dict() for s in self._flat.specs]
        return make_entry(
            step,
            self.name,
            self.size,
            specs,
            [u.as_dict() for u in units],
            {},
            shards,
            time.time(),
        )

    def _shard(self, step: int, extra: dict | None) -> dict:
        path = self.tier.step_dir(self.rank, step)
        return {
            "shard": self.rank,
            "rank": self.rank,
            "path": Tier.rel(self.rank, step),
            "bytes": dir_bytes(path),
            "files": None,
            "extra": dict(extra or {}),
        }

    def _meta(self, step: int, extra: dict | None) -> dict:
        return {
            "step": step,
            "rank": self.rank,
            "world_size": self.size,
            "extra": dict(extra or {}),
        }


@register_saver("rank0-blocking", Rank0BlockingOptions)
class Rank0Blocking(_Base):
    """Rank 0 saves the whole state synchronously; the others do nothing."""

    _ckptr = None

    def save(self, step: int, state: Any, extra: dict | None = None) -> SaveRecord:
        import jax

        t0 = time.perf_counter()
        rec = SaveRecord(step=int(step))
        if self.rank == 0:
            cpu0 = process_cpu()  # training is paused: the process is the writer
            with get_tracer().span(
                "checkpoint", "checkpoint", step=step, saver=self.name
            ):
                leaves, _ = self._flat.flatten(state)
                host = jax.device_get([_host(x) for x in leaves])
                path = self.tier.step_dir(0, step)
                remove_tree(path)
                path.parent.mkdir(parents=True, exist_ok=True)
                if self._ckptr is None:
                    self._ckptr = new_checkpointer(
                        use_async=False, compress=self.compress
                    )
                self._ckptr.save(
                    path,
                    args=shard_args(
                        dict(zip(self._flat.names, host)), self._meta(step, extra)
                    ),
                )
                self._hook("written", step)
                shard = self._shard(step, extra)
                rec.bytes_written = rec.shard_bytes = shard["bytes"]
                entry = self._entry(step, plan(self._flat.specs, 1), [shard])
                self._commit(self.tier, step, self.keep, entry)
            rec.writer_cpu_s = process_cpu() - cpu0
            rec.committed_s = rec.persisted_s = time.perf_counter() - t0
        rec.blocking_s = time.perf_counter() - t0
        self.records[rec.step] = rec
        return rec


@register_saver("orbax-blocking", OrbaxBlockingOptions)
class OrbaxBlocking(_Base):
    """Every rank saves its balanced shard with Orbax's blocking Checkpointer."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._ckptr = new_checkpointer(use_async=False, compress=self.compress)
        self._units: list[Unit] = []

    def save(self, step: int, state: Any, extra: dict | None = None) -> SaveRecord:
        import jax

        t0 = time.perf_counter()
        rec = SaveRecord(step=int(step))
        cpu0 = process_cpu()  # training is paused: the process is the writer
        with get_tracer().span("checkpoint", "checkpoint", step=step, saver=self.name):
            leaves, changed = self._flat.flatten(state)
            if changed or not self._units:
                self._units = plan(self._flat.specs, self.size)
            index = {n: i for i, n in enumerate(self._flat.names)}
            mine = [u for u in self._units if u.owner == self.rank]
            host = [
                cut(np.asarray(jax.device_get(_host(leaves[index[u.leaf]]))), u.rows)
                for u in mine
            ]
            path = self.tier.step_dir(self.rank, step)
            remove_tree(path)
            report: dict[str, Any] = {"rank": self.rank, "status": "ok"}
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._ckptr.save(
                    path,
                    args=shard_args(
                        {u.name: a for u, a in zip(mine, host)},
                        self._meta(step, extra),
                    ),
                )
                report["shard"] = self._shard(step, extra)
                rec.bytes_written = rec.shard_bytes = report["shard"]["bytes"]
                self._hook("written", step)
            except Exception as e:  # noqa: BLE001 - reported to every rank
                report.update(status="error", error=f"{type(e).__name__}: {e}")
            rec.writer_cpu_s = process_cpu() - cpu0  # the write, not the agreement
            with get_tracer().span("commit", "checkpoint", step=step):
                reports = allgather_json(self.comm, report)
            failed = [r for r in reports if r["status"] != "ok"]
            if failed:
                remove_tree(path)
                raise CheckpointError(
                    f"checkpoint of step {step} failed: "
                    + "; ".join(f"rank {r['rank']}: {r['error']}" for r in failed)
                )
            entry = (
                self._entry(step, self._units, [r["shard"] for r in reports])
                if self.rank == 0
                else None
            )
            self._commit(self.tier, step, self.keep, entry)
        rec.blocking_s = rec.committed_s = rec.persisted_s = time.perf_counter() - t0
        self.records[rec.step] = rec
        return rec


@register_saver("orbax-async-rank0", OrbaxAsyncRank0Options)
class OrbaxAsyncRank0(_Base):
    """Rank 0 saves the whole state with Orbax's AsyncCheckpointer."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._ckptr = (
            new_checkpointer(use_async=True, compress=self.compress)
            if self.rank == 0
            else None
        )
        self._watcher: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, step: int, state: Any, extra: dict | None = None) -> SaveRecord:

        t0 = time.perf_counter()
        rec = SaveRecord(step=int(step))
        self.records[rec.step] = rec
        if self.rank == 0:
            tr = get_tracer()
            with tr.span("checkpoint", "checkpoint", step=step, saver=self.name):
                rec.inflight = int(
                    self._watcher is not None and self._watcher.is_alive()
                )
                with tr.span("wait for previous save", "checkpoint", step=step):
                    self._join()  # Orbax's save would wait here anyway
                rec.wait_s = time.perf_counter() - t0
                self._raise()
                cpu = OffThread()  # Orbax's threads, and this thread in save
                leaves, _ = self._flat.flatten(state)
                path = self.tier.step_dir(0, step)
                remove_tree(path)
                path.parent.mkdir(parents=True, exist_ok=True)
                # Orbax copies device arrays to host before returning (donation-safe).
                self._ckptr.save(
                    path,
                    args=shard_args(
                        dict(zip(self._flat.names, [_host(x) for x in leaves])),
                        self._meta(step, extra),
                    ),
                )
                cpu.mark_returned()
                self._watcher = threading.Thread(
                    target=self._commit_when_done,
                    args=(step, rec, t0, extra, cpu),
                    name="orbax-async-commit",
                    daemon=True,
                )
                self._watcher.start()
        rec.blocking_s = time.perf_counter() - t0
        return rec

    def _commit_when_done(
        self, step: int, rec: SaveRecord, t0: float, extra: dict | None, cpu: Any
    ) -> None:
        try:
            with get_tracer().span("write", "checkpoint-bg", step=step):
                self._ckptr.wait_until_finished()
            self._hook("written", step)
            rec.writer_cpu_s = cpu.elapsed()
            shard = self._shard(step, extra)
            rec.bytes_written = rec.shard_bytes = shard["bytes"]
            entry = self._entry(step, plan(self._flat.specs, 1), [shard])
            with get_tracer().span("commit", "checkpoint-bg", step=step):
                self._commit(self.tier, step, self.keep, entry)
            rec.committed_s = rec.persisted_s = time.perf_counter() - t0
        except BaseException as e:  # noqa: BLE001 - surfaced on the next save/wait
            self._error = e

    def _join(self) -> None:
        if self._watcher is not None:
            self._watcher.join()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise CheckpointError(f"asynchronous save failed: {err}") from err

    def wait(self) -> None:
        self._join()
        self._raise()

    def close(self) -> None:
        """Finish rank 0's save, then the collective part, then raise its failure.

        Only rank 0 can hold a failure, so raising it before the barrier would
        leave every other rank waiting there for a rank 0 that never comes.
        """
        self._join()
        if self._ckptr is not None:
            self._ckptr.close()  # local: Orbax's own threads
        super().close()
        self._raise()
