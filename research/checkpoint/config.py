"""Checkpointing configuration: pick a saver by name and build it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from research.checkpoint.registry import NONE
from research.checkpoint.savers import check_saver_options, list_savers, options_class
from research.flags import CKPT, flag

if TYPE_CHECKING:  # importing them imports mpi4py, which starts MPI: flag
    # parsing before an experiment relaunches itself must not
    from research.checkpoint.base import Checkpointer
    from research.comm.world import World

# The savers are registered (research.checkpoint.registry): ``list_savers()``
# names them, "none" means no checkpoints.
__all__ = ["CheckpointConfig", "list_savers"]


@dataclasses.dataclass
class CheckpointConfig:
    """How, where and how often to checkpoint.

    The fields below ``directory`` are options of the savers; each saver gets
    those its options dataclass has (``research/checkpoint/registry.py``), and
    ``options`` adds or overrides any of its options by name (a saver of your
    own: its options go there).

    Attributes:
      saver: a registered saver (``list_savers()``) or ``"none"``.
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
      options: more options of the saver, by name (``--checkpoint-opt``).
    """

    saver: str = flag(
        "deepfreeze",
        "checkpoint saver (into RUN_DIR/checkpoints; see --list), or none; "
        "default %(default)s",
        CKPT,
        name="--checkpoint",
        metavar="SAVER",
    )
    every: int = flag(
        10,
        "checkpoint every N steps and after the last; default %(default)s",
        CKPT,
        name="--checkpoint-every",
        metavar="N",
    )
    directory: str = ""
    fast_dir: str | None = flag(
        "auto",
        "deepfreeze's node-local fast tier: a folder of yours that nobody else "
        "can write in (created 0700), 'none' (persistent tier only), or 'auto': "
        "/dev/shm/research-<user>/ckpt-<hash> (0700); default %(default)s",
        CKPT,
        metavar="DIR",
        type=str,
    )
    keep: int = 3
    keep_fast: int = 2
    max_inflight: int = 2
    on_busy: str = "wait"
    snapshot: str = "auto"
    compress: bool = False
    fsync: bool = True
    resume: bool = flag(
        True,
        "start over even when --run-dir holds a committed checkpoint "
        "(default: resume from the newest one)",
        CKPT,
    )
    final: bool = False
    rank_local: tuple[str, ...] = ("batch_stats", "strategy")
    writer: str = "process"
    nice: int = 10
    idle: bool = False
    keep_fast_tier: bool = False
    options: dict[str, Any] = flag(
        None,
        "checkpoint saver option, repeatable (e.g. keep=5; see --list)",
        CKPT,
        name="--checkpoint-opt",
        factory=dict,
    )

    def __post_init__(self) -> None:
        if self.fast_dir == "none":  # --fast-dir none: the persistent tier only
            self.fast_dir = None

    def saver_options(self) -> dict[str, Any]:
        """The options the saver is built with: each field named like one of
        its options, then :attr:`options` (empty for ``"none"``)."""
        try:
            spec = options_class(self.saver).spec()
        except ValueError:  # unknown: validate() says so
            return dict(self.options)
        fields = {f.name for f in dataclasses.fields(self)} - {"options", "saver"}
        out = {k: getattr(self, k) for k in spec if k in fields}
        out.update(self.options)
        return out

    def validate(self) -> str | None:
        """A one-line problem, or None when the configuration is usable
        (the saver's options checked against its declaration)."""
        if self.every < 0:
            return "checkpoint interval must be >= 0"
        if self.saver == NONE:
            return None
        return check_saver_options(self.saver, self.saver_options())

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
        if self.saver == NONE:
            return None
        directory = self.directory or str(Path(run_dir or ".") / "checkpoints")
        options = options_class(self.saver).make(self.saver_options())
        return options.create(world, directory, **kw)
