"""The watchdog's stall cases launched as real jobs, and the bound they keep.

``tests/watchdog_driver.py`` is the job (each rank runs a case and stamps the
moment the fault is injected); :func:`run_case` launches it and measures from
that stamp to the job's end. ``tests/test_watchdog.py`` runs one case of each
kind, ``tests/faults/test_matrix.py`` (``make test-faults``) all of them.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from tests.harness import run_under_mpiexec

#: Seconds past the timeout within which a stalled job has ended: the
#: watchdog, the roll call's wait, MPI_Abort's grace and mpiexec's kill
#: (measured 2-4 s here; the bound leaves room for a loaded machine).
BOUND_S = 20.0


def run_case(
    case: str, np_: int, timeout_s: float, tmp_path: Path, env: dict | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    """Run the driver; ``(proc, seconds from the fault to the job's end)``."""
    proc = run_under_mpiexec(
        np_,
        ["tests/watchdog_driver.py", case, str(timeout_s), str(tmp_path)],
        timeout=240,
        env_extra=env,
    )
    end = time.time()
    stamps = re.findall(r"INJECTED (\d+\.\d+)", proc.stdout)
    assert stamps, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, end - float(stamps[0])
