"""Export a committed checkpoint step as a standard Orbax checkpoint.

    python -m scripts.export_checkpoint RUN_OR_CHECKPOINT_DIR --format orbax OUT
    python -m scripts.export_checkpoint runs/train-<time> --step 30 --format orbax OUT

Reads the step in this one process (:func:`research.checkpoint.load`: no
mpiexec; every file and unit CRC-32 verified) and writes it with Orbax's
``StandardCheckpointer``, so that anyone opens it with Orbax alone::

    import orbax.checkpoint as ocp
    state = ocp.StandardCheckpointer().restore("/abs/path/OUT")

The tree is nested dicts of numpy arrays keyed by the state's path names (see
:mod:`research.checkpoint.offline`); ``OUT`` must not exist yet.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

PROG = "python -m scripts.export_checkpoint"
FORMATS = ("orbax",)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("source", type=Path, help="a run folder or its checkpoints/")
    p.add_argument("out", type=Path, help="the folder to write (must not exist)")
    p.add_argument("--format", choices=FORMATS, required=True)
    p.add_argument("--step", type=int, help="a committed step (default: newest)")
    args = p.parse_args(argv)
    out = args.out.absolute()  # Orbax refuses relative paths
    if out.exists():
        p.error(f"{args.out} exists; choose a new folder")
    from research.checkpoint.offline import NoCheckpointError, load_step

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step, tree = load_step(args.source, args.step)
    except NoCheckpointError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(out, tree)
        ckptr.wait_until_finished()
    print(f"step {step} of {args.source} -> {out} (Orbax StandardCheckpointer)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
