"""The adaptive study's page and README paragraph, from a run's ``results.json``.

``results.json`` is :func:`research.studies.adaptive.analyze`'s data: per rank
count, every arm's figures per seed (seconds per phase, start-up, time to the
target, final accuracy, adaptive's switches) and the oracle's. The tables and
the checks (:mod:`research.studies.adaptive_report`) are rendered from it
again, the checks recomputed, never read back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from research.studies.adaptive import FIXED, SCENARIOS
from research.studies.adaptive_report import _ratio, _stat, checks, format_table

#: What the page keeps of a run folder (``python -m scripts.results``).
KEEP = ("results.json", "np*/*/summary.json", "link-np*.json")


def load(root: Path) -> dict[str, Any]:
    data = json.loads((Path(root) / "results.json").read_text())
    data["checks"] = checks(data)
    return data


def render(root: Path) -> list[str]:
    """The run's part of ``docs/results/adaptive.md``."""
    return format_table(load(root)).rstrip("\n").splitlines()


def _word(lines: list[str], P: str, part: str) -> str:
    return next((x.split()[0] for x in lines if f"{P} ranks:" in x and part in x), "-")


def _scenario(root: Path) -> str:
    """One scenario's sentence: its design and its headline figures."""
    from research.provenance import read_jobs

    data = load(root)
    name = data.get("scenario") or "?"
    asks = SCENARIOS.get(name, {}).get("asks", {})
    jobs = read_jobs(root)
    when = jobs[0]["started_utc"][:10] if jobs else "?"
    said = []
    for P, arms in data["np"].items():
        if "adaptive" not in arms:
            continue
        fixed = [a for a in FIXED if a in arms]
        best = min(fixed, key=lambda a: _stat(arms[a], "to_target_s")[0])
        oracle = data["oracle"].get(P)
        part = f"{P} ranks: "
        if "as_fast_as" in asks and asks["as_fast_as"] in arms:
            rival = asks["as_fast_as"]
            r = _ratio(arms["adaptive"], arms[rival], "to_target_s")
            part += (
                f"{r.brief('.2f', 'x')} fixed {rival}'s time "
                f"({_word(data['checks'], P, 'fixed ' + rival)})"
            )
        else:
            g = _ratio(arms[best], arms["adaptive"], "to_target_s")
            part += (
                f"{g.brief('.2f', 'x')} sooner than {best} "
                f"({_word(data['checks'], P, 'sooner than')})"
            )
        if oracle:
            o = _ratio(arms["adaptive"], oracle["runs"], "to_target_s")
            gain = _ratio(arms[best], oracle["runs"], "to_target_s")
            part += (
                f", {o.brief('.2f', 'x')} the oracle's "
                f"({_word(data['checks'], P, 'the oracle' + chr(39) + 's time')}; "
                f"the oracle {gain.value:.2f}x ahead of {best})"
            )
        said.append(part)
    seeds = ", ".join(map(str, data.get("seeds") or []))
    about = SCENARIOS.get(name, {}).get("about", "")
    return (
        f"`{name}` ({about}; {when}, seeds {seeds}, to {data['target']:g}): "
        + "; ".join(said)
    )


def readme(runs: list[Path], sections: dict[str, list[Path]]) -> str | None:
    """The README's paragraph on the adaptive study, from the page's runs."""
    if not runs:
        return None
    tuned = json.loads((runs[0] / "results.json").read_text()).get("tuned_seeds") or []
    text = (
        "`python -m experiments.adaptive` (local nodes, one rank per node, TCP; "
        "P1B2 with 4096 features; every arm's start-up in its time to the "
        f"target; the model tuned on seeds {', '.join(map(str, tuned))}, judged on "
        "others; 90% intervals over the seeds, `docs/results/adaptive.md`). The "
        "default scenario, `mixed`, was built to give switching room: each phase "
        "favours another method by far. " + ". ".join(_scenario(r) for r in runs) + "."
    )
    return text
