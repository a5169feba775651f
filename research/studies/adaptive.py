"""The adaptive strategy against every fixed one while the link and the load change.

One MPI job per rank count runs every arm (``adaptive``, ``host``, ``sparse``,
``majority``, ``solo``) for every seed, seed by seed, on the same schedule:
the link's rate set with ``tc`` at fixed steps
(:mod:`research.studies.adaptive_link`) and one window of steps in which each
step one random rank is held up (``--straggler``). Fixed steps, not fixed
times: every arm trains the same steps under each condition, so a phase's time
is the same work for every arm and the arms compare phase by phase; the time
the change itself takes is outside every step. An arm's time to the target
counts everything after its run started: its set-up before the first step
(``start_s``: adaptive compiles every candidate's update and runs every
collective there) and its steps, the same for every arm.

The model was tuned on :data:`TUNED_SEEDS`; the default runs are judged on
:data:`JUDGED_SEEDS`, and the page says which.

Two scenarios (:data:`SCENARIOS`), chosen from the fixed arms' phase times
before adaptive's: ``mixed`` (the default), whose phases each favour another
method by far (a fast link: dense; a slow link: top-k; a strong straggler:
solo), and ``link-drop``, the first demonstration's (a slow link in which
top-k wins, a mild straggler).

:func:`analyze` reads the run folders: per phase the seconds each arm spent
in its steps, the time to the target test accuracy, the final accuracy, what
``adaptive`` ran, its switches and probes, and the oracle
(:mod:`research.studies.adaptive_oracle`); the checks and tables are
:mod:`research.studies.adaptive_report`'s.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path
from typing import Any

from research.studies.adaptive_oracle import schedule, stitch, time_to

#: The arms: strategy and its options (the density and the staleness bound come
#: from the config, the same for the fixed arms and adaptive's candidates).
ARMS = ("adaptive", "host", "sparse", "majority", "solo")
FIXED = ARMS[1:]
#: The seeds the adaptive model's constants were chosen on (issues 31, 43: its
#: bounds, the probing rule, the guard); its claims are judged on others.
TUNED_SEEDS = (0, 1, 2)
#: The seeds it is judged on by default: none of the tuned ones.
JUDGED_SEEDS = (3, 4, 5)

#: The scenarios: steps, the link's schedule, the straggler, the target, and
#: what the issue asks of adaptive on each (research.studies.adaptive_report).
SCENARIOS: dict[str, dict[str, Any]] = {
    "mixed": {
        "steps": 240,
        "link_schedule": "0:10gbit,40:1gbit,100:10gbit",
        "straggler": "random:k=1:seconds=0.32:start=100:end=180",
        "target_acc": 0.80,
        "about": "10 Gb/s (dense wins), 1 Gb/s (top-k wins), 10 Gb/s with a "
        "0.32 s straggler, eager-SGD's (solo wins), 10 Gb/s",
        "asks": {"oracle_gain": 1.25, "vs_best": 1.1, "vs_oracle": 1.15},
    },
    "link-drop": {
        "steps": 320,
        "link_schedule": "0:10gbit,60:1gbit,140:10gbit",
        "straggler": "random:k=1:seconds=0.1:start=160:end=220",
        "target_acc": 0.83,
        "about": "10 Gb/s, 1 Gb/s, 10 Gb/s, a 0.1 s straggler (the first "
        "demonstration's)",
        "asks": {"as_fast_as": "sparse"},
    },
}


def arm_strategy(cfg: Any, arm: str) -> tuple[str, dict[str, Any]]:
    """``(strategy, options)`` of an arm under ``cfg`` (the experiment's)."""
    if arm == "adaptive":
        opts = {"densities": str(cfg.density), "staleness": cfg.staleness}
        return "adaptive", {**opts, **cfg.adaptive_options}
    if arm == "sparse":
        return "sparse", {"density": cfg.density}
    if arm in ("majority", "solo"):
        return arm, {"full_every": cfg.staleness}
    return arm, {}


def phases(cfg: Any) -> list[dict[str, Any]]:
    """The schedule's windows of steps ``[start, end)`` with their rate and
    whether the straggler is on."""
    from research.imbalance import parse_imbalance
    from research.studies.adaptive_link import parse_schedule

    total = cfg.train.steps
    marks = {0, total}
    sched = parse_schedule(cfg.link_schedule)
    marks |= {s for s, _ in sched if s < total}
    straggler = parse_imbalance(cfg.straggler, size=max(cfg.nps))
    window = (getattr(straggler, "start", 0), getattr(straggler, "end", None))
    if straggler.name != "none":
        marks |= {min(window[0], total), min(window[1] or total, total)}
    bounds = sorted(marks)
    out = []
    for a, b in zip(bounds, bounds[1:]):
        rate = [r for s, r in sched if s <= a][-1]
        on = straggler.name != "none" and window[0] <= a < (window[1] or total)
        label = rate.replace("gbit", " Gb/s").replace("mbit", " Mb/s")
        out.append(
            {"start": a, "end": b, "rate": rate, "straggler": on,
             "label": label + (" + straggler" if on else "")}
        )  # fmt: skip
    return out


def run_job(cfg: Any, root: Path, world: Any) -> None:
    """Every seed and arm at this job's size, into ``root/np{P}/ARM-sSEED``."""
    from research.imbalance import parse_imbalance
    from research.studies.adaptive_link import LinkSchedule, parse_schedule
    from research.train.loop import Trainer

    sched = parse_schedule(cfg.link_schedule)
    # Two steps of dense first, apart: the arms share one process, so the
    # first arm would otherwise pay alone for compiling what all of them run.
    warm = dataclasses.replace(
        cfg.train, strategy=cfg.train.strategy.to("host"), steps=2,
        run_dir=str(root / f"np{world.size}" / "warm-up"),
    )  # fmt: skip
    Trainer(warm, world).run()
    for seed in cfg.seeds:
        for arm in cfg.arms:
            strategy, options = arm_strategy(cfg, arm)
            folder = root / f"np{world.size}" / f"{arm}-s{seed}"
            train = dataclasses.replace(
                cfg.train,
                strategy=cfg.train.strategy.to(strategy, options),
                seed=seed,
                run_dir=str(folder),
            )
            imbalance = parse_imbalance(cfg.straggler, size=world.size, seed=seed)
            world.log(f"{arm}, seed {seed}, {world.size} ranks -> {folder}")
            link = [] if cfg.no_link else [LinkSchedule(root / "link", sched)]
            Trainer(train, world, imbalance=imbalance, callbacks=link).run()


# -- reading the runs ---------------------------------------------------------------
def _load_run(folder: Path) -> dict[str, Any]:
    from research.rundir import read_metrics

    summary = json.loads((folder / "summary.json").read_text())
    rows = read_metrics(folder)
    steps = [r for r in rows if "step_time" in r and not r.get("kind")]
    return {
        "summary": summary,
        "steps": steps,
        "switches": [r for r in rows if r.get("kind") in ("switch", "decision")],
        "changes": [r for r in rows if r.get("kind") == "change"],
        "evals": summary.get("evals", []),
    }


def _within(steps: list[dict], phase: dict) -> list[dict]:
    """The step rows of a phase: 0-based steps ``[start, end)`` are the rows
    ``step`` ``start + 1 .. end`` (a row counts the steps done)."""
    return [r for r in steps if phase["start"] < r["step"] <= phase["end"]]


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


#: How many of the new method's steps after a switch make its own pace.
NEXT = 10


def _next_steps(steps: list[dict], after: int, method: str, own: Any) -> float | None:
    """The median of the (at most :data:`NEXT`) steps after step ``after`` that
    ran ``method``, as ``own`` counts them; None under three such steps."""
    xs = [
        own(r)
        for r in steps
        if after < r["step"] <= after + NEXT and r.get("comm_method") == method
    ]
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if len(xs) >= 3 else None


def _own(r: dict) -> float | None:
    """A step's seconds less the delay injected into this rank (rank 0's
    rows): the same for a switch's step and the steps it is held to."""
    t = r.get("step_time")
    return None if t is None else t - (r.get("delay_s") or 0.0)


def fixed_arm(label: str) -> str:
    """The fixed arm that runs a candidate (``"sparse:0.05"`` -> ``"sparse"``)."""
    return label.split(":")[0]


def _beside_fixed(adaptive: list[dict], loaded: dict[int, dict[str, dict]]) -> None:
    """Give each switch of ``adaptive`` (its per-seed figures) ``fixed_s``: the
    step the new method's fixed arm took at the same step of the same seed (the
    same straggler draw and the same moment of the link's schedule), or None."""
    for r in adaptive:
        for s in r["switch_steps"]:
            fixed = loaded.get(r["seed"], {}).get(fixed_arm(s["to"]))
            rows = fixed["steps"] if fixed else []
            row = next((x for x in rows if x["step"] == s["step"] + 1), None)
            s["fixed_s"] = None if row is None else _own(row)


def start_of(run: dict) -> float:
    """The seconds a run spent before its first step (``start_s``; a run
    recorded before every run had it: adaptive's own start-up, else 0)."""
    summary = run["summary"]
    if summary.get("start_s") is not None:
        return float(summary["start_s"])
    return float(
        ((summary.get("adaptive") or {}).get("startup") or {}).get("seconds", 0)
    )


def _per_seed(run: dict, arm: str, ph: list[dict], target: float) -> dict:
    steps = run["steps"]
    methods = []
    for p in ph:
        counts: dict[str, int] = {}
        for r in _within(steps, p):
            m = r.get("comm_method", arm)
            counts[m] = counts.get(m, 0) + 1
        methods.append(counts)
    by_step = {r["step"]: r for r in steps}
    switches = [s for s in run["switches"] if s["kind"] == "switch"]

    return {
        "phase_s": [sum(r["step_time"] for r in _within(steps, p)) for p in ph],
        "total_s": sum(r["step_time"] for r in steps),
        "start_s": start_of(run),
        "to_target_s": start_of(run) + time_to(run["evals"], target),
        "final_acc": run["summary"].get("final_test_acc"),
        "methods": methods,
        "adaptive": run["summary"].get("adaptive"),
        "switches": len(switches),
        # The step each switch happened at (its row counts it done) and its time.
        "switch_steps": [
            {
                "step": s["step"],
                "to": s["to"],
                "reason": s["reason"],
                "seconds": _own(by_step.get(s["step"] + 1, {})),
                "switch_s": (s.get("switch_ms") or 0.0) / 1e3,
                "next_s": _next_steps(steps, s["step"] + 1, s["to"], _own),
            }
            for s in switches
        ],  # fmt: skip
        "first_step_s": by_step.get(1, {}).get("step_time"),
        # A phase's ordinary step: its median step time (the first step
        # apart), each less the delay injected into rank 0.
        "ordinary_s": [
            _median([_own(r) for r in _within(steps, p) if r["step"] > 1]) for p in ph
        ],
        "changes": run["changes"],
    }


def analyze(root: Path, cfg: Any) -> dict[str, Any]:
    """Per rank count: every arm's figures per seed and the oracle's (the
    checks: :func:`research.studies.adaptive_report.checks`)."""
    ph = phases(cfg)
    out: dict[str, Any] = {
        "scenario": getattr(cfg, "scenario", ""),
        "phases": ph,
        "target": cfg.target_acc,
        "seeds": list(cfg.seeds),
        "tuned_seeds": list(TUNED_SEEDS),
        "np": {},
        "oracle": {},
    }
    for np_dir in sorted(root.glob("np*"), key=lambda d: int(d.name[2:])):
        P = int(np_dir.name[2:])
        arms: dict[str, Any] = {}
        loaded: dict[int, dict[str, dict]] = {}
        for arm in cfg.arms:
            per_seed = []
            for seed in cfg.seeds:
                folder = np_dir / f"{arm}-s{seed}"
                if not (folder / "summary.json").exists():
                    continue
                run = _load_run(folder)
                loaded.setdefault(seed, {})[arm] = run
                per_seed.append(
                    {"seed": seed, **_per_seed(run, arm, ph, cfg.target_acc)}
                )
            if per_seed:
                arms[arm] = per_seed
        if not arms:  # a rank count with none of these seeds' runs: no table
            continue
        out["np"][P] = arms
        _beside_fixed(arms.get("adaptive", []), loaded)
        fixed = [a for a in FIXED if a in arms]
        seeds = [s for s in cfg.seeds if all(a in loaded.get(s, {}) for a in fixed)]
        if fixed and seeds:
            plan = schedule(
                {
                    a: [r["phase_s"] for r in arms[a] if r["seed"] in seeds]
                    for a in fixed
                }
            )
            runs = [
                {"seed": s, **stitch(loaded[s], plan, ph, cfg.target_acc)}
                for s in seeds
            ]
            for r in runs:
                r.pop("evals")
                # It starts as the arm of its first phase does, then never
                # pays for a switch.
                r["start_s"] = start_of(loaded[r["seed"]][plan[0]])
                r["to_target_s"] += r["start_s"]
            out["oracle"][P] = {"schedule": plan, "runs": runs}
    return out
