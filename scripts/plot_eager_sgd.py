"""Figures of an eager-SGD run, drawn only from its run folders.

    python -m scripts.plot_eager_sgd runs/eager_sgd-<time> [--target-acc 0.85]

The figures are drawn by :mod:`research.studies.eager_sgd_plots`, which the experiment
calls at its end; this is the entry point for a finished run folder.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from research.studies.eager_sgd_plots import plot_all, plot_sweep


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m scripts.plot_eager_sgd", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("root", help="the experiment folder (runs/eager_sgd-<time>)")
    p.add_argument(
        "--target-acc",
        type=float,
        default=None,
        help="draw this accuracy (default: the run's, from results.json)",
    )
    args = p.parse_args(argv)
    target = args.target_acc
    if (Path(args.root) / "sweep.json").exists():  # a --sweep folder
        print(plot_sweep(args.root, target))
        return
    results = Path(args.root) / "results.json"
    if target is None and results.exists():
        target = json.loads(results.read_text()).get("target_acc")
    for path in plot_all(args.root, target):
        print(path)


if __name__ == "__main__":
    main()
