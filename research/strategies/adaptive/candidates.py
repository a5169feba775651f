"""The ``adaptive`` strategy's candidates and plan, read from its text options.

A candidate is one method the strategy may run: a registered strategy
(``host``, ``sparse``, ``majority``, ``solo``; ``sparse`` once per density,
``sparse:0.01``), of a kind (dense, sparse, partial). They are listed from the
most to the least accurate (dense, top-k from dense to sparse, majority,
solo), the order :class:`~research.strategies.adaptive.policy.Policy` prefers them
in. A plan (``"host@0,sparse:0.01@40"``) fixes switches at fixed steps.
:func:`check_text_options` checks both before launch
(``AdaptiveOptions.problem``); nothing here imports MPI or numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DENSE, SPARSE, PARTIAL = "dense", "sparse", "partial"
#: The registered strategies a candidate may be, and their kinds.
KINDS = {"host": DENSE, "sparse": SPARSE, "majority": PARTIAL, "solo": PARTIAL}


@dataclass(frozen=True)
class Candidate:
    """One method the strategy may run: ``host``, ``sparse:0.01``, ``solo``..."""

    label: str
    strategy: str
    kind: str
    density: float | None = None


def parse_candidates(candidates: str, densities: str) -> list[Candidate]:
    """The candidates, most accurate first (``sparse`` expands to each density,
    densest first).

    Raises:
      ValueError: an unknown name, no ``host``, a bad or repeated density.
    """
    names = [n.strip() for n in candidates.split(",") if n.strip()]
    unknown = [n for n in names if n not in KINDS]
    if unknown:
        raise ValueError(
            f"adaptive: candidates {', '.join(unknown)} unknown; choose from "
            + ", ".join(KINDS)
        )
    if "host" not in names:
        raise ValueError("adaptive: candidates must include host (the dense method)")
    if len(set(names)) != len(names):
        raise ValueError(f"adaptive: a candidate is named twice in {candidates!r}")
    try:
        dens = sorted({float(d) for d in densities.split(",") if d.strip()})[::-1]
    except ValueError:
        raise ValueError(
            f"adaptive: densities={densities!r} must be numbers such as 0.01,0.001"
        ) from None
    if "sparse" in names and (not dens or not all(0 < d <= 1 for d in dens)):
        raise ValueError(f"adaptive: densities={densities!r} must lie in (0, 1]")
    order = sorted(names, key=list(KINDS).index)  # dense, sparse, majority, solo
    out: list[Candidate] = []
    for name in order:
        if name == "sparse":
            out += [Candidate(f"sparse:{d:g}", "sparse", SPARSE, d) for d in dens]
        else:
            out.append(Candidate(name, name, KINDS[name]))
    return out


def check_text_options(options: dict[str, Any]) -> str | None:
    """The problem with the adaptive strategy's free-text options (candidates,
    densities, plan) in one line, or None: checked before launch
    (``AdaptiveOptions.problem``)."""
    try:
        cands = parse_candidates(
            str(options.get("candidates", "host,sparse,majority,solo")),
            str(options.get("densities", "0.01")),
        )
        parse_plan(str(options.get("plan", "")), [c.label for c in cands])
    except ValueError as e:
        return str(e)
    return None


def parse_plan(plan: str, labels: list[str]) -> list[tuple[int, int]]:
    """``"host@0,sparse:0.01@40"`` as ``[(step, candidate index)]``, by step."""
    out: list[tuple[int, int]] = []
    for part in (p.strip() for p in plan.split(",") if p.strip()):
        label, _, step = part.rpartition("@")
        if not label or not step.isdigit():
            raise ValueError(
                f"adaptive: plan entry {part!r} must be METHOD@STEP, "
                "e.g. sparse:0.01@40"
            )
        if label not in labels:
            raise ValueError(
                f"adaptive: plan names {label!r}; the candidates are "
                + ", ".join(labels)
            )
        out.append((int(step), labels.index(label)))
    steps = [s for s, _ in out]
    if len(set(steps)) != len(steps):
        raise ValueError(f"adaptive: plan {plan!r} names a step twice")
    return sorted(out)
