"""The SparCML experiment's figures: time against density, and accuracy.

``time_vs_density.png``: each algorithm's allreduce time per rank count and
link, with the cost model's dense/sparse crossover marked; ``accuracy.png``:
the training arms' test accuracy against step. Drawn from the rows
:mod:`research.studies.sparcml` measures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from research.comm.link import Link

SPARSE = ("ssar_rd", "ssar_sag", "dsar_sag")


def crossover(model: Any, dim: int, P: int) -> float | None:
    """Density at which the model's dense allreduce overtakes the best sparse
    algorithm (uniform inputs), or None when one side wins over the whole range."""
    from research.comm.sparse.cost import predicted_time

    prev = None
    for d in np.logspace(-4, 0, 81):
        k = d * dim
        sparse = min(predicted_time(model, a, k, dim, P) for a in SPARSE)
        dense_wins = predicted_time(model, "dense", k, dim, P) <= sparse
        if dense_wins and prev is False:
            return float(d)
        prev = dense_wins
    return None


def plot(root: Path, bench, results, link: Link) -> list[Path]:
    """time_vs_density.png (per P and link, model crossover marked), accuracy.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from research.comm.sparse.calibration import load_model
    from research.comm.sparse.mean import link_model

    made = []
    if bench:
        sizes = sorted({r["P"] for r in bench})
        fig, axes = plt.subplots(
            len(sizes), 2, figsize=(10, 3.2 * len(sizes)), squeeze=False
        )
        for row, P in zip(axes, sizes):
            dim = bench[0].get("dim")
            model = load_model(P)
            links = {"real_s": Link(), "emulated_s": link}
            for ax, key, name in zip(
                row, ("real_s", "emulated_s"), ("real", str(link))
            ):
                for alg in (*SPARSE, "dense", "auto"):
                    pts = [
                        (r["density"], r[key])
                        for r in bench
                        if r["P"] == P and r["algorithm"] == alg
                    ]
                    ax.plot(*zip(*pts), marker="o", label=alg)
                if dim:
                    at = crossover(link_model(model, links[key], P), dim, P)
                    if at is not None:
                        ax.axvline(at, ls="--", c="gray", label="model crossover")
                ax.set(xscale="log", yscale="log", xlabel="density", ylabel="s")
                ax.set_title(f"P={P}, {name} link")
                ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(root / "time_vs_density.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    if results:
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in results:
            if r["curve"]:
                ax.plot(*zip(*r["curve"]), marker=".", label=r["arm"])
        ax.set(xlabel="step", ylabel="test accuracy")
        ax.legend()
        fig.tight_layout()
        made.append(root / "accuracy.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    return made
