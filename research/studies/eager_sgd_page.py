"""eager-SGD's table, checks and README paragraph, from a run's ``results.json``.

``results.json`` (:func:`research.studies.eager_sgd.write_results`) holds one
record per arm and seed, read from that arm's run folder: throughput, median
steps, time to the target, final accuracy, contributors, gradient age. From
those alone:

* the table: per arm, mean +- sd over the seeds (a run's step figures are
  medians over its steps after the first);
* throughput relative to allreduce: per seed (the arms of one seed share its
  data order and its straggler draws), then the mean ratio and its 90% t
  interval over the seeds;
* the checks (``research.studies.intervals``), per eager arm: faster than
  allreduce (the ratio's interval above 1); sooner to the target (allreduce's
  time minus the arm's, paired by seed, its interval above 0); and its final
  accuracy not lost: allreduce's accuracy minus the arm's, paired by seed, at
  most the seeds' own spread (twice the sd of allreduce's final accuracy over
  the seeds: the accuracy a second seed of the same arm moves by). One seed
  decides nothing: UNDECIDED. The waiting lines (allreduce's step grows by
  the delay, the eager arms' do not) are INFO: no target is asked of them.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from research.studies import intervals as iv

#: What the page keeps of a run folder (``python -m scripts.results``).
KEEP = ("results.json", "*/summary.json")
ORDER = ("balanced", "allreduce", "solo", "majority", "ps")
EAGER = ("solo", "majority")
#: The final accuracy may fall by this many sds of allreduce's over seeds.
SPREADS = 2.0


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per arm: (mean, sd) over seeds of every column, and the
    per-seed values of each (``per_seed``)."""
    out = []
    for arm in sorted({r["arm"] for r in runs}, key=ORDER.index):
        mine = sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"])
        row: dict[str, Any] = {
            "arm": arm,
            "seeds": [r["seed"] for r in mine],
            "steps": mine[0]["steps"],
            "per_seed": {},
        }
        for key in (
            "samples_per_s",
            "median_step_s",
            "step_without_delay_s",
            "time_to_target_s",
            "final_test_acc",
            "mean_contributors",
            "mean_age",
        ):
            vals = [r.get(key) for r in mine]
            row["per_seed"][key] = vals
            row[key] = _mean_sd(vals)
        out.append(row)
    return out


def _mean_sd(values: list[float | None]) -> tuple[float, float] | None:
    vals = [v for v in values if v is not None]
    if not vals or len(vals) < len(values):
        return None  # a seed never got there: no mean
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def _fmt(v, scale: float = 1.0, digits: int = 1, std: bool = True) -> str:
    if v is None:
        return "-"
    mean, sd = v[0] * scale, v[1] * scale
    return f"{mean:.{digits}f} +- {sd:.{digits}f}" if std else f"{mean:.{digits}f}"


def format_table(rows: list[dict[str, Any]], target_acc: float) -> str:
    """The experiment's table as Markdown (sd shown with several seeds)."""
    multi = any(len(r["seeds"]) > 1 for r in rows)
    head = [
        "arm",
        "steps",
        "samples/s",
        "median step ms",
        "without own delay",
        f"time to {target_acc:.0%} s",
        "final test acc",
        "fresh contributors",
        "gradient age",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        name = r["arm"] + (" (no imbalance)" if r["arm"] == "balanced" else "")
        acc = r["final_test_acc"] if r["arm"] != "balanced" else None
        cells = [
            name,
            str(r["steps"]),
            _fmt(r["samples_per_s"], std=multi, digits=0),
            _fmt(r["median_step_s"], 1e3, std=multi),
            _fmt(r.get("step_without_delay_s"), 1e3, std=multi),
            _fmt(r["time_to_target_s"], std=multi),
            _fmt(acc, digits=4, std=multi),
            _fmt(r["mean_contributors"], digits=2, std=multi),
            _fmt(r["mean_age"], digits=2, std=multi),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def speedups(rows: list[dict[str, Any]]) -> dict[str, iv.Estimate]:
    """Each arm's samples/s over allreduce's: per seed, then over the seeds."""
    by = {r["arm"]: r for r in rows}
    ref = by.get("allreduce")
    out = {}
    for arm in ("solo", "majority", "ps"):
        if arm in by and ref:
            mine = dict(zip(by[arm]["seeds"], by[arm]["per_seed"]["samples_per_s"]))
            base = dict(zip(ref["seeds"], ref["per_seed"]["samples_per_s"]))
            out[arm] = iv.mean(
                [mine[s] / base[s] for s in mine if s in base and base[s]], "seeds"
            )
    return out


def _paired(rows: dict, arm: str, key: str) -> tuple[list, list]:
    """Allreduce's and ``arm``'s values of ``key``, seed by seed."""
    a, b = rows["allreduce"], rows[arm]
    mine = dict(zip(b["seeds"], b["per_seed"][key]))
    return (
        [v for s, v in zip(a["seeds"], a["per_seed"][key]) if s in mine],
        [mine[s] for s in a["seeds"] if s in mine],
    )


def check_records(
    rows: list[dict[str, Any]], delay: float | None, target_acc: float
) -> list[dict[str, str]]:
    """The checks (module docstring): ``word`` (INFO, PASS, FAIL, UNDECIDED),
    ``arm``, ``claim`` (``faster``, ``sooner``, ``accuracy``, ``info``), ``text``."""
    by = {r["arm"]: r for r in rows}

    def val(arm: str, key: str) -> float | None:
        v = by.get(arm, {}).get(key)
        return v[0] if v else None

    out: list[dict[str, str]] = []

    def add(word: str, arm: str, claim: str, text: str) -> None:
        out.append({"word": word, "arm": arm, "claim": claim, "text": text})

    n = len(by["allreduce"]["seeds"]) if "allreduce" in by else 0
    base = val("balanced", "step_without_delay_s")
    sync = val("allreduce", "step_without_delay_s")
    if delay and base and sync:
        grow = sync - base
        add(
            "INFO",
            "allreduce",
            "info",
            f"allreduce's median step grew by {grow * 1e3:.1f} ms over the "
            f"no-imbalance step ({base * 1e3:.1f} ms), {grow / delay:.0%} of the "
            f"{delay * 1e3:.1f} ms injected delay (means over {n} seeds)",
        )
    for arm in EAGER:
        step = val(arm, "step_without_delay_s")
        if base and step:
            add(
                "INFO",
                arm,
                "info",
                f"{arm}'s median step without its own delay {step * 1e3:.1f} ms, "
                f"{step / base:.2f}x the no-imbalance step",
            )
    fast = speedups(rows)
    acc = by.get("allreduce", {}).get("per_seed", {}).get("final_test_acc") or []
    acc = [a for a in acc if a is not None]
    spread = SPREADS * statistics.stdev(acc) if len(acc) > 1 else None
    for arm in EAGER:
        if arm not in by or "allreduce" not in by:
            continue
        s = fast[arm]
        add(
            iv.verdict(s, 1.0, above=True),
            arm,
            "faster",
            f"{arm} trains faster than allreduce under the imbalance: "
            f"{s.show('.2f', 'x')} its samples/s (asked above 1x)",
        )
        ref, mine = _paired(by, arm, "time_to_target_s")
        sooner = iv.difference(ref, mine, "seeds", paired=True)
        add(
            iv.verdict(sooner, 0.0, above=True),
            arm,
            "sooner",
            f"{arm} reaches {target_acc:.0%} sooner than allreduce: by "
            f"{sooner.show('.1f', ' s')} (allreduce's time minus {arm}'s, paired "
            "by seed; asked above 0)",
        )
        ref, mine = _paired(by, arm, "final_test_acc")
        loss = iv.difference(ref, mine, "seeds", paired=True)
        word = iv.verdict(loss, spread, above=False) if spread else iv.UNDECIDED
        limit = f"{spread:.4f}" if spread else "unknown with one seed"
        add(
            word,
            arm,
            "accuracy",
            f"{arm} does not lose accuracy: allreduce's final accuracy minus "
            f"{arm}'s {loss.show('+.4f')} (paired by seed), asked at most the "
            f"seeds' spread, {limit} ({SPREADS:g} sd of allreduce's over its "
            "seeds)",
        )
    return out


def checks(rows: list[dict[str, Any]], delay: float | None, target: float) -> list[str]:
    """The checks as the page's lines."""
    return [
        iv.check_line(c["word"], c["text"]) for c in check_records(rows, delay, target)
    ]


def _mean_delay(spec: str, size: int) -> float | None:
    """Mean seconds a delayed rank is held up per step under ``spec``."""
    from research.imbalance import (
        DistImbalance,
        FixedImbalance,
        RandomImbalance,
        parse_imbalance,
    )

    try:
        imb = parse_imbalance(spec, size=size)
    except ValueError:
        return None
    if isinstance(imb, (FixedImbalance, RandomImbalance)):
        return imb.seconds
    if isinstance(imb, DistImbalance):
        return imb.mean()
    return None


def load(root: Path) -> dict[str, Any]:
    """A run's ``results.json`` with its rows aggregated (``rows``)."""
    data = json.loads((Path(root) / "results.json").read_text())
    data["rows"] = aggregate(data["runs"])
    return data


def render(root: Path) -> list[str]:
    """The run's part of ``docs/results/eager_sgd.md`` (module docstring)."""
    data = load(root)
    rows, target = data["rows"], data["target_acc"]
    size = data["runs"][0]["world_size"] if data["runs"] else 1
    seeds = sorted({r["seed"] for r in data["runs"]})
    steps = {r["arm"]: r["steps"] for r in rows}
    lines = format_table(rows, target).splitlines()
    lines += [
        "",
        f"Each cell: mean +- sd over {len(seeds)} seed{'s' * (len(seeds) > 1)} "
        f"({', '.join(map(str, seeds))}), one run per arm and seed of "
        + ", ".join(f"{a} {n}" for a, n in steps.items())
        + " steps; a run's step figures are medians over its steps after the "
        "first. Time to the target: the arm's set-up before its first step "
        "(its strategy's start-up) plus its training clock until the first "
        "evaluation at the target; step 1 (compilation, cached across arms) and "
        "the evaluations left out for every arm alike.",
    ]
    fast = speedups(rows)
    if fast:
        lines.append(
            "throughput relative to allreduce (per seed, then the mean and its 90% "
            "interval over seeds): "
            + ", ".join(f"{a} {e.show('.2f', 'x')}" for a, e in fast.items())
        )
    if data.get("imbalance"):
        lines.append(f"imbalance: {data['imbalance']}")
    lines += checks(rows, _mean_delay(data.get("imbalance", ""), size), target)
    return lines


def _words(root: Path) -> dict[str, Any]:
    data = load(root)
    rows = data["rows"]
    return {
        "seeds": len({r["seed"] for r in data["runs"]}),
        "when": _date(root),
        "fast": speedups(rows),
        "checks": check_records(rows, None, data["target_acc"]),
    }


def _date(root: Path) -> str:
    from research.provenance import read_jobs

    jobs = read_jobs(root)
    return jobs[0]["started_utc"][:10] if jobs else "?"


def _verdicts(records: list[dict[str, str]], claim: str) -> str:
    return ", ".join(f"{c['arm']} {c['word']}" for c in records if c["claim"] == claim)


def readme(runs: list[Path], sections: dict[str, list[Path]]) -> str | None:
    """The README's paragraph on eager-SGD, from the page's runs."""
    if not runs:
        return None
    w = _words(runs[-1])
    fast = w["fast"]
    text = (
        "**eager-SGD** (`make run` = `python -m experiments.eager_sgd --seeds 0 1 "
        "2`): 4 ranks train `cnn_small`, one random rank held up each step; solo "
        "and majority partial allreduce (`research/comm/partial.py`) against "
        f"synchronous allreduce and a parameter server. {w['when']}, {w['seeds']} "
        f"seeds: solo runs at {fast['solo'].show('.2f', 'x')} allreduce's "
        f"samples/s, majority {fast['majority'].show('.2f', 'x')} (90% "
        "intervals); faster: "
        + _verdicts(w["checks"], "faster")
        + "; sooner to the target: "
        + _verdicts(w["checks"], "sooner")
        + "; accuracy kept within the seeds' spread: "
        + _verdicts(w["checks"], "accuracy")
        + "."
    )
    for title, roots in sections.items():
        s = _words(roots[-1])
        text += (
            f" {title}, {s['when']} ({s['seeds']} seed{'s' * (s['seeds'] > 1)}): "
            f"solo {s['fast']['solo'].show('.2f', 'x')}, majority "
            f"{s['fast']['majority'].show('.2f', 'x')}."
        )
    text += (
        " The paper: 1.29x (ResNet-50, ImageNet) and 1.27x (an LSTM, UCF101) "
        "over synchronous SGD on 64 GPUs, 2.64x over a parameter server"
    )
    if "ps" in fast:
        text += (
            f"; here the server runs at {fast['ps'].show('.2f', 'x')} allreduce's "
            "samples/s (a 0.6 MB model never saturates one server; `--sweep` finds "
            "where it does)"
        )
    return text + "."
