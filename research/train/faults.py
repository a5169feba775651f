"""The run's fault options: how long a collective may make no progress.

``TrainConfig.faults`` is a :class:`FaultConfig` (``--comm-timeout``);
``create(run_dir)`` arms them for this process before any collective: the
communication watchdog's timeout (:mod:`research.comm.faults.watchdog`) and the
folder where a failing rank writes why (:mod:`research.comm.faults.failures`).
Pure Python at import (the flags are parsed before a relaunch); the watchdog
is imported where it is armed. Restarting on the nodes that still answer is the
launcher's (``--max-restarts``, :mod:`research.entry.restart`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from research.flags import PARALLEL, flag


@dataclasses.dataclass
class FaultConfig:
    """What ends a job that stalls (``--comm-timeout``)."""

    comm_timeout: str = flag(
        "auto",
        "end the job when a collective makes no progress for this many seconds "
        "(a warning at a third of it): 'auto' (180 s, or 10x the slowest step "
        "measured), 'off' or SECONDS; default %(default)s",
        PARALLEL,
        metavar="SECONDS",
    )

    def problem(self) -> str | None:
        """What is wrong with the options, in one line (None: nothing)."""
        from research.comm.faults.watchdog import parse_timeout

        try:
            parse_timeout(self.comm_timeout)
        except ValueError as e:
            return str(e)
        return None

    def create(self, run_dir: str | Path) -> None:
        """Arm this process's fault handling for a run into ``run_dir``: the
        watchdog's timeout (every rank sets the same) and where a failing rank
        says why."""
        from research.comm.faults import failures, watchdog

        watchdog.configure(self.comm_timeout)
        failures.set_dir(run_dir)
