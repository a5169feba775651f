"""Analyze a run's timeline: print a table and write ``RUN_DIR/analysis.json``.

    python -m scripts.analyze_trace runs/train-<time>

Reads ``RUN_DIR/trace.json`` (written with ``--trace``). Metric definitions:
``research/trace_analysis/metrics.py``. A missing or malformed trace ends with one
line and exit code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from research.entry.cli import ArgumentParser
from research.rundir import write_json
from research.trace_analysis import TraceError, analyze, format_table

PROG = "python -m scripts.analyze_trace"


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, help="a run folder holding trace.json")
    args = p.parse_args(argv)
    if not args.run_dir.is_dir():
        p.error(f"{args.run_dir} is not a folder")
    try:
        result = analyze(args.run_dir / "trace.json")
    except TraceError as e:
        p.error(str(e))
    write_json(args.run_dir / "analysis.json", result)
    print(format_table(result))
    print(f"-> {args.run_dir / 'analysis.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
