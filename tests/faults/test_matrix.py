"""The watchdog's whole matrix on one machine (``make test-faults``).

Every case of ``tests/watchdog_driver.py`` at 2 and 3 ranks: a rank that sleeps
outside any collective or stops (SIGSTOP) while the others wait in the host
allreduce, the fused allreduce inside jit, an asynchronous handle, a solo
round and the parameter server's end (``finish``), each ending the job with
exit 124 and a line naming the wait within the timeout and the bound; and a
rank slowed to 2% of the time, which must finish.
``make test`` keeps one of each (``tests/test_watchdog.py``).
"""

from __future__ import annotations

import re

import pytest

from research.comm.faults import failures, watchdog
from tests.harness import processes_naming, until
from tests.stalls import BOUND_S, run_case

TIMEOUT_S = 6.0
WHAT = {
    "hang-host": "allreduce-host (ring allreduce), step 4",
    "freeze-fused": "fused step (ring allreduce in jit), step 4",
    "freeze-handles": "allreduce (",
    "freeze-solo": "solo round 4",
    # the server waits for the frozen worker's "done", a worker for the server
    "freeze-ps": ("ps finish (every worker's done), step 4", "ps final bcast, step 4"),
}


@pytest.mark.parametrize("np_", [2, 3])
@pytest.mark.parametrize("case", sorted(WHAT))
def test_a_stopped_rank_ends_the_job(case, np_, tmp_path):
    proc, took = run_case(case, np_, TIMEOUT_S, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == watchdog.EXIT_CODE, out[-4000:]
    assert took < TIMEOUT_S + BOUND_S, f"took {took:.1f} s"
    last = np_ - 1
    for r in range(last):
        pattern = rf"r{r} \| comm watchdog: no progress .* ending the job.*"
        line = re.search(pattern, out)
        whats = WHAT[case] if isinstance(WHAT[case], tuple) else (WHAT[case],)
        assert line and any(w in line.group(0) for w in whats), out[-4000:]
        who = "(no answer)" if case.startswith("freeze") else "in no collective"
        assert re.search(rf"r{last} \([^)]*{re.escape(who)}", line.group(0)) or (
            f"r{last} {who}" in line.group(0)
        ), line.group(0)
    recs = failures.read(tmp_path, 0)
    assert recs and {r["cause"] for r in recs} == {"comm-timeout"}
    until(lambda: not processes_naming(tmp_path), 10)


@pytest.mark.parametrize("np_", [2, 3])
def test_a_slow_rank_finishes(np_, tmp_path):
    proc, _ = run_case("slow-fused", np_, 3.0, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "ending the job" not in out, out[-4000:]
    quiet = [float(q) for q in re.findall(r"QUIET (\d+\.\d+)", proc.stdout)]
    assert len(quiet) == np_ and max(quiet) < 3.0, proc.stdout
