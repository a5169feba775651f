"""Checkpointing configuration: pick a saver by name and build it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importing them imports mpi4py, which starts MPI: flag
    # parsing before an experiment relaunches itself must not
    from research.checkpoint.base import Checkpointer
    from research.comm.world import World

#: The savers by name ("none": no checkpoints). "Saver", not "strategy": a
#: strategy is how gradients are averaged (``--strategy``).
SAVERS = ("none", "rank0-blocking", "orbax-blocking", "orbax-async-rank0", "deepfreeze")
#: Names before 2026-11-25, accepted for one release with a one-line note.
RENAMED_SAVERS = {"rank0-sync": "rank0-blocking", "orbax-sync": "orbax-blocking"}


def saver_name(name: str) -> str:
    """``name``, or the current name of an old one (with a one-line note)."""
    new = RENAMED_SAVERS.get(name)
    if new is None:
        return name
    from research.comm.base import renamed

    renamed(f"checkpoint saver {name!r}", repr(new))
    return new


@dataclasses.dataclass
class CheckpointConfig:
    """How, where and how often to checkpoint.

    Attributes:
      saver: one of ``SAVERS`` (``strategy=``, the old keyword, works for
        one release).
      every: checkpoint after every ``every`` steps (0: never). Read by the
        Trainer's hook and by :meth:`due`; a checkpointer you drive yourself
        saves whenever you call ``save`` (ask ``config.due(step, total)``).
      directory: persistent tier (default ``<run_dir>/checkpoints``).
      fast_dir: DeepFreeze's fast tier: ``"auto"`` (``ckpt-<hash>`` in this
        user's private folder, ``/dev/shm/research-<user>``, 0700), a folder
        of yours that nobody else may write in, or None for the persistent
        tier only (``research/privdir.py``).
      keep: committed steps kept in the persistent tier.
      keep_fast: committed steps kept in the fast tier.
      max_inflight: DeepFreeze checkpoints outstanding at once.
      on_busy: DeepFreeze policy beyond ``max_inflight``: ``"wait"`` or ``"skip"``.
      snapshot: DeepFreeze snapshot mode: auto, view, host or device.
      compress: zstd-compress shard chunks (every saver).
      fsync: make persistent files durable.
      resume: restore the newest committed step at the start of training;
        False forgets every committed step instead (the run starts over).
      final: also checkpoint after the last step (a finished run can then be
        extended: the same command with more steps resumes where it ended).
      rank_local: DeepFreeze: name prefixes of leaves that differ between ranks
        (BatchNorm statistics, a strategy's per-rank state such as the
        ``sparse`` residual); each rank saves and gets back its own. The
        baselines save one copy (rank 0's or the owner's) for all ranks.
      writer: DeepFreeze's writer: ``"process"`` (a niced helper per rank) or
        ``"thread"`` (in the rank's background thread).
      nice: niceness of DeepFreeze's helper process.
      idle: run DeepFreeze's helper process under ``SCHED_IDLE`` (Linux): only
        on cores nothing else wants (off by default: on a machine saturated by
        other jobs the writer then starves and checkpoints wait).
      keep_fast_tier: DeepFreeze: keep the fast tier after a normal close
        (removed by default: /dev/shm is memory).
    """

    saver: str = "deepfreeze"
    every: int = 10
    directory: str = ""
    fast_dir: str | None = "auto"
    keep: int = 3
    keep_fast: int = 2
    max_inflight: int = 2
    on_busy: str = "wait"
    snapshot: str = "auto"
    compress: bool = False
    fsync: bool = True
    resume: bool = True
    final: bool = False
    rank_local: tuple[str, ...] = ("batch_stats", "strategy")
    writer: str = "process"
    nice: int = 10
    idle: bool = False
    keep_fast_tier: bool = False
    #: The old name of ``saver`` (one release).
    strategy: dataclasses.InitVar[str | None] = None

    def __post_init__(self, strategy: str | None) -> None:
        if strategy is not None:
            from research.comm.base import renamed

            renamed("CheckpointConfig(strategy=...)", "CheckpointConfig(saver=...)")
            self.saver = strategy
        self.saver = saver_name(self.saver)

    def validate(self) -> str | None:
        """A one-line problem, or None when the configuration is usable."""
        if self.saver not in SAVERS:
            return f"unknown checkpoint saver {self.saver!r}; valid: " + ", ".join(
                SAVERS
            )
        if self.every < 0:
            return "checkpoint interval must be >= 0"
        if min(self.keep, self.keep_fast, self.max_inflight) < 1:
            return "keep, keep_fast and max_inflight must be >= 1"
        if self.writer not in ("process", "thread"):
            return f"writer must be 'process' or 'thread', got {self.writer!r}"
        if self.on_busy not in ("wait", "skip"):
            return f"on_busy must be 'wait' or 'skip', got {self.on_busy!r}"
        return None

    def due(self, step: int, total: int | None = None) -> bool:
        """Whether a checkpoint is due after ``step`` completed steps: every
        ``every`` steps, and after the last (``total``) when ``final``."""
        from research.periodic import itstime

        return itstime(
            step, self.every, -1 if total is None else total, last=self.final
        )

    def create(
        self, world: World, run_dir: str | Path | None = None, **kw: Any
    ) -> Checkpointer | None:
        """Build the saver (collective); None for ``"none"``."""
        problem = self.validate()
        if problem:
            raise ValueError(problem)
        if self.saver == "none":
            return None
        directory = self.directory or str(Path(run_dir or ".") / "checkpoints")
        common = {"compress": self.compress, "fsync": self.fsync, "keep": self.keep}
        if self.saver == "deepfreeze":
            from research.checkpoint.deepfreeze import DeepFreeze

            return DeepFreeze(
                world,
                directory,
                fast_dir=self.fast_dir,
                keep_fast=self.keep_fast,
                max_inflight=self.max_inflight,
                on_busy=self.on_busy,
                snapshot=self.snapshot,
                rank_local=tuple(self.rank_local),
                writer=self.writer,
                nice=self.nice,
                idle=self.idle,
                keep_fast_tier=self.keep_fast_tier,
                **common,
                **kw,
            )
        from research.checkpoint import baselines

        cls = {
            "rank0-blocking": baselines.Rank0Blocking,
            "orbax-blocking": baselines.OrbaxBlocking,
            "orbax-async-rank0": baselines.OrbaxAsyncRank0,
        }[self.saver]
        return cls(world, directory, **common, **kw)
