"""The trace analyzer on hand-made traces with known answers, and on a real run.

Hand-made traces are lists of Chrome events laid out as ``research.trace`` writes
them (``test_helper_writes_what_the_tracer_writes`` holds the helper to that).
Times below are in milliseconds; the analyzer answers in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from research.trace import TRACKS as TRACK_IDS
from research.trace import Tracer, merge_traces
from research.trace_analysis import TraceError, analyze, classify, format_table
from research.trace_analysis.intervals import intersect, subtract, total, union
from tests.harness import python

# One worker: the traced run of the module fixture is made once.
pytestmark = pytest.mark.xdist_group("test_analysis")
ROOT = Path(__file__).parent.parent
MS = 1e-3


def meta(rank: int) -> list[dict]:
    """The metadata events a ``Tracer`` writes first for ``rank``."""
    out = [
        {"ph": "M", "pid": rank, "tid": 0, "name": "process_name",
         "args": {"name": f"rank {rank}"}},
        {"ph": "M", "pid": rank, "tid": 0, "name": "process_sort_index",
         "args": {"sort_index": rank}},
    ]  # fmt: skip
    for track, tid in TRACK_IDS.items():
        out.append(
            {"ph": "M", "pid": rank, "tid": tid, "name": "thread_name",
             "args": {"name": track}}
        )  # fmt: skip
        out.append(
            {"ph": "M", "pid": rank, "tid": tid, "name": "thread_sort_index",
             "args": {"sort_index": tid}}
        )  # fmt: skip
    return out


def span(rank: int, track: str, name: str, t0_ms: float, t1_ms: float, **args):
    """A complete event as ``Tracer.complete`` writes it."""
    return {
        "ph": "X",
        "pid": rank,
        "tid": TRACK_IDS.get(track, 99),
        "name": name,
        "cat": track,
        "ts": round(t0_ms * 1e3, 1),
        "dur": round((t1_ms - t0_ms) * 1e3, 1),
        "args": args,
    }


def trace(*spans: dict) -> dict:
    ranks = sorted({s["pid"] for s in spans})
    events = [e for r in ranks for e in meta(r)] + list(spans)
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def approx_ms(x: float):
    return pytest.approx(x * MS, abs=1e-9)


# -- the format ------------------------------------------------------------------
def test_helper_writes_what_the_tracer_writes(tmp_path):
    tracers = [Tracer(tmp_path, rank=r, size=2) for r in (0, 1)]
    for t in tracers:
        t.complete("forward+backward", "compute", t._t0 + 0.002, t._t0 + 0.010, step=0)
        t.complete("average", "comm", t._t0 + 0.010, t._t0 + 0.0125, bytes=8, step=0)
    for t in reversed(tracers):  # rank 0 last: it merges every rank's file
        t.close()
    written = json.loads((tmp_path / "trace.json").read_text())
    built = trace(
        *[span(r, "compute", "forward+backward", 2, 10, step=0) for r in (0, 1)],
        *[span(r, "comm", "average", 10, 12.5, bytes=8, step=0) for r in (0, 1)],
    )
    key = json.dumps
    assert sorted(map(key, written["traceEvents"])) == sorted(
        map(key, built["traceEvents"])
    )


# -- building blocks -------------------------------------------------------------
def test_intervals():
    a = union([(5, 7), (0, 2), (1, 3), (6, 6.5), (9, 9)])
    assert a == [(0, 3), (5, 7)]
    b = union([(2, 6)])
    assert intersect(a, b) == [(2, 3), (5, 6)]
    assert subtract(a, b) == [(0, 2), (6, 7)]
    assert subtract(b, a) == [(3, 5)]
    assert total(a) == 5


def test_classification_table_and_wait_rule():
    assert classify("compute", "forward+backward") == ("compute", False, True, False)
    assert classify("update", "update") == ("compute", False, True, False)
    assert classify("delay", "injected delay") == ("compute", False, True, False)
    # Blocking averaging on the compute thread: exposed, a collective.
    assert classify("comm", "average") == ("comm", True, True, True)
    assert classify("comm-bg", "solo round") == ("comm", False, False, True)
    # Waits are exposed communication wherever the compute thread records them.
    assert classify("wait", "allgather stage 2") == ("comm", True, True, False)
    assert classify("compute", "wait for allgather") == ("comm", True, True, False)
    assert classify("comm", "Wait") == ("comm", True, True, False)
    assert classify("compute", "waiting room") == ("compute", False, True, False)
    assert classify("checkpoint", "wait for checkpoints") == (
        "other",
        False,
        False,
        False,
    )
    assert classify("data", "load batch") == ("other", False, True, False)
    assert classify("no-such-track", "x") == ("other", False, False, False)


# -- one rank: nesting, overlap, waits, idle gaps ---------------------------------
ONE_RANK = trace(
    # step 0
    span(0, "data", "load batch", 0, 2, step=0),
    span(0, "compute", "forward+backward", 2, 10, step=0),
    span(0, "compute", "backward stage 1", 6, 9, step=0, stage=1),  # nested
    span(0, "comm-bg", "reduce-scatter", 7, 13, step=0, bytes=100),  # background
    span(0, "wait", "allgather", 10, 12, step=0),
    span(0, "update", "update", 12, 13, step=0),
    # idle 13..14; step 1
    span(0, "data", "load batch", 14, 16, step=1),
    span(0, "compute", "forward", 16, 24, step=1),
    span(0, "compute", "wait for allgather stage 1", 17, 19, step=1),  # inside
    span(0, "comm", "average", 24, 27, step=1, bytes=400),
    span(0, "update", "update", 27, 28, step=1),
    # idle 28..30; overlapping non-step work
    span(0, "checkpoint", "checkpoint", 30, 32, step=2),
    span(0, "checkpoint-bg", "write", 31, 36, step=2),
    span(0, "eval", "evaluate", 36, 40, step=2),
)


def test_rank_breakdown_with_nesting_overlap_waits_and_idle():
    r = analyze(ONE_RANK)["ranks"][0]
    # C = [2,10] [12,13] [16,24] [27,28]; E (exposed) = [10,12] [17,19] [24,27];
    # M = [7,13] [17,19] [24,27]; O = [0,2] [14,16] [30,40].
    assert r["rank"] == 0
    assert r["window_start_s"] == 0 and r["window_end_s"] == approx_ms(40)
    assert r["wall_s"] == approx_ms(40)
    assert r["compute_s"] == approx_ms(
        16
    )  # C - E: [2,10] [12,13] [16,17] [19,24] [27,28]
    assert r["comm_s"] == approx_ms(11)
    assert r["hidden_comm_s"] == approx_ms(4)  # [7,10] [12,13]
    assert r["hidden_fraction"] == pytest.approx(4 / 11)
    assert r["exposed_comm_s"] == approx_ms(7)
    assert r["other_s"] == approx_ms(14)
    assert r["idle_s"] == approx_ms(3)  # [13,14] [28,30]
    assert (
        r["compute_s"] + r["comm_s"] - r["hidden_comm_s"] + r["other_s"] + r["idle_s"]
    ) == pytest.approx(r["wall_s"])
    assert {k: round(v / MS, 6) for k, v in r["by_track_s"].items()} == {
        "data": 4,
        "compute": 16,
        "update": 2,
        "comm": 3,
        "wait": 2,
        "comm-bg": 6,
        "eval": 4,
        "checkpoint": 2,
        "checkpoint-bg": 5,
    }
    # Steps: 0 = [0,13], 1 = [14,28]; evaluation and checkpoints are not steps;
    # the median skips step 0 (warm-up).
    assert r["steps"] == 2
    assert r["step_s"] == approx_ms(14)
    assert r["dropped_events"] == 0


def test_one_rank_collectives_steps_and_stage():
    res = analyze(ONE_RANK)
    assert res["world_size"] == 1 and res["wall_s"] == approx_ms(40)
    names = [(c["track"], c["name"], c["index"]) for c in res["collectives"]]
    assert names == [("comm-bg", "reduce-scatter", 0), ("comm", "average", 0)]
    avg = res["collectives"][1]
    assert avg["step"] == 1 and avg["bytes"] == 400
    assert avg["skew_s"] == 0 and avg["wait_s"] == [0]
    assert avg["duration_s"] == approx_ms(3)
    assert avg["bus_bw_Bps"] is None  # one rank moves nothing
    assert res["unmatched_collectives"] == 0
    steps = res["steps"]
    assert [s["step"] for s in steps] == [0, 1]
    assert [s["basis"] for s in steps] == ["collective", "collective"]
    assert steps[0]["arrivals_s"] == [approx_ms(7)]  # the reduce-scatter's start
    assert steps[1]["arrivals_s"] == [approx_ms(24)]
    assert all(s["straggler"] is None and s["lead_s"] is None for s in steps)
    assert all(s["late_s"] == 0 for s in steps)
    assert res["stragglers"] == {
        "steps": 1,
        "counts": {},
        "late_median_s": 0,
        "lead_median_s": None,
    }
    (stage,) = res["stages"]
    assert stage["stage"] == "model" and stage["updates"] == 2
    # One gap, kept (the warm-up rule never empties a series): 27 - 13.
    assert stage["gaps"] == 1
    assert stage["gap_min_s"] == stage["gap_median_s"] == stage["gap_max_s"]
    assert stage["gap_median_s"] == approx_ms(14)
    assert stage["free_share_min"] == stage["free_share_median"]
    assert stage["free_share_median"] == pytest.approx(14 / 15)
    assert res["totals"]["hidden_fraction"] == pytest.approx(4 / 11)


# -- three ranks: a straggler and a collective with skew --------------------------
ARRIVALS = {0: (10, 12, 11), 1: (110, 110, 130), 2: (215, 210, 240)}  # step: ranks
BYTES = 3_000_000


def _three_ranks() -> dict:
    spans = []
    for step, arrivals in ARRIVALS.items():
        base = 100 * step
        end = max(arrivals) + 6  # the allreduce takes 6 ms once all have arrived
        for r, arrive in enumerate(arrivals):
            spans += [
                span(r, "data", "load batch", base, base + 1, step=step),
                span(r, "compute", "forward+backward", base + 1, base + 10, step=step),
                span(r, "comm", "average", arrive, end, step=step, bytes=BYTES),
                span(r, "update", "update", end, end + 1, step=step),
            ]
            if arrive > base + 10:
                spans.append(
                    span(r, "delay", "injected delay", base + 10, arrive, step=step)
                )
    # A server's work on rank 0 only: not a collective of all ranks.
    spans += [span(0, "comm-bg", "ps update", t, t + 1) for t in (50, 150)]
    return trace(*spans)


def test_collectives_skew_waits_and_ring_bandwidth():
    res = analyze(_three_ranks())
    assert res["world_size"] == 3
    avg = [c for c in res["collectives"] if c["name"] == "average"]
    assert [c["index"] for c in avg] == [0, 1, 2]
    assert [c["step"] for c in avg] == [0, 1, 2]
    assert [c["first_rank"] for c in avg] == [0, 0, 1]  # ties go to the lowest rank
    assert [c["last_rank"] for c in avg] == [1, 2, 2]
    assert [c["skew_s"] for c in avg] == [approx_ms(2), approx_ms(20), approx_ms(30)]
    assert avg[0]["wait_s"] == [approx_ms(2), approx_ms(0), approx_ms(1)]
    assert avg[1]["wait_s"] == [approx_ms(20), approx_ms(20), approx_ms(0)]
    assert avg[2]["wait_s"] == [approx_ms(25), approx_ms(30), approx_ms(0)]
    assert all(c["duration_s"] == approx_ms(6) for c in avg)
    assert all(c["bytes"] == BYTES for c in avg)
    ring = 2 * (3 - 1) / 3 * BYTES / 0.006
    assert all(c["bus_bw_Bps"] == pytest.approx(ring) for c in avg)
    assert res["unmatched_collectives"] == 2
    (summary,) = res["collective_summary"]
    assert summary["track"] == "comm" and summary["name"] == "average"
    assert summary["count"] == 3
    # Occurrence 0 is warm-up: skews 20 and 30, waits 20 20 0 25 30 0.
    assert summary["skew_median_s"] == approx_ms(25)
    assert summary["skew_max_s"] == approx_ms(30)
    assert summary["wait_mean_s"] == approx_ms(95 / 6)
    assert summary["bus_bw_median_Bps"] == pytest.approx(ring)


def test_straggler_per_step():
    res = analyze(_three_ranks())
    steps = res["steps"]
    assert [s["basis"] for s in steps] == ["collective"] * 3
    assert [s["arrivals_s"] for s in steps] == [
        [approx_ms(t) for t in ARRIVALS[k]] for k in range(3)
    ]
    assert [s["straggler"] for s in steps] == [1, 2, 2]
    assert [s["late_s"] for s in steps] == [approx_ms(2), approx_ms(20), approx_ms(30)]
    assert [s["lead_s"] for s in steps] == [approx_ms(1), approx_ms(20), approx_ms(25)]
    assert res["stragglers"] == {
        "steps": 2,
        "counts": {2: 2},
        "late_median_s": approx_ms(25),
        "lead_median_s": approx_ms(22.5),
    }
    # The straggler's own breakdown: its delay is compute, its averaging exposed.
    r2 = res["ranks"][2]
    assert r2["exposed_comm_s"] == approx_ms(7 + 6 + 6)
    assert r2["by_track_s"]["delay"] == approx_ms(1 + 20 + 30)
    assert r2["compute_s"] == approx_ms(3 * 9 + 51 + 3)  # fwd+bwd, delays, updates
    assert r2["steps"] == 3
    assert r2["step_s"] == approx_ms(42)  # median of 137 - 100 and 247 - 200


# -- stages ------------------------------------------------------------------------
def test_update_gaps_per_stage():
    ups = {
        (0, "body"): [(10, 12), (30, 32), (50, 52), (90, 92)],
        (1, "body"): [(10, 11), (30, 31), (50, 51)],
        (0, 2): [(12, 13), (32, 33)],
    }
    res = analyze(
        trace(
            *[
                span(r, "update", f"update {stage}", a, b, stage=stage)
                for (r, stage), times in ups.items()
                for a, b in times
            ]
        )
    )
    body, head = res["stages"]
    # rank 0: gaps 18 (warm-up, skipped), 18, 38; free 18/20, 38/40.
    # rank 1: gaps 19 (skipped), 19; free 19/20.
    assert body["stage"] == "body" and body["updates"] == 7
    assert body["gaps"] == 3
    assert body["gap_min_s"] == approx_ms(18)
    assert body["gap_median_s"] == approx_ms(19)
    assert body["gap_max_s"] == approx_ms(38)
    assert body["free_share_min"] == pytest.approx(0.9)
    assert body["free_share_median"] == pytest.approx(0.95)
    r0, r1 = body["per_rank"]
    assert (r0["rank"], r0["updates"], r0["gaps"]) == (0, 4, 2)
    assert r0["gap_median_s"] == approx_ms(28)
    assert r0["free_share_median"] == pytest.approx((0.9 + 0.95) / 2)
    assert (r1["rank"], r1["updates"], r1["gaps"]) == (1, 3, 1)
    assert r1["gap_min_s"] == r1["gap_max_s"] == approx_ms(19)
    # A stage id that is a number is reported as text; one gap is kept.
    assert head["stage"] == "2" and head["updates"] == 2 and head["gaps"] == 1
    assert head["gap_median_s"] == approx_ms(19)
    assert head["free_share_median"] == pytest.approx(19 / 20)
    assert [row["rank"] for row in head["per_rank"]] == [0]


def test_fused_steps_straggler_from_compute_and_no_stages():
    ends = {0: (10, 20), 1: (12, 25)}
    res = analyze(
        trace(
            *[
                span(r, "compute", "fwd+bwd+allreduce+update", 11 * k + 1, end, step=k)
                for r, times in ends.items()
                for k, end in enumerate(times)
            ]
        )
    )
    assert [s["basis"] for s in res["steps"]] == ["compute", "compute"]
    assert [s["straggler"] for s in res["steps"]] == [1, 1]
    assert res["steps"][1]["late_s"] == approx_ms(5)
    assert res["steps"][1]["lead_s"] == approx_ms(5)
    assert res["stages"] == [] and res["collectives"] == []
    r0, r1 = res["ranks"]
    assert r1["comm_s"] == 0 and r1["hidden_fraction"] is None
    assert r1["compute_s"] == approx_ms(11 + 13) and r1["idle_s"] == 0
    assert r0["compute_s"] == approx_ms(9 + 8) and r0["idle_s"] == approx_ms(2)
    assert res["totals"]["hidden_fraction"] is None
    text = format_table(res)
    assert "no update spans" in text and "rank 1 in 1" in text


# -- malformed input -----------------------------------------------------------------
@pytest.mark.parametrize(
    "source, needle",
    [
        ({"traceEvents": []}, "no spans"),
        ({"nothing": 1}, "expected a list"),
        ([{"ph": "X", "pid": 0, "ts": "soon", "dur": 1}], "bad 'ts'"),
        ([{"ph": "X", "pid": "r0", "ts": 0, "dur": 1}], "bad 'pid'"),
        ([{"ph": "X", "pid": 0, "ts": 0, "dur": -1}], "negative 'dur'"),
        ([3], "not an object"),
    ],
)
def test_malformed_events_raise_trace_error(source, needle):
    with pytest.raises(TraceError, match=needle):
        analyze(source)


def test_dropped_events_and_thread_name_fallback():
    events = meta(0) + [
        {"ph": "X", "pid": 0, "tid": TRACK_IDS["comm"], "name": "average",
         "ts": 0, "dur": 1000, "args": {}},  # no "cat": the track from metadata
        {"ph": "M", "pid": 0, "tid": 0, "name": "dropped_events",
         "args": {"count": 7, "cap": 1}},
    ]  # fmt: skip
    (r,) = analyze(events)["ranks"]
    assert r["comm_s"] == approx_ms(1) and r["exposed_comm_s"] == approx_ms(1)
    assert r["dropped_events"] == 7


# -- a real run and the command line -------------------------------------------------
STEPS = 5


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A traced single-process run of a tiny model (staged host averaging)."""
    out = tmp_path_factory.mktemp("traced") / "run"
    proc = python(
        ["-m", "experiments.train", "--np", "1", "--model", "cnn_small",
         "--data-opt", "n_train=256", "--data-opt", "n_test=64",
         "--steps", str(STEPS), "--batch-size", "16", "--eval-every", "0",
         "--strategy", "host", "--trace", "--run-dir", str(out)],
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_real_trace_is_consistent(run_dir):
    res = analyze(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert res["world_size"] == 1
    (r,) = res["ranks"]
    assert r["steps"] == STEPS and r["step_s"] > 0
    # Single process: load, forward+backward, average, update, evaluate never
    # overlap, so the breakdown adds up to the window without an overlap term.
    assert r["hidden_comm_s"] == 0
    parts = r["compute_s"] + r["comm_s"] + r["other_s"] + r["idle_s"]
    assert parts == pytest.approx(r["wall_s"], rel=1e-9)
    assert r["compute_s"] == pytest.approx(
        r["by_track_s"]["compute"] + r["by_track_s"]["update"], rel=1e-9
    )
    assert r["exposed_comm_s"] == pytest.approx(r["comm_s"])  # blocking averaging
    # The same steps as the loop's own timing (both skip the compiling first step).
    assert r["step_s"] == pytest.approx(summary["median_step_s"], rel=0.1, abs=5e-3)
    assert [c["name"] for c in res["collectives"]] == ["average"] * STEPS
    assert [s["step"] for s in res["steps"]] == list(range(STEPS))
    (stage,) = res["stages"]
    assert stage["updates"] == STEPS and stage["gaps"] == STEPS - 2
    assert 0 < stage["free_share_min"] <= stage["free_share_median"] < 1


def test_cli_writes_analysis_and_prints_table(run_dir):
    proc = python(["-m", "scripts.analyze_trace", str(run_dir)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    written = json.loads((run_dir / "analysis.json").read_text())
    assert written == json.loads(json.dumps(analyze(run_dir)))
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("trace: 1 ranks")
    header = lines[1].split()
    assert header[:4] == ["rank", "steps", "step_ms", "compute_s"]
    assert lines[2].split()[:2] == ["0", str(STEPS)]
    assert "average" in proc.stdout and "model" in proc.stdout


@pytest.mark.parametrize(
    "content, needle",
    [
        (None, "no trace at"),
        ('{"traceEvents": [', "not valid JSON"),
        ('{"traceEvents": [{"ph": "X", "pid": 0, "ts": 1}]}', "bad 'dur'"),
        ('{"traceEvents": []}', "no spans"),
    ],
)
def test_cli_bad_trace_one_line_exit_2(tmp_path, content, needle):
    if content is not None:
        (tmp_path / "trace.json").write_text(content)
    proc = python(["-m", "scripts.analyze_trace", str(tmp_path)], timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "error:" in proc.stderr, proc.stderr
    assert needle in proc.stderr
    assert not (tmp_path / "analysis.json").exists()


def test_cli_missing_folder_one_line_exit_2(tmp_path):
    proc = python(["-m", "scripts.analyze_trace", str(tmp_path / "no")], timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "is not a folder" in proc.stderr


def test_merged_trace_of_tracer_files(tmp_path):
    # A run that died before its merge: merging its rank files gives an analyzable
    # trace (the analyzer itself reads only trace.json).
    t = Tracer(tmp_path, rank=0, size=1)
    t.complete("update", "update", t._t0, t._t0 + 0.001, step=0)
    t.flush()
    merge_traces(tmp_path)
    assert analyze(tmp_path)["stages"][0]["updates"] == 1
