"""Bad input from the command line: one clear line and exit code 2.

:class:`UsageError` is raised where bad input is found (a flag's value, data
files, a model's options), alike on every rank; an entry point reports it with
:func:`fail_usage`, printed by one process only.
"""

from __future__ import annotations

import sys

from research.comm.process.env import env_rank

USAGE_EXIT = 2


class UsageError(Exception):
    """Bad command-line input: reported as one line with exit code 2."""


def fail_usage(prog: str, message: str) -> None:
    """Print ``prog: error: message`` once (rank 0) and exit 2 on every rank."""
    if env_rank() == 0:
        print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(USAGE_EXIT)
