"""``get_world()`` installs the abort hook: a rank that fails ends the whole job.

A user's own script under ``mpiexec`` that never heard of
``install_abort_on_error``: rank 1 raises while rank 0 waits in a collective it
will never complete. With the hook the job ends non-zero with rank 1's traceback;
without it (``RESEARCH_ABORT_ON_ERROR=0``) rank 0 would wait forever, so that
case is checked in-process only (the hooks stay Python's own).
"""

from __future__ import annotations

import subprocess
import sys

from tests.test_mpi import run_under_mpiexec

SCRIPT = """
import sys, threading
from research.comm.world import get_world
world = get_world()
assert world.size == 2, world.size
if world.rank == 1:
    if sys.argv[1] == "thread":
        t = threading.Thread(target=lambda: 1 / 0, name="user-worker")
        t.start(); t.join()
        threading.Event().wait()  # the main thread would go on forever
    raise ValueError("rank 1 failed in the user's code")
world.barrier()  # rank 0 waits here for a rank that is gone
"""


def test_a_failing_rank_ends_a_user_script():
    for where in ("main", "thread"):
        proc = run_under_mpiexec(2, ["-c", SCRIPT, where], timeout=120)
        assert proc.returncode != 0, where
        expected = "ValueError" if where == "main" else "ZeroDivisionError"
        assert f"r1 | {expected}" in proc.stderr, proc.stderr[-3000:]
        assert "aborting the job" in proc.stderr


def test_opting_out_leaves_pythons_hooks():
    probe = (
        "import sys, threading; from research.comm.world import get_world; "
        "get_world(); print(sys.excepthook is sys.__excepthook__, "
        "threading.excepthook is threading.__excepthook__)"
    )
    proc = run_under_mpiexec(
        2, ["-c", probe], timeout=120, env_extra={"RESEARCH_ABORT_ON_ERROR": "0"}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    flags = [w for w in proc.stdout.split() if w in ("True", "False")]
    assert flags == ["True", "True"] * 2, proc.stdout[-2000:]
    alone = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    flags = [w for w in alone.stdout.split() if w in ("True", "False")]
    assert flags == ["True", "True"], alone.stdout[-2000:]  # a world of one
