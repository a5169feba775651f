"""The adaptive strategy against every fixed one while the link and the load change.

One MPI job per rank count runs every arm (``adaptive``, ``host``, ``sparse``,
``majority``, ``solo``) for every seed, seed by seed, on the same schedule:
the link's rate set with ``tc`` at fixed steps
(:mod:`research.studies.adaptive_link`) and one window of steps in which each
step one random rank is held up (``--straggler``). Fixed steps, not fixed
times: every arm trains the same steps under each condition, so a phase's time
is the same work for every arm and the arms compare phase by phase; the time
the change itself takes is outside every step.

:func:`report` reads the run folders: per phase (the link's and the
straggler's windows) the seconds each arm spent in its steps, the time to the
target test accuracy over the whole run, the final accuracy, which method
``adaptive`` ran in each phase, and the issue's three checks (PASS, FAIL or
UNDECIDED within the seeds' spread).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path
from typing import Any

#: The arms: strategy and its options (the density and the staleness bound come
#: from the config, the same for the fixed arms and adaptive's candidates).
ARMS = ("adaptive", "host", "sparse", "majority", "solo")
FIXED = ARMS[1:]


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
    schedule = parse_schedule(cfg.link_schedule)
    marks |= {s for s, _ in schedule if s < total}
    straggler = parse_imbalance(cfg.straggler, size=max(cfg.nps))
    window = (getattr(straggler, "start", 0), getattr(straggler, "end", None))
    if straggler.name != "none":
        marks |= {min(window[0], total), min(window[1] or total, total)}
    bounds = sorted(marks)
    out = []
    for a, b in zip(bounds, bounds[1:]):
        rate = [r for s, r in schedule if s <= a][-1]
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

    schedule = parse_schedule(cfg.link_schedule)
    for seed in cfg.seeds:
        for arm in cfg.arms:
            strategy, options = arm_strategy(cfg, arm)
            folder = root / f"np{world.size}" / f"{arm}-s{seed}"
            train = dataclasses.replace(
                cfg.train,
                strategy=strategy,
                strategy_options=options,
                seed=seed,
                run_dir=str(folder),
            )
            imbalance = parse_imbalance(cfg.straggler, size=world.size, seed=seed)
            world.log(f"{arm}, seed {seed}, {world.size} ranks -> {folder}")
            link = [] if cfg.no_link else [LinkSchedule(root / "link", schedule)]
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
        "evals": summary.get("evals", []),
    }


def _within(steps: list[dict], phase: dict) -> list[dict]:
    """The step rows of a phase: 0-based steps ``[start, end)`` are the rows
    ``step`` ``start + 1 .. end`` (a row counts the steps done)."""
    return [r for r in steps if phase["start"] < r["step"] <= phase["end"]]


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if math.isfinite(x)]
    if not xs:
        return math.inf, math.nan
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def _time_to(evals: list[dict], target: float) -> float:
    hit = [e["train_time"] for e in evals if e["test_acc"] >= target]
    return hit[0] if hit else math.inf


def analyze(root: Path, cfg: Any) -> dict[str, Any]:
    """Per rank count: phase seconds, time to target, final accuracy per arm
    and seed; adaptive's method per phase; the checks."""
    out: dict[str, Any] = {"phases": phases(cfg), "target": cfg.target_acc, "np": {}}
    for np_dir in sorted(root.glob("np*")):
        P = int(np_dir.name[2:])
        arms: dict[str, Any] = {}
        for arm in cfg.arms:
            per_seed = []
            for seed in cfg.seeds:
                folder = np_dir / f"{arm}-s{seed}"
                if not (folder / "summary.json").exists():
                    continue
                run = _load_run(folder)
                phase_s = [
                    sum(r["step_time"] for r in _within(run["steps"], p))
                    for p in out["phases"]
                ]
                methods = []
                for p in out["phases"]:
                    counts: dict[str, int] = {}
                    for r in _within(run["steps"], p):
                        m = r.get("comm_method", arm)
                        counts[m] = counts.get(m, 0) + 1
                    methods.append(counts)
                per_seed.append(
                    {
                        "seed": seed,
                        "phase_s": phase_s,
                        "total_s": sum(phase_s),
                        "to_target_s": _time_to(run["evals"], cfg.target_acc),
                        "final_acc": run["summary"].get("final_test_acc"),
                        "methods": methods,
                        "adaptive": run["summary"].get("adaptive"),
                        "switches": len(
                            [s for s in run["switches"] if s["kind"] == "switch"]
                        ),
                    }
                )
            if per_seed:
                arms[arm] = per_seed
        if arms:  # a rank count with none of these seeds' runs: no table
            out["np"][P] = arms
    out["checks"] = checks(out)
    return out


def _stat(runs: list[dict], key: str, i: int | None = None) -> tuple[float, float]:
    xs = [r[key][i] if i is not None else r[key] for r in runs]
    return _mean_sd([float("inf") if x is None else float(x) for x in xs])


def _noise(a: tuple[float, float], b: tuple[float, float], n: int) -> float:
    """Two standard errors of the difference of two seed means."""
    return 2 * math.hypot(a[1], b[1]) / math.sqrt(max(n, 1))


def checks(data: dict[str, Any]) -> list[str]:
    """The issue's three claims, per rank count, as PASS/FAIL/UNDECIDED lines."""
    lines = []
    for P, arms in data["np"].items():
        if "adaptive" not in arms or not any(a in arms for a in FIXED):
            continue
        ad = arms["adaptive"]
        n = len(ad)
        fixed = [a for a in FIXED if a in arms]
        # 1. sooner to the target than every fixed strategy, over the whole run
        a_t = _stat(ad, "to_target_s")
        worse = []
        for arm in fixed:
            f_t = _stat(arms[arm], "to_target_s")
            if not a_t[0] < f_t[0]:
                worse.append(f"{arm} {f_t[0]:.1f} s")
        best = min(fixed, key=lambda a: _stat(arms[a], "to_target_s")[0])
        b_t = _stat(arms[best], "to_target_s")
        verdict = "PASS" if not worse and math.isfinite(a_t[0]) else "FAIL"
        if verdict == "PASS" and b_t[0] - a_t[0] <= _noise(a_t, b_t, n):
            verdict = "UNDECIDED"
        lines.append(
            f"{verdict}  {P} ranks: adaptive reaches test accuracy "
            f"{data['target']:g} in {a_t[0]:.1f} +- {a_t[1]:.1f} s, the best fixed "
            f"strategy ({best}) in {b_t[0]:.1f} +- {b_t[1]:.1f} s"
            + (f"; not sooner than {', '.join(worse)}" if worse else "")
        )
        # 2. within noise of the best fixed strategy in each phase
        for i, p in enumerate(data["phases"]):
            a_p = _stat(ad, "phase_s", i)
            best = min(fixed, key=lambda a: _stat(arms[a], "phase_s", i)[0])
            b_p = _stat(arms[best], "phase_s", i)
            gap = a_p[0] - b_p[0]
            ok = gap <= _noise(a_p, b_p, n)
            lines.append(
                f"{'PASS' if ok else 'FAIL'}  {P} ranks, steps {p['start']}-{p['end']} "
                f"({p['label']}): adaptive {a_p[0]:.1f} +- {a_p[1]:.1f} s, best fixed "
                f"{best} {b_p[0]:.1f} +- {b_p[1]:.1f} s ({gap:+.1f} s, noise "
                f"{_noise(a_p, b_p, n):.1f} s)"
            )
        # 3. the same final accuracy as dense, within the seeds' spread
        if "host" in arms:
            a_f, h_f = _stat(ad, "final_acc"), _stat(arms["host"], "final_acc")
            gap = a_f[0] - h_f[0]
            ok = abs(gap) <= max(_noise(a_f, h_f, n), a_f[1], h_f[1])
            lines.append(
                f"{'PASS' if ok else 'FAIL'}  {P} ranks: final test accuracy adaptive "
                f"{a_f[0]:.4f} +- {a_f[1]:.4f}, host {h_f[0]:.4f} +- {h_f[1]:.4f} "
                f"({gap:+.4f})"
            )
    return lines


def format_table(data: dict[str, Any]) -> str:
    """The tables (seconds per phase, time to target, final accuracy) and the
    method adaptive ran in each phase, as markdown."""
    ph = data["phases"]
    out = []
    for P, arms in data["np"].items():
        n = len(next(iter(arms.values()), []))
        out += [f"### {P} ranks ({n} seeds; seconds in steps, mean +- sd)", ""]
        head = ["arm", *[f"{p['start']}-{p['end']}: {p['label']}" for p in ph]]
        head += ["whole run", f"to {data['target']:g}", "final acc"]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for arm, runs in arms.items():
            cells = [arm]
            for i in range(len(ph)):
                m, s = _stat(runs, "phase_s", i)
                cells.append(f"{m:.1f} +- {s:.1f}")
            for key, fmt in (("total_s", ".1f"), ("to_target_s", ".1f"),
                             ("final_acc", ".4f")):  # fmt: skip
                m, s = _stat(runs, key)
                cells.append(
                    "not reached" if math.isinf(m) else f"{m:{fmt}} +- {s:{fmt}}"
                )
            out.append("| " + " | ".join(cells) + " |")
        if "adaptive" in arms:
            out += ["", "What adaptive ran (steps per method, summed over seeds):", ""]
            for i, p in enumerate(ph):
                counts: dict[str, int] = {}
                for r in arms["adaptive"]:
                    for m, c in r["methods"][i].items():
                        counts[m] = counts.get(m, 0) + c
                desc = ", ".join(
                    f"{m} {c}" for m, c in sorted(counts.items(), key=lambda x: -x[1])
                )
                out.append(f"- steps {p['start']}-{p['end']} ({p['label']}): {desc}")
            sw = [r["switches"] for r in arms["adaptive"]]
            out.append(f"- switches per run: {', '.join(map(str, sw))}")
        out.append("")
    out += ["### Checks", ""] + data["checks"]
    return "\n".join(out) + "\n"
