"""The network page's part of a ``scripts.bench_link --sweep`` run.

Rendered from the run's ``results.json`` alone (every call's measured times,
the calibration of each job) with today's link model
(:func:`research.studies.network.format_table`): the medians over each
point's timed calls, their min-max, and the model's error against them. The
README states no figure of this page (it names the page).
"""

from __future__ import annotations

import json
from pathlib import Path

#: What the page keeps of a run folder (``python -m scripts.results``).
KEEP = ("results.json",)


def render(root: Path) -> list[str]:
    """The run's part of ``docs/results/network.md``."""
    from research.studies.network import format_table

    results = json.loads((Path(root) / "results.json").read_text())
    one_node = {j["ranks"]: j for j in results.get("one_node", [])}
    calls = sorted({len(r["times_s"]) for j in results["jobs"] for r in j["rows"]})
    span = f"{calls[0]}" if len(calls) == 1 else f"{calls[0]}-{calls[-1]}"
    return [
        f"network ms: the median of each point's {span} timed calls on the real "
        "link, their min-max beside it; one node ms the same call's median over "
        "shared memory.",
        "",
        *format_table(results["jobs"], one_node).rstrip("\n").splitlines(),
    ]


def readme(runs: list[Path], sections: dict[str, list[Path]]) -> None:
    """No README paragraph: the README names the page, no figure of it."""
    return None
