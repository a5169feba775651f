"""A fixed-width text table of :func:`research.trace_analysis.analyze`'s result."""

from __future__ import annotations

from typing import Any


def _f(x: float | None, scale: float = 1.0, width: int = 9, digits: int = 3) -> str:
    if x is None:
        return f"{'-':>{width}}"
    return f"{x * scale:>{width}.{digits}f}"


def _pct(x: float | None, width: int = 7) -> str:
    return f"{'-':>{width}}" if x is None else f"{x * 100:>{width - 1}.1f}%"


def _rank_table(result: dict[str, Any]) -> list[str]:
    head = (
        f"{'rank':>4} {'steps':>5} {'step_ms':>9} {'compute_s':>9} {'comm_s':>9} "
        f"{'hidden_s':>9} {'hidden':>7} {'exposed_s':>9} {'other_s':>9} "
        f"{'idle_s':>9} {'wall_s':>9}"
    )
    lines = [head]
    for r in result["ranks"]:
        lines.append(
            f"{r['rank']:>4} {r['steps']:>5} {_f(r['step_s'], 1e3)} "
            f"{_f(r['compute_s'])} {_f(r['comm_s'])} {_f(r['hidden_comm_s'])} "
            f"{_pct(r['hidden_fraction'])} {_f(r['exposed_comm_s'])} "
            f"{_f(r['other_s'])} {_f(r['idle_s'])} {_f(r['wall_s'])}"
        )
    t = result["totals"]
    lines.append(
        f"{'all':>4} {'':>5} {'':>9} {_f(t['compute_s'])} {_f(t['comm_s'])} "
        f"{_f(t['hidden_comm_s'])} {_pct(t['hidden_fraction'])} "
        f"{_f(t['exposed_comm_s'])} {_f(t['other_s'])} {_f(t['idle_s'])} "
        f"{_f(t['wall_s'])}"
    )
    return lines


def _collective_table(result: dict[str, Any]) -> list[str]:
    summary = result["collective_summary"]
    lines = [
        f"collectives: {len(result['collectives'])} matched across ranks, "
        f"{result['unmatched_collectives']} unmatched occurrences"
    ]
    if not summary:
        return lines
    lines.append(
        f"{'track':<8} {'name':<24} {'count':>6} {'skew_ms':>9} {'skew_max_ms':>11} "
        f"{'wait_ms':>9} {'ring_GB/s':>9}"
    )
    for c in summary:
        lines.append(
            f"{c['track']:<8.8} {c['name']:<24.24} {c['count']:>6} "
            f"{_f(c['skew_median_s'], 1e3)} {_f(c['skew_max_s'], 1e3, 11)} "
            f"{_f(c['wait_mean_s'], 1e3)} {_f(c['bus_bw_median_Bps'], 1e-9)}"
        )
    return lines


def _straggler_line(result: dict[str, Any]) -> list[str]:
    s = result["stragglers"]
    if not s["steps"]:
        return ["stragglers: no step traced on every rank"]
    if not s["counts"]:
        return [f"stragglers: one rank, {s['steps']} steps"]
    who = ", ".join(f"rank {r} in {n}" for r, n in s["counts"].items())
    return [
        f"stragglers over {s['steps']} steps: last to arrive {who}; "
        f"median late {_f(s['late_median_s'], 1e3, 0)} ms, "
        f"lead over the next {_f(s['lead_median_s'], 1e3, 0)} ms"
    ]


def _stage_table(result: dict[str, Any]) -> list[str]:
    if not result["stages"]:
        return ["update gaps: no update spans (fused steps record none)"]
    lines = [
        f"{'stage':<12} {'gaps':>5} {'gap_min_ms':>10} {'gap_med_ms':>10} "
        f"{'gap_max_ms':>10} {'free_min':>8} {'free_med':>8}"
    ]
    for s in result["stages"]:
        lines.append(
            f"{s['stage']:<12.12} {s['gaps']:>5} {_f(s['gap_min_s'], 1e3, 10)} "
            f"{_f(s['gap_median_s'], 1e3, 10)} {_f(s['gap_max_s'], 1e3, 10)} "
            f"{_pct(s['free_share_min'], 8)} {_pct(s['free_share_median'], 8)}"
        )
    return lines


def format_table(result: dict[str, Any]) -> str:
    """Per rank, per collective, stragglers and update gaps, as aligned text."""
    steps = max((r["steps"] for r in result["ranks"]), default=0)
    lines = [
        f"trace: {result['world_size']} ranks, {result['wall_s']:.3f} s, "
        f"{steps} steps (medians skip the first, which compiles)",
        *_rank_table(result),
        "",
        *_collective_table(result),
        "",
        *_straggler_line(result),
        "",
        *_stage_table(result),
    ]
    return "\n".join(lines)
