"""The adaptive study's figure: throughput and the chosen method under the link.

``adaptive.png``: per rank count, the samples per second of every arm against
the step (seed 0; a rolling mean over 5 steps), the background shaded where
the link runs at its lower rate and hatched where the straggler is on, and
under it a strip coloured by the method ``adaptive`` ran at each step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

COLORS = {
    "adaptive": "black",
    "host": "tab:blue",
    "sparse": "tab:green",
    "majority": "tab:purple",
    "solo": "tab:red",
}


def _method_color(label: str) -> str:
    return COLORS.get(label.split(":")[0], "tab:gray")


def plot(root: Path, data: dict[str, Any], global_batch: dict[int, int]) -> Path:
    """Draw ``root/adaptive.png`` from the run folders and :func:`analyze`'s data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from research.plots import save_figure
    from research.studies.adaptive import _load_run

    sizes = sorted(data["np"])
    fig, axes = plt.subplots(
        2 * len(sizes), 1, figsize=(10, 4.2 * len(sizes)), squeeze=False,
        gridspec_kw={"height_ratios": [5, 1] * len(sizes)}, sharex=True,
    )  # fmt: skip
    rates = sorted({p["rate"] for p in data["phases"]}, key=_bits)
    low = rates[0] if len(rates) > 1 else None
    for k, P in enumerate(sizes):
        ax, strip = axes[2 * k, 0], axes[2 * k + 1, 0]
        for p in data["phases"]:
            if p["rate"] == low:
                ax.axvspan(p["start"], p["end"], color="0.85", lw=0)
            if p["straggler"]:
                ax.axvspan(
                    p["start"], p["end"], fill=False, hatch="//", ec="tab:orange", lw=0
                )
        methods: list[str] = []
        for arm in data["np"][P]:
            seed = data["np"][P][arm][0]["seed"]
            run = _load_run(Path(root) / f"np{P}" / f"{arm}-s{seed}")
            steps = np.array([r["step"] for r in run["steps"]])
            rate = global_batch[P] / np.array([r["step_time"] for r in run["steps"]])
            ones = np.ones(5)
            smooth = np.convolve(rate, ones, "same") / np.convolve(
                np.ones_like(rate), ones, "same"
            )
            ax.plot(
                steps, smooth, color=COLORS.get(arm, "gray"),
                lw=2.2 if arm == "adaptive" else 1.0, label=arm,
                alpha=1.0 if arm == "adaptive" else 0.75,
            )  # fmt: skip
            if arm == "adaptive":
                methods = [r.get("comm_method", "host") for r in run["steps"]]
                for s, m in zip(steps, methods):
                    strip.axvspan(s - 1, s, color=_method_color(m), lw=0)
        ax.set_ylabel("samples/s")
        ax.set_title(f"{P} ranks: throughput (seed 0, 5-step mean)")
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper right", fontsize=8, ncol=5)
        strip.set_yticks([])
        strip.set_ylabel("adaptive", rotation=0, ha="right", va="center")
        used = sorted(set(methods))
        strip.legend(
            handles=[Patch(color=_method_color(m), label=m) for m in used],
            loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7,
            frameon=False,
        )  # fmt: skip
    slow = (low or "").replace("gbit", " Gb/s").replace("mbit", " Mb/s")
    axes[-1, 0].set_xlabel(
        f"step (grey: the links at {slow or 'their one rate'}; hatched: a straggler)"
    )
    fig.tight_layout()
    return save_figure(fig, Path(root) / "adaptive.png")


def _bits(rate: str) -> float:
    from research.localnet import parse_rate

    return parse_rate(rate)
