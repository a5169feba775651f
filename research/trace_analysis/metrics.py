r"""What a run's timeline says: compute, communication, stragglers, update gaps.

    from research.trace_analysis import analyze, format_table
    result = analyze("runs/train-<time>")   # a run folder, a trace.json, or events
    print(format_table(result))

or ``python -m scripts.analyze_trace RUN_DIR`` (prints the table, writes
``RUN_DIR/analysis.json``). All times in the result are seconds.

Input. Chrome trace events as ``research.trace`` writes them: complete events
(``"ph": "X"``) with ``ts`` and ``dur`` in microseconds, ``pid`` = rank, the track
in ``cat`` (else the ``thread_name`` metadata of the event's ``tid``) and arguments
in ``args``. Other events are ignored except the ``dropped_events`` metadata, which
is reported per rank. All ranks count time from one barrier, so their times compare
up to that barrier's exit skew (microseconds on one node).

Classification: :data:`TRACKS`, the one table. Per track: its category (compute,
comm or other), whether the compute (training) thread records on it, and whether
its spans make up a training step::

    track          category compute-thread step
    data           other    yes            yes   loading the batch
    compute        compute  yes            yes   forward, backward (per stage later)
    delay          compute  yes            yes   injected imbalance (a slow rank)
    update         compute  yes            yes   the weight update
    comm           comm     yes            yes   communication the compute thread runs
                                                 or blocks on (blocking averaging)
    wait           comm     yes            yes   the compute thread waiting for
                                                 background communication
    comm-bg        comm     no             no    communication on a background thread
    eval           other    yes            no
    checkpoint     other    yes            no    the blocking part of a checkpoint
    checkpoint-bg  other    no             no    background persistence
    log            other    yes            no
    restart        other    yes            no    a run relaunched after a failure
    anything else  other    no             no

One rule by name: a span named ``wait`` or ``wait ...`` (``wait\b``, any case) on a
compute-thread track of category compute or comm is a *wait*: communication on the
compute thread, never compute, whichever of those tracks it was recorded on.
("wait for checkpoints" on the checkpoint track stays a checkpoint span.) A
*collective* is a comm span that is neither a wait nor on the wait track.

What recording code must do for this to hold: communication run by a background
thread goes on comm-bg; communication the compute thread runs or blocks on goes on
comm; the compute thread's waits for background communication go on wait (or are
named "wait ..." on compute or comm); spans of the training thread carry
``args.step``; per-stage spans carry ``args.stage``.

Per rank (``ranks``, totals over the run). With unions over the rank's spans (so
nested and overlapping spans count once) C = compute spans, M = comm spans (waits
included), E = comm spans on compute-thread tracks (exposed), O = other spans:

* ``wall_s``: last span end - first span start (the rank's trace window);
* ``compute_s`` = |C - E|: exposed waits are cut out of an enclosing compute span
  (a forward that waits for its allgather does not compute meanwhile);
* ``comm_s`` = |M|;
* ``hidden_comm_s`` = |M & (C - E)|: communication while the same rank computes;
* ``hidden_fraction`` = hidden_comm_s / comm_s (None when comm_s is 0);
* ``exposed_comm_s`` = |E|: the compute thread running or waiting on communication;
* ``other_s`` = |O - (C | M)|: data, evaluation, checkpointing, logging;
* ``idle_s`` = wall_s - |C | M | O|: covered by no span at all; so
  compute_s + comm_s - hidden_comm_s + other_s + idle_s = wall_s exactly;
* ``by_track_s``: |union of the track's spans| per track;
* ``steps`` and ``step_s``: step s of a rank lasts from the first start to the last
  end of its step-track spans with ``args.step == s``; ``step_s`` is the median.
  Step args, not update ends, define steps: fused steps record no update span, and
  evaluation or checkpoints between steps stay out, as in summary.json's step times.

Whole run: ``world_size`` (ranks with spans), ``wall_s`` (first start to last end
over all ranks), ``tracks`` (the table), ``totals`` (sums over ranks of the time
fields above; ``hidden_fraction`` of the sums).

Warm-up rule: the first step includes JIT compilation and first touches of buffers,
so every median, min, max, mean and count of a summary skips the first item of its
series (the lowest step, a collective's first occurrence, a rank's first gap
between updates) when the series has more than one. Per-item lists keep all.

Per collective (``collectives``). Occurrence k of (track, name) on every rank is one
collective: every rank starts collectives in the same order. Occurrences a name has
on only some ranks (a server's work) are counted in ``unmatched_collectives``. With
rank r inside from s_r to e_r, P ranks and L the last rank to arrive:

* ``skew_s`` = max s_r - min s_r (arrival skew), ``first_rank``, ``last_rank`` = L;
* ``wait_s[i]`` = min(s_L, e_r) - s_r for the i-th rank: its time inside before
  the last rank arrived;
* ``duration_s`` = e_L - s_L: the collective once all have arrived;
* ``bytes``: the largest ``args.bytes`` of the ranks (None without);
* ``bus_bw_Bps`` = 2 (P - 1) / P x bytes / duration_s: what each rank moves in a
  ring allreduce, per second (None for P = 1, no bytes or zero duration). Spans
  time the host, so this includes packing buffers where the span does;
* ``step``: the ranks' common ``args.step``, else None.

``collective_summary`` per (track, name): ``count``, median and max skew, mean wait
over ranks and occurrences, median ``bus_bw_Bps`` (warm-up rule).

Per step (``steps``), for each step traced on every rank. A rank's arrival is the
start of its earliest collective with that ``args.step`` when every rank has one
(``basis`` "collective"), else the end of its last compute span of that step
("compute": the fused style, one rank); else the step is left out.

* ``straggler``: the last rank to arrive (None with one rank);
* ``late_s``: last arrival - first arrival (how long the first rank waits for it);
* ``lead_s``: last arrival - second-last arrival (how much sooner the step's
  collective could start without the straggler; None with one rank).

``stragglers``: ``steps`` counted, ``counts`` {rank: steps it arrived last} (keys
become text in JSON), ``late_median_s``,
``lead_median_s`` (warm-up rule).

Per stage (``stages``). Updates are the update track's spans; their stage is
``args.stage``, else "model" (the whole model is one stage). For consecutive updates
k, k + 1 of one stage on one rank:

* gap = start(k + 1) - end(k): the stage's weights stay unchanged (DeepFreeze can
  capture them any time in it); ``gap_min_s``, ``gap_median_s``, ``gap_max_s``;
* free share = gap / (end(k + 1) - end(k)): the share of the stage's
  update-to-update step in which none of its updates runs, i.e. free for background
  work on its weights; ``free_share_min``, ``free_share_median``.

Pooled over ranks, and ``per_rank``; each rank's first gap is skipped (warm-up
rule). The fused style records no update span: ``stages`` is then empty.
"""

from __future__ import annotations

import functools
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from research.trace_analysis.events import TraceError, complete_events, load_events
from research.trace_analysis.intervals import intersect, subtract, total, union


class Track(NamedTuple):
    category: str  # "compute", "comm" or "other"
    compute_thread: bool  # recorded by the training thread
    in_step: bool  # its spans make up a training step


TRACKS: dict[str, Track] = {
    "data": Track("other", True, True),
    "compute": Track("compute", True, True),
    "delay": Track("compute", True, True),
    "update": Track("compute", True, True),
    "comm": Track("comm", True, True),
    "wait": Track("comm", True, True),
    "comm-bg": Track("comm", False, False),
    "eval": Track("other", True, False),
    "checkpoint": Track("other", True, False),
    "checkpoint-bg": Track("other", False, False),
    "log": Track("other", True, False),
    "restart": Track("other", True, False),
}
UNKNOWN_TRACK = Track("other", False, False)
DEFAULT_STAGE = "model"
_WAIT = re.compile(r"wait\b", re.IGNORECASE)


@dataclass(slots=True)
class Span:
    """One complete event, classified."""

    rank: int
    track: str
    name: str
    start: float
    end: float
    args: dict = field(default_factory=dict)
    category: str = "other"
    exposed: bool = False  # communication on the compute thread
    in_step: bool = False
    collective: bool = False
    step: int | None = None  # args.step when it is an integer


def classify(track: str, name: str) -> tuple[str, bool, bool, bool]:
    """(category, exposed, in_step, collective) of a span; see the module doc."""
    info = TRACKS.get(track, UNKNOWN_TRACK)
    is_wait = (
        info.compute_thread
        and info.category in ("compute", "comm")
        and _WAIT.match(name) is not None
    )
    category = "comm" if is_wait else info.category
    exposed = category == "comm" and info.compute_thread
    collective = category == "comm" and track != "wait" and not _WAIT.match(name)
    return category, exposed, info.in_step, collective


def parse_spans(events: list[dict]) -> tuple[dict[int, list[Span]], dict[int, int]]:
    """Classified spans per rank (sorted by start) and dropped-event counts."""
    raw, dropped = complete_events(events)
    kinds = functools.lru_cache(maxsize=None)(classify)  # few distinct names
    spans: dict[int, list[Span]] = defaultdict(list)
    for r in raw:
        step = r.args.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            step = None
        spans[r.rank].append(Span(*r, *kinds(r.track, r.name), step))
    for lst in spans.values():
        lst.sort(key=lambda s: (s.start, -s.end))
    return dict(spans), dropped


# -- helpers --------------------------------------------------------------------
def warm(series: list) -> list:
    """The series without its first item (warm-up), unless that is its only one."""
    return series[1:] if len(series) > 1 else series


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _union_of(spans: list[Span], keep) -> list[tuple[float, float]]:
    return union((s.start, s.end) for s in spans if keep(s))


# -- per rank -------------------------------------------------------------------
def step_intervals(spans: list[Span]) -> dict[int, tuple[float, float]]:
    """Step -> (first start, last end) of the rank's step-track spans of that step."""
    out: dict[int, tuple[float, float]] = {}
    for s in spans:
        if s.in_step and s.step is not None:
            a, b = out.get(s.step, (s.start, s.end))
            out[s.step] = (min(a, s.start), max(b, s.end))
    return dict(sorted(out.items()))


def rank_metrics(rank: int, spans: list[Span], dropped: int = 0) -> dict[str, Any]:
    """The per-rank breakdown of the module doc."""
    c = _union_of(spans, lambda s: s.category == "compute")
    m = _union_of(spans, lambda s: s.category == "comm")
    e = _union_of(spans, lambda s: s.exposed)
    o = _union_of(spans, lambda s: s.category == "other")
    computing = subtract(c, e)
    c_or_m = union(c + m)
    busy = total(c_or_m) + total(subtract(o, c_or_m))
    start = min(s.start for s in spans)
    end = max(s.end for s in spans)
    comm_s, hidden_comm_s = total(m), total(intersect(m, computing))
    steps = step_intervals(spans)
    durations = [b - a for a, b in steps.values()]
    per_track: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s in spans:
        per_track[s.track].append((s.start, s.end))
    return {
        "rank": rank,
        "window_start_s": start,
        "window_end_s": end,
        "wall_s": end - start,
        "steps": len(steps),
        "step_s": _median(warm(durations)),
        "compute_s": total(computing),
        "comm_s": comm_s,
        "hidden_comm_s": hidden_comm_s,
        "hidden_fraction": _ratio(hidden_comm_s, comm_s),
        "exposed_comm_s": total(e),
        "other_s": total(subtract(o, c_or_m)),
        "idle_s": (end - start) - busy,
        "by_track_s": {
            t: total(union(per_track[t]))
            for t in sorted(per_track, key=lambda t: (t not in TRACKS, t))
        },
        "dropped_events": dropped,
    }


# -- across ranks ---------------------------------------------------------------
def match_collectives(
    spans: dict[int, list[Span]],
) -> tuple[list[dict[str, Any]], int]:
    """Collectives matched across ranks by (track, name, occurrence); see module doc."""
    ranks = sorted(spans)
    per_rank: dict[int, dict[tuple[str, str], list[Span]]] = {}
    for r in ranks:
        d: dict[tuple[str, str], list[Span]] = defaultdict(list)
        for s in spans[r]:  # already sorted by start
            if s.collective:
                d[(s.track, s.name)].append(s)
        per_rank[r] = d
    keys = {k for d in per_rank.values() for k in d}
    p, out, unmatched = len(ranks), [], 0
    for key in keys:
        counts = [len(per_rank[r].get(key, ())) for r in ranks]
        n = min(counts)
        unmatched += sum(counts) - n * p
        for k in range(n):
            group = [per_rank[r][key][k] for r in ranks]
            out.append(_collective(key, k, ranks, group))
    out.sort(key=lambda c: (c["first_start_s"], c["track"], c["name"]))
    return out, unmatched


def _collective(key, k: int, ranks: list[int], group: list[Span]) -> dict[str, Any]:
    p = len(ranks)
    starts = [s.start for s in group]
    last = max(range(p), key=lambda i: (starts[i], -i))
    first = min(range(p), key=lambda i: (starts[i], i))
    s_last = starts[last]
    duration = group[last].end - s_last
    sizes = [
        s.args["bytes"]
        for s in group
        if isinstance(s.args.get("bytes"), (int, float))
        and not isinstance(s.args.get("bytes"), bool)
    ]
    nbytes = max(sizes) if sizes else None
    bw = None
    if p > 1 and nbytes and duration > 0:
        bw = 2 * (p - 1) / p * nbytes / duration
    steps = {s.step for s in group}
    return {
        "track": key[0],
        "name": key[1],
        "index": k,
        "step": steps.pop() if len(steps) == 1 else None,
        "first_start_s": starts[first],
        "first_rank": ranks[first],
        "last_rank": ranks[last],
        "skew_s": s_last - starts[first],
        "wait_s": [max(0.0, min(s_last, s.end) - s.start) for s in group],
        "duration_s": duration,
        "bytes": nbytes,
        "bus_bw_Bps": bw,
    }


def summarize_collectives(collectives: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (track, name): count, skew, wait and bandwidth (warm-up rule)."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for c in collectives:
        groups[(c["track"], c["name"])].append(c)
    out = []
    for (track, name), cs in groups.items():
        cs = warm(sorted(cs, key=lambda c: c["index"]))
        waits = [w for c in cs for w in c["wait_s"]]
        bws = [c["bus_bw_Bps"] for c in cs if c["bus_bw_Bps"] is not None]
        out.append(
            {
                "track": track,
                "name": name,
                "count": len(groups[(track, name)]),
                "skew_median_s": _median([c["skew_s"] for c in cs]),
                "skew_max_s": max(c["skew_s"] for c in cs),
                "wait_mean_s": statistics.fmean(waits) if waits else None,
                "bus_bw_median_Bps": _median(bws),
            }
        )
    return out


def step_stragglers(spans: dict[int, list[Span]]) -> list[dict[str, Any]]:
    """Per step traced on every rank: who arrived last and by how much."""
    ranks = sorted(spans)
    coll: list[dict[int, float]] = []
    comp: list[dict[int, float]] = []
    for r in ranks:
        first_coll: dict[int, float] = {}
        last_comp: dict[int, float] = {}
        for s in spans[r]:
            if s.step is None:
                continue
            if s.collective:
                first_coll[s.step] = min(first_coll.get(s.step, s.start), s.start)
            elif s.category == "compute":
                last_comp[s.step] = max(last_comp.get(s.step, s.end), s.end)
        coll.append(first_coll)
        comp.append(last_comp)
    common = set.intersection(*(set(step_intervals(spans[r])) for r in ranks))
    out = []
    for step in sorted(common):
        if all(step in d for d in coll):
            basis, arrivals = "collective", [d[step] for d in coll]
        elif all(step in d for d in comp):
            basis, arrivals = "compute", [d[step] for d in comp]
        else:
            continue
        order = sorted(range(len(ranks)), key=lambda i: (arrivals[i], -i))
        multi = len(ranks) > 1
        out.append(
            {
                "step": step,
                "basis": basis,
                "arrivals_s": arrivals,
                "straggler": ranks[order[-1]] if multi else None,
                "late_s": arrivals[order[-1]] - arrivals[order[0]],
                "lead_s": arrivals[order[-1]] - arrivals[order[-2]] if multi else None,
            }
        )
    return out


def summarize_stragglers(steps: list[dict[str, Any]]) -> dict[str, Any]:
    kept = warm(steps)
    counts: dict[int, int] = defaultdict(int)
    for s in kept:
        if s["straggler"] is not None:
            counts[s["straggler"]] += 1
    leads = [s["lead_s"] for s in kept if s["lead_s"] is not None]
    return {
        "steps": len(kept),
        "counts": dict(sorted(counts.items())),
        "late_median_s": _median([s["late_s"] for s in kept]),
        "lead_median_s": _median(leads),
    }


def update_gaps(spans: dict[int, list[Span]]) -> list[dict[str, Any]]:
    """Per stage: gaps between consecutive updates and the free share of steps."""
    by_stage: dict[str, dict[int, list[Span]]] = defaultdict(lambda: defaultdict(list))
    for r in sorted(spans):
        for s in spans[r]:
            if s.track == "update":
                by_stage[str(s.args.get("stage", DEFAULT_STAGE))][r].append(s)
    out = []
    for stage, per_rank in by_stage.items():
        rows, pooled_gaps, pooled_free = [], [], []
        for r, ups in sorted(per_rank.items()):
            pairs = warm(list(zip(ups, ups[1:])))
            gaps = [b.start - a.end for a, b in pairs]
            free = [_ratio(b.start - a.end, b.end - a.end) for a, b in pairs]
            free = [f for f in free if f is not None]
            pooled_gaps += gaps
            pooled_free += free
            rows.append({"rank": r, "updates": len(ups), **_gap_stats(gaps, free)})
        out.append(
            {
                "stage": stage,
                "updates": sum(row["updates"] for row in rows),
                **_gap_stats(pooled_gaps, pooled_free),
                "per_rank": rows,
            }
        )
    return out


def _gap_stats(gaps: list[float], free: list[float]) -> dict[str, Any]:
    return {
        "gaps": len(gaps),
        "gap_min_s": min(gaps) if gaps else None,
        "gap_median_s": _median(gaps),
        "gap_max_s": max(gaps) if gaps else None,
        "free_share_min": min(free) if free else None,
        "free_share_median": _median(free),
    }


# -- the whole ------------------------------------------------------------------
def analyze(source: Any) -> dict[str, Any]:
    """Analyze a trace (run folder, ``trace.json`` path, or events); see module doc.

    Raises:
        TraceError: the trace is missing, not JSON, malformed, or has no spans.
    """
    spans, dropped = parse_spans(load_events(source))
    if not spans:
        raise TraceError("the trace has no spans (complete 'X' events)")
    ranks = [rank_metrics(r, spans[r], dropped.get(r, 0)) for r in sorted(spans)]
    collectives, unmatched = match_collectives(spans)
    steps = step_stragglers(spans)
    sums = {
        k: sum(row[k] for row in ranks)
        for k in ("wall_s", "compute_s", "comm_s", "hidden_comm_s", "exposed_comm_s")
        + ("other_s", "idle_s")
    }
    return {
        "world_size": len(ranks),
        "wall_s": max(r["window_end_s"] for r in ranks)
        - min(r["window_start_s"] for r in ranks),
        "tracks": {t: info._asdict() for t, info in TRACKS.items()},
        "ranks": ranks,
        "totals": {
            **sums,
            "hidden_fraction": _ratio(sums["hidden_comm_s"], sums["comm_s"]),
        },
        "collectives": collectives,
        "collective_summary": summarize_collectives(collectives),
        "unmatched_collectives": unmatched,
        "steps": steps,
        "stragglers": summarize_stragglers(steps),
        "stages": update_gaps(spans),
    }
