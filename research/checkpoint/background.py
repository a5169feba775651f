"""DeepFreeze's background thread: write, agree, commit, flush.

:class:`~research.checkpoint.deepfreeze.DeepFreeze` (its protocol is in that
module's docstring) takes the snapshot on the training thread and queues a
:class:`_Job`; one thread per rank runs the jobs in request order with the
methods of :class:`Background`, which ``DeepFreeze`` inherits: the writer
writes the shard into the first tier, every rank reports in the commit round,
rank 0 adds the step to the manifest, then the shard is flushed to the
persistent tier and committed there. Failures travel in the commit round, so
every rank raises the same ``CheckpointError``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

from research import privdir
from research.checkpoint.agreement import allgather_json
from research.checkpoint.base import (
    CheckpointError,
    SaveRecord,
)
from research.checkpoint.integrity import remove_tree
from research.checkpoint.manifest import (
    make_entry,
)
from research.checkpoint.partition import LOCAL
from research.checkpoint.rawshard import retire, stage
from research.checkpoint.tiers import Tier
from research.trace import get_tracer


class WriterError(RuntimeError):
    """The writer failed; its message is the original error (``OSError: ...``)."""


def _describe(e: BaseException) -> str:
    return str(e) if isinstance(e, WriterError) else f"{type(e).__name__}: {e}"


@dataclasses.dataclass
class _Job:
    step: int
    record: SaveRecord
    t_request: float
    taken: list[Any] | None = None
    names: list[str] = dataclasses.field(default_factory=list)  # this rank's units
    specs: list[dict] = dataclasses.field(default_factory=list)
    units: list[dict] = dataclasses.field(default_factory=list)  # every rank's
    extra: dict = dataclasses.field(default_factory=dict)
    skipped: bool = False


class Background:
    """The background-thread half of :class:`DeepFreeze` (``deepfreeze.py``)."""

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                # Broken for good: a thread that left a round half done must join
                # no later one (its next collective would meet the other ranks'
                # previous one), and the first error is the one to report.
                if self._broken is None:
                    self._process(job)
            except BaseException as e:  # noqa: BLE001 - agreement broke: stop for good
                with self._cv:
                    self._broken = e
            finally:
                with self._cv:
                    self._inflight -= 1
                    self._cv.notify_all()
        if self._local is not None:
            self._local.close()
        self._buf = None
        if self._proc is not None:
            # The helper removes the transfer file and drops its mapping of it
            # (otherwise its memory stays taken until the helper exits).
            with contextlib.suppress(OSError, RuntimeError, ValueError):
                self._proc.request(
                    {"op": "remove", "paths": [str(self._xfer)]}, lambda e: None
                )
        self._xfer.unlink(missing_ok=True)

    def _request(self, req: dict, progress) -> dict[str, Any]:
        if self._proc is not None:
            return self._proc.request(req, progress)
        try:
            return self._local.handle(req, progress)
        except Exception as e:  # noqa: BLE001 - same shape as the helper's replies
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}

    def _process(self, job: _Job) -> None:
        tr, first = get_tracer(), self.tiers[0]
        report: dict[str, Any] = {"rank": self.rank, "status": "ok"}
        local_exc: BaseException | None = None
        if job.skipped:
            report["status"] = "skipped"
        else:
            try:
                report["shard"] = self._write(job, first)
            except Exception as e:  # noqa: BLE001 - reported to every rank below
                local_exc = e
                report.update(status="error", error=_describe(e))
            finally:
                self._snap.release(job.taken)
                job.taken = None
        with tr.span("commit", "checkpoint-bg", step=job.step, tier=first.name):
            reports = allgather_json(self.comm, report)
            if not self._settle(job, first, reports, local_exc, "committed_s"):
                remove_tree(first.step_dir(self.rank, job.step))
                return
        self._hook("committed", job.step)
        shards = [r["shard"] for r in reports]
        for tier in self.tiers[1:]:
            report = {"rank": self.rank, "status": "ok"}
            local_exc = None
            try:
                with tr.span(
                    "flush", "checkpoint-bg", step=job.step, tier=tier.name
                ) as sp:
                    n = self._flush(job.step, shards[self.rank], first, tier)
                    sp.set(bytes=n)
                job.record.bytes_written += n
            except Exception as e:  # noqa: BLE001
                local_exc = e
                report.update(status="error", error=_describe(e))
            with tr.span("commit", "checkpoint-bg", step=job.step, tier=tier.name):
                reports = allgather_json(self.comm, report)
                if not self._settle(
                    job,
                    tier,
                    [{**r, "shard": s} for r, s in zip(reports, shards)],
                    local_exc,
                    "persisted_s",
                ):
                    remove_tree(tier.step_dir(self.rank, job.step))
                    remove_tree(tier.rank_dir(self.rank) / f"{job.step}.flush-tmp")
                    return
            self._hook("flushed", job.step)

    def _settle(
        self,
        job: _Job,
        tier: Tier,
        reports: list[dict],
        local_exc: BaseException | None,
        field: str,
    ) -> bool:
        """Record the outcome of a commit round; rank 0 writes the manifest last."""
        failed = [r for r in reports if r["status"] == "error"]
        if failed:
            msg = "; ".join(f"rank {r['rank']}: {r['error']}" for r in failed)
            err = CheckpointError(
                f"checkpoint of step {job.step} was not committed to "
                f"the {tier.name} tier ({tier.root}): {msg}"
            )
            err.__cause__ = local_exc
            with self._cv:
                self._errors.append(err)
            job.record.skipped = True
            return False
        if any(r["status"] != "ok" for r in reports):
            job.record.skipped = True  # some rank skipped it: nobody commits it
            return False
        keep = self.keep if tier is self.tiers[-1] else self.keep_fast
        drop = self._stale(tier, job.step, keep)
        manifest_error = None
        if self.rank == 0:
            try:
                self._write_manifest(job, tier, reports, drop)
            except Exception as e:  # noqa: BLE001 - every rank learns of it below
                manifest_error = _describe(e)
        # The manifest is the commit point: no rank goes on (to flush, or to
        # report "committed") before rank 0 has written it, or learns it failed.
        manifest_error = allgather_json(self.comm, manifest_error)[0]
        if manifest_error is not None:
            err = CheckpointError(
                f"checkpoint of step {job.step} was not committed to the "
                f"{tier.name} tier ({tier.root}): rank 0's manifest: {manifest_error}"
            )
            with self._cv:
                self._errors.append(err)
            job.record.skipped = True
            return False
        self._note_committed(tier, job.step, drop)  # the dropped shards go
        setattr(job.record, field, time.perf_counter() - job.t_request)
        if tier is self.tiers[-1] and field == "committed_s":
            job.record.persisted_s = job.record.committed_s
        return True

    def _write_manifest(
        self, job: _Job, tier: Tier, reports: list[dict], drop: list[int]
    ) -> None:
        """Rank 0: the step's entry into ``tier``'s manifest (the commit), and
        the steps it pushes out of the retention window out of it."""
        local = {u["name"] for u in job.units if u["shard"] == LOCAL}
        crcs: dict[str, int] = {}
        shards = []
        for r in reports:
            sc = r["shard"].get("crc32", {})
            crcs.update({n: c for n, c in sc.items() if n not in local})
            shard = {k: v for k, v in r["shard"].items() if k != "crc32"}
            # Rank-local leaves have one CRC per shard, not one per leaf.
            shard["local_crc32"] = {n: c for n, c in sc.items() if n in local}
            shards.append(shard)
        entry = make_entry(
            job.step,
            self.name,
            self.size,
            job.specs,
            job.units,
            crcs,
            shards,
            time.time(),
        )
        self._update_manifest(tier, entry, drop)

    def _write(self, job: _Job, tier: Tier) -> dict[str, Any]:
        """Write this rank's shard of ``job`` into ``tier``; returns its report."""
        tr, step = get_tracer(), job.step
        tier.check()  # still ours and private, before anything goes into it
        privdir.check(self._xfer.parent)
        cpu0 = time.thread_time()  # this thread's copy counts as writer CPU
        with tr.span("device-to-host", "checkpoint-bg", step=step) as span:
            host = self._snap.materialize(job.taken)
            units, size, self._buf = stage(host, job.names, self._buf, self._xfer)
            span.set(bytes=size)
        self._snap.release(job.taken)
        job.taken = None  # the snapshot's buffers may now be reused or donated
        job.record.writer_cpu_s += time.thread_time() - cpu0
        meta = {
            "step": step,
            "rank": self.rank,
            "world_size": self.size,
            "units": [u for u in job.units if u["shard"] in (self.rank, LOCAL)],
            "extra": job.extra,
        }
        req = {
            "op": "write",
            "path": str(tier.step_dir(self.rank, step)),
            "buffer": str(self._xfer),
            "size": size,
            "units": units,
            "meta": meta,
            "format": "orbax" if self.compress else "raw",  # raw cannot compress
            "compress": self.compress,
            # Only when this is the last tier: the fast tier is never synced,
            # and the flush makes the persistent copy durable.
            "fsync": self.fsync and tier is self.tiers[-1],
            "private": tier.private,
            "pause": self._hooked,
        }
        self._hook("write-begin", step)
        with tr.span(
            "serialize+write",
            "checkpoint-bg",
            step=step,
            bytes=size,
            tier=tier.name,
            writer=self.writer,
        ):
            rep = self._request(req, lambda event: self._hook(event, step))
        job.record.writer_cpu_s += rep.get("cpu_s", 0.0)
        if not rep["ok"]:
            raise WriterError(rep["error"])
        job.record.bytes_written += rep["bytes"]
        job.record.shard_bytes = rep["bytes"]
        self._hook("written", step)
        return {
            "shard": self.rank,
            "rank": self.rank,
            "path": Tier.rel(self.rank, step),
            "bytes": rep["bytes"],
            "files": rep["files"],
            "extra": job.extra,
            "crc32": rep["crc32"],
            **rep.get("tags", {}),  # format, checksum algorithm
        }

    def _flush(self, step: int, shard: dict, src: Tier, dst: Tier) -> int:
        """Verified copy of this rank's shard from ``src`` to ``dst`` (tmp, rename)."""
        src.check()  # read only from a tier that is still ours and private
        dst.check()
        req = {
            "op": "flush",
            "src": str(src.step_dir(self.rank, step)),
            "dst": str(dst.step_dir(self.rank, step)),
            "files": shard["files"],
            "checksum": shard.get("checksum"),
            "fsync": self.fsync,
            "pause": self._hooked,
        }
        rep = self._request(req, lambda event: self._hook(event, step))
        self.records[step].writer_cpu_s += rep.get("cpu_s", 0.0)
        if not rep["ok"]:
            raise WriterError(rep["error"])
        return rep["bytes"]

    def _remove_step(self, tier: Tier, step: int) -> None:
        retire(tier.step_dir(self.rank, step))  # its data file is the next's
