"""The adaptive study's checks and tables (from ``adaptive.analyze``'s data).

The checks, per rank count (PASS or FAIL; means over the seeds, the noise two
standard errors of a difference of seed means):

* the scenario: the oracle's time to the target against the best fixed
  method's (``mixed`` asks at least 1.25x);
* adaptive's time to the target against the best fixed method's (``mixed``:
  at least 1.1x sooner) and the oracle's (``mixed``: within 1.15x);
  ``link-drop`` asks it to be at least as fast as fixed top-k, within the noise;
* its final test accuracy within 0.005 of dense's (``host``);
* no more probes than phases, in every run;
* its first step within 10% of fixed dense's first step (each job compiles
  what the arms run before the first arm), and each switch's step within 10%
  of the step the method it switched to takes in that phase when it runs
  alone (that fixed arm's median step there, same seed; both less the delay
  injected into rank 0, whose rows these are), and the switch's own work
  (carrying state over) within 10% of that step;
* and, as before, its seconds in each phase against the best fixed arm's.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from research.studies.adaptive import FIXED, SCENARIOS, fixed_arm

ACC_GAP = 0.005
SWITCH_GAP = 1.10


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return math.inf, math.nan
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def _stat(runs: list[dict], key: str, i: int | None = None) -> tuple[float, float]:
    xs = [r[key][i] if i is not None else r[key] for r in runs]
    return _mean_sd([math.inf if x is None else float(x) for x in xs])


def _noise(a: tuple[float, float], b: tuple[float, float], n: int) -> float:
    """Two standard errors of the difference of two seed means."""
    sa = a[1] if math.isfinite(a[1]) else 0.0
    sb = b[1] if math.isfinite(b[1]) else 0.0
    return 2 * math.hypot(sa, sb) / math.sqrt(max(n, 1))


def _ok(flag: bool) -> str:
    return "PASS" if flag else "FAIL"


def checks(data: dict[str, Any]) -> list[str]:
    """The issue's checks, per rank count, as PASS/FAIL lines."""
    asks = SCENARIOS.get(data.get("scenario", ""), {}).get("asks", {})
    target = data["target"]
    lines = []
    for P, arms in data["np"].items():
        if "adaptive" not in arms or not any(a in arms for a in FIXED):
            continue
        ad, n = arms["adaptive"], len(arms["adaptive"])
        fixed = [a for a in FIXED if a in arms]
        a_t = _stat(ad, "to_target_s")
        best = min(fixed, key=lambda a: _stat(arms[a], "to_target_s")[0])
        b_t = _stat(arms[best], "to_target_s")
        oracle = data["oracle"].get(P)
        o_t = _stat(oracle["runs"], "to_target_s") if oracle else (math.inf, math.nan)
        head = f"{P} ranks:"
        if oracle:
            gain = b_t[0] / o_t[0]
            want = asks.get("oracle_gain")
            verdict = _ok(gain >= want) if want else "INFO"
            lines.append(
                f"{verdict}  {head} the oracle ({', '.join(oracle['schedule'])}) "
                f"reaches {target:g} in {o_t[0]:.1f} +- {o_t[1]:.1f} s, the best fixed "
                f"method ({best}) in {b_t[0]:.1f} +- {b_t[1]:.1f} s: {gain:.2f}x"
                + (f" (asked >= {want:g}x)" if want else "")
            )
        gain = b_t[0] / a_t[0]
        want = asks.get("vs_best")
        if want:
            short = b_t[0] / want - a_t[0]
            lines.append(
                f"{_ok(gain >= want)}  {head} adaptive reaches {target:g} in "
                f"{a_t[0]:.1f} +- {a_t[1]:.1f} s, {gain:.2f}x sooner than {best} "
                f"(asked >= {want:g}x"
                + (f"; {-short:.1f} s too slow for it)" if short < 0 else ")")
            )
        rival = asks.get("as_fast_as")
        if rival and rival in arms:
            r_t = _stat(arms[rival], "to_target_s")
            noise = _noise(a_t, r_t, n)
            lines.append(
                f"{_ok(a_t[0] <= r_t[0] + noise)}  {head} adaptive reaches "
                f"{target:g} in {a_t[0]:.1f} +- {a_t[1]:.1f} s, fixed {rival} in "
                f"{r_t[0]:.1f} +- {r_t[1]:.1f} s ({a_t[0] - r_t[0]:+.1f} s, noise "
                f"{noise:.1f} s); the best fixed method ({best}) {b_t[0]:.1f} s"
            )
        want = asks.get("vs_oracle")
        if oracle and want:
            ratio = a_t[0] / o_t[0]
            lines.append(
                f"{_ok(ratio <= want)}  {head} adaptive takes {ratio:.2f}x the "
                f"oracle's time to {target:g} (asked <= {want:g}x)"
            )
        if "host" in arms:
            a_f, h_f = _stat(ad, "final_acc"), _stat(arms["host"], "final_acc")
            gap = a_f[0] - h_f[0]
            lines.append(
                f"{_ok(abs(gap) <= ACC_GAP)}  {head} final test accuracy adaptive "
                f"{a_f[0]:.4f} +- {a_f[1]:.4f}, host {h_f[0]:.4f} +- {h_f[1]:.4f} "
                f"({gap:+.4f}; asked within {ACC_GAP:g})"
            )
        probes = [(r.get("adaptive") or {}).get("probes", 0) for r in ad]
        cost = [(r.get("adaptive") or {}).get("probe_s", 0.0) for r in ad]
        nph = len(data["phases"])
        spent = ", ".join(f"{c:.1f}" for c in cost)
        lines.append(
            f"{_ok(max(probes) <= nph)}  {head} probes per run "
            f"{', '.join(map(str, probes))} (their steps {spent} s) for {nph} phases"
        )
        lines += _switch_checks(data, arms, head)
        for i, p in enumerate(data["phases"]):
            a_p = _stat(ad, "phase_s", i)
            best_p = min(fixed, key=lambda a: _stat(arms[a], "phase_s", i)[0])
            b_p = _stat(arms[best_p], "phase_s", i)
            gap, noise = a_p[0] - b_p[0], _noise(a_p, b_p, n)
            lines.append(
                f"{_ok(gap <= noise)}  {head} steps {p['start']}-{p['end']} "
                f"({p['label']}): adaptive {a_p[0]:.1f} +- {a_p[1]:.1f} s, best fixed "
                f"{best_p} {b_p[0]:.1f} +- {b_p[1]:.1f} s ({gap:+.1f} s, noise "
                f"{noise:.1f} s)"
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
            worst = max(a / b for a, b in pairs)
            out.append(
                f"{_ok(worst <= SWITCH_GAP)}  {head} first step "
                + ", ".join(f"{a:.2f}" for a, _ in pairs)
                + " s against fixed dense's "
                + ", ".join(f"{b:.2f}" for _, b in pairs)
                + f" s (at most {worst:.2f}x)"
            )
    ratios, handling = [], []
    for r in ad:
        for s in r["switch_steps"]:
            arm = fixed_arm(s["to"])
            phase = next(
                (i for i, p in enumerate(data["phases"])
                 if p["start"] <= s["step"] < p["end"]), None,
            )  # fmt: skip
            runs = {x["seed"]: x for x in arms.get(arm, [])}
            if phase is None or r["seed"] not in runs or not s["seconds"]:
                continue
            ordinary = runs[r["seed"]]["ordinary_s"][phase]
            if ordinary and math.isfinite(ordinary):
                ratios.append(s["seconds"] / ordinary)
                handling.append(s.get("switch_s", 0.0) / ordinary)
    if ratios:
        within = sum(1 for x in ratios if x <= SWITCH_GAP)
        out.append(
            f"{_ok(within == len(ratios))}  {head} switch steps within "
            f"{SWITCH_GAP - 1:.0%} of the new method's ordinary step: {within} of "
            f"{len(ratios)} (median {statistics.median(ratios):.2f}x, worst "
            f"{max(ratios):.2f}x)"
        )
        within = sum(1 for x in handling if x <= SWITCH_GAP - 1)
        out.append(
            f"{_ok(within == len(handling))}  {head} the switches themselves "
            f"(carrying the residual or the carried gradients over): {within} of "
            f"{len(handling)} within {SWITCH_GAP - 1:.0%} of the new method's "
            f"ordinary step (median {statistics.median(handling):.0%}, worst "
            f"{max(handling):.0%})"
        )
    for key, what in (
        ("next_s", "the new method's next steps in the same run (median of up to 10)"),
        ("fixed_s", "the new method's fixed arm at the same step and seed (the same "
         "straggler draw and moment of the link)"),
    ):  # fmt: skip
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
        n = len(next(iter(arms.values()), []))
        out += [f"### {P} ranks ({n} seeds; seconds in steps, mean +- sd)", ""]
        head = ["arm", *[f"{p['start']}-{p['end']}: {p['label']}" for p in ph]]
        head += ["whole run", f"to {data['target']:g}", "final acc"]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        rows = list(arms.items())
        oracle = data["oracle"].get(P)
        if oracle:
            rows.append(("oracle: " + ", ".join(oracle["schedule"]), oracle["runs"]))
        for arm, runs in rows:
            cells = [arm]
            for i in range(len(ph)):
                m, s = _stat(runs, "phase_s", i)
                cells.append(f"{m:.1f} +- {s:.1f}")
            for key, fmt in (("total_s", ".1f"), ("to_target_s", ".1f"),
                             ("final_acc", ".4f")):  # fmt: skip
                m, s = _stat(runs, key)
                cells.append(
                    "not reached" if math.isinf(m) else f"{m:{fmt}} +- {s:{fmt}}"
                )
            out.append("| " + " | ".join(cells) + " |")
        if "adaptive" in arms:
            out += _adaptive_lines(arms["adaptive"], ph)
        out.append("")
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
        "- per run: switches " + ", ".join(str(r["switches"]) for r in ad)
        + "; probes " + ", ".join(str(s.get("probes", 0)) for s in summ)
        + "; switches the model mispredicted by more than its bound "
        + ", ".join(str(s.get("mispredicted", 0)) for s in summ)
        + "; start-up (outside the steps) "
        + ", ".join(f"{(s.get('startup') or {}).get('seconds', 0):.1f}" for s in summ)
        + " s"
    )  # fmt: skip
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
