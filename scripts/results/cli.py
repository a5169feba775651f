"""``python -m scripts.results``: the command line of :mod:`scripts.results`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import scripts.results
from scripts.results import ROOT, ResultsError, rel, render
from scripts.results.check import check


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m scripts.results",
        description=(scripts.results.__doc__ or "").split("\n\n")[0],
        epilog="Example: python -m scripts.results runs/eager_sgd-20261124-161000",
    )
    p.add_argument("roots", nargs="*", type=Path, help="run folders (run roots)")
    p.add_argument(
        "--root",
        type=Path,
        default=ROOT,
        help="the repository whose docs/results/ and README.md these are "
        "(default: this one)",
    )
    p.add_argument(
        "--note",
        action="append",
        help="a line under each run's provenance, e.g. what else was running; "
        "given once per run folder, one for each, in order",
    )
    p.add_argument(
        "--section",
        metavar="TITLE",
        help="render into the section TITLE of the experiment's page, replacing "
        "only that section (e.g. 'Real network (local cluster)')",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="render every page and the README's paragraphs again from the "
        "committed data and compare (exit 1 at the first difference)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="with --check: a part whose data are not in the repository fails",
    )
    args = p.parse_args(argv)
    if args.check:
        code, lines = check(args.root, strict=args.strict)
        print("\n".join(lines), file=sys.stderr if code else sys.stdout)
        return code
    try:
        if not args.roots:
            raise ResultsError("give the run folders to render (or --check)")
        page = render(args.roots, args.root, args.note, args.section)
    except ResultsError as e:
        print(f"python -m scripts.results: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {rel(page, args.root)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
