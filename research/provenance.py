"""Where a result came from: ``RUN_ROOT/run.json``, written as each job starts.

Every ``python -m experiments.NAME`` job appends one record to its run root's
``run.json``: the command as typed (``python -m experiments.NAME ARGS``), the
UTC time, the machine (host, CPU model, cores, memory), the load average when
it started and when it ended, the git commit of the code (with ``+dirty`` when
the tree had changes) and the world size; where the ranks span several nodes,
the nodes' hostnames (``hosts``) and the link between them (``network``, e.g.
"real network link, 4 nodes at 1gbit per node (local cluster, TCP)"). An
experiment that runs several MPI jobs into one root (DeepFreeze's 1/2/4-rank
jobs) gets one record per job. ``python -m scripts.results`` keeps it beside
``docs/results/NAME.md`` with the run's other small files and renders the
page from them, so every table in the docs says what produced it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FILE = "run.json"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None
    return round(pages * size / 2**30, 1)


def _commit() -> str | None:
    """The code's commit: ``RESEARCH_COMMIT`` where it is set (a copy whose git
    cannot say it: a working tree sent to a lent GPU machine carries the git of
    an earlier commit), else :func:`_git_commit` of this checkout."""
    given = os.environ.get("RESEARCH_COMMIT", "").strip()
    return given or _git_commit(Path(__file__).resolve().parent)


def _git_commit(where: Path) -> str | None:
    """``<sha>`` of the code's checkout, ``+dirty`` when it had changes; None
    outside a git checkout (an installed copy)."""
    try:
        sha = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _user_args(argv: list[str]) -> tuple[list[str], str | None]:
    """``argv`` without the ``--job NAME`` an experiment adds to its own
    sub-jobs (DeepFreeze), and that name: the command is what the user typed."""
    args, job, i = [], None, 0
    while i < len(argv):
        if argv[i] == "--job" and i + 1 < len(argv):
            job, i = argv[i + 1], i + 2
            continue
        if argv[i].startswith("--job="):
            job = argv[i].split("=", 1)[1]
        else:
            args.append(argv[i])
        i += 1
    return args, job


def job_record(
    experiment: str, world_size: int, module: str | None = None
) -> dict[str, Any]:
    """This job's record: command, time, machine, load, code version, world size.

    ``module``: the program that was typed (default ``experiments.<experiment>``).
    """
    args, job = _user_args(sys.argv[1:])
    module = module or f"experiments.{experiment}"
    return {
        "experiment": experiment,
        "command": shlex.join(["python", "-m", module, *args]),
        "job": job,
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "host": platform.node(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "commit": _commit(),
        "world_size": world_size,
    }


def _write(path: Path, jobs: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"jobs": jobs}, indent=1) + "\n")
    os.replace(tmp, path)


def record_job(
    root: str | Path,
    experiment: str,
    world_size: int,
    module: str | None = None,
    nodes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Append this job's record to ``root/run.json`` (call on one rank only).

    ``nodes``: ``{"hosts": [...], "network": label}`` where the ranks span
    several nodes (added to the record as they are).

    When the process ends normally the record gains ``ended_utc`` and
    ``load_average_end`` (the load the job itself and anything else running
    made); a job that was killed or aborted keeps only its start.
    """
    path = Path(root) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    jobs = read_jobs(root)
    record = {**job_record(experiment, world_size, module), **(nodes or {})}
    jobs.append(record)
    _write(path, jobs)
    atexit.register(_record_end, path, len(jobs) - 1)
    return record


def _record_end(path: Path, index: int) -> None:
    jobs = read_jobs(path.parent)
    if index >= len(jobs):  # the file was replaced meanwhile: leave it
        return
    jobs[index]["ended_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    jobs[index]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    with contextlib.suppress(OSError):  # the run folder is gone: nothing to do
        _write(path, jobs)


def read_jobs(root: str | Path) -> list[dict[str, Any]]:
    """The job records of ``root/run.json`` (empty when there is none)."""
    try:
        return list(json.loads((Path(root) / FILE).read_text())["jobs"])
    except (OSError, ValueError, KeyError, TypeError):
        return []
