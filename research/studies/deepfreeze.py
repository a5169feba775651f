"""DeepFreeze's logic: the interleaved checkpointing job, its table and targets.

``python -m experiments.deepfreeze`` (the paper, the commands and the measured
table are in its docstring) parses the flags, starts the jobs with
:func:`launch_jobs` (or runs :func:`run_job` when started under mpiexec) and
prints :func:`report`; the table reads nothing but the jobs' JSON files.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from research.comm.process.malloc import launch_env
from research.entry.cli import check_private_dir
from research.entry.launch import (
    bind_args,
    check_may_launch,
    launch_command,
    mpiexec_path,
)
from research.threads import thread_env

#: Rounds of the extra jobs for the ranks figure (blocking times only).
RANKS_JOB_ROUNDS = 2


def check_flags(cfg: Any) -> str | None:
    """The first problem with the experiment's own values as one line, or None
    (``cfg``: ``experiments.deepfreeze.Config``)."""
    if min([cfg.interval, cfg.window, cfg.rounds, *cfg.intervals]) < 1:
        return "--interval, --intervals, --window and --rounds must be >= 1"
    if cfg.interval > cfg.window or max(cfg.intervals, default=1) > cfg.window:
        return f"intervals must not exceed --window ({cfg.window})"
    if not 0 < cfg.settle < cfg.window:
        return f"--settle must be between 1 and --window - 1 ({cfg.window - 1})"
    if cfg.minor_rounds < 1:
        return "--minor-rounds must be >= 1"
    from research.checkpoint.savers import check_saver_options

    for saver in cfg.savers:
        problem = check_saver_options(saver, {})
        if problem:
            return f"--savers: {problem}"
    if cfg.tiers != "persistent" and cfg.train.fast_dir != "auto":
        return check_private_dir(cfg.train.fast_dir, "--fast-dir")
    return None


# -- inside an MPI job -----------------------------------------------------------------
def arms_and_configs(cfg: Any) -> tuple[dict, dict, dict]:
    """The arms ``{name: (saver, interval)}``, a config per saver, and the
    minor arms ``{name: periods}`` (no target depends on them)."""
    from research.checkpoint import CheckpointConfig

    fast = None if cfg.tiers == "persistent" else cfg.train.fast_dir
    df = CheckpointConfig(
        saver="deepfreeze",
        fast_dir=fast,
        snapshot=cfg.snapshot,
        writer=cfg.writer,
        nice=cfg.nice,
        idle=cfg.writer_priority == "idle",
    )
    configs = {s: CheckpointConfig(saver=s) for s in cfg.savers}
    arms: dict[str, tuple[str, int]] = {"none": ("none", 0)}
    for s in cfg.savers:
        arms[f"{s}@{cfg.interval}"] = (s, cfg.interval)
    if "deepfreeze" in configs:
        configs["deepfreeze"] = df
        if cfg.job != "ranks":
            # Requests while one is in flight: every step, wait and skip policies.
            configs["deepfreeze-skip"] = dataclasses.replace(df, on_busy="skip")
            arms["deepfreeze@1"] = ("deepfreeze", 1)
            arms["deepfreeze-skip@1"] = ("deepfreeze-skip", 1)
    if cfg.job != "ranks":
        for s in ("rank0-blocking", "deepfreeze"):
            for i in cfg.intervals:
                if s in configs and i != cfg.interval:
                    arms[f"{s}@{i}"] = (s, i)
    minor = {
        a: cfg.minor_rounds for a, (_, i) in arms.items() if i not in (0, cfg.interval)
    }
    return arms, configs, minor


def run_job(cfg: Any, root: Path) -> dict[str, Any]:
    """One MPI job: the interleaved run; rank 0 writes ``<root>/<job>-np<P>.json``
    (``cfg``: ``experiments.deepfreeze.Config``)."""
    from research.comm.world import get_world, install_abort_on_error
    from research.studies.checkpoint_bench import run_interleaved
    from research.train.process import freeze_imports

    logging.getLogger("absl").setLevel(logging.ERROR)  # Orbax's per-save chatter
    world = get_world()
    install_abort_on_error()
    freeze_imports()
    job = "ranks" if cfg.job == "ranks" else "main"
    train = dataclasses.replace(
        cfg.train,
        run_dir=str(root / f"{job}-np{world.size}"),
        progress=False,
        trace=cfg.train.trace and job != "ranks",
    )
    arms, configs, minor = arms_and_configs(cfg)
    # The ranks figure needs blocking times only: a few rounds are plenty.
    rounds = min(RANKS_JOB_ROUNDS, cfg.rounds) if job == "ranks" else cfg.rounds
    if world.rank == 0:
        print(
            f"r0 | {job} job, {world.size} ranks: {len(arms)} arms x {rounds} "
            f"rounds of {cfg.window}-step periods (settle {cfg.settle}) "
            f"-> {train.run_dir}",
            flush=True,
        )
    out = run_interleaved(
        world,
        train,
        configs,
        arms,
        rounds=rounds,
        window=cfg.window,
        settle=cfg.settle,
        minor=minor,
        seed=cfg.train.seed,
    )
    out.update(job=job, interval=cfg.interval, tiers=cfg.tiers)
    # Which cores each rank could run on (--bind core: its own), for the record.
    out["cpu_affinity"] = world.comm.allgather(sorted(os.sched_getaffinity(0)))
    if world.rank == 0:
        path = root / f"{job}-np{world.size}.json"
        path.write_text(json.dumps(out, indent=1) + "\n")
        print(f"r0 | wrote {path}", flush=True)
    world.barrier()
    return out


# -- the table (no MPI) ----------------------------------------------------------------
def _current(job: dict) -> dict:
    """A job file in today's words: files written before the savers' rename say
    "strategy"/"strategies" and "rank0-sync"/"orbax-sync" for the savers."""
    old = {"rank0-sync": "rank0-blocking", "orbax-sync": "orbax-blocking"}

    def name(n: str) -> str:
        return old.get(n, n)

    if "strategies" in job:
        job["savers"] = {name(k): v for k, v in job.pop("strategies").items()}
    for arm in job.get("arms", {}).values():
        if "strategy" in arm:
            arm["saver"] = name(arm.pop("strategy"))
    return job


def load_results(root: Path) -> tuple[dict | None, list[dict]]:
    """The main job's results and every job's (for the ranks figure)."""
    jobs = [
        _current(json.loads(p.read_text())) for p in sorted(root.glob("*-np*.json"))
    ]
    main = next((j for j in jobs if j["job"] == "main"), None)
    return main, jobs


def table_rows(main: dict) -> list[dict[str, Any]]:
    """One row per saver at the main interval, the placebo (``none``) first."""
    rows = []
    iv = str(main["interval"])
    for a in main["arms"].values():
        if a["saver"] != "none" and a["interval"] != main["interval"]:
            continue
        row = {
            "saver": a["saver"],
            "overhead": a["overhead"],
            "ci": a.get("overhead_ci90"),
            "diff_ci": a.get("diff_ci90"),
            "cost_s": a.get("cost_s"),
            "periods": a.get("periods"),
            "raw_overhead": a.get("raw_overhead"),
            "raw_ci": a.get("raw_ci90"),
            "drain_s": a.get("drain_s"),
        }
        if a["saver"] == "none":
            rows.insert(0, row)
            continue
        st = main["savers"][a["saver"]]
        d = st["by_interval"].get(iv, {})
        b = [x for x in d.get("bytes_per_rank", []) if x] or [0]
        row.update(
            {
                "blocking_s": d.get("median_blocking_s"),
                "committed_s": d.get("median_committed_s"),
                "persisted_s": d.get("median_persisted_s"),
                "restore_s": st.get("restore_s"),
                "mb_min": min(b) / 1e6,
                "mb_max": max(b) / 1e6,
                "writers": len([x for x in d.get("bytes_per_rank", []) if x]),
                "cpu_s": d.get("median_writer_cpu_s"),
                "cpu_s_per_mb": d.get("median_writer_cpu_s_per_mb"),
            }
        )
        rows.append(row)
    return rows


def _pct(v: float, ci: list[float] | None) -> str:
    ci_text = f" [{ci[0]:+.1%}, {ci[1]:+.1%}]" if ci else ""
    return f"{v:+.1%}{ci_text}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def format_table(main: dict) -> str:
    """Markdown table, targets and the in-flight measurement."""
    rows = table_rows(main)
    head = [
        "saver",
        "blocking ms (median)",
        "committed s",
        "persisted s",
        f"overhead @{main['interval']} [90% CI]",
        "cost ms/ckpt",
        "minus deepfreeze [90% CI]",
        "restore s",
        "MB written/rank/ckpt",
        "writer CPU ms/ckpt (ms/MB)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        diff = r.get("diff_ci")
        diff_text = f"[{diff[0]:+.1%}, {diff[1]:+.1%}]" if diff else "-"
        if r["saver"] == "none":
            lines.append(
                f"| none (placebo, uncorrected) | - | - | - | "
                f"{_pct(r['raw_overhead'], r['raw_ci'])} | - | - | - | - | - |"
            )
            continue
        mb = (
            f"{r['mb_max']:.1f} (rank 0 only)"
            if r["writers"] == 1
            else f"{r['mb_min']:.1f}-{r['mb_max']:.1f} ({r['writers']} ranks)"
        )
        lines.append(
            f"| {r['saver']} | {_ms(r['blocking_s'])} | "
            f"{_s(r['committed_s'])} | {_s(r['persisted_s'])} | "
            f"{_pct(r['overhead'], r.get('ci'))} | {_ms(r['cost_s'])} | "
            f"{diff_text if r['saver'] != 'deepfreeze' else '-'} | "
            f"{_s(r['restore_s'])} | {mb} | "
            f"{_ms(r.get('cpu_s'))} ({_ms(r.get('cpu_s_per_mb'))}) |"
        )
    lines.append("")
    periods = max((r.get("periods") or 0) for r in rows)
    lines.append(
        f"model {main['model']}, {main['ranks']} ranks, reference step "
        f"{main['reference_step_s'] * 1e3:.0f} ms, {periods} periods of "
        f"{main['window']} steps per arm (checkpoint at the first step, its work "
        f"waited for {main['settle']} steps later); cost = charged steps minus as "
        "many local clean steps, mean over periods, less the placebo's; "
        "overhead = cost / reference time of a period; 90% CIs from a "
        "bootstrap over rounds "
        "(research/checkpoint/overhead.py); writer CPU: median per writing "
        "rank and checkpoint, on the writer's own CPU clock "
        "(research/checkpoint/cpuclock.py), per MB of one tier's shard"
    )
    lines += targets(rows, main)
    return "\n".join(lines)


def _check(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def targets(rows: list[dict], main: dict) -> list[str]:
    """The issue's targets (PASS/FAIL), the placebo check and the in-flight
    policies, as printed lines."""
    by = {r["saver"]: r for r in rows}
    out = []
    df, r0, none = by.get("deepfreeze"), by.get("rank0-blocking"), by.get("none")
    if none and none.get("raw_ci"):
        out.append(
            f"method: the placebo (periods without a checkpoint, measured alike) "
            f"came out at {_pct(none['raw_overhead'], none['raw_ci'])}; every "
            "overhead above is relative to it"
        )
    if df and r0 and df.get("blocking_s") is not None and r0.get("blocking_s"):
        ratio = df["blocking_s"] / r0["blocking_s"]
        out.append(
            f"target: DeepFreeze blocking {ratio:.1%} of rank0-blocking's "
            f"(<= 10%): {_check(ratio <= 0.10)}"
        )
    if df and main["interval"] == 10:
        upper = f", upper 90% bound {df['ci'][1]:+.1%}" if df.get("ci") else ""
        out.append(
            f"target: DeepFreeze overhead {df['overhead']:+.1%} at a checkpoint "
            f"every 10 steps (<= 5%; CheckFreq 3.5%{upper}): "
            f"{_check(df['overhead'] <= 0.05)}"
        )
    if df and df.get("cpu_s_per_mb") is not None:
        per_mb = df["cpu_s_per_mb"] * 1e3
        out.append(
            f"target: DeepFreeze writer CPU {per_mb:.2f} ms per MB "
            f"({_ms(df['cpu_s'])} ms per checkpoint; <= 1.5 ms/MB): "
            f"{_check(per_mb <= 1.5)}"
        )
    others = [r for r in rows if r["saver"] not in ("none", "deepfreeze")]
    if df and others:
        out.append(_separation(df, others))
    for arm, policy in (("deepfreeze@1", "wait"), ("deepfreeze-skip@1", "skip")):
        a = main["arms"].get(arm)
        st = main["savers"].get(a["saver"]) if a else None
        d = st["by_interval"].get("1") if st else None
        if d:
            out.append(
                f"in flight (checkpoint every step, policy {policy}): "
                f"{d['checkpoints']} requests, {d['stalled']} waited (median "
                f"wait {_ms(d['median_wait_s'])} ms, max blocking "
                f"{_ms(max(d['blocking_s']))} ms), {d['skipped']} skipped, "
                f"overhead {a['overhead']:.0%}"
            )
    return out


def _separation(df: dict, others: list[dict]) -> str:
    """Is DeepFreeze's overhead the lowest, every difference's 90% CI above 0?"""
    if not all(r.get("diff_ci") for r in others) or not df.get("ci"):
        return "target: DeepFreeze overhead lowest, CIs separated: FAIL (no CIs)"
    lowest = all(df["overhead"] < r["overhead"] for r in others)
    apart = [r["saver"] for r in others if r["diff_ci"][0] > 0]
    disjoint = [r["saver"] for r in others if df["ci"][1] < r["ci"][0]]
    ok = lowest and len(apart) == len(others)
    return (
        f"target: DeepFreeze overhead lowest of all savers, separated "
        f"(90% CI of each difference above 0): {_check(ok)} (lowest {lowest}; "
        f"difference above 0 for {', '.join(apart) or 'none'}; the two 90% "
        f"CIs themselves disjoint for {', '.join(disjoint) or 'none'})"
    )


def launch_jobs(cfg: Any, argv: list[str], root: Path, module: str) -> int:
    """Start the main job and the ranks-sweep jobs under mpiexec, one at a time.

    Each job runs ``python -m module argv --run-dir root --job JOB``; with
    ``cfg.bind == "core"`` each rank is bound to ``cfg.train.threads`` cores (at
    least one; :func:`research.entry.launch.bind_args`), and so are its writer
    process and threads.
    """
    env = dict(launch_env(os.environ), **thread_env(cfg.train.threads))
    env["PYTHONUNBUFFERED"] = "1"
    check_may_launch()
    mpiexec = mpiexec_path()
    bind: list[str] = []
    if cfg.bind == "core" and cfg.train.threads < 1:
        print(
            "note: --bind core needs --threads >= 1 (cores per rank); with XLA's "
            "default threads the ranks run unbound",
            file=sys.stderr,
            flush=True,
        )
    elif cfg.bind == "core":
        bind = bind_args(mpiexec, cfg.train.threads) or []
        if not bind:
            print(
                f"warning: {mpiexec} is not MPICH's Hydra, so --bind core is not "
                "applied: ranks run unbound (bind them with your launcher's own "
                "option, or pass --bind none to silence this)",
                file=sys.stderr,
                flush=True,
            )
    rest = [
        sys.executable,
        "-m",
        module,
        *argv,
        "--run-dir",
        str(root),
    ]
    jobs = [(cfg.np, "main")] + [(n, "ranks") for n in cfg.sweep_ranks if n != cfg.np]
    for n, job in jobs:
        launcher, extra = launch_command(n, cfg.hosts)
        cmd = [*launcher, *bind, *rest, "--job", job]
        code = subprocess.call(cmd, env={**env, **extra})
        if code != 0:
            return code
    return 0


def report(root: Path, plot: Callable[[Path], list[Path]] | None = None) -> str | None:
    """Table (printed, table.md) and figures from the job files in ``root``.

    ``plot(root)`` draws the figures and returns their paths (None: no figures).
    """
    main, _ = load_results(root)
    if main is None:
        return None
    text = format_table(main)
    (root / "table.md").write_text(text + "\n")
    print(text, flush=True)
    if plot is not None:
        for path in plot(root):
            print(f"figure {path}", flush=True)
    print(f"results in {root}", flush=True)
    return text
