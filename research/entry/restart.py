"""Restart a job that ended abnormally, on the nodes that still answer.

``python -m experiments.train --max-restarts N [--hosts n1,n2] ...`` runs the job
under mpiexec; when it ends abnormally (any exit code but 0, 2 for bad input,
and a stop the launcher itself forwarded: Ctrl-C, SIGTERM, SIGUSR1), up to N
times:

1. **Why.** The failure records the ranks wrote (:mod:`research.comm.faults.failures`:
   ``comm-timeout`` from the watchdog, ``exception``), earliest first; without
   one, ``exit N`` (a rank killed, a node lost: mpiexec returns at once).
2. **Where.** With hosts, each is asked to run ``true`` the way mpiexec reaches
   it, within :data:`PROBE_TIMEOUT_S`; those that do not answer are dropped and
   the job keeps its ranks per node on the rest. Without hosts there is no
   node to lose: the same ``--np`` again.
3. **How big.** A smaller world keeps the global batch (the per-rank batch
   grows to global / new size) and the first attempt's step count, so the
   learning-rate schedule and the loss curve continue; where the global batch
   does not divide, the per-rank batch is rounded and the learning rate scaled
   by the new global batch over the old (the linear scaling rule; with
   ``--scale-lr`` it follows by itself).
4. **From where.** The same ``--run-dir`` (chosen before the first attempt when
   not given): the run resumes from the newest step every rank committed, from
   the persistent tier where a node-local copy is gone
   (:mod:`research.checkpoint`); with no committed checkpoint it starts over
   from step 0 and says so.

Each restart is a record in ``RUN_DIR/restarts.json`` (cause, message, exit
code, lost nodes, world sizes, batch, when it failed: ``failed_at``, the
moment a rank declared it, and for a stall ``stalled_since``, the last
progress), completed by the restarted run's rank 0 after its first step (step
resumed, ``seconds_to_first_step`` from ``failed_at``, and
``seconds_from_stall`` from ``stalled_since``), copied into ``summary.json``
(``restarts``) and marked on the timeline (an event ``restart N`` on track
``restart``).

A node that comes back is not rejoined mid-run: the world only shrinks within
one run (growing it would need every rank to agree on a new world while the
others train); the same command run again starts on every host given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from research.comm.faults import failures
from research.entry.launch import relaunch
from research.rundir import read_restarts, write_restarts
from research.usage import USAGE_EXIT

#: Seconds a host gets to answer the probe.
PROBE_TIMEOUT_S = 15.0
#: Exit codes that are not failures: done, bad input.
NORMAL_EXITS = (0, USAGE_EXIT)


def resized(
    batch_size: int, lr: float, old_np: int, new_np: int, scale_lr: bool = False
) -> dict[str, Any]:
    """The per-rank batch and learning rate of a world of ``new_np`` ranks that
    continues one of ``old_np`` (module docstring, rule 3)."""
    global_batch = batch_size * old_np
    new_batch = max(1, round(global_batch / new_np))
    new_lr = lr
    if new_batch * new_np != global_batch and not scale_lr:
        new_lr = lr * new_batch * new_np / global_batch
    return {
        "batch_size": new_batch,
        "lr": new_lr,
        "global_batch_before": global_batch,
        "global_batch_after": new_batch * new_np,
    }


def answering(hosts: Sequence[str], timeout: float = PROBE_TIMEOUT_S) -> list[str]:
    """The hosts that mpiexec still reaches: from the first host that can run
    mpiexec, a one-rank job on each other host (its proxy connects back over
    the network, as a job's would) that must end within ``timeout``. A host
    whose own mpiexec cannot start (a local node that is gone) is not one."""
    from research.entry.launch import launch_command

    for base in hosts:
        alone = _probe([f"{base}:1"], timeout)
        if alone:
            break
    else:
        return []
    procs = {}
    for host in hosts:
        if host == base:
            continue
        try:
            cmd, env = launch_command(2, f"{base}:1,{host}:1")
        except Exception:  # noqa: BLE001 - a host that cannot be named is gone
            continue
        procs[host] = subprocess.Popen(
            [*cmd, "true"],
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    alive = [base]
    end = time.monotonic() + timeout
    for host, proc in procs.items():
        if _ended_well(proc, end):
            alive.append(host)
    return [h for h in hosts if h in alive]


def _probe(spec: list[str], timeout: float) -> bool:
    from research.entry.launch import launch_command

    try:
        cmd, env = launch_command(len(spec), ",".join(spec))
    except Exception:  # noqa: BLE001 - a node that is gone
        return False
    proc = subprocess.Popen(
        [*cmd, "true"],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return _ended_well(proc, time.monotonic() + timeout)


def _ended_well(proc: subprocess.Popen, end: float) -> bool:
    try:
        return proc.wait(max(0.1, end - time.monotonic())) == 0
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # its own session: mpiexec and what it started
        proc.wait()
        return False


def cause_of(run_dir: str | os.PathLike, attempt: int, code: int) -> dict[str, Any]:
    """What ended attempt ``attempt``: its earliest failure record, else the
    exit code.

    A rank's MPI error (``mpi-error``) is what it saw of another's end, not a
    cause of its own: a rank killed with SIGKILL records nothing, and its peer
    fails reading from it a moment later. So such records count only when no
    other was written, and then as the exit code's cause, with what the rank
    saw in the message.
    """
    recs = failures.read(run_dir, attempt)
    own = [r for r in recs if r.get("cause") != failures.MPI_ERROR]
    if own:
        first = own[0]
        out = {
            "cause": first.get("cause"),
            "message": first.get("message"),
            "failed_rank": first.get("rank"),
            "failed_host": first.get("host"),
            "failed_at": first.get("time"),
        }
        if first.get("quiet_s") is not None:  # the watchdog: stalled since then
            out["stalled_since"] = first["time"] - first["quiet_s"]
        return out
    words = _exit_words(code)
    out = {"cause": "exit", "message": f"the job (mpiexec or srun) ended with {words}"}
    if recs:  # only what the ranks saw of it
        seen = recs[0]
        out["message"] += f"; r{seen.get('rank')} then: {seen.get('message')}"
        out["failed_at"] = seen.get("time")
    return out


def _exit_words(code: int) -> str:
    """An exit code in words: a signal's name where it is 128 + a signal."""
    import signal

    if code < 0 or 128 < code <= 128 + 64:
        try:
            return f"exit code {code} ({signal.Signals(abs(code) % 128).name})"
        except ValueError:
            pass
    if code == 255:
        return "exit code 255 (a rank or a node was lost)"
    return f"exit code {code}"


def _say(text: str) -> None:
    print(f"restart: {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Job:
    """A job to run under restarts.

    Attributes:
      module, argv, np, threads, hosts: what :func:`research.entry.launch.relaunch`
        starts (``python -m MODULE ARGV`` on ``np`` ranks).
      run_dir: the run folder every attempt uses (absolute).
      batch_size, lr, scale_lr: the first attempt's, for rule 3.
      max_restarts: how many times a failed job is relaunched.
    """

    module: str
    argv: list[str]
    np: int
    threads: int
    run_dir: str
    batch_size: int
    lr: float
    scale_lr: bool = False
    hosts: str = ""
    max_restarts: int = 0


def run(job: Job) -> int:
    """Run ``job``, restarting it up to ``job.max_restarts`` times (module
    docstring); returns the exit code of the last attempt."""
    from research.entry import launch

    np_, batch_size, lr = job.np, job.batch_size, job.lr
    run_dir, max_restarts = job.run_dir, job.max_restarts
    where = launch.placement(job.hosts, np_) if job.hosts else []
    argv = [*job.argv, "--run-dir", run_dir]
    extra: list[str] = []
    attempt = 0
    while True:
        spec = ",".join(f"{h}:{n}" for h, n in where)
        env = {failures.ATTEMPT_ENV: str(attempt)}
        code = relaunch(
            job.module, argv + extra, np_, job.threads, spec, env_extra=env,
            run_dir=run_dir,
        )  # fmt: skip
        ended_at = time.time()
        if code in NORMAL_EXITS or launch.told_to_stop is not None:
            return code
        if attempt >= max_restarts:
            if max_restarts:
                _say(f"the job failed again (exit {code}); no restarts left")
            return code
        lost: list[str] = []
        if where:
            alive = answering([h for h, _ in where])
            lost = [h for h, _ in where if h not in alive]
            where = [(h, n) for h, n in where if h in alive]
            if not where:
                _say("no host answers; giving up")
                return code
        new_np = sum(n for _, n in where) if where else np_
        resized_flags = after_failure(
            run_dir, attempt=attempt, code=code, np_before=np_, np_after=new_np,
            lost=lost, batch_size=batch_size, lr=lr, scale_lr=job.scale_lr,
            ended_at=ended_at,
        )  # fmt: skip
        extra = resized_flags or extra
        if new_np != np_:
            batch_size = int(extra[extra.index("--batch-size") + 1])
            lr = float(extra[extra.index("--lr") + 1])
        message = read_restarts(run_dir)[-1].get("message")
        _say(
            f"attempt {attempt} ended ({message}); lost nodes: "
            f"{', '.join(lost) or 'none'}; restarting on {new_np} ranks"
            + (f" ({', '.join(h for h, _ in where)})" if where else "")
            + f" ({attempt + 1} of {max_restarts})"
        )
        np_ = new_np
        attempt += 1


def _total_steps(run_dir: str) -> int | None:
    try:
        config = json.loads((Path(run_dir) / "config.json").read_text())
        return int(config["total_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def after_failure(
    run_dir: str,
    *,
    attempt: int,
    code: int,
    np_before: int,
    np_after: int,
    lost: Sequence[str],
    batch_size: int,
    lr: float,
    scale_lr: bool,
    ended_at: float | None = None,
) -> list[str]:
    """Record failed attempt ``attempt`` in ``run_dir``; the flags the
    restarted job needs on top of its own (rule 3; [] for the same world).
    ``ended_at``: when mpiexec returned (default: now)."""
    ended_at = ended_at or time.time()
    record: dict[str, Any] = {"restart": attempt + 1, "exit_code": code}
    record.update(cause_of(run_dir, attempt, code))
    record["failed_at"] = record.get("failed_at") or ended_at
    record["launcher_saw_it_at"] = ended_at
    record.update(
        lost_nodes=list(lost), world_size_before=np_before, world_size_after=np_after
    )
    extra: list[str] = []
    if np_after != np_before:
        sized = resized(batch_size, lr, np_before, np_after, scale_lr)
        record.update(sized)
        extra = ["--batch-size", str(sized["batch_size"]), "--lr", repr(sized["lr"])]
        steps = _total_steps(run_dir)
        if steps:
            extra += ["--steps", str(steps)]
    write_restarts(run_dir, [*read_restarts(run_dir), record])
    return extra


def main(argv: list[str] | None = None) -> None:
    """``python -m research.entry.restart after-failure ... -- FLAGS``: what a
    batch template calls between two attempts (``scripts/slurm.sbatch``), with
    the job's own flags after ``--``. Prints the flags to add, on one line.

    The same command line runs again: nothing of it is parsed but its
    ``--run-dir``; the first attempt's batch size and learning rate (rule 3)
    are what its rank 0 wrote to ``RUN_DIR/config.json``. Without a run folder,
    or before the first attempt wrote one, there is nothing to resume from or
    to resize against: no flags.
    """
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m research.entry.restart",
        epilog="Then -- and the job's own flags.",
    )
    p.add_argument("command", choices=["after-failure"])
    p.add_argument("--attempt", type=int, required=True)
    p.add_argument("--exit-code", type=int, required=True)
    p.add_argument("--np-before", type=int, required=True)
    p.add_argument("--np-after", type=int, required=True)
    p.add_argument("--lost", default="", help="lost nodes, comma-separated")
    # The job's flags after "--", split off by hand: a REMAINDER positional
    # after "command" would swallow this parser's own options too.
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    ns = p.parse_args(argv[:cut])
    run_dir = flag_value(argv[cut + 1 :], "--run-dir")
    first = _first_config(run_dir) if run_dir else None
    if first is None:
        print("", flush=True)  # nothing to resume from or resize against
        return
    extra = after_failure(
        run_dir,
        attempt=ns.attempt,
        code=ns.exit_code,
        np_before=ns.np_before,
        np_after=ns.np_after,
        lost=[h for h in ns.lost.split(",") if h],
        batch_size=int(first["batch_size"]),
        lr=float(first["lr"]),
        scale_lr=bool(first.get("scale_lr", False)),
    )
    print(" ".join(extra), flush=True)


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of the last ``flag VALUE`` or ``flag=VALUE`` in ``argv``."""
    found = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif a.startswith(flag + "="):
            found = a.split("=", 1)[1]
    return found


def _first_config(run_dir: str) -> dict[str, Any] | None:
    """The training config the run's rank 0 wrote (``config.json``), or None."""
    try:
        record = json.loads((Path(run_dir) / "config.json").read_text())
        return dict(record["config"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


if __name__ == "__main__":
    main()
