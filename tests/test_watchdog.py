"""The communication watchdog: a stalled wait ends the job, a slow one does not.

Unit checks of the pieces (timeout values, progress from real TCP bytes, the
restart rule, lifelines), then real MPI jobs (``tests/watchdog_driver.py``):
a frozen rank in a fused step ends the job with exit 124 and the message
within the bound, and a rank slowed far below the timeout's pace finishes.
The rest of the fault matrix (every case, at 2 and 3 ranks, and the local
nodes' faults) is ``make test-faults``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from research.comm.faults import failures, lifeline, traffic, watchdog
from research.entry.launch import JOB_ENV, job_processes, reap_job
from research.entry.restart import resized
from tests.harness import processes_naming, until
from tests.stalls import BOUND_S, run_case


def test_timeout_values():
    assert watchdog.parse_timeout("auto") == "auto"
    assert watchdog.parse_timeout(None) == "auto"
    assert watchdog.parse_timeout("off") is None
    assert watchdog.parse_timeout("0") is None
    assert watchdog.parse_timeout("90") == 90.0
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(ValueError, match="--comm-timeout"):
            watchdog.parse_timeout(bad)


def test_auto_timeout_follows_the_slowest_step():
    dog = watchdog.Watchdog(0, 2)
    dog.setting = "auto"
    assert dog.timeout_s() == watchdog.DEFAULT_TIMEOUT_S
    dog.slowest_step = 60.0
    assert dog.timeout_s() == 600.0
    dog.setting = 30.0
    assert dog.timeout_s() == 30.0


def test_a_quiet_watch_warns_and_progress_resets_it(capsys):
    dog = watchdog.Watchdog(0, 2)
    dog.setting = 9.0
    watchdog._state.on = True
    try:
        with watchdog.watch("allreduce-host", peers=[1], detail="ring") as w:
            t0 = w.since
            dog.check(t0 + 1.0)
            assert "comm watchdog" not in capsys.readouterr().err
            dog.check(t0 + 3.5)  # past a third of 9 s
            err = capsys.readouterr().err
            assert "r0 | comm watchdog: no progress for 4 s in allreduce-host" in err
            assert "waits for r1" in err and "ends after 9 s" in err
            watchdog.progress()
            dog.check(time.monotonic() + 1.0)
        assert dog.longest[0] >= 3.5 and dog.longest[1].startswith("allreduce-host")
    finally:
        watchdog._state.on = False


def test_tcp_bytes_count_received_and_acknowledged():
    srv = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    try:
        rx0, ack0 = traffic.tcp_bytes()
        a.sendall(b"x" * 100_000)
        got = 0
        while got < 100_000:
            got += len(b.recv(1 << 20))
        time.sleep(0.1)
        rx, ack = traffic.tcp_bytes()
        assert rx - rx0 >= 100_000 and ack - ack0 >= 100_000
    finally:
        for s in (a, b, srv):
            s.close()


def test_the_restart_rule_keeps_the_global_batch():
    assert resized(32, 0.1, 4, 2) == {
        "batch_size": 64,
        "lr": 0.1,
        "global_batch_before": 128,
        "global_batch_after": 128,
    }
    odd = resized(32, 0.1, 4, 3)  # 128 / 3: 43 per rank, 129 in all
    assert odd["batch_size"] == 43 and odd["lr"] == pytest.approx(0.1 * 129 / 128)
    assert resized(32, 0.1, 4, 3, scale_lr=True)["lr"] == 0.1


def test_failure_records(tmp_path, monkeypatch):
    monkeypatch.setenv(failures.ATTEMPT_ENV, "2")
    failures.set_dir(tmp_path)
    try:
        failures.record("comm-timeout", "no progress", rank=1, step=7)
        failures.record("exception", "later", rank=1)  # the first one stays
    finally:
        failures.set_dir(None)
    (rec,) = failures.read(tmp_path, 2)
    assert rec["cause"] == "comm-timeout" and rec["step"] == 7
    assert failures.read(tmp_path, 0) == []


def test_an_mpi_error_is_what_a_rank_saw_not_the_cause(tmp_path, monkeypatch):
    """A rank killed with SIGKILL writes nothing; its peer then fails in MPI
    (seen in make test: ``process_vm_readv failed (errno 3)``). The restart
    record names the exit, with what the peer saw; any other record wins."""
    from mpi4py import MPI

    from research.comm.world import _from_mpi
    from research.entry.restart import cause_of

    try:
        try:
            raise MPI.Exception(MPI.ERR_OTHER)
        except MPI.Exception as e:
            raise RuntimeError("partial allreduce failed in the background") from e
    except RuntimeError as e:
        assert _from_mpi(e)
    assert not _from_mpi(ValueError("bad shard"))
    # The ring allreduce's MPI failure, raised through XLA inside jit (seen in
    # make test: a restart blamed rank 0's "exception"), and its own argument
    # errors, which are not MPI's.
    import jax

    from research.comm.dense.ring_build import SOURCE

    assert f'"{failures.RING_MPI_ERROR}"' in SOURCE.read_text()
    seen_in_jit = (
        f"INTERNAL: {failures.RING_MPI_ERROR}Other MPI error, error stack:\n"
        "copy_iovs(224).........: process_vm_readv failed (errno 3)"
    )
    assert _from_mpi(jax.errors.JaxRuntimeError(seen_in_jit))
    assert not _from_mpi(
        ValueError("ring allreduce: divisor needs a float32/float64 SUM")
    )

    failures.set_dir(tmp_path)
    try:
        monkeypatch.setenv(failures.ATTEMPT_ENV, "0")
        failures.record(failures.MPI_ERROR, "process_vm_readv failed", rank=0)
        monkeypatch.setenv(failures.ATTEMPT_ENV, "1")
        failures.record(failures.MPI_ERROR, "process_vm_readv failed", rank=0)
        failures.record("exception", "injected", rank=1)  # later, but a cause
    finally:
        failures.set_dir(None)
    seen = cause_of(tmp_path, 0, 9)
    assert seen["cause"] == "exit", seen
    assert seen["message"].endswith("; r0 then: process_vm_readv failed"), seen
    assert seen["failed_at"] == failures.read(tmp_path, 0)[0]["time"]
    own = cause_of(tmp_path, 1, 1)
    assert (own["cause"], own["failed_rank"]) == ("exception", 1), own
    assert cause_of(tmp_path, 2, 1)["message"].startswith("the job (mpiexec")


def test_a_child_dies_with_its_parent(tmp_path):
    """PR_SET_PDEATHSIG: a rank (here a grandchild) goes when its proxy (the
    child) is killed with SIGKILL, which no handler can catch."""
    pidfile = tmp_path / "pid"
    grandchild = (
        "import time; from research.comm.faults import lifeline; "
        f"lifeline.die_with_parent(); open({str(pidfile)!r}, 'w').write("
        "str(__import__('os').getpid())); time.sleep(60)"
    )
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
            f"{grandchild!r}]).wait()",
        ]
    )
    until(pidfile.exists, 30)
    pid = int(pidfile.read_text())
    child.kill()
    child.wait()
    until(lambda: not _alive(pid), 10)


def test_the_launcher_ends_what_a_job_left_behind():
    tag = "test-" + os.urandom(4).hex()
    env = dict(os.environ, **{JOB_ENV: tag})
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    code += "time.sleep(60)"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(2)]
    try:
        until(lambda: len(job_processes(tag)) == 2, 10)
        t0 = time.monotonic()
        left = reap_job(tag, grace=0.5)
        assert sorted(p for p, _ in left) == sorted(p.pid for p in procs)
        for p in procs:
            assert p.wait(5) == -signal.SIGKILL
        assert time.monotonic() - t0 < 5
        assert job_processes(tag) == []
    finally:
        for p in procs:
            p.kill()


def test_lifeline_notices_a_reparented_process():
    assert not lifeline.parent_gone()  # nothing armed in pytest itself


# -- real jobs ---------------------------------------------------------------------
@pytest.mark.launches
def test_a_frozen_rank_ends_the_job_within_the_bound(tmp_path):
    """The last of 3 ranks stops (SIGSTOP, as a frozen node) while the others
    are in the fused allreduce inside jit: exit 124 within timeout + bound,
    each waiting rank names the collective, the step and the silent rank, a
    failure record says why, and no process of the job is left."""
    proc, took = run_case("freeze-fused", 3, 6, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == watchdog.EXIT_CODE, out[-4000:]
    assert took < 6 + BOUND_S, f"took {took:.1f} s"
    for r in (0, 1):
        pattern = rf"r{r} \| comm watchdog: no progress .* ending the job.*"
        line = re.search(pattern, out)
        assert line, out[-4000:]
        assert "fused step (ring allreduce in jit), step 4" in line.group(0)
        assert "r2 (no answer)" in line.group(0)
    assert failures.read(tmp_path, 0)[0]["cause"] == "comm-timeout"
    until(lambda: not processes_naming(tmp_path), 10)


@pytest.mark.launches
def test_a_slow_rank_does_not_trip_it(tmp_path):
    """The last rank runs 2% of the time (stopped 0.5 s, running 0.01 s) through
    a 128 MB ring allreduce that takes longer than the 2 s timeout: bytes keep
    moving (the ring's counter, inside jit), so the job finishes. (64 MB took
    3.1-3.6 s here alone, 2.7 s beside the rest of the suite, where the
    throttling child wakes late and the rank runs longer, and 1.2 s in a fresh
    clone on a fast day: then shorter than the timeout, and the test proved
    nothing. Hence 128 MB.)
    With MPICH's default yield: the suite's heavy yield (tests/conftest.py)
    sleeps at every lock hand-over, and the slowed rank's 16 KiB pieces then
    took 22.5 s instead of 2.6."""
    proc, _ = run_case(
        "slow-fused", 2, 2, tmp_path, env={"MPIR_CVAR_ENABLE_HEAVY_YIELD": "0"}
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "ending the job" not in out, out[-4000:]
    took = [float(t) for t in re.findall(r"TOOK (\d+\.\d+)", proc.stdout)]
    quiet = [float(q) for q in re.findall(r"QUIET (\d+\.\d+)", proc.stdout)]
    assert len(took) == 2 and max(took) > 2, proc.stdout  # slower than the timeout
    assert max(quiet) < 2, proc.stdout


# -- helpers ----------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
