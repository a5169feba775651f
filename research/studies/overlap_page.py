"""The overlap study's tables, checks and README paragraph, from ``results.jsonl``.

One row per run (:func:`research.studies.overlap.run_point`): its medians and
its measured steps themselves (``samples``: step, compute, communication and
exposed seconds of every step after the warm-up, rank 0's). Every figure the
page shows is a median over those steps, and each check is decided on a 90%
bootstrap interval over them (``research.studies.intervals``):

* overlap hides at least 80% of its communication: 1 - exposed / comm (the
  ratio of the medians, the steps resampled in pairs);
* its step within 1.1 x max(compute, comm) + one stage's communication;
* at least 1.3x host's speed at the most ranks on the link: host's median
  step over overlap's, each run's steps resampled on their own;
* at or ahead of layerwise, within 5%.

The targets are checked on every emulated link (``auto`` or a spec) and on
the real link where the ranks span nodes; on shared memory overlap against
host is INFO. The interval is the noise of one run's steps, not what a second
run would show (the journal records 20-30% between runs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from research.studies import intervals as iv

#: What the page keeps of a run folder (``python -m scripts.results``).
KEEP = ("results.jsonl", "*/summary.json")
STRATEGIES = ("host", "fused", "layerwise", "overlap", "overlap-fcx")


def read_results(root: Path) -> list[dict[str, Any]]:
    path = Path(root) / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def name_of(row: dict[str, Any]) -> str:
    return row.get("label", row["strategy"])


def unique(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run once: a run measured twice (a job rerun into the same folder)
    counts once, the later row."""
    key = lambda r: (r["model"], name_of(r), r["ranks"], r["link_kind"])  # noqa: E731
    return list({key(r): r for r in rows}.values())


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{1e3 * v:.1f}"


def steps(row: dict[str, Any], key: str = "step_s") -> list[float]:
    """The row's measured steps of ``key`` (empty: a row kept without them)."""
    return [x for x in (row.get("samples") or {}).get(key, []) if x is not None]


def step_est(row: dict[str, Any]) -> iv.Estimate:
    """The median step and its interval over the run's measured steps."""
    xs = steps(row)
    return iv.median(xs) if xs else iv.Estimate(row["step_s"], None, None, 0, "steps")


def speedup(host: dict[str, Any], row: dict[str, Any]) -> iv.Estimate:
    """Host's median step over ``row``'s, its interval over both runs' steps."""
    a, b = steps(host), steps(row)
    if a and b:
        return iv.ratio(a, b)
    return iv.Estimate(host["step_s"] / row["step_s"], None, None, 0, "steps")


def hidden_est(row: dict[str, Any]) -> iv.Estimate | None:
    """1 - exposed / comm (medians) and its interval, the steps in pairs."""
    comm, exposed = steps(row, "comm_s"), steps(row, "exposed_s")
    if not row.get("comm_s"):
        return None
    if len(comm) == len(exposed) and comm:
        r = iv.ratio(exposed, comm, paired=True)
        lo, hi = (1 - r.hi, 1 - r.lo) if r.known else (None, None)
        return iv.Estimate(max(0.0, 1 - r.value), lo, hi, r.n, "steps")
    return iv.Estimate(row.get("hidden") or 0.0, None, None, 0, "steps")


def format_table(rows: list[dict[str, Any]], model: str) -> str:
    """One model's table: medians over each run's measured steps."""
    rows = [r for r in rows if r["model"] == model]
    by = {(name_of(r), r["ranks"], r["link_kind"]): r for r in rows}
    head = [
        "strategy",
        "ranks",
        "link",
        "step ms [90%]",
        "steps",
        "compute ms",
        "comm ms",
        "hidden",
        "exposed ms",
        "vs host [90%]",
        "eff(1)",
        "opt MB/rank",
    ]
    lines = [
        f"#### {model}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    order = {s: i for i, s in enumerate(STRATEGIES)}
    rows.sort(
        key=lambda r: (
            r["link_kind"] != "real",
            r["link_kind"],
            r["ranks"],
            order.get(r["strategy"], 9),
            r.get("bucket_mb") or 0,
        )
    )
    for r in rows:
        host = by.get(("host", r["ranks"], r["link_kind"]))
        one = by.get(("host", 1, "real"))
        s = step_est(r)
        step = f"{_ms(s.value)}" + (f" [{_ms(s.lo)}, {_ms(s.hi)}]" if s.known else "")
        vs = "-"
        if host:
            sp = speedup(host, r)
            vs = f"{sp.value:.2f}x" + (
                f" [{sp.lo:.2f}, {sp.hi:.2f}]" if sp.known else ""
            )
        eff = f"{one['step_s'] / r['step_s']:.2f}" if one else "-"
        h = hidden_est(r)
        lines.append(
            f"| {name_of(r)} | {r['ranks']} | {r['link_kind']} | {step} | {s.n} | "
            f"{_ms(r['compute_s'])} | {_ms(r['comm_s'])} | "
            f"{'-' if h is None else f'{100 * h.value:.0f}%'} | {_ms(r['exposed_s'])} "
            f"| {vs} | {eff} | {r['opt_bytes'] / 2**20:.1f} |"
        )
    lines.append("")
    lines.append(
        "Medians over each run's measured steps (the steps column; the first "
        "ones, compilation and overlap's step without an allgather to wait for, "
        "left out); [90%]: bootstrap over those steps. eff(1): host's step on 1 "
        "rank / this step, batch per rank fixed."
    )
    links = sorted({r["link"] for r in rows if r["link_kind"] != "real"})
    if links:
        lines.append(f"emulated link(s): {', '.join(links)}")
    real = sorted(
        {
            (r["ranks"], r["link_label"])
            for r in rows
            if r["link_kind"] == "real" and r.get("link_label") and r["ranks"] > 1
        }
    )
    for p, text in real:
        lines.append(f"real link at {p} ranks: {text}")
    return "\n".join(lines)


def network(row: dict[str, Any]) -> bool:
    """Whether a real-link row's ranks spanned several nodes (bytes crossed a
    network, not shared memory); rows written before nodes were recorded: no."""
    return row["link_kind"] == "real" and (row.get("nodes") or 1) > 1


def _where(kind: str, row: dict[str, Any]) -> str:
    if kind == "auto":
        return "emulated"
    if kind == "real":
        return f"real network, {row['nodes']} nodes"
    return f"emulated {kind}"


def _claims(by: dict, p: int, kind: str, top: int) -> list[dict[str, Any]]:
    """The targets for ``p`` ranks on link ``kind`` (``top``: the most ranks on
    that link, where the speed-up target applies)."""
    ov, host = by.get(("overlap", p, kind)), by.get(("host", p, kind))
    lw = by.get(("layerwise", p, kind))
    if ov is None or ov["comm_s"] is None:
        return []
    where = f"{p} ranks, {_where(kind, ov)}"
    out = []

    def add(word: str, claim: str, text: str, est: iv.Estimate | None = None) -> None:
        out.append(
            {
                "word": word,
                "claim": claim,
                "ranks": p,
                "kind": kind,
                "text": f"{where}: {text}",
                "est": est,
            }
        )

    h = hidden_est(ov)
    add(
        iv.verdict(h, 0.8, above=True),
        "hidden",
        f"overlap hides {h.show('.0%')} of its communication (asked >= 80%)",
        h,
    )
    bound = (
        1.1 * max(ov["compute_s"], ov["comm_s"])
        + ov["comm_s"] * ov["biggest_stage_share"]
    )
    s = step_est(ov)
    add(
        iv.verdict(s, bound, above=False),
        "bound",
        f"overlap's step {s.show('.1f', ' ms', 1e3)} within 1.1 x max(compute, "
        f"comm) + one stage's comm = {_ms(bound)} ms",
        s,
    )
    if host and p == top:
        sp = speedup(host, ov)
        add(
            iv.verdict(sp, 1.3, above=True),
            "speedup",
            f"overlap {sp.show('.2f', 'x')} host's speed (asked >= 1.3x)",
            sp,
        )
    if lw:
        r = (
            iv.ratio(steps(ov), steps(lw))
            if steps(ov) and steps(lw)
            else iv.Estimate(ov["step_s"] / lw["step_s"], None, None, 0, "steps")
        )
        add(
            iv.verdict(r, 1.05, above=False),
            "layerwise",
            f"overlap's step {r.show('.2f', 'x')} layerwise's (asked <= 1.05x)",
            r,
        )
    sweep = [
        r
        for (_, q, k), r in by.items()
        if r["strategy"] == "layerwise" and q == p and k == kind
    ]
    if len(sweep) > 1:
        best = min(sweep, key=lambda r: r["step_s"])
        add(
            "INFO",
            "bucket",
            f"best layerwise bucket {best['bucket_mb']:g} MiB "
            f"({_ms(best['step_s'])} ms; overlap {_ms(ov['step_s'])} ms)",
        )
    return out


def check_records(rows: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    """Every check and INFO line of one model (module docstring)."""
    rows = [r for r in rows if r["model"] == model]
    by = {(name_of(r), r["ranks"], r["link_kind"]): r for r in rows}
    out: list[dict[str, Any]] = []
    kinds = sorted({r["link_kind"] for r in rows if r["link_kind"] != "real"})
    if any(network(r) for r in rows):
        kinds.append("real")
    for kind in kinds:
        sizes = sorted(
            {
                r["ranks"]
                for r in rows
                if r["link_kind"] == kind and (kind != "real" or network(r))
            }
        )
        for p in sizes:
            out += _claims(by, p, kind, max(sizes))
    for p in sorted({r["ranks"] for r in rows if r["link_kind"] == "real"}):
        ov, host = by.get(("overlap", p, "real")), by.get(("host", p, "real"))
        if ov and host and p > 1 and not network(ov):
            sp, h = speedup(host, ov), hidden_est(ov)
            out.append(
                {
                    "word": "INFO",
                    "claim": "shared",
                    "ranks": p,
                    "kind": "real",
                    "est": sp,
                    "text": f"{p} ranks, real link: overlap "
                    f"{sp.show('.2f', 'x')} host's speed, hides "
                    f"{100 * (h.value if h else 0):.0f}% (shared memory: moving "
                    "bytes takes the CPU the computation needs)",
                }
            )
    for (name, p, kind), fcx in sorted(by.items()):
        ov = by.get(("overlap", p, kind))
        if name != "overlap-fcx" or not ov:
            continue
        mb = [(r.get("sent_bytes") or 0) / 2**20 for r in (fcx, ov)]
        where = "real link" if kind == "real" and not network(ov) else _where(kind, ov)
        out.append(
            {
                "word": "INFO",
                "claim": "fcx",
                "ranks": p,
                "kind": kind,
                "est": None,
                "text": f"{p} ranks, {where}: FC-activation exchange "
                f"{_ms(fcx['step_s'])} ms vs overlap {_ms(ov['step_s'])} ms "
                f"({ov['step_s'] / fcx['step_s']:.2f}x); handed to MPI per step "
                f"{mb[0]:.1f} vs {mb[1]:.1f} MB; optimizer "
                f"{fcx['opt_bytes'] / 2**20:.1f} vs {ov['opt_bytes'] / 2**20:.1f} "
                "MB/rank",
            }
        )
    return out


def format_checks(rows: list[dict[str, Any]], model: str) -> str:
    """One model's checks as lines (empty: none apply)."""
    recs = check_records(rows, model)
    return "\n".join(iv.check_line(c["word"], c["text"]) for c in recs)


def models_of(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["model"] for r in rows))


def render(root: Path) -> list[str]:
    """The run's part of ``docs/results/overlap.md``: per model its table and
    checks."""
    rows = unique(read_results(root))
    lines: list[str] = []
    for model in models_of(rows):
        lines += format_table(rows, model).splitlines()
        checks = format_checks(rows, model)
        if checks:
            lines += ["", f"Checks, {model}:", "", *checks.splitlines()]
        lines.append("")
    return lines[:-1] if lines else ["(no runs)"]


def _date(root: Path) -> str:
    from research.provenance import read_jobs

    jobs = read_jobs(root)
    return jobs[0]["started_utc"][:10] if jobs else "?"


def _speeds(root: Path, kind: str) -> tuple[str, list[dict[str, Any]], int]:
    """ "VGG-16 at a / b, ResNet-50 at c / d" on link kind, the checks, steps."""
    rows = unique(read_results(root))
    parts, recs, n = [], [], 0
    for model in models_of(rows):
        by = {
            (name_of(r), r["ranks"], r["link_kind"]): r
            for r in rows
            if r["model"] == model
        }
        sizes = sorted(
            {p for (s, p, k) in by if s == "overlap" and k == kind and p > 1}
        )
        shown = []
        for p in sizes:
            if ("host", p, kind) in by:
                sp = speedup(by[("host", p, kind)], by[("overlap", p, kind)])
                shown.append(f"{sp.brief('.2f', 'x')}")
                n = max(n, sp.n)
        if shown:
            parts.append(
                f"{model} at {' / '.join(shown)} (at "
                f"{' / '.join(map(str, sizes))} ranks)"
            )
        recs += [c for c in check_records(rows, model) if c["kind"] == kind]
    return "; ".join(parts), recs, n


def _link(root: Path) -> str:
    """The real link a run's widest job ran on (``run.json``)."""
    from research.provenance import read_jobs

    nets = [j for j in read_jobs(root) if j.get("network")]
    if not nets:
        return "one node"
    job = max(nets, key=lambda j: len(j.get("hosts") or ()))
    return job["network"].replace("real network link, ", "")


def _words(recs: list[dict[str, Any]], claim: str) -> str:
    return ", ".join(
        f"{c['ranks']} ranks {c['word']}" for c in recs if c["claim"] == claim
    )


def readme(runs: list[Path], sections: dict[str, list[Path]]) -> str | None:
    """The README's paragraph on the SC18 overlap, from the page's runs."""
    if not runs:
        return None
    root = runs[0]  # the default command's run (others: what it leaves out)
    speeds, recs, n = _speeds(root, "auto")
    text = (
        "**SC18 overlap** (`python -m experiments.overlap`): `host`, `fused`, "
        "`layerwise` (DDP-style buckets) and `overlap` (per-stage reduce-scatter, "
        "sharded update, allgather waited for by the next forward) on VGG-16 and "
        f"ResNet-50. Emulated link ({_date(root)}, medians of {n} measured steps per "
        f"run, 90% intervals over them): overlap runs at {speeds} `host`'s speed; "
        f"hides >= 80%: {_words(recs, 'hidden') or '-'}; 1.3x `host` at the most "
        f"ranks: {_words(recs, 'speedup') or '-'}."
    )
    for title, roots in sections.items():
        parts = []
        for r in roots:
            s, rr, _ = _speeds(r, "real")
            if s:
                parts.append(
                    f"{_link(r)}: {s}, hides >= 80%: {_words(rr, 'hidden') or '-'}"
                )
        if parts:
            text += (
                f" {title} ({_date(roots[0])}): overlap at " + "; ".join(parts) + "."
            )
    return text
