"""DeepFreeze's table, targets and README paragraph, from a run's job files.

A run root holds one ``<job>-np<P>.json`` per MPI job
(:func:`research.studies.deepfreeze.run_job`): per arm its overhead with the
90% bootstrap interval over rounds (``research/checkpoint/overhead.py``: each
round one period of every arm, the placebo's cost taken out of every arm's),
per saver its blocking, commit and persist times per checkpoint and its
writer's CPU per checkpoint and rank. The targets, each decided on an
interval (``research.studies.intervals``):

* DeepFreeze's blocking at most 10% of rank0-blocking's: the ratio of the
  median blocking per checkpoint, bootstrap over checkpoints;
* its overhead at a checkpoint every 10 steps at most 5% (CheckFreq: 3.5%):
  the upper end of its 90% interval; the placebo's own figure (the bias every
  overhead is corrected by) is stated beside it;
* its writer's CPU at most 1.5 ms per MB: the median over writing ranks and
  checkpoints, bootstrap;
* the lowest overhead of all savers, separated: PASS when the interval of
  every difference (another saver's minus DeepFreeze's) lies above 0, FAIL
  when one lies below 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from research.studies import intervals as iv

#: What the page keeps of a run folder (``python -m scripts.results``).
KEEP = ("*-np*.json",)
LIMIT = 0.05


def _current(job: dict) -> dict:
    """A job file in today's words: files written before the savers' rename say
    "strategy"/"strategies" and "rank0-sync"/"orbax-sync" for the savers."""
    old = {"rank0-sync": "rank0-blocking", "orbax-sync": "orbax-blocking"}

    def name(n: str) -> str:
        return old.get(n, n)

    if "strategies" in job:
        job["savers"] = {name(k): v for k, v in job.pop("strategies").items()}
    for arm in job.get("arms", {}).values():
        if "strategy" in arm:
            arm["saver"] = name(arm.pop("strategy"))
    return job


def load_results(root: Path) -> tuple[dict | None, list[dict]]:
    """The main job's results and every job's (for the ranks figure)."""
    jobs = [
        _current(json.loads(p.read_text())) for p in sorted(root.glob("*-np*.json"))
    ]
    main = next((j for j in jobs if j["job"] == "main"), None)
    return main, jobs


def table_rows(main: dict) -> list[dict[str, Any]]:
    """One row per saver at the main interval, the placebo (``none``) first."""
    rows = []
    iv_key = str(main["interval"])
    for a in main["arms"].values():
        if a["saver"] != "none" and a["interval"] != main["interval"]:
            continue
        row = {
            "saver": a["saver"],
            "overhead": a["overhead"],
            "ci": a.get("overhead_ci90"),
            "diff_ci": a.get("diff_ci90"),
            "cost_s": a.get("cost_s"),
            "periods": a.get("periods"),
            "raw_overhead": a.get("raw_overhead"),
            "raw_ci": a.get("raw_ci90"),
        }
        if a["saver"] == "none":
            rows.insert(0, row)
            continue
        st = main["savers"][a["saver"]]
        d = st["by_interval"].get(iv_key, {})
        b = [x for x in d.get("bytes_per_rank", []) if x] or [0]
        row.update(
            {
                "blocking_s": d.get("median_blocking_s"),
                "blocking": d.get("blocking_s") or [],
                "committed_s": d.get("median_committed_s"),
                "persisted_s": d.get("median_persisted_s"),
                "restore_s": st.get("restore_s"),
                "mb_min": min(b) / 1e6,
                "mb_max": max(b) / 1e6,
                "writers": len([x for x in d.get("bytes_per_rank", []) if x]),
                "cpu_s": d.get("median_writer_cpu_s"),
                "cpu_per_mb": d.get("writer_cpu_s_per_mb") or [],
            }
        )
        rows.append(row)
    return rows


def _pct(v: float, ci: list[float] | None) -> str:
    ci_text = f" [{ci[0]:+.1%}, {ci[1]:+.1%}]" if ci else ""
    return f"{v:+.1%}{ci_text}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def overhead(row: dict) -> iv.Estimate:
    """A saver's overhead and its 90% interval over rounds."""
    ci = row.get("ci")
    lo, hi = (ci[0], ci[1]) if ci else (None, None)
    return iv.Estimate(row["overhead"], lo, hi, row.get("periods") or 0, "rounds")


def format_table(main: dict) -> str:
    """Markdown table, targets and the in-flight measurement."""
    rows = table_rows(main)
    periods = max((r.get("periods") or 0) for r in rows)
    head = [
        "saver",
        "blocking ms (median)",
        "committed s",
        "persisted s",
        f"overhead @{main['interval']} [90% CI]",
        "cost ms/ckpt",
        "minus deepfreeze [90% CI]",
        "restore s",
        "MB written/rank/ckpt",
        "writer CPU ms/ckpt (ms/MB)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        diff = r.get("diff_ci")
        diff_text = f"[{diff[0]:+.1%}, {diff[1]:+.1%}]" if diff else "-"
        if r["saver"] == "none":
            lines.append(
                f"| none (placebo, uncorrected) | - | - | - | "
                f"{_pct(r['raw_overhead'], r['raw_ci'])} | - | - | - | - | - |"
            )
            continue
        mb = (
            f"{r['mb_max']:.1f} (rank 0 only)"
            if r["writers"] == 1
            else f"{r['mb_min']:.1f}-{r['mb_max']:.1f} ({r['writers']} ranks)"
        )
        per_mb = iv.median(r["cpu_per_mb"]).value if r["cpu_per_mb"] else None
        lines.append(
            f"| {r['saver']} | {_ms(r['blocking_s'])} | "
            f"{_s(r['committed_s'])} | {_s(r['persisted_s'])} | "
            f"{_pct(r['overhead'], r.get('ci'))} | {_ms(r['cost_s'])} | "
            f"{diff_text if r['saver'] != 'deepfreeze' else '-'} | "
            f"{_s(r['restore_s'])} | {mb} | "
            f"{_ms(r.get('cpu_s'))} ({_ms(per_mb)}) |"
        )
    lines.append("")
    lines.append(
        f"model {main['model']}, {main['ranks']} ranks, reference step "
        f"{main['reference_step_s'] * 1e3:.0f} ms, {periods} rounds: {periods} "
        f"periods of {main['window']} steps per arm (checkpoint at the first step, "
        f"its work waited for {main['settle']} steps later); cost = charged steps "
        "minus as many local clean steps, mean over periods, less the placebo's; "
        "overhead = cost / reference time of a period; 90% intervals from a "
        "bootstrap over the rounds (research/checkpoint/overhead.py); blocking, "
        f"committed, persisted: medians over each saver's {_counts(main)} "
        "checkpoints; writer CPU: "
        "median per writing rank and checkpoint, on the writer's own CPU clock "
        "(research/checkpoint/cpuclock.py), per MB of one tier's shard"
    )
    lines += targets(rows, main)
    return "\n".join(lines)


def _counts(main: dict) -> str:
    """How many checkpoints each saver made at the main interval: "28" or "27-28"."""
    key = str(main["interval"])
    n = sorted(
        {
            d.get("checkpoints", len(d.get("blocking_s") or []))
            for st in main["savers"].values()
            if (d := st["by_interval"].get(key))
        }
    )
    if not n:
        return "?"
    return f"{n[0]}" if n[0] == n[-1] else f"{n[0]}-{n[-1]}"


def target_records(rows: list[dict], main: dict) -> list[dict[str, str]]:
    """The targets: ``word``, ``claim`` and ``text`` (module docstring)."""
    by = {r["saver"]: r for r in rows}
    out: list[dict[str, str]] = []
    df, r0, none = by.get("deepfreeze"), by.get("rank0-blocking"), by.get("none")
    bias = (
        f"the placebo's own {_pct(none['raw_overhead'], none['raw_ci'])} taken out"
        if none and none.get("raw_ci")
        else "no placebo measured"
    )
    if df and r0 and df["blocking"] and r0["blocking"]:
        est = iv.ratio(df["blocking"], r0["blocking"], "checkpoints")
        out.append(
            _rec(
                iv.verdict(est, 0.10, above=False),
                "blocking",
                f"DeepFreeze's blocking against rank0-blocking's: "
                f"{est.show('.1%')} (medians per checkpoint; asked <= 10%)",
            )
        )
    if df and main["interval"] == 10:
        est = overhead(df)
        raw = df.get("raw_overhead")
        raw_text = f", uncorrected {raw:+.1%}" if raw is not None else ""
        out.append(
            _rec(
                iv.verdict(est, LIMIT, above=False),
                "overhead",
                "DeepFreeze's overhead at a checkpoint every 10 steps: "
                f"{est.show('+.1%')} ({bias}{raw_text}; asked: the interval's "
                "upper end <= 5%; CheckFreq 3.5%)",
            )
        )
    if df and df["cpu_per_mb"]:
        est = iv.median(df["cpu_per_mb"], "writes")
        out.append(
            _rec(
                iv.verdict(est, 1.5e-3, above=False),
                "cpu",
                "DeepFreeze's writer CPU per MB: "
                f"{est.show('.2f', ' ms', 1e3)} ({_ms(df['cpu_s'])} ms per "
                "checkpoint; asked <= 1.5 ms/MB)",
            )
        )
    others = [r for r in rows if r["saver"] not in ("none", "deepfreeze")]
    if df and others:
        out.append(_separation(df, others))
    return out


def targets(rows: list[dict], main: dict) -> list[str]:
    """The targets, the placebo and the in-flight policies, as lines."""
    by = {r["saver"]: r for r in rows}
    none = by.get("none")
    out = []
    if none and none.get("raw_ci"):
        out.append(
            f"method: the placebo (periods without a checkpoint, measured alike) "
            f"came out at {_pct(none['raw_overhead'], none['raw_ci'])}; every "
            "overhead above is relative to it, and its interval is part of theirs"
        )
    out += [iv.check_line(t["word"], t["text"]) for t in target_records(rows, main)]
    for arm, policy in (("deepfreeze@1", "wait"), ("deepfreeze-skip@1", "skip")):
        a = main["arms"].get(arm)
        st = main["savers"].get(a["saver"]) if a else None
        d = st["by_interval"].get("1") if st else None
        if d:
            out.append(
                f"INFO  in flight (checkpoint every step, policy {policy}): "
                f"{d['checkpoints']} requests, {d['stalled']} waited (median "
                f"wait {_ms(d['median_wait_s'])} ms, max blocking "
                f"{_ms(max(d['blocking_s']))} ms), {d['skipped']} skipped, "
                f"overhead {a['overhead']:.0%}"
            )
    return out


def _separation(df: dict, others: list[dict]) -> dict[str, str]:
    """Is DeepFreeze's overhead the lowest, every difference's interval above 0?"""
    text = "DeepFreeze overhead lowest of all savers, separated (90% interval of each "
    if not all(r.get("diff_ci") for r in others) or not df.get("ci"):
        return _rec(iv.UNDECIDED, "lowest", text + "difference above 0): none")
    above = [r["saver"] for r in others if r["diff_ci"][0] > 0]
    below = [r["saver"] for r in others if r["diff_ci"][1] < 0]
    word = iv.FAIL if below else iv.PASS if len(above) == len(others) else iv.UNDECIDED
    text += "other saver's minus DeepFreeze's above 0): above 0 for "
    text += ", ".join(above) or "none"
    return _rec(
        word, "lowest", text + (f"; below 0 for {', '.join(below)}" if below else "")
    )


def _rec(word: str, claim: str, text: str) -> dict[str, str]:
    return {"word": word, "claim": claim, "text": text}


def render(root: Path) -> list[str]:
    """The run's part of ``docs/results/deepfreeze.md``."""
    main, _ = load_results(root)
    if main is None:
        return ["(no main job in this run)"]
    return format_table(main).splitlines()


def _summary(root: Path) -> dict[str, Any]:
    from research.provenance import read_jobs

    main, _ = load_results(root)
    rows = table_rows(main)
    by = {r["saver"]: r for r in rows}
    jobs = read_jobs(root)
    return {
        "when": jobs[0]["started_utc"][:10] if jobs else "?",
        "by": by,
        "targets": {t["claim"]: t for t in target_records(rows, main)},
        "main": main,
    }


def readme(runs: list[Path], sections: dict[str, list[Path]]) -> str | None:
    """The README's paragraph on DeepFreeze, from the page's runs."""
    if not runs:
        return None
    s = _summary(runs[-1])
    by, t = s["by"], s["targets"]
    df = by["deepfreeze"]
    none = by.get("none") or {}
    others = ", ".join(
        f"{name} {overhead(r).point('+.1%')}"
        for name, r in by.items()
        if name not in ("none", "deepfreeze")
    )
    text = (
        "**DeepFreeze** (`python -m experiments.deepfreeze`): 4 ranks train CANDLE "
        "P1B2 while each saver checkpoints every 10 steps in shuffled periods. "
        f"{s['when']}: DeepFreeze costs {overhead(df).show('+.1%')} of training time "
        f"(90% interval; the placebo's own "
        f"{_pct(none.get('raw_overhead', 0.0), none.get('raw_ci'))} taken out), "
        f"blocks {_ms(df['blocking_s'])} ms per checkpoint; {others}. At most 5%: "
        f"{t.get('overhead', {}).get('word', '-')}; the lowest, separated: "
        f"{t.get('lowest', {}).get('word', '-')}."
    )
    for title, roots in sections.items():
        x = _summary(roots[-1])
        d, n = x["by"]["deepfreeze"], x["by"].get("none") or {}
        text += (
            f" {title}, {x['when']}: {overhead(d).show('+.1%')} (placebo "
            f"{_pct(n.get('raw_overhead', 0.0), n.get('raw_ci'))}), at most 5%: "
            f"{x['targets'].get('overhead', {}).get('word', '-')}."
        )
    return text
