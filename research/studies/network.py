"""The network page: the link model against measured times, as a table.

The logic behind ``python -m scripts.bench_link`` (see its docstring for what
is measured and how) that turns a run's ``results.json`` into ``table.md``:
what the project charges each call on a link (:func:`model_of`), what the
emulated link makes of it (:func:`emulated`), the link the model is given
(:func:`job_link`), and the table. It reads the model from
:mod:`research.comm.link` when it renders, so ``--render`` shows a changed
model against the same measurements.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from research.comm.link import Link

#: An exchange this close to the link's payload rate is the link's, not the
#: host's (1 Gb/s: 0.90-0.96 Gb/s measured against 0.93 modelled).
CEILING_SLACK = 0.05


def model_of(link: Link, cost: list, P: int) -> float:
    """What the project charges for a call on ``link``: ``cost`` is
    ``[method, bytes]`` of :class:`~research.comm.link.Link` or ``["sparse",
    bytes sent, messages]``."""
    kind, *args = cost
    if kind == "sparse":
        return link.sparse(*args)
    if kind == "p2p":
        return link.p2p(*args)
    return getattr(link, kind)(*args, P)


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g}" if s < 0.1 else f"{s * 1e3:.0f}"


def emulated(one_node_s: float, model_s: float, additive: bool = False) -> float:
    """What ``--link`` makes of a call that took ``one_node_s`` over shared
    memory: held until the model's time has passed (every collective on the
    handles, the host allreduce), or, ``additive`` (the sparse strategy), the
    model's time on top of the call's own (its merges are CPU work between the
    transfers)."""
    return one_node_s + model_s if additive else max(one_node_s, model_s)


#: The collectives that run as blocking calls on the calling thread (the host
#: path's ring, the sparse algorithms); the others go through the handles.
BLOCKING = ("allreduce ring", "sparse ")


def path_of(collective: str) -> str:
    """``"blocking"`` or ``"handles"``: how the project runs ``collective``."""
    return "blocking" if collective.startswith(BLOCKING) else "handles"


def job_link(job: dict, path: str = "blocking") -> Link:
    """The link the model is given for ``job``'s calls on ``path``: its rate,
    the measured one-way time of a small message as the latency per step, and
    as ``cpu=`` the host's ceiling where the calibration's exchange on that path
    (blocking ``Sendrecv``; through a handle, whichever is slower) fell more
    than ``CEILING_SLACK`` short of the link's payload rate (the host, not the
    link, was the limit). Jobs measured before the handle exchange was
    calibrated use the blocking one for both paths."""
    link = Link.parse(job["link"])
    c = job["calibration"]
    rate = c["exchange_bytes_per_s"]
    if path == "handles":
        rate = min(rate, c.get("handle_exchange_bytes_per_s", rate))
    elif path != "blocking":
        raise ValueError(f"path must be 'blocking' or 'handles', got {path!r}")
    cpu = 8 * rate
    changes = {"latency_s": float(f"{c['one_way_s'] * 1e6:.2g}") * 1e-6}
    if cpu < (1 - CEILING_SLACK) * link.payload * link.bits_per_s:
        changes["cpu_bits_per_s"] = float(f"{cpu:.2g}")
    return dataclasses.replace(link, **changes)


def format_table(jobs: list[dict], one_node: dict[int, dict] | None = None) -> str:
    """One markdown table of every network job's rows: the emulated link before
    and after the corrections, measured, errors; then the calibration.

    ``one_node``: the same points on one node (shared memory), by rank count.
    """
    lines = [
        "| link (model) | nodes | collective | size | one node ms | before ms "
        "| model ms | network ms (min-max) | error before | error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    errors, before, points = [], [], []
    for job in jobs:
        P, bare = job["ranks"], Link.parse(job["link"]).ideal()
        links = {path: job_link(job, path) for path in ("blocking", "handles")}
        shm = {}
        if one_node and P in one_node:
            shm = {(r["collective"], r["size"]): float(np.median(r["times_s"]))
                   for r in one_node[P]["rows"]}  # fmt: skip
        for row in job["rows"]:
            ts, name = row["times_s"], row["collective"]
            link = links[path_of(name)]
            med = float(np.median(ts))
            local = shm.get((name, row["size"]), 0.0)
            ideal = max(model_of(bare, c, P) for c in row["costs"])
            model = max(model_of(link, c, P) for c in row["costs"])
            old = max(local, ideal)  # the emulation before: max throughout
            new = emulated(local, model, additive=name.startswith("sparse "))
            errors.append(abs(new / med - 1))
            before.append(abs(old / med - 1))
            where = f"{bare.bits_per_s / 1e9:g} Gb/s, {P} nodes"
            points.append((where, name, row["size"], new / med - 1))
            lines.append(
                f"| {link} | {P} | {name} | {row['size']} | "
                f"{_ms(local) if shm else '-'} | {_ms(old)} | {_ms(new)} | "
                f"{_ms(med)} ({_ms(min(ts))}-{_ms(max(ts))}) | "
                f"{old / med - 1:+.0%} | {new / med - 1:+.0%} |"
            )
    lines += [
        "",
        f"Within 10% of the network's median: {sum(e <= 0.10 for e in errors)} of "
        f"{len(errors)} points (before the corrections: "
        f"{sum(e <= 0.10 for e in before)}); median error {np.median(errors):.0%} "
        f"(before: {np.median(before):.0%}), largest {max(errors):.0%}.",
        "",
        *_summary(points),
        "",
        "Calibration (what the model's constants stand for, measured in each job):",
        "",
        "| where | ranks | one-way 8 B us | exchange Gb/s each way "
        "| through a handle | sum GB/s | load |",
        "|---|---|---|---|---|---|---|",
    ]
    for job in ([*one_node.values()] if one_node else []) + jobs:
        c = job["calibration"]
        where = job["link"] if job["nodes"] > 1 else "one node"
        h = c.get("handle_exchange_bytes_per_s")
        handle = "-" if h is None else f"{h * 8 / 1e9:.2f}"
        lines.append(
            f"| {where} | {job['ranks']} | {c['one_way_s'] * 1e6:.0f} | "
            f"{c['exchange_bytes_per_s'] * 8 / 1e9:.2f} | {handle} | "
            f"{c['add_bytes_per_s'] / 1e9:.2f} | "
            f"{job['load_average'][0]:.1f}-{job['load_average_end'][0]:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _summary(points: list[tuple[str, str, str, float]]) -> list[str]:
    """The errors by link and node count, then by collective: how many points
    within 10%, the median and the largest (signed: - is the model short)."""
    out = []
    for title, key in (("link, nodes", 0), ("collective", 1)):
        groups: dict[str, list] = {}
        for p in points:
            groups.setdefault(p[key], []).append(p)
        out += [
            f"| {title} | within 10% | median error | largest error (where) |",
            "|---|---|---|---|",
        ]
        for name, group in groups.items():
            errs = [abs(p[3]) for p in group]
            worst = max(group, key=lambda p: abs(p[3]))
            at = worst[1 - key] + ", " + worst[2]
            out.append(
                f"| {name} | {sum(e <= 0.10 for e in errs)} of {len(errs)} | "
                f"{np.median(errs):.0%} | {worst[3]:+.0%} ({at}) |"
            )
        out.append("")
    return out[:-1]


def render(root: Path) -> str:
    """``root/table.md`` from ``root/results.json`` with today's model."""
    results = json.loads((root / "results.json").read_text())
    one_node = {j["ranks"]: j for j in results.get("one_node", [])}
    table = format_table(results["jobs"], one_node)
    (root / "table.md").write_text(table)
    return table
