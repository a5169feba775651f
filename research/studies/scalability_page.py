"""SC19's tables, checks and README paragraph, from the rows of ``results.jsonl``.

One row per configuration (:func:`research.studies.scalability.run_point`):
its medians, its measured steps (``samples``), and what its timeline says:
the free share of every update-to-update interval (``free_shares``) and, with
checkpoints, each background span's seconds inside the gaps and its length
(``ckpt_bg_parts``). Each figure is a median over a row's measured steps with
its 90% bootstrap interval (``research.studies.intervals``); the paper's
findings are checked on those intervals:

* a straggler is only partly absorbed by pipelining: for layerwise and
  overlap at each delay, absorbed = delay - (median step with the delay -
  median step without), its interval inside (0, delay): PASS; at or below 0
  (nothing absorbed) or at or above the delay (all of it): FAIL;
* the gaps between weight updates are large: the median free share of the
  update-to-update intervals (no checkpoint) at least 50%;
* background work fits in those gaps: at least 90% of DeepFreeze's
  background checkpoint work ran while no update did (the ratio of the sums
  over its spans, bootstrap over the spans).

Host's absorbed delay and the checkpoints' cost to the step are INFO.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from research.studies import intervals as iv
from research.studies.scalability_report import SECTIONS, derived, read_rows

#: What the page keeps of a run folder (``python -m scripts.results``).
KEEP = ("results.jsonl",)
PIPELINED = ("layerwise", "overlap")
FREE, IN_GAPS = 0.5, 0.9


def _steps(r: dict[str, Any]) -> list[float]:
    return [x for x in (r.get("samples") or {}).get("step_s", []) if x is not None]


def step_est(r: dict[str, Any]) -> iv.Estimate:
    xs = _steps(r)
    return (
        iv.median(xs)
        if xs
        else iv.Estimate(r.get("step_s") or 0.0, None, None, 0, "steps")
    )


def absorbed(r: dict[str, Any], base: dict[str, Any]) -> iv.Estimate:
    """The part of ``r``'s delay that did not reach its step, and its interval."""
    a, b = _steps(r), _steps(base)
    if a and b:
        grow = iv.shift(a, b)
    else:
        grow = iv.Estimate(r["step_s"] - base["step_s"], None, None, 0, "steps")
    lo, hi = (
        (r["delay"] - grow.hi, r["delay"] - grow.lo) if grow.known else (None, None)
    )
    return iv.Estimate(r["delay"] - grow.value, lo, hi, grow.n, "steps")


def free_est(r: dict[str, Any]) -> iv.Estimate | None:
    shares = r.get("free_shares")
    if shares:
        return iv.median(shares, "update intervals")
    if r.get("free_share_median") is not None:
        return iv.Estimate(r["free_share_median"], None, None, 0, "update intervals")
    return None


def in_gaps_est(r: dict[str, Any]) -> iv.Estimate | None:
    parts = r.get("ckpt_bg_parts")
    if parts:
        return iv.ratio(
            [p[0] for p in parts],
            [p[1] for p in parts],
            "background spans",
            stat="mean",
            paired=True,
        )
    if r.get("ckpt_bg_in_gaps") is not None:
        return iv.Estimate(r["ckpt_bg_in_gaps"], None, None, 0, "background spans")
    return None


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{1e3 * v:.0f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _iv_ms(e: iv.Estimate) -> str:
    return _ms(e.value) + (f" [{_ms(e.lo)}, {_ms(e.hi)}]" if e.known else "")


def _extra(r: dict[str, Any], tag: str, by: dict) -> str:
    if tag == "straggler" and r["delay"]:
        base = by.get(_key(r, delay=0.0))
        a = absorbed(r, base) if base else None
        return (
            f"delay {_ms(r['delay'])}, absorbed {_iv_ms(a) if a else '-'}, late "
            f"{_ms(r.get('late_median_s'))}"
        )
    if tag == "straggler":
        return f"no delay, late {_ms(r.get('late_median_s'))}"
    if tag == "checkpoint" and r["ckpt_every"]:
        g = in_gaps_est(r)
        shown = "-" if g is None else g.brief(".0%")
        return (
            f"every {r['ckpt_every']}: overhead {_pct(r.get('ckpt_overhead'))}, "
            f"block {_ms(r.get('ckpt_block_s'))}/save, bg "
            f"{_ms(r.get('ckpt_bg_s'))}/save, bg in gaps {shown}"
        )
    if tag == "checkpoint":
        f = free_est(r)
        shown = "-" if f is None else f.brief(".0%")
        return f"no checkpoint: update gap {_ms(r.get('gap_median_s'))}, free {shown}"
    return ""


FIELDS = (
    "model",
    "strategy",
    "ranks",
    "threads",
    "batch",
    "link",
    "delay",
    "ckpt_every",
)


def _key(r: dict[str, Any], **kw: Any) -> tuple:
    return tuple({**r, **kw}[k] for k in FIELDS)


def format_table(rows: list[dict[str, Any]]) -> str:
    """One table per sweep; medians over each row's measured steps."""
    rows = derived(rows)
    by = {_key(r): r for r in rows}
    head = [
        "model",
        "strategy",
        "PxT",
        "batch",
        "link",
        "step ms [90%]",
        "steps",
        "smp/s",
        "eff",
        "comp",
        "comm",
        "expo",
        "hidden",
        "",
    ]
    parts = []
    for tag, title in SECTIONS:
        mine = [r for r in rows if tag in r.get("tags", [])]
        if not mine:
            continue
        mine.sort(
            key=lambda r: (
                r["model"],
                r["strategy"],
                r["ranks"],
                r["threads"],
                r["batch"],
                r["delay"],
                r["ckpt_every"],
            )
        )
        lines = [
            f"#### {title}",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        for r in mine:
            s = step_est(r)
            eff = r["eff_strong"] if tag == "ranks:strong" else r["eff_weak"]
            hidden = None
            if r.get("comm_s"):
                hidden = max(0.0, 1 - (r.get("exposed_s") or 0.0) / r["comm_s"])
            sps = r.get("samples_s")
            cells = [
                r["model"], r["strategy"], f"{r['ranks']}x{r['threads']}",
                str(r["batch"]), r["link"], _iv_ms(s), str(s.n),
                "-" if not sps else f"{sps:.1f}",
                "-" if eff is None else f"{eff:.2f}", _ms(r.get("compute_s")),
                _ms(r.get("comm_s")), _ms(r.get("exposed_s")), _pct(hidden),
                _extra(r, tag, by),
            ]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    nets = sorted(
        {(r["ranks"], r["link_label"]) for r in rows if (r.get("nodes") or 1) > 1}
    )
    if nets:
        parts.append("\n".join(f"{p} ranks: {label}" for p, label in nets))
    parts.append(
        "ms unless said; medians over each configuration's measured steps (the "
        "steps column; the first ones left out), [90%]: bootstrap over them; "
        "eff: weak scaling T(1) / T(P), strong T(1, B) / (P x T(P, B/P)); absorbed: "
        "delay - (step with it - step without); free: the median share of the "
        "update-to-update intervals in which no update ran; bg in gaps: the share "
        "of the checkpoints' background work that ran while no update did"
    )
    return "\n\n".join(parts)


def check_records(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings' checks and the INFO lines (module docstring)."""
    rows = derived(rows)
    by = {_key(r): r for r in rows}
    out: list[dict[str, Any]] = []

    def add(word: str, claim: str, r: dict, text: str) -> None:
        out.append(
            {
                "word": word,
                "claim": claim,
                "strategy": r["strategy"],
                "text": f"{r['model']} {r['strategy']} {r['ranks']}x{r['threads']}"
                f"{'' if r['link'] == 'real' else ' on ' + r['link']}: {text}",
            }
        )

    for r in rows:
        if "straggler" not in r.get("tags", []) or not r["delay"]:
            continue
        base = by.get(_key(r, delay=0.0))
        if base is None:
            continue
        a = absorbed(r, base)
        text = f"a {_ms(r['delay'])} ms straggler, absorbed {a.show('.0f', ' ms', 1e3)}"
        if r["strategy"] not in PIPELINED:
            add("INFO", "absorbed", r, text + " (no pipelining)")
            continue
        if not a.known:
            word = iv.UNDECIDED
        elif a.hi <= 0 or a.lo >= r["delay"]:
            word = iv.FAIL
        elif a.lo > 0 and a.hi < r["delay"]:
            word = iv.PASS
        else:
            word = iv.UNDECIDED
        add(word, "partly", r, text + " (asked: only partly, inside (0, the delay))")
    for r in rows:
        if "checkpoint" not in r.get("tags", []):
            continue
        if not r["ckpt_every"]:
            f = free_est(r)
            if f is not None:
                add(
                    iv.verdict(f, FREE, above=True),
                    "free",
                    r,
                    f"update-to-update time free of updates {f.show('.0%')} (asked "
                    f">= {FREE:.0%})",
                )
            continue
        g = in_gaps_est(r)
        if g is not None:
            add(
                iv.verdict(g, IN_GAPS, above=True),
                "gaps",
                r,
                f"DeepFreeze's background work inside the gaps {g.show('.0%')} "
                f"(asked >= {IN_GAPS:.0%})",
            )
        none = by.get(_key(r, ckpt_every=0))
        if none and _steps(r) and _steps(none):
            cost = iv.ratio(_steps(r), _steps(none))
            add(
                "INFO",
                "cost",
                r,
                f"checkpoints every {r['ckpt_every']} steps: the "
                f"step {cost.show('.2f', 'x')} the step without",
            )
    return out


def report(dirs: list[str | Path], out: str | Path, plots: bool = True) -> str:
    """Tables and checks (``out/table.md``; :mod:`research.studies.scalability_page`)
    and figures (``out/*.png``) from ``dirs``' rows."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = read_rows(dirs)
    text = format_table(rows)
    recs = check_records(rows)
    if recs:
        text += "\n\nChecks:\n\n" + "\n".join(
            iv.check_line(c["word"], c["text"]) for c in recs
        )
    (out / "table.md").write_text(text + "\n")
    if plots and rows:
        from research.studies.scalability_plots import plot_all

        plot_all(derived(rows), [Path(d) for d in dirs], out)
    return text


def render(root: Path) -> list[str]:
    """The run's part of ``docs/results/scalability.md``."""
    rows = read_rows([root])
    lines = format_table(rows).splitlines()
    recs = check_records(rows)
    if recs:
        lines += ["", "Checks:", ""]
        lines += [iv.check_line(c["word"], c["text"]) for c in recs]
    return lines


def _words(recs: list[dict[str, Any]], claim: str) -> str:
    words = [c["word"] for c in recs if c["claim"] == claim]
    if not words:
        return "-"
    return ", ".join(f"{words.count(w)} {w}" for w in dict.fromkeys(words))


def readme(runs: list[Path], sections: dict[str, list[Path]]) -> str | None:
    """The README's paragraph on the SC19 study, from the page's runs."""
    from research.provenance import read_jobs

    text = (
        "**SC19 scalability** (`python -m experiments.scalability`): sweeps of ranks, "
        "threads, batch size, a straggler and DeepFreeze checkpoints for CANDLE NT3 "
        "and ResNet-50, each run traced and analyzed."
    )
    for title, roots in [("", runs), *sections.items()]:
        for root in roots:
            rows = read_rows([root])
            recs = check_records(rows)
            jobs = read_jobs(root)
            when = jobs[0]["started_utc"][:10] if jobs else "?"
            weak = [
                r
                for r in derived(rows)
                if "ranks:weak" in r.get("tags", [])
                and r["ranks"] == 2
                and r["eff_weak"] is not None
            ]
            effs = ", ".join(
                f"{r['strategy']} {r['eff_weak']:.2f}"
                for r in weak
                if r["model"] == "nt3"
            )
            n = max((step_est(r).n for r in rows), default=0)
            text += (
                f" {title + ', ' if title else ''}{when} (medians of up to {n} "
                f"measured steps): a straggler only partly absorbed by pipelining: "
                f"{_words(recs, 'partly')}; update-to-update time at least "
                f"{FREE:.0%} free: {_words(recs, 'free')}; DeepFreeze's background "
                f"work at least {IN_GAPS:.0%} inside the gaps: {_words(recs, 'gaps')}"
                + (f"; NT3 weak-scaling efficiency at 2 ranks {effs}" if effs else "")
                + "."
            )
    return text
