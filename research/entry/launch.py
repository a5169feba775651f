"""Starting ranks: an experiment relaunches itself under ``mpiexec``.

Started without a launcher, ``python -m experiments.NAME`` relaunches itself
under the environment's ``mpiexec`` with ``--np`` ranks (:func:`maybe_relaunch`,
:func:`relaunch`), each rank with its threads (:mod:`research.threads`) and
heap settings, bound to its cores, on ``--hosts`` where given; under mpiexec,
srun or a PBS job it uses the world it is given. A launcher forwards a stop
signal to its job and reaps what the job leaves (MPICH's /dev/shm files).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from research.comm.faults import lifeline
from research.comm.process.env import SHM_DIR, SHM_PREFIXES, launched_by_mpi
from research.comm.process.malloc import launch_env
from research.privdir import owned
from research.threads import thread_env
from research.usage import USAGE_EXIT, UsageError


def check_may_launch() -> None:
    """Refuse to start an MPI job where ``RESEARCH_NO_MPIEXEC`` is set
    (``make test-fast``: a test that launches one is marked ``launches``)."""
    if os.environ.get("RESEARCH_NO_MPIEXEC"):
        raise UsageError("RESEARCH_NO_MPIEXEC is set: no MPI job may start here")


def mpiexec_path() -> str:
    """The ``mpiexec`` of this environment (the mpich wheel's), else the PATH's.

    A site-MPI environment (``scripts/install.sh --site-mpi``) has none of its
    own: the site MPI's ``mpiexec``/``mpirun`` on PATH (its module loaded) is it.
    """
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise UsageError(
            "no mpiexec found: run `make run` once, or put mpiexec on PATH"
        )
    return found


def bind_args(mpiexec: str, cores_per_rank: int) -> list[str] | None:
    """``mpiexec`` arguments that bind each rank to ``cores_per_rank`` cores.

    Ranks are placed round robin over the cores (more ranks than cores share
    them), and whatever a rank starts (threads, helper processes) inherits its
    cores. Only MPICH's Hydra is known (``-bind-to core:N``); for any other
    launcher this returns None and the caller runs unbound.
    """
    try:
        out = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if "HYDRA" not in out.stdout + out.stderr:
        return None
    return ["-bind-to", f"core:{max(1, cores_per_rank)}"]


# SHM_DIR, SHM_PREFIXES: MPICH's shared-memory files (research.comm.process.env).


def _mapped_shm_files() -> set[str]:
    """Files under SHM_DIR that some live process has mapped (from /proc/*/maps)."""
    mapped: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    path = line.rstrip("\n").partition(f" {SHM_DIR}/")[2]
                    if path:
                        mapped.add(path.removesuffix(" (deleted)"))
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return mapped


def remove_orphaned_shm() -> list[str]:
    """Remove this user's MPICH shared-memory files that no live process maps.

    A rank that aborts or is killed cannot remove them, and /dev/shm is memory.
    Other users' files are never touched (run as root, this would otherwise
    delete them too). Called around every launched job, and by the test
    suite. Returns the names.
    """
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(SHM_PREFIXES)]
    except OSError:
        return []
    if not names:
        return []
    mapped = _mapped_shm_files()
    removed = []
    for name in names:
        if name not in mapped and owned(os.path.join(SHM_DIR, name)):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(name)
            except OSError:
                continue
    return removed


#: Signals the relaunching process hands on to its mpiexec, which (MPICH's
#: Hydra) forwards them to every rank: the clean-stop signals of
#: ``research.train.preemption``.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


#: Every process of a job the launcher starts carries this variable (a fresh
#: tag per launch), so what is left of it afterwards can be found and ended.
JOB_ENV = "RESEARCH_JOB"
#: Seconds the job's processes get to end by themselves after mpiexec returned.
REAP_GRACE_S = 5.0
#: Set when the launcher forwarded a stop signal (SIGTERM, SIGUSR1) or Ctrl-C:
#: a job told to stop is not restarted.
told_to_stop: int | None = None


def is_hydra(mpiexec: str) -> bool:
    """Whether ``mpiexec`` is MPICH's Hydra (else Open MPI's mpirun is assumed)."""
    try:
        out = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "HYDRA" in out.stdout + out.stderr


def placement(hosts: str, np_: int) -> list[tuple[str, int]]:
    """``--hosts`` as ``[(host, ranks)]`` (see :func:`research.localnet.parse_hosts`);
    with fewer ranks than hosts, the first ``np_`` hosts (a scaling sweep's 1
    and 2 ranks on 4 nodes). Raises UsageError on a bad list."""
    from research.localnet import parse_hosts

    names = [h for h in hosts.split(",") if h.strip()]
    if names and ":" not in hosts and np_ < len(names):
        hosts = ",".join(names[:np_])
    try:
        return parse_hosts(hosts, np_)
    except ValueError as e:
        raise UsageError(str(e)) from None


def launch_command(np_: int, hosts: str = "") -> tuple[list[str], dict[str, str]]:
    """The launcher's command (up to the program) and extra environment.

    Without ``hosts``: ``mpiexec -n np_`` on this machine. With ``hosts``
    (``n1,n2`` or ``n1:2,n2:1``): the ranks in blocks over those hosts; where
    they are nodes of a local cluster (``research/localnet.py``), mpiexec runs
    on its first node with the nodes' launcher, else the MPI's own host list
    (Hydra's ``-hosts``, Open MPI's ``--host``) over ssh.
    """
    mpiexec = mpiexec_path()
    if not hosts:
        return [mpiexec, "-n", str(np_)], {}
    where = placement(hosts, np_)
    from research.localnet import LocalnetError, find_cluster

    try:
        cluster = find_cluster([h for h, _ in where])
    except LocalnetError as e:
        raise UsageError(str(e)) from None
    if cluster is not None:
        try:
            enter = cluster.enter(where[0][0])
        except LocalnetError as e:
            raise UsageError(str(e)) from None
        if is_hydra(mpiexec):
            args = cluster.mpiexec_args(where)
        else:  # Open MPI's mpirun
            args = cluster.openmpi_args(where)
        return [*enter, mpiexec, *args, "-n", str(np_)], cluster.env()
    spec = ",".join(f"{h}:{n}" for h, n in where)
    if is_hydra(mpiexec):
        return [mpiexec, "-hosts", spec, "-n", str(np_)], {}
    return [mpiexec, "--host", spec, "-n", str(np_)], {}


def relaunch(
    module: str,
    argv: list[str],
    np_: int,
    threads: int = 1,
    hosts: str = "",
    *,
    env_extra: dict[str, str] | None = None,
    run_dir: str | os.PathLike | None = None,
) -> int:
    """Run ``python -m module argv`` under ``mpiexec -n np_`` and return its exit code.

    ``hosts``: run the ranks on those hosts (:func:`launch_command`).
    Rank output streams straight through. Ctrl-C stops the whole job. SIGTERM
    and SIGUSR1 are forwarded to mpiexec (the ranks stop cleanly and exit
    ``128 + signal``, which is returned); a signal sent to the whole process
    group reaches mpiexec twice, which is harmless (the ranks keep a flag).

    Nothing is left behind (``research.comm.faults.lifeline``): mpiexec dies with this
    process, even by SIGKILL; once mpiexec returns, any process of the job
    still running here (tagged ``RESEARCH_JOB``) gets :data:`REAP_GRACE_S`
    seconds, then SIGKILL. With ``run_dir``, a rank's failure record there
    (``research.comm.faults.failures``) bounds the wait: an mpiexec that has not
    returned :data:`ABORTED_JOB_S` seconds after it (its own node frozen, a
    proxy that cannot be reached) is killed. ``env_extra`` is added to the
    job's environment.
    """
    global told_to_stop
    env = launch_env(
        dict(os.environ)
    )  # huge pages for malloc (research.comm.process.malloc)
    env.setdefault("PYTHONUNBUFFERED", "1")
    check_may_launch()
    launcher, extra_env = launch_command(np_, hosts)
    env.update(thread_env(threads))  # then the launcher's own (a cluster's) win
    env.update(extra_env)
    env.update(env_extra or {})
    env[JOB_ENV] = tag = uuid.uuid4().hex
    cmd = [*launcher, sys.executable, "-m", module, *argv]
    remove_orphaned_shm()  # a killed earlier job's MPICH segments
    proc = subprocess.Popen(cmd, env=env, preexec_fn=lifeline.lifeline_preexec())
    previous = {}

    def forward(signum: int, _frame: object) -> None:
        global told_to_stop
        told_to_stop = signum
        proc.send_signal(signum)

    if threading.current_thread() is threading.main_thread():
        for sig in FORWARDED_SIGNALS:
            previous[sig] = signal.signal(sig, forward)
    try:
        code = _wait(proc, run_dir, env.get("RESEARCH_ATTEMPT", "0"), module)
    except KeyboardInterrupt:  # as subprocess.call did: mpiexec got SIGINT too
        told_to_stop = signal.SIGINT
        proc.kill()
        proc.wait()
        code = 130
    finally:
        for sig, prev in previous.items():
            signal.signal(sig, prev)
    left = reap_job(tag)
    if left:
        print(
            f"{module}: ended {len(left)} processes the job left behind: "
            + ", ".join(f"{pid} ({name})" for pid, name in left),
            file=sys.stderr,
            flush=True,
        )
    if code != 0:
        remove_orphaned_shm()  # an aborted job's MPICH segments
    return code


#: Seconds after a rank's failure record within which mpiexec must return (the
#: aborting ranks' own bound, research.comm.world.ABORT_FALLBACK_S, and more).
ABORTED_JOB_S = 30.0


def _wait(proc: subprocess.Popen, run_dir: Any, attempt: str, module: str) -> int:
    """``proc.wait()``, bounded by the failure records in ``run_dir``."""
    if run_dir is None:
        return proc.wait()
    from research.comm.faults import failures

    while True:
        try:
            return proc.wait(1.0)
        except subprocess.TimeoutExpired:
            pass
        recs = failures.read(run_dir, int(attempt))
        if recs and time.time() - recs[0]["time"] > ABORTED_JOB_S:
            print(
                f"{module}: mpiexec still running {ABORTED_JOB_S:.0f} s after rank "
                f"{recs[0].get('rank')} ended the job ({recs[0].get('cause')}): "
                "killing it",
                file=sys.stderr,
                flush=True,
            )
            proc.kill()
            proc.wait()
            return 128 + signal.SIGKILL


def job_processes(tag: str) -> list[tuple[int, str]]:
    """``(pid, name)`` of this machine's processes whose environment holds
    ``RESEARCH_JOB=tag`` (those we may read: ours, or all as root)."""
    want = f"{JOB_ENV}={tag}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if want not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:  # ended meanwhile, or not ours to read
            continue
        if stat.rpartition(")")[2].split()[0] == "Z":
            continue  # a zombie: already ended, its parent will reap it
        found.append((int(pid), stat[stat.find("(") + 1 : stat.rfind(")")]))
    return found


def reap_job(tag: str, grace: float = REAP_GRACE_S) -> list[tuple[int, str]]:
    """End what is left of job ``tag`` here: wait up to ``grace`` seconds for
    its processes to end by themselves, then SIGKILL them; returns those
    killed."""
    end = time.monotonic() + grace
    while (left := job_processes(tag)) and time.monotonic() < end:
        time.sleep(0.1)
    for pid, _ in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return left


def maybe_relaunch(
    module: str, argv: list[str], np_: int, threads: int = 1, hosts: str = ""
) -> None:
    """Relaunch under mpiexec unless already launched by MPI or ``np_`` is 1
    on this node (this process alone); exits when it does."""
    if launched_by_mpi() or (np_ == 1 and not hosts):
        return
    try:
        code = relaunch(module, argv, np_, threads, hosts)
    except UsageError as e:
        print(f"{module}: error: {e}", file=sys.stderr)
        code = USAGE_EXIT
    raise SystemExit(code)
