"""Figures of an eager-SGD run, drawn only from its run folders.

    python -m scripts.plot_eager_sgd runs/eager_sgd-<time> [--target-acc 0.85]

Reads ``<root>/<arm>-s<seed>/{config.json,metrics.jsonl,trace.json}`` (the first
seed of each arm) and writes into ``<root>``:

* ``throughput.png``: samples per second (sliding window) against training time;
* ``accuracy.png``: test accuracy against training time (evaluation excluded),
  with the target accuracy;
* ``contributors.png``: histogram of fresh contributors per round;
* ``timeline.png``: a window of the timeline, per rank: compute, injected delay,
  waiting for the average (comm), update, and the background rounds (comm-bg).

A ``--sweep`` folder (``sweep.json``) gets ``sweep.png`` instead: throughput and
time to target against model bytes, the parameter server's crossover marked.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from research.plots import save_figure
from research.trace import read_trace_events

ORDER = ("balanced", "allreduce", "solo", "majority", "ps")
COLORS = {
    "balanced": "0.6",
    "allreduce": "tab:blue",
    "solo": "tab:orange",
    "majority": "tab:green",
    "ps": "tab:red",
}
PHASES = {
    "compute": "tab:blue",
    "delay": "tab:red",
    "comm": "tab:orange",
    "update": "tab:green",
    "comm-bg": "0.55",
    "data": "tab:cyan",
    "eval": "tab:purple",
}


def _rows(run: Path) -> list[dict[str, Any]]:
    rows = []
    path = run / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut off by a crash
    return rows


def first_seed_runs(root: str | Path) -> dict[str, Path]:
    """Arm -> run folder of its lowest seed, in display order."""
    found: dict[str, tuple[int, Path]] = {}
    for d in Path(root).iterdir():
        arm, sep, seed = d.name.rpartition("-s")
        if not (sep and seed.isdigit() and (d / "metrics.jsonl").exists()):
            continue
        if arm not in found or int(seed) < found[arm][0]:
            found[arm] = (int(seed), d)
    return {
        a: found[a][1]
        for a in sorted(
            found, key=lambda a: (ORDER.index(a) if a in ORDER else len(ORDER), a)
        )
    }


def _first_step_s(rows: list[dict[str, Any]]) -> float:
    """Step 1's time (it compiles); the figures' clock starts after it."""
    steps = [r for r in rows if "step_time" in r and r.get("kind") != "eval"]
    return steps[0]["step_time"] if steps and steps[0].get("step") == 1 else 0.0


def _global_batch(run: Path) -> int:
    cfg = json.loads((run / "config.json").read_text())
    return int(cfg["config"]["batch_size"]) * int(cfg["world_size"])


def plot_throughput(runs: dict[str, Path], out: Path, window: int = 10) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for arm, run in runs.items():
        rows = _rows(run)
        steps = [r for r in rows if "step_time" in r and r.get("kind") != "eval"]
        if len(steps) <= window:
            continue
        gb = _global_batch(run)
        first = _first_step_s(rows)
        t = [r["train_time"] - first for r in steps]
        xs = t[window:]
        ys = [
            gb * window / max(t[i] - t[i - window], 1e-9) for i in range(window, len(t))
        ]
        ax.plot(xs, ys, color=COLORS.get(arm), lw=1.2, label=arm)
    ax.set(
        xlabel="training time (s; evaluation and compiling step 1 excluded)",
        ylabel="samples / s",
        title=f"throughput ({window}-step window)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out / "throughput.png")


def plot_accuracy(runs: dict[str, Path], out: Path, target: float | None) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for arm, run in runs.items():
        if arm == "balanced":
            continue  # a short reference: its accuracy is not comparable
        rows = _rows(run)
        first = _first_step_s(rows)
        ev = [r for r in rows if r.get("kind") == "eval"]
        ax.plot(
            [0.0] + [r["train_time"] - first for r in ev],
            [None] + [r["test_acc"] for r in ev],
            "o-",
            ms=3,
            color=COLORS.get(arm),
            label=arm,
        )
    if target is not None:
        ax.axhline(target, color="k", ls="--", lw=0.8, label=f"target {target:.0%}")
    ax.set(
        xlabel="training time (s; evaluation and compiling step 1 excluded)",
        ylabel="test accuracy",
        title="test accuracy against time",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out / "accuracy.png")


def plot_contributors(runs: dict[str, Path], out: Path) -> Path:
    import matplotlib.pyplot as plt

    data = {}
    size = 1
    for arm, run in runs.items():
        if arm in ("ps", "balanced"):
            continue
        size = max(size, json.loads((run / "config.json").read_text())["world_size"])
        c = [r["comm_contributors"] for r in _rows(run) if "comm_contributors" in r]
        if c:
            data[arm] = c
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    width = 0.8 / max(len(data), 1)
    for i, (arm, c) in enumerate(data.items()):
        xs = list(range(0, size + 1))
        frac = [sum(1 for v in c if v == x) / len(c) for x in xs]
        ax.bar(
            [x + (i - (len(data) - 1) / 2) * width for x in xs],
            frac,
            width,
            color=COLORS.get(arm),
            label=f"{arm} (mean {statistics.fmean(c):.2f})",
        )
    ax.set(
        xlabel="ranks with a fresh gradient in the round",
        ylabel="fraction of rounds",
        title="contributors per round",
        xticks=list(range(0, size + 1)),
    )
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return save_figure(fig, out / "contributors.png")


def plot_timeline(runs: dict[str, Path], out: Path, steps: int = 8) -> Path | None:
    """Per arm, ``steps`` steps' worth of every rank's timeline from mid-run."""
    import matplotlib.pyplot as plt

    arms = [a for a in runs if a in ("allreduce", "solo", "majority", "ps")]
    events = {
        a: [e for e in read_trace_events(runs[a]) if e.get("ph") == "X"] for a in arms
    }
    arms = [a for a in arms if events[a]]
    if not arms:
        return None
    ref = "allreduce" if "allreduce" in arms else arms[0]
    steps_ref = [r["step_time"] for r in _rows(runs[ref]) if "step_time" in r]
    span_us = steps * statistics.median(steps_ref) * 1e6 if steps_ref else 1e6
    fig, axes = plt.subplots(
        len(arms), 1, figsize=(9, 1.6 + 1.2 * len(arms)), squeeze=False
    )
    for ax, arm in zip(axes[:, 0], arms):
        ev = [e for e in events[arm] if e.get("cat") in PHASES]
        compute = sorted(e["ts"] for e in ev if e["cat"] == "compute")
        t0 = compute[len(compute) // 2] if compute else 0.0
        ranks = sorted({e["pid"] for e in ev})
        for e in ev:
            if e["ts"] + e["dur"] < t0 or e["ts"] > t0 + span_us:
                continue
            row = ranks.index(e["pid"]) * 2 + (1 if e["cat"] == "comm-bg" else 0)
            ax.broken_barh(
                [((e["ts"] - t0) / 1e3, e["dur"] / 1e3)],
                (row + 0.1, 0.8),
                color=PHASES[e["cat"]],
                lw=0,
            )
        ax.set_yticks(
            [i * 2 + 0.5 for i in range(len(ranks))]
            + [i * 2 + 1.5 for i in range(len(ranks))]
        )
        ax.set_yticklabels(
            [f"r{r}" for r in ranks] + [f"r{r} bg" for r in ranks], fontsize=7
        )
        ax.set_xlim(0, span_us / 1e3)
        ax.invert_yaxis()
        ax.set_title(arm, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("ms from a mid-run step")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in PHASES.values()]
    fig.legend(handles, list(PHASES), loc="upper center", ncol=len(PHASES), fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return save_figure(fig, out / "timeline.png")


def plot_all(root: str | Path, target_acc: float | None = None) -> list[Path]:
    """Every figure for the run folders under ``root``; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    root = Path(root)
    runs = first_seed_runs(root)
    paths = [
        plot_throughput(runs, root),
        plot_accuracy(runs, root, target_acc),
        plot_contributors(runs, root),
        plot_timeline(runs, root),
    ]
    return [p for p in paths if p is not None]


def plot_sweep(root: str | Path, target_acc: float | None = None) -> Path:
    """``sweep.png`` of a ``--sweep`` folder: throughput and time to target
    against parameter bytes, one colour per arm, one line style per rank count;
    a dotted vertical line marks, per rank count, the first model size at which
    the parameter server's throughput fell below allreduce's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from research.studies.eager_sweep import collect, crossover, link_line

    root = Path(root)
    if target_acc is None:
        target_acc = json.loads((root / "sweep.json").read_text())["target_acc"]
    rows = collect(root, target_acc)
    sizes = sorted({r["world_size"] for r in rows})
    styles = dict(zip(sizes, ("-", "--", ":", "-.") * 4))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for arm in ORDER[1:]:
        for size in sizes:
            mine = [r for r in rows if r["arm"] == arm and r["world_size"] == size]
            by: dict[int, list[dict[str, Any]]] = {}
            for r in mine:
                by.setdefault(r["param_bytes"], []).append(r)
            xs = sorted(by)
            if not xs:
                continue
            mb = [x / 1e6 for x in xs]
            tput = [statistics.fmean(r["samples_per_s"] for r in by[x]) for x in xs]
            times = [
                [r["time_to_target_s"] for r in by[x] if r["time_to_target_s"]]
                for x in xs
            ]
            kw = dict(color=COLORS[arm], linestyle=styles[size], marker="o", ms=3)
            ax1.plot(mb, tput, label=f"{arm}, {size} ranks", **kw)
            pts = [(m, statistics.fmean(t)) for m, t in zip(mb, times) if t]
            if pts:
                ax2.plot(*zip(*pts), **kw)
    for size, c in crossover(rows).items():
        if c["bytes"] is not None and c["below"] is not None:
            for ax in (ax1, ax2):
                ax.axvline(
                    c["bytes"] / 1e6, color="tab:red", linestyle=styles[size], lw=0.8
                )
            ax1.annotate(
                f"ps < allreduce\n({size} ranks)",
                (c["bytes"] / 1e6, ax1.get_ylim()[1]),
                fontsize=7,
                va="top",
                ha="right",
                rotation=90,
            )
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ScalarFormatter())  # 3.7, not 3.7 x 10^0
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("model parameters (MB of float32)")
        ax.grid(alpha=0.3, which="both")
    ax1.set_yscale("log")
    ax1.set_ylabel("samples / s")
    ax1.set_title("throughput")
    ax2.set_ylabel(f"seconds to {target_acc:.0%} test accuracy")
    ax2.set_title("time to target (missing: not reached)")
    ax1.legend(fontsize=6, ncol=2)
    link = json.loads((root / "sweep.json").read_text()).get("link")
    fig.suptitle(link_line(link), fontsize=9)
    return save_figure(fig, root / "sweep.png")
