"""Figures of a DeepFreeze experiment, drawn only from its run folder.

    python -m scripts.plot_deepfreeze runs/deepfreeze-<time>

Reads ``<root>/<job>-np<P>.json`` (written by ``python -m experiments.deepfreeze``)
and the main job's ``trace.json``, and writes into ``<root>``:

* ``overhead_vs_interval.png``: end-to-end overhead against the checkpoint
  interval (mean over periods, less the placebo's), per saver;
* ``blocking_vs_ranks.png``: median blocking time per checkpoint against the
  number of ranks (one point per job), log scale;
* ``timeline.png`` and ``timeline_excerpt.json`` (Chrome trace: open in
  https://ui.perfetto.dev): one DeepFreeze period, every rank's training
  phases and the checkpoint's snapshot, serialization, write, commit and
  flush falling into the gaps between weight updates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from research.plots import save_figure
from research.studies.deepfreeze_page import load_results
from research.trace import read_trace_events

#: Colours of the savers, in the order ``list_savers()`` names them; a
#: variant arm (``deepfreeze-skip``) takes its saver's colour, lighter.
PALETTE = ("tab:blue", "tab:purple", "tab:orange", "tab:red", "tab:green", "tab:brown")


def saver_color(arm: str) -> Any:
    """The colour of a saver's arm (any registered saver, no list to update)."""
    from matplotlib.colors import to_rgba

    from research.checkpoint.savers import list_savers

    savers = list_savers()
    base = next((s for s in savers if arm == s or arm.startswith(s + "-")), None)
    if base is None:
        return "0.5"
    color = to_rgba(PALETTE[savers.index(base) % len(PALETTE)])
    return color if base == arm else (*color[:3], 0.5)


LANES = ("compute", "comm", "update", "checkpoint", "checkpoint-bg")
PHASES = {
    "fwd+bwd+allreduce+update": "tab:blue",
    "forward+backward": "tab:blue",
    "average": "tab:orange",
    "update": "tab:green",
    "load batch": "tab:cyan",
    "checkpoint": "tab:red",
    "snapshot": "darkred",
    "device-to-host": "0.7",
    "checksum": "0.5",
    "serialize+write": "tab:olive",
    "write": "tab:brown",
    "checksum files": "0.4",
    "commit": "black",
    "flush": "tab:pink",
    "retention": "0.8",
    "wait for checkpoints in flight": "magenta",
}


def plot_overhead(main: dict, out: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    by: dict[str, list[tuple[int, float]]] = {}
    for a in main["arms"].values():
        if a["saver"] != "none" and a["overhead"] is not None:
            by.setdefault(a["saver"], []).append((a["interval"], a["overhead"]))
    for s, pts in sorted(by.items()):
        pts.sort()
        ax.plot(
            [p[0] for p in pts],
            [100 * p[1] for p in pts],
            "o-",
            color=saver_color(s),
            label=s,
        )
    ax.axhline(5, color="0.5", ls="--", lw=1)
    ax.text(ax.get_xlim()[1], 5, " 5% target", va="bottom", ha="right", fontsize=7)
    ax.axhline(0, color="0.8", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=10)
    ax.set_xlabel("checkpoint every N steps")
    ax.set_ylabel("end-to-end overhead (%)")
    ax.set_title(
        f"{main['model']}, {main['ranks']} ranks, step "
        f"{main['reference_step_s'] * 1e3:.0f} ms",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    return save_figure(fig, out / "overhead_vs_interval.png")


def plot_blocking(jobs: list[dict], out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    pts: dict[str, list[tuple[int, float]]] = {}
    for j in jobs:
        iv = str(j["interval"])
        for name, st in j["savers"].items():
            d = st["by_interval"].get(iv)
            if d and d.get("median_blocking_s") and name != "deepfreeze-skip":
                pts.setdefault(name, []).append((j["ranks"], d["median_blocking_s"]))
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for s, p in sorted(pts.items()):
        p.sort()
        ax.plot(
            [x for x, _ in p],
            [1e3 * y for _, y in p],
            "o-",
            color=saver_color(s),
            label=s,
        )
    ax.set_yscale("log")
    ax.set_xticks(sorted({x for p in pts.values() for x, _ in p}))
    ax.set_xlabel("ranks")
    ax.set_ylabel("median blocking time per checkpoint (ms)")
    ax.legend(fontsize=8)
    return save_figure(fig, out / "blocking_vs_ranks.png")


def excerpt(main: dict) -> tuple[list[dict], float, float] | None:
    """Events of the first DeepFreeze period at the main interval (with margins)."""
    events = read_trace_events(main["run_dir"])
    slot = next(
        (
            w
            for w in main["windows"]
            if w["saver"] == "deepfreeze" and w["interval"] == main["interval"]
        ),
        None,
    )
    if not events or slot is None:
        return None
    step = slot["start"]
    mine = [
        e
        for e in events
        if e.get("ph") == "X"
        and e.get("args", {}).get("step") == step
        and e.get("cat") in ("checkpoint", "checkpoint-bg")
    ]
    if not mine:
        return None
    t0 = min(e["ts"] for e in mine) - 2 * main["reference_step_s"] * 1e6
    t1 = max(e["ts"] + e["dur"] for e in mine) + 2 * main["reference_step_s"] * 1e6
    keep = [
        e
        for e in events
        if e.get("ph") == "M"
        or (e.get("ph") == "X" and e["ts"] + e["dur"] >= t0 and e["ts"] <= t1)
    ]
    return keep, t0, t1


def plot_timeline(main: dict, out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    got = excerpt(main)
    if got is None:
        return None
    events, t0, t1 = got
    (out / "timeline_excerpt.json").write_text(json.dumps({"traceEvents": events}))
    xs = [e for e in events if e.get("ph") == "X" and e.get("cat") in LANES]
    ranks = sorted({e["pid"] for e in xs})
    fig, ax = plt.subplots(figsize=(10, 1 + 0.9 * len(ranks) * len(LANES) / 3))
    for e in xs:
        row = ranks.index(e["pid"]) * (len(LANES) + 1) + LANES.index(e["cat"])
        ax.broken_barh(
            [((e["ts"] - t0) / 1e3, max(e["dur"], 200) / 1e3)],
            (row + 0.1, 0.8),
            color=PHASES.get(e["name"], "0.3"),
            lw=0,
        )
    ticks = [
        (r * (len(LANES) + 1) + i + 0.5, f"r{r} {lane}")
        for r in ranks
        for i, lane in enumerate(LANES)
    ]
    ax.set_yticks([t for t, _ in ticks])
    ax.set_yticklabels([lab for _, lab in ticks], fontsize=6)
    ax.set_xlim(0, (t1 - t0) / 1e3)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    shown = sorted({e["name"] for e in xs if e["name"] in PHASES})
    handles = [plt.Rectangle((0, 0), 1, 1, color=PHASES[n]) for n in shown]
    ax.legend(
        handles,
        shown,
        fontsize=6,
        ncol=len(shown) // 2 + 1,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.1),
    )
    ax.set_title(
        "one DeepFreeze checkpoint: snapshot (training thread), then "
        "serialize+write, commit and flush (background) between updates",
        fontsize=8,
    )
    return save_figure(fig, out / "timeline.png")


def plot_all(root: str | Path) -> list[Path]:
    """Every figure for the experiment folder ``root``; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    root = Path(root)
    main, jobs = load_results(Path(root))
    if main is None:
        return []
    paths = [
        plot_overhead(main, root),
        plot_blocking(jobs, root),
        plot_timeline(main, root),
    ]
    return [p for p in paths if p is not None]
