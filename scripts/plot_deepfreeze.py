"""Figures of a DeepFreeze experiment, drawn only from its run folder.

    python -m scripts.plot_deepfreeze runs/deepfreeze-<time>

The figures are drawn by :mod:`research.studies.deepfreeze_plots`, which the experiment
calls at its end; this is the entry point for a finished run folder.
"""

from __future__ import annotations

import argparse

from research.studies.deepfreeze_plots import plot_all


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m scripts.plot_deepfreeze", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("root", help="the experiment folder (runs/deepfreeze-<time>)")
    for path in plot_all(p.parse_args(argv).root):
        print(path)


if __name__ == "__main__":
    main()
