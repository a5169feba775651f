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

import pytest

from tests.harness import run_under_mpiexec

pytestmark = pytest.mark.launches  # MPI jobs: not in make test-fast

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


def test_opting_out_leaves_pythons_hooks(tmp_path):
    # Each rank writes its flags to its own file: mpiexec merges the ranks'
    # stdout byte by byte, and two short prints once interleaved mid-line.
    probe = (
        "import sys, threading; from research.comm.world import get_world; "
        "w = get_world(); "
        f"open(r'{tmp_path}' + f'/rank{{w.rank}}-of-{{w.size}}', 'w').write("
        "f'{sys.excepthook is sys.__excepthook__} "
        "{threading.excepthook is threading.__excepthook__}')"
    )
    proc = run_under_mpiexec(
        2, ["-c", probe], timeout=120, env_extra={"RESEARCH_ABORT_ON_ERROR": "0"}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in range(2):
        flags = (tmp_path / f"rank{rank}-of-2").read_text()
        assert flags == "True True", (rank, flags)
    alone = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert (tmp_path / "rank0-of-1").read_text() == "True True"  # a world of one
