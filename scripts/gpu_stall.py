"""A stalled rank ends the job: SIGSTOP one of 2 ranks mid-run, on each allreduce path.

    python -m scripts.gpu_stall [--paths fused-mpi,fused-ring,host] \\
        [--comm-timeout 20] [--json OUT.json] [--out DIR]

For each path, ``python -m experiments.train --np 2`` trains (on the GPU where
the machine has one; ``JAX_PLATFORMS=cpu`` rehearses the same on the CPU); once
it has logged step 5, its rank 1 is stopped with SIGSTOP, as a frozen node or a
rank stuck in a driver would be. What is measured per path:

* the job's exit code (the communication watchdog's 124 expected);
* seconds from the stop to the job's end, against ``--comm-timeout`` plus
  :data:`BOUND_S` (the watchdog's warning, roll call and abort);
* the watchdog's line on rank 0 (``no progress ... in <collective>``), which
  names what it waited in;
* processes of the job left after its end (none expected), and on a GPU the
  compute processes ``nvidia-smi`` still lists for the job (none expected).

Paths: ``fused-mpi`` (``fused`` with ``allreduce=mpi``: mpi4jax inside the
jitted step; on GPU arrays mpi4jax's CUDA path, staged through host unless the
MPI is CUDA-aware), ``fused-ring`` (``fused`` with ``allreduce=ring``: on GPU
arrays the ring staged through host by XLA's host callback, on the CPU the
ring's custom call), ``host`` (gradients to the host, the host allreduce).
The wait of the first two is inside XLA's program, where no Python runs: the
watchdog sees it from its own thread while the training thread blocks on the
step's result. ``scripts/gpu_check.py``'s ``stall`` stage runs this.

Every job is tagged through its environment, so its processes (the launcher,
mpiexec, the ranks) are found and, whatever happened, ended: nothing of a check
outlives it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: Seconds past ``--comm-timeout`` a stalled job may take to end: the
#: watchdog's polling, its roll call of the ranks and the launcher's clean-up.
BOUND_S = 15.0
#: The strategy flags of each path.
PATHS: dict[str, list[str]] = {
    "fused-mpi": ["--strategy", "fused", "--strategy-opt", "allreduce=mpi"],
    "fused-ring": ["--strategy", "fused", "--strategy-opt", "allreduce=ring"],
    "host": ["--strategy", "host"],
}
TAG = "RESEARCH_STALL_TAG"
_WATCHDOG = re.compile(r"r0 \| comm watchdog: no progress[^\n]*ending the job[^\n]*")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m scripts.gpu_stall",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "--paths",
        default=",".join(PATHS),
        help="comma-separated, of: " + ", ".join(PATHS) + " (default: all)",
    )
    p.add_argument(
        "--comm-timeout",
        type=float,
        default=20.0,
        help="the jobs' --comm-timeout in seconds (default %(default)s)",
    )
    p.add_argument("--model", default="cnn_small", help="default %(default)s")
    p.add_argument("--out", default="runs/gpu-stall", help="folder of the jobs")
    p.add_argument("--json", help="write the rows here as JSON")
    args = p.parse_args(argv)
    args.paths = [s.strip() for s in args.paths.split(",") if s.strip()]
    bad = sorted(set(args.paths) - set(PATHS))
    if bad:
        p.error(f"--paths: unknown {', '.join(bad)}; choose from {', '.join(PATHS)}")
    if args.comm_timeout < 5:
        p.error(f"--comm-timeout must be >= 5 s, got {args.comm_timeout}")
    return args


def tagged(tag: str) -> dict[int, dict[str, str]]:
    """``{pid: {"rank": PMI_RANK or "", "cmd": command line}}`` of the
    processes whose environment carries ``tag``."""
    out: dict[int, dict[str, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if f"{TAG}={tag}".encode() not in env:
            continue
        rank = next((e[9:] for e in env if e.startswith(b"PMI_RANK=")), b"")
        out[int(entry.name)] = {"rank": rank.decode(), "cmd": cmd.decode().strip()}
    return out


def gpu_pids() -> set[int] | None:
    """Pids of the GPU's compute processes, or None without ``nvidia-smi``."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return {int(x) for x in out.stdout.split() if x.strip().isdigit()}


def _logged_step(metrics: Path, step: int) -> bool:
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return False
    for line in reversed(lines):
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if row.get("kind", "step") == "step" and row.get("step", 0) >= step:
                return True
    return False


def _end_all(tag: str) -> None:
    """Continue, then kill, every process of the job (stopped ones included)."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        for pid in tagged(tag):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def stall(path: str, args: argparse.Namespace, platform_env: dict[str, str]) -> dict:
    """One path: train, stop rank 1 at step 5, measure how the job ends."""
    run_dir = Path(args.out).absolute() / path
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier job's metrics
    run_dir.mkdir(parents=True)
    tag = uuid.uuid4().hex
    cmd = [sys.executable, "-m", "experiments.train", "--np", "2"]
    cmd += PATHS[path] + ["--model", args.model, "--steps", "1000000"]
    cmd += ["--log-every", "1", "--eval-every", "1000000", "--no-progress"]
    cmd += ["--no-tensorboard", "--comm-timeout", f"{args.comm_timeout:g}"]
    cmd += ["--run-dir", str(run_dir)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", **platform_env)
    env[TAG] = tag
    for var in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK"):
        env.pop(var, None)
    row: dict[str, Any] = {"path": path, "comm_timeout_s": args.comm_timeout}
    log = run_dir / "job.log"
    start_by = time.monotonic() + 240  # compile and reach step 5
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=out, start_new_session=True
        )
    try:
        while proc.poll() is None and time.monotonic() < start_by:
            if _logged_step(run_dir / "metrics.jsonl", 5):
                break
            time.sleep(0.2)
        if proc.poll() is not None or time.monotonic() >= start_by:
            row["problem"] = (
                f"the job ended (rc {proc.poll()}) before step 5"
                if proc.poll() is not None
                else "no step 5 within 240 s"
            )
            return row
        procs = tagged(tag)
        ranks = {
            p: v for p, v in procs.items() if v["rank"] == "1" and "python" in v["cmd"]
        }
        if not ranks:
            row["problem"] = "rank 1's process not found"
            return row
        pid = min(ranks)  # the rank itself, not a child it started
        row["gpu_pids_before"] = sorted((gpu_pids() or set()) & set(procs))
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        limit = args.comm_timeout + BOUND_S + 60  # measure past the bound
        try:
            row["rc"] = proc.wait(limit)
        except subprocess.TimeoutExpired:
            row["rc"] = None
        row["end_s"] = round(time.monotonic() - t0, 2)
        row["within_bound"] = row["rc"] is not None and row["end_s"] <= (
            args.comm_timeout + BOUND_S
        )
        time.sleep(2.0)  # what the launcher's clean-up still has to end
        row["left"] = [v["cmd"][:80] for v in tagged(tag).values()]
        left_gpu = gpu_pids()
        row["gpu_pids_left"] = (
            None if left_gpu is None else sorted(left_gpu & set(procs))
        )
        line = _WATCHDOG.search(log.read_text(errors="replace"))
        row["watchdog_line"] = line.group(0)[:300] if line else None
        return row
    finally:
        _end_all(tag)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def passed(row: dict) -> bool:
    """Exit 124 within the bound, the collective named, nothing left."""
    return (
        row.get("rc") == 124
        and bool(row.get("within_bound"))
        and bool(row.get("watchdog_line"))
        and not row.get("left")
        and not row.get("gpu_pids_left")
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    on_gpu = bool(gpu_pids() is not None and os.environ.get("JAX_PLATFORMS") != "cpu")
    platform_env = {} if on_gpu else {"JAX_PLATFORMS": "cpu"}
    rows = []
    for path in args.paths:
        row = stall(path, args, platform_env)
        row["platform"] = "gpu" if on_gpu else "cpu"
        row["passed"] = passed(row)
        rows.append(row)
        print(
            f"gpu_stall: {path} on {row['platform']}: rc {row.get('rc')} in "
            f"{row.get('end_s', float('nan'))} s (timeout {args.comm_timeout:g} s), "
            f"{'PASS' if row['passed'] else 'FAIL'}"
            + (f"; {row['problem']}" if row.get("problem") else ""),
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
