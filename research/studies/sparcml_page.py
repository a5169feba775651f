"""SparCML's tables, checks and README paragraph, from a run's ``results.json``.

``results.json`` (:func:`research.studies.sparcml.run_experiment`) holds the
micro-benchmark's points, each with its timed calls (``real_reps``,
``emulated_reps``: the slowest rank's time of each call), the training arms
(per seed: final accuracy, time to target) and the communication-bound runs
(one row per model, link, arm and seed). Every check is decided on a 90%
interval (``research.studies.intervals``), and every time a check compares is
measured, never a model's choice:

* sparse (``auto``) against dense on the emulated link at 0.1% and 1%
  density (at most 0.1x and 0.3x): the ratio of the medians, bootstrap over
  the calls;
* ``auto`` against the best fixed algorithm (at most 1.10x) and, from 10%
  density, against dense (at most 1.05x): ``auto``'s own calls (gather the
  counts, choose for the link, run) against each one's;
* bytes sent against the cost model's (within 1.05x): exact counts, no noise;
* top-k 1% with error feedback within 0.5 points of dense, and without error
  feedback at least 1 point worse: the gap paired by seed, t interval;
* communication-bound: top-k with error feedback reaches the target sooner
  than dense, paired by seed (one seed: UNDECIDED).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from research.comm.link import Link
from research.studies import intervals as iv

#: What the page keeps of a run folder (``python -m scripts.results``).
KEEP = ("results.json", "*/summary.json", "comm_bound/*/*/summary.json")
SPARSE = ("ssar_rd", "ssar_sag", "dsar_sag")


def _reps(r: dict[str, Any], key: str = "emulated") -> list[float]:
    """A point's timed calls (a row kept without them: its median alone)."""
    return r.get(f"{key}_reps") or [r[f"{key}_s"]]


def _ratio(a: dict, b: dict, key: str = "emulated") -> iv.Estimate:
    return iv.ratio(_reps(a, key), _reps(b, key), "calls")


def bench_checks(rows: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """The micro-benchmark's checks (module docstring) on the emulated link's
    times (on the real link, where it is the only one, the same)."""
    out: list[dict[str, Any]] = []
    if not rows:
        return out
    P = 4 if any(r["P"] == 4 for r in rows) else max(r["P"] for r in rows)
    at = {(r["P"], r["density"], r["algorithm"]): r for r in rows}

    def add(word: str, claim: str, text: str) -> None:
        out.append({"word": word, "claim": claim, "text": text})

    for density, limit in ((0.001, 0.1), (0.01, 0.3)):
        if (P, density, "dense") in at and (P, density, "auto") in at:
            est = _ratio(at[P, density, "auto"], at[P, density, "dense"])
            add(
                iv.verdict(est, limit, above=False),
                f"dense@{density:g}",
                f"{where}, P={P}, density {density:g}: sparse (auto) / dense time "
                f"{est.show('.3f')} (asked <= {limit})",
            )
    for r in (r for r in rows if r["algorithm"] == "auto"):
        key = (r["P"], r["density"])
        fixed = [at[(*key, a)] for a in (*SPARSE, "dense") if (*key, a) in at]
        best = min(fixed, key=lambda x: x["emulated_s"])
        est = _ratio(r, best)
        add(
            iv.verdict(est, 1.10, above=False),
            "best",
            f"{where}, P={key[0]}, density {key[1]:g}: auto / best fixed "
            f"({best['algorithm']}) measured time {est.show('.2f')} (asked <= 1.10; "
            f"auto took {r.get('chosen_emulated', r['chosen'])})",
        )
        if key[1] >= 0.1 and (*key, "dense") in at:
            est = _ratio(r, at[(*key, "dense")])
            add(
                iv.verdict(est, 1.05, above=False),
                "auto-dense",
                f"  and auto / dense {est.show('.2f')} (asked <= 1.05)",
            )

    def bytes_ratio(r: dict[str, Any]) -> float:
        if r["model_bytes"] == 0:
            return 1.0 if r["bytes"] == 0 else math.inf
        return r["bytes"] / r["model_bytes"]

    worst = max(rows, key=lambda r: abs(math.log(max(bytes_ratio(r), 1e-12))))
    ratio = bytes_ratio(worst)
    add(
        iv.exact(1 / 1.05 <= ratio <= 1.05),
        "bytes",
        f"measured bytes / model within 1.05x at every point (worst {ratio:.3f}: "
        f"P={worst['P']} density {worst['density']:g} {worst['algorithm']}; exact "
        "counts)",
    )
    return out


def _paired_gap(a: dict, b: dict) -> iv.Estimate:
    """``a``'s final accuracy minus ``b``'s in points, paired by seed."""
    acc_b = dict(zip(b.get("seeds", [0]), b.get("final_accs", [b["final_test_acc"]])))
    pairs = [
        (100 * x, 100 * acc_b[s])
        for s, x in zip(a.get("seeds", [0]), a.get("final_accs", [a["final_test_acc"]]))
        if s in acc_b
    ]
    return iv.difference(
        [p[0] for p in pairs], [p[1] for p in pairs], "seeds", paired=True
    )


def train_checks(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The accuracy targets, on the gap's interval over seeds."""
    by = {r["arm"]: r for r in results}
    out: list[dict[str, Any]] = []
    if "dense" in by and "topk_ef" in by:
        gap = _paired_gap(by["dense"], by["topk_ef"])
        out.append(
            {
                "word": iv.verdict(gap, 0.5, above=False),
                "claim": "accuracy",
                "text": "top-k 1% + error feedback within 0.5 points of dense: "
                f"gap {gap.show('.2f', ' points')} (dense minus top-k, paired by "
                "seed)",
            }
        )
    if "topk_ef" in by and "topk_noef" in by:
        gap = _paired_gap(by["topk_ef"], by["topk_noef"])
        out.append(
            {
                "word": iv.verdict(gap, 1.0, above=True),
                "claim": "feedback",
                "text": "without error feedback visibly worse (>= 1 point): gap "
                f"{gap.show('.2f', ' points')} (with minus without, paired by "
                "seed)",
            }
        )
    return out


def _network(row: dict[str, Any]) -> bool:
    """A real-link row whose ranks spanned several nodes."""
    return not Link.parse(row["link"]).emulated and (row.get("nodes") or 1) > 1


def comm_bound_checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Top-k with error feedback reaches the target sooner than dense, paired
    by seed, on each emulated link and on a real network."""
    from research.studies.sparcml_commbound import phases_note, step_reached

    out: list[dict[str, Any]] = []
    groups = sorted({(r["model"], r["link"]) for r in rows})
    for model, spec in groups:
        mine = [r for r in rows if r["model"] == model and r["link"] == spec]
        topk = {r.get("seed", 0): r for r in mine if r["arm"] == "topk_ef"}
        dense = {r.get("seed", 0): r for r in mine if r["arm"] == "dense"}
        if not topk or not dense:
            continue
        one = next(iter(topk.values()))
        if not (Link.parse(spec).emulated or _network(one)):
            continue
        link = (
            spec if Link.parse(spec).emulated else f"real network, {one['nodes']} nodes"
        )
        seeds = sorted(set(topk) & set(dense))
        target = one["target"]
        d_t = [dense[s]["time_to_target_s"] for s in seeds]
        t_t = [topk[s]["time_to_target_s"] for s in seeds]
        # A seed where top-k never got there and dense did is against the
        # claim; one where neither did says nothing of it (left out, named).
        never = [s for s, d, t in zip(seeds, d_t, t_t) if t is None and d is not None]
        neither = [s for s, d, t in zip(seeds, d_t, t_t) if t is None and d is None]
        est = iv.difference(d_t, t_t, "seeds", paired=True)  # where both reached
        word = iv.FAIL if never else iv.verdict(est, 0.0, above=True)
        first_t, first_d = topk[seeds[0]], dense[seeds[0]]
        note = phases_note(first_t, first_d)
        at_t, at_d = step_reached(first_t, target), step_reached(first_d, target)
        if at_t is not None and at_d is not None:
            note += f"; seed {seeds[0]} reached it at step {at_t} vs {at_d}"
        reached = "" if not never else f"; top-k never reached it with seed(s) {never}"
        if neither:
            reached += f"; neither reached it with seed(s) {neither}"
        out.append(
            {
                "word": word,
                "claim": f"{model}@{spec}",
                "kind": "comm-bound",
                "link": spec if Link.parse(spec).emulated else "real",
                "text": f"{model}, {link}: top-k + EF faster to {target:g} than "
                f"dense: by {est.show('.1f', ' s')} (dense's time minus top-k's, "
                f"paired by seed{reached}{note})",
            }
        )
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{1e3 * v:.2f}"


def format_bench(rows: list[dict[str, Any]], head: str) -> list[str]:
    """The micro-benchmark's table: medians over the timed calls."""
    lines = [
        head,
        "",
        "| P | density | algorithm | real ms | /dense | emul ms [90%] "
        "| /dense | calls | MB/rank | model MB | chosen |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    at = {(r["P"], r["density"], r["algorithm"]): r for r in rows}
    for r in rows:
        d = at[r["P"], r["density"], "dense"]
        e = iv.median(_reps(r))
        emu = _ms(e.value) + (f" [{_ms(e.lo)}, {_ms(e.hi)}]" if e.known else "")
        chosen = ""
        if r["algorithm"] == "auto":
            chosen = f"real: {r['chosen']}, emulated: {r.get('chosen_emulated', '-')}"
        lines.append(
            f"| {r['P']} | {r['density']:g} | {r['algorithm']} | "
            f"{_ms(r['real_s'])} | {r['real_s'] / d['real_s']:.3f} | {emu} | "
            f"{r['emulated_s'] / d['emulated_s']:.3f} | {e.n} | "
            f"{r['bytes'] / 1e6:.3f} | {r['model_bytes'] / 1e6:.3f} | {chosen} |"
        )
    return lines


def format_train(results: list[dict[str, Any]], target_acc: float) -> list[str]:
    n = max((len(r.get("seeds", [0])) for r in results), default=1)
    steps = sorted({r.get("steps") for r in results if r.get("steps")})
    caption = [
        f"Each arm: {n} seed{'s' * (n > 1)}, {'/'.join(map(str, steps)) or '?'} "
        "steps each; ms/step and MB/step: means over a run's steps after the "
        "first, then over the seeds; to the target: the mean over the seeds that "
        "reached it",
        "",
    ]
    lines = [
        *caption,
        f"| arm | final acc ({n} seeds: mean +- sd) | to {target_acc:g} | "
        "ms/step | MB/step/rank |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        t, b = r["time_to_target_s"], r["bytes_per_step"]
        reached = r.get("reached", 1)
        to = "-" if t is None else f"{t:.1f} s" + (f" ({reached}/{n})" * (reached < n))
        lines.append(
            f"| {r['arm']} | {r['final_test_acc']:.4f} +- "
            f"{r.get('final_acc_std', 0.0):.4f} | {to} | "
            f"{1e3 * (r['mean_step_s'] or math.nan):.1f} | "
            f"{'-' if b is None else f'{b / 1e6:.4f}'} |"
        )
    return lines


def format_comm_bound(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| model | link | arm | seed | ms/step | target | reached | final acc "
        "| MB/step/rank |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t, b = r["time_to_target_s"], r["bytes_per_step"]
        lines.append(
            f"| {r['model']} | {r['link']} | {r['arm']} | {r.get('seed', 0)} | "
            f"{1e3 * (r['mean_step_s'] or math.nan):.1f} | {r['target']:g} | "
            f"{'-' if t is None else f'{t:.1f} s'} | {r['final_test_acc']:.4f} | "
            f"{'-' if b is None else f'{b / 1e6:.3f}'} |"
        )
    lines += [
        f"real: {label}"
        for label in sorted({r["link_label"] for r in rows if _network(r)})
    ]
    return lines


def all_checks(data: dict[str, Any]) -> list[dict[str, Any]]:
    return (
        bench_checks(
            data.get("bench") or [], data.get("where") or data.get("link", "?")
        )
        + train_checks(data.get("train") or [])
        + comm_bound_checks(data.get("comm_bound") or [])
    )


def render(root: Path) -> list[str]:
    """The run's part of ``docs/results/sparcml.md`` from ``results.json``."""
    data = json.loads((Path(root) / "results.json").read_text())
    lines: list[str] = []
    if data.get("bench"):
        reps = max(len(_reps(r)) for r in data["bench"])
        lines += [
            f"Micro-benchmark, dim {data['bench'][0].get('dim', '?')}, {reps} "
            "timed calls per point after one warm-up (the slowest rank's time "
            "of each; the table's figures are their medians)",
            "",
        ]
        lines += format_bench(data["bench"], data.get("bench_head", ""))
        lines.append("")
    if data.get("train"):
        lines += [data.get("train_head", "training"), ""]
        lines += format_train(data["train"], data.get("target_acc", 0.8)) + [""]
    if data.get("comm_bound"):
        lines += [data.get("comm_head", "communication-bound training"), ""]
        lines += format_comm_bound(data["comm_bound"]) + [""]
    lines += ["Checks:", ""]
    lines += [iv.check_line(c["word"], c["text"]) for c in all_checks(data)]
    return lines


def readme(runs: list[Path], sections: dict[str, list[Path]]) -> str | None:
    """The README's paragraph on SparCML, from the page's runs."""
    from research.provenance import read_jobs

    text = (
        "**SparCML** (`python -m experiments.sparcml`): sparse allreduce algorithms "
        "(`research/comm/sparse/`: recursive doubling, split-allgather, dense "
        "switch, quantized values, `auto` from a calibrated cost model) and top-k "
        "training with error feedback."
    )
    for root in [*runs, *(r for rs in sections.values() for r in rs)]:
        data = json.loads((Path(root) / "results.json").read_text())
        jobs = read_jobs(root)
        when = jobs[0]["started_utc"][:10] if jobs else "?"
        recs = all_checks(data)
        bench = {
            (r["P"], r["density"], r["algorithm"]): r for r in data.get("bench") or []
        }
        said = []
        for density in (0.001, 0.01):
            pts = [
                (p, _ratio(bench[p, density, "auto"], bench[p, density, "dense"]))
                for p in sorted({k[0] for k in bench})
                if (p, density, "auto") in bench
            ]
            if pts:
                said.append(
                    f"at {density:.1%} density `auto` takes "
                    + " / ".join(e.point(".3f") for _, e in pts)
                    + f" of dense's time (P = {'/'.join(str(p) for p, _ in pts)})"
                )
        by = {r["arm"]: r for r in data.get("train") or []}
        if "dense" in by and "topk_ef" in by:
            gap = _paired_gap(by["dense"], by["topk_ef"])
            dense_b, topk_b = (
                by["dense"]["bytes_per_step"],
                by["topk_ef"]["bytes_per_step"],
            )
            acc = next(c for c in recs if c["claim"] == "accuracy")
            said.append(
                f"top-k 1% on `cnn_small` {gap.show('.2f', ' points')} below "
                f"dense (within 0.5: {acc['word']}) at "
                f"{topk_b / dense_b:.3f} of its bytes"
            )
        cb = [c for c in recs if c.get("kind") == "comm-bound"]
        if cb:
            said.append(
                "top-k + error feedback sooner to its target than dense "
                "(`--comm-bound`, P1B2): "
                + ", ".join(
                    c["word"] if c["link"] == "real" else f"{c['link']} {c['word']}"
                    for c in cb
                )
            )
        if said:
            text += f" {_where(data, jobs)}, {when}: " + "; ".join(said) + "."
    return text


def _where(data: dict[str, Any], jobs: list[dict[str, Any]]) -> str:
    """Where a run's figures were measured, for the README: the local nodes
    and their rate (from the job's record), else the emulated link."""
    network = (jobs[0].get("network") if jobs else None) or ""
    nodes = re.search(r"(\d+) nodes at (\S+) per node", network)
    if nodes:
        return f"{nodes[1]} local nodes at {nodes[2]} (TCP)"
    if data.get("bench"):
        return f"emulated link {data.get('where') or '?'}"
    return "emulated links"
