"""The adaptive study's checks and tables (from ``adaptive.analyze``'s data).

The checks, per rank count, each on a 90% t interval over the seeds (paired:
the arms of one seed share its data, its straggler draws and the moments of
the link's schedule; ``research.studies.intervals``); every time to the
target counts the arm's start-up (``start_s``):

* the scenario: the best fixed method's time to the target over the
  oracle's (``mixed`` asks at least 1.25x);
* the best fixed method's time over adaptive's (``mixed``: at least 1.1x)
  and adaptive's over the oracle's (``mixed``: at most 1.15x); ``link-drop``
  asks adaptive's time over fixed top-k's at most 1.05x (as fast as top-k);
* its final test accuracy minus dense's (``host``) inside +-0.005;
* no more probes than phases, in every run (an exact count);
* its first step over fixed dense's first step at most 1.1x (each job
  compiles what the arms run before the first arm); each switch's step over
  the step the method it switched to takes in that phase when it runs alone
  (that fixed arm's median step there, same seed; both less the delay
  injected into rank 0, whose rows these are), the median over the switches
  with its bootstrap interval, at most 1.1x, and the switch's own work
  (carrying state over) at most 10% of that step;
* its seconds in each phase over the best fixed arm's there, at most 1.05x;
* and that the seeds it is judged on are not those its model was tuned on.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from research.studies import intervals as iv
from research.studies.adaptive import FIXED, SCENARIOS, fixed_arm

ACC_GAP = 0.005
SWITCH_GAP = 1.10
#: "As fast as": at most this times the other's time.
AS_FAST = 1.05


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return math.inf, math.nan
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def _stat(runs: list[dict], key: str, i: int | None = None) -> tuple[float, float]:
    xs = [r[key][i] if i is not None else r[key] for r in runs]
    return _mean_sd([math.inf if x is None else float(x) for x in xs])


def _by_seed(runs: list[dict], key: str, i: int | None = None) -> dict:
    out = {}
    for r in runs:
        x = r[key][i] if i is not None else r[key]
        out[r["seed"]] = math.inf if x is None else float(x)
    return out


def _ratio(num: list[dict], den: list[dict], key: str, i: int | None = None):
    """``num``'s figure over ``den``'s, per seed, and the t interval of the mean."""
    a, b = _by_seed(num, key, i), _by_seed(den, key, i)
    xs = [a[s] / b[s] for s in a if s in b and b[s] and math.isfinite(b[s])]
    return iv.mean(xs, "seeds")


def checks(data: dict[str, Any]) -> list[str]:
    """The issue's checks, per rank count, as PASS/FAIL/UNDECIDED lines."""
    asks = SCENARIOS.get(data.get("scenario", ""), {}).get("asks", {})
    target = data["target"]
    lines = []
    tuned, judged = set(data.get("tuned_seeds") or []), data.get("seeds") or []
    if tuned:
        both = sorted(tuned & set(judged))
        lines.append(
            iv.check_line(
                iv.exact(not both),
                f"judged on seeds {', '.join(map(str, judged))}; the model was tuned "
                f"on {', '.join(map(str, sorted(tuned)))}"
                + (f" (both: {', '.join(map(str, both))})" if both else " (held out)"),
            )
        )
    for P, arms in data["np"].items():
        if "adaptive" not in arms or not any(a in arms for a in FIXED):
            continue
        ad = arms["adaptive"]
        fixed = [a for a in FIXED if a in arms]
        a_t = _stat(ad, "to_target_s")
        best = min(fixed, key=lambda a: _stat(arms[a], "to_target_s")[0])
        b_t = _stat(arms[best], "to_target_s")
        oracle = data["oracle"].get(P)
        head = f"{P} ranks:"
        if oracle:
            o_t = _stat(oracle["runs"], "to_target_s")
            gain = _ratio(arms[best], oracle["runs"], "to_target_s")
            want = asks.get("oracle_gain")
            word = iv.verdict(gain, want, above=True) if want else "INFO"
            lines.append(
                f"{word}  {head} the oracle ({', '.join(oracle['schedule'])}) reaches "
                f"{target:g} in {o_t[0]:.1f} +- {o_t[1]:.1f} s, the best fixed method "
                f"({best}) in {b_t[0]:.1f} +- {b_t[1]:.1f} s: {gain.show('.2f', 'x')}"
                + (f" (asked >= {want:g}x)" if want else "")
            )
        want = asks.get("vs_best")
        if want:
            gain = _ratio(arms[best], ad, "to_target_s")
            lines.append(
                f"{iv.verdict(gain, want, above=True)}  {head} adaptive reaches "
                f"{target:g} in {a_t[0]:.1f} +- {a_t[1]:.1f} s (start-up included), "
                f"{gain.show('.2f', 'x')} sooner than {best} (asked >= {want:g}x)"
            )
        rival = asks.get("as_fast_as")
        if rival and rival in arms:
            r_t = _stat(arms[rival], "to_target_s")
            ratio = _ratio(ad, arms[rival], "to_target_s")
            lines.append(
                f"{iv.verdict(ratio, AS_FAST, above=False)}  {head} adaptive reaches "
                f"{target:g} in {a_t[0]:.1f} +- {a_t[1]:.1f} s (start-up included), "
                f"fixed {rival} in {r_t[0]:.1f} +- {r_t[1]:.1f} s: "
                f"{ratio.show('.2f', 'x')} its time (asked <= {AS_FAST:g}x); the best "
                f"fixed method ({best}) {b_t[0]:.1f} s"
            )
        want = asks.get("vs_oracle")
        if oracle and want:
            ratio = _ratio(ad, oracle["runs"], "to_target_s")
            lines.append(
                f"{iv.verdict(ratio, want, above=False)}  {head} adaptive takes "
                f"{ratio.show('.2f', 'x')} the oracle's time to {target:g} (asked <= "
                f"{want:g}x)"
            )
        if "host" in arms:
            a_f, h_f = _by_seed(ad, "final_acc"), _by_seed(arms["host"], "final_acc")
            seeds = [s for s in a_f if s in h_f]
            gap = iv.difference(
                [a_f[s] for s in seeds], [h_f[s] for s in seeds], "seeds", paired=True
            )
            if not gap.known:
                word = iv.UNDECIDED
            elif gap.lo >= -ACC_GAP and gap.hi <= ACC_GAP:
                word = iv.PASS
            elif gap.hi < -ACC_GAP or gap.lo > ACC_GAP:
                word = iv.FAIL
            else:
                word = iv.UNDECIDED
            lines.append(
                f"{word}  {head} final test accuracy adaptive minus host "
                f"{gap.show('+.4f')} (asked inside +-{ACC_GAP:g})"
            )
        probes = [(r.get("adaptive") or {}).get("probes", 0) for r in ad]
        cost = [(r.get("adaptive") or {}).get("probe_s", 0.0) for r in ad]
        nph = len(data["phases"])
        spent = ", ".join(f"{c:.1f}" for c in cost)
        lines.append(
            f"{iv.exact(max(probes) <= nph)}  {head} probes per run "
            f"{', '.join(map(str, probes))} (their steps {spent} s) for {nph} phases"
        )
        lines += _switch_checks(data, arms, head)
        for i, p in enumerate(data["phases"]):
            a_p = _stat(ad, "phase_s", i)
            best_p = min(fixed, key=lambda a: _stat(arms[a], "phase_s", i)[0])
            b_p = _stat(arms[best_p], "phase_s", i)
            ratio = _ratio(ad, arms[best_p], "phase_s", i)
            lines.append(
                f"{iv.verdict(ratio, AS_FAST, above=False)}  {head} steps "
                f"{p['start']}-{p['end']} ({p['label']}): adaptive {a_p[0]:.1f} +- "
                f"{a_p[1]:.1f} s, best fixed {best_p} {b_p[0]:.1f} +- {b_p[1]:.1f} s: "
                f"{ratio.show('.2f', 'x')} its time (asked <= {AS_FAST:g}x)"
            )
    return lines


def _switch_checks(data: dict, arms: dict, head: str) -> list[str]:
    """The first step against fixed dense's; each switch's step against the
    new method's ordinary step in that phase (its fixed arm, same seed)."""
    out = []
    ad = arms["adaptive"]
    if "host" in arms:
        by_seed = {r["seed"]: r for r in arms["host"]}
        pairs = [
            (r["first_step_s"], by_seed[r["seed"]]["first_step_s"])
            for r in ad
            if r["seed"] in by_seed
            and r["first_step_s"]
            and by_seed[r["seed"]]["first_step_s"]
        ]
        if pairs:
            est = iv.mean([a / b for a, b in pairs], "seeds")
            out.append(
                f"{iv.verdict(est, SWITCH_GAP, above=False)}  {head} first step "
                + ", ".join(f"{a:.2f}" for a, _ in pairs)
                + " s against fixed dense's "
                + ", ".join(f"{b:.2f}" for _, b in pairs)
                + f" s: {est.show('.2f', 'x')} (asked <= {SWITCH_GAP:g}x)"
            )
    ratios, handling = [], []
    for r in ad:
        for s in r["switch_steps"]:
            arm = fixed_arm(s["to"])
            phase = next(
                (
                    i
                    for i, p in enumerate(data["phases"])
                    if p["start"] <= s["step"] < p["end"]
                ),
                None,
            )
            runs = {x["seed"]: x for x in arms.get(arm, [])}
            if phase is None or r["seed"] not in runs or not s["seconds"]:
                continue
            ordinary = runs[r["seed"]]["ordinary_s"][phase]
            if ordinary and math.isfinite(ordinary):
                ratios.append(s["seconds"] / ordinary)
                handling.append(s.get("switch_s", 0.0) / ordinary)
    if ratios:
        est = iv.median(ratios, "switches")
        within = sum(1 for x in ratios if x <= SWITCH_GAP)
        out.append(
            f"{iv.verdict(est, SWITCH_GAP, above=False)}  {head} a switch's step over "
            f"the new method's ordinary step: median {est.show('.2f', 'x')} (asked <= "
            f"{SWITCH_GAP:g}x; {within} of {len(ratios)} within, worst "
            f"{max(ratios):.2f}x)"
        )
        est = iv.median(handling, "switches")
        within = sum(1 for x in handling if x <= SWITCH_GAP - 1)
        out.append(
            f"{iv.verdict(est, SWITCH_GAP - 1, above=False)}  {head} the switches "
            "themselves (carrying the residual or the carried gradients over) against "
            f"the new method's ordinary step: median {est.show('.0%')} (asked <= "
            f"{SWITCH_GAP - 1:.0%}; {within} of {len(handling)} within, worst "
            f"{max(handling):.0%})"
        )
    for key, what in (
        ("next_s", "the new method's next steps in the same run (median of up to 10)"),
        (
            "fixed_s",
            "the new method's fixed arm at the same step and seed (the same "
            "straggler draw and moment of the link)",
        ),
    ):
        by_to: dict[str, list[float]] = {}
        for r in ad:
            for s in r["switch_steps"]:
                if s["seconds"] and s.get(key):
                    by_to.setdefault(s["to"], []).append(s["seconds"] / s[key])
        if by_to:
            out.append(
                f"INFO  {head} each switch's step against {what}, by the method "
                "switched to: "
                + "; ".join(
                    f"{to} {statistics.median(xs):.2f}x ({len(xs)}, worst "
                    f"{max(xs):.2f}x)"
                    for to, xs in sorted(by_to.items())
                )
            )
    return out


def format_table(data: dict[str, Any]) -> str:
    """The tables (seconds per phase, time to target, final accuracy; the
    oracle's), what adaptive ran, and the checks, as markdown."""
    ph = data["phases"]
    out = []
    for P, arms in data["np"].items():
        seeds = sorted({r["seed"] for r in next(iter(arms.values()), [])})
        out += [
            f"### {P} ranks (seeds {', '.join(map(str, seeds))}; seconds, mean +- sd "
            "over the seeds)",
            "",
        ]
        head = ["arm", "start-up"]
        head += [f"{p['start']}-{p['end']}: {p['label']}" for p in ph]
        head += [
            "steps, whole run",
            f"to {data['target']:g} (start-up in)",
            "final acc",
        ]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        rows = list(arms.items())
        oracle = data["oracle"].get(P)
        if oracle:
            rows.append(("oracle: " + ", ".join(oracle["schedule"]), oracle["runs"]))
        for arm, runs in rows:
            m, sd = (
                _stat(runs, "start_s")
                if all("start_s" in r for r in runs)
                else (math.nan, math.nan)
            )
            cells = [arm, "-" if math.isnan(m) else f"{m:.1f} +- {sd:.1f}"]
            for i in range(len(ph)):
                m, s = _stat(runs, "phase_s", i)
                cells.append(f"{m:.1f} +- {s:.1f}")
            for key, fmt in (
                ("total_s", ".1f"),
                ("to_target_s", ".1f"),
                ("final_acc", ".4f"),
            ):
                m, s = _stat(runs, key)
                cells.append(
                    "not reached" if math.isinf(m) else f"{m:{fmt}} +- {s:{fmt}}"
                )
            out.append("| " + " | ".join(cells) + " |")
        if "adaptive" in arms:
            out += _adaptive_lines(arms["adaptive"], ph)
        out.append("")
    tuned = data.get("tuned_seeds")
    if tuned:
        out += [
            f"The model was tuned on seeds {', '.join(map(str, tuned))}; these runs "
            f"judge it on seeds {', '.join(map(str, data.get('seeds') or []))}. "
            "Every arm's time to the target counts its start-up (its seconds before "
            "the first step: adaptive compiles every candidate's update and runs "
            "every collective there); the oracle starts as its first phase's arm "
            "and never pays for a switch.",
            "",
        ]
    out += ["### Checks", ""] + data["checks"]
    return "\n".join(out) + "\n"


def _adaptive_lines(ad: list[dict], ph: list[dict]) -> list[str]:
    out = ["", "What adaptive ran (steps per method, summed over seeds):", ""]
    for i, p in enumerate(ph):
        counts: dict[str, int] = {}
        for r in ad:
            for m, c in r["methods"][i].items():
                counts[m] = counts.get(m, 0) + c
        desc = ", ".join(
            f"{m} {c}" for m, c in sorted(counts.items(), key=lambda x: -x[1])
        )
        out.append(f"- steps {p['start']}-{p['end']} ({p['label']}): {desc}")
    summ = [r.get("adaptive") or {} for r in ad]
    out.append(
        "- per run: switches "
        + ", ".join(str(r["switches"]) for r in ad)
        + "; probes "
        + ", ".join(str(s.get("probes", 0)) for s in summ)
        + "; switches the model mispredicted by more than its bound "
        + ", ".join(str(s.get("mispredicted", 0)) for s in summ)
        + "; start-up (outside the steps) "
        + ", ".join(f"{(s.get('startup') or {}).get('seconds', 0):.1f}" for s in summ)
        + " s"
    )
    for r in ad[:1]:
        seen = [f"{c['what']} at step {c['step']}" for c in r.get("changes", [])]
        if seen:
            out.append(
                f"- changes the model saw (seed {r['seed']}): " + ", ".join(seen)
            )
        sw = [f"{s['step']} -> {s['to']} ({s['reason']})" for s in r["switch_steps"]]
        if sw:
            out.append(f"- switches (seed {r['seed']}): " + ", ".join(sw))
    return out
