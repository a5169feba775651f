"""A restarted run's own record: what it resumed from and what the restart cost.

The launcher (:mod:`research.entry.restart`) relaunches a failed job with
``RESEARCH_ATTEMPT=N`` and appends a record to ``RUN_DIR/restarts.json``. In
the restarted run this callback (added by the Trainer when N > 0)

* says on rank 0 where the run resumes: the step every rank committed, or step
  0 when no checkpoint was committed ("starting over");
* marks the restart on the timeline (an event on track ``restart``);
* after the first step, completes the record: ``step_resumed``,
  ``first_step_at`` and ``seconds_to_first_step`` (from the failure, as the
  failing rank recorded it, or from mpiexec's end where no rank could), and for
  a stall ``seconds_from_stall`` (from its last progress);
* puts every restart's record into ``summary.json`` (``restarts``).
"""

from __future__ import annotations

import time
from typing import Any

from research.comm.faults import failures
from research.rundir import read_restarts, write_restarts
from research.train.callback import Callback, Run


class RestartRecord(Callback):
    """The record of the restart that started this run (see module docstring)."""

    def __init__(self) -> None:
        self.attempt = failures.attempt()
        self.records: list[dict[str, Any]] = []
        self._done = False

    def on_train_start(self, trainer: Run) -> None:
        self.records = read_restarts(trainer.run_dir)
        rec = self._mine()
        if rec is None:
            return
        resumed = self._resumed(trainer)
        rec["step_resumed"] = resumed
        rec["world_size_after"] = trainer.world.size
        where = (
            f"resuming from step {resumed}"
            if resumed
            else "no committed checkpoint: starting over from step 0"
        )
        trainer.world.log(
            f"restart {rec['restart']} after {rec.get('cause')} "
            f"({rec.get('message')}); {trainer.world.size} ranks; {where}"
        )
        now = time.perf_counter()
        trainer.tracer.complete(
            f"restart {rec['restart']}",
            "restart",
            now,
            now,
            cause=rec.get("cause"),
            lost_nodes=rec.get("lost_nodes"),
            step_resumed=resumed,
        )

    def on_step_end(self, trainer: Run, step: int) -> None:
        if self._done:
            return
        self._done = True
        rec = self._mine()
        if rec is None:
            return
        rec["first_step_at"] = now = time.time()
        rec["seconds_to_first_step"] = round(now - rec["failed_at"], 3)
        if rec.get("stalled_since"):
            rec["seconds_from_stall"] = round(now - rec["stalled_since"], 3)
        if trainer.world.rank == 0:
            records = read_restarts(trainer.run_dir)
            for i, r in enumerate(records):
                if r.get("restart") == rec["restart"]:
                    records[i] = rec
            write_restarts(trainer.run_dir, records)
            self.records = records

    def summary(self) -> dict[str, Any]:
        return {"restarts": self.records}

    def _mine(self) -> dict[str, Any] | None:
        for r in self.records:
            if r.get("restart") == self.attempt:
                return r
        return None

    @staticmethod
    def _resumed(trainer: Run) -> int:
        for cb in trainer.callbacks:
            step = getattr(cb, "resumed_from", None)
            if step is not None:
                return int(step)
        return 0
