"""The SC19 study's plan, derived numbers, merge of run folders and cluster lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.scalability import _sweep_flags, main, parse
from research.studies.scalability import Point, jobs, plan
from research.studies.scalability_page import check_records, format_table
from research.studies.scalability_report import cluster_lists, derived, read_rows


def row(model="nt3", strategy="host", ranks=1, batch=8, step_s=1.0, tags=(), **kw):
    p = Point(model, strategy, ranks, batch=batch, **kw)
    return {"id": p.id, "tags": list(tags), **p.__dict__, "step_s": step_s}


def write_rows(folder: Path, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "results.jsonl", "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def test_plan_lists_each_configuration_once_with_all_its_sweeps():
    args = parse(["--models", "nt3", "--ranks", "1", "2", "4"])
    points = plan(args)
    # The weak-scaling point at 2 ranks, batch 8, host, is also the 1x2 threads
    # point (global batch 16 on 2 cores), a batch point and the checkpoint
    # sweep's run without checkpoints: run once, read by every sweep.
    shared = points[Point("nt3", "host", 2, batch=8).id][1]
    assert {"ranks:weak", "threads", "batch", "checkpoint"} <= set(shared)
    # Strong scaling: global batch 8 -> 4 per rank at 2 ranks, 2 at 4.
    assert "ranks:strong" in points[Point("nt3", "overlap", 4, batch=2).id][1]
    # No layerwise or overlap at 1 rank (nothing to communicate).
    assert all(p.ranks > 1 or p.strategy == "host" for p, _ in points.values())
    # Threads at 2 cores: 1 rank x 2 threads with the whole global batch.
    assert Point("nt3", "host", 1, threads=2, batch=16).id in points
    # Straggler: every strategy at 0 and each delay, on the emulated link.
    strag = [p for p, t in points.values() if "straggler" in t]
    assert len(strag) == 3 * 3 and {p.link for p in strag} == {"1gbps"}
    ck = [p for p, t in points.values() if "checkpoint" in t and p.ckpt_every]
    assert {p.strategy for p in ck} == {"host", "overlap"}
    assert len(points) == len({p.id for p, _ in points.values()})


def test_laptop_scope_keeps_resnet_to_the_weak_ranks_sweep():
    points = plan(parse([]))
    resnet = {p: t for p, t in points.values() if p.model == "resnet50"}
    assert {s for p in resnet for s in [p.strategy]} == {"host", "overlap"}
    assert all(p.batch == 8 and p.threads == 1 and p.link == "real" for p in resnet)
    full = plan(parse(["--scope", "full"]))
    assert len(full) > len(points)
    assert any(p.model == "resnet50" and p.delay for p, _ in full.values())


def test_jobs_group_points_by_ranks_and_threads():
    groups = jobs(plan(parse(["--models", "nt3"])))
    assert list(groups) == [(1, 1), (1, 2), (2, 1), (4, 1)]
    assert groups[(1, 2)] == [Point("nt3", "host", 1, threads=2, batch=16).id]
    # ResNet-50's laptop scope: host at 1, 2, 4 ranks and overlap at 2, 4.
    resnet = len(plan(parse([]))) - sum(len(ids) for ids in groups.values())
    assert resnet == 5


def test_efficiency_absorbed_delay_and_checkpoint_overhead():
    rows = [
        row(ranks=1, batch=8, step_s=1.0, tags=["baseline", "ranks:weak"]),
        row(ranks=2, batch=8, step_s=1.25, tags=["ranks:weak"]),
        row(ranks=2, batch=4, step_s=0.8, tags=["ranks:strong"]),
        row("nt3", "overlap", 2, batch=8, step_s=1.6, tags=["ranks:weak"]),
        row("nt3", "overlap", 2, batch=8, step_s=1.0, link="1gbps"),
        row("nt3", "overlap", 2, batch=8, step_s=1.15, link="1gbps", delay=0.2),
        row("nt3", "overlap", 2, batch=8, step_s=1.5, ckpt_every=3),
    ]
    by = {r["id"]: r for r in derived(rows)}

    def get(*a, **kw):
        return by[Point(*a, **kw).id]

    weak = get("nt3", "host", 2, batch=8)
    assert weak["eff_weak"] == pytest.approx(1.0 / 1.25)
    assert weak["samples_s"] == pytest.approx(16 / 1.25)
    strong = get("nt3", "host", 2, batch=4)
    assert strong["eff_strong"] == pytest.approx(1.0 / (2 * 0.8))
    # No overlap point at 1 rank: efficiency against host's.
    assert get("nt3", "overlap", 2, batch=8)["eff_weak"] == pytest.approx(1 / 1.6)
    # 200 ms injected, the step grew by 150 ms: 50 ms absorbed.
    d = get("nt3", "overlap", 2, batch=8, link="1gbps", delay=0.2)
    assert d["absorbed_s"] == pytest.approx(0.05)
    assert get("nt3", "overlap", 2, batch=8, link="1gbps")["absorbed_s"] is None
    ck = get("nt3", "overlap", 2, batch=8, ckpt_every=3)
    assert ck["ckpt_overhead"] == pytest.approx(1.5 / 1.6 - 1)


def test_merge_reads_every_run_folder_and_merges_tags(tmp_path):
    a, b = tmp_path / "laptop", tmp_path / "cluster"
    write_rows(a, [row(ranks=1, tags=["baseline"]), row(ranks=2, step_s=2.0)])
    # A cluster array: one folder per task; the later row of an id wins.
    write_rows(b / "task0", [row(ranks=2, step_s=1.5, tags=["ranks:weak"])])
    write_rows(b / "task1", [row(ranks=4, step_s=1.8, tags=["ranks:weak"])])
    rows = {r["ranks"]: r for r in read_rows([a, b])}
    assert sorted(rows) == [1, 2, 4]
    assert rows[2]["step_s"] == 1.5 and rows[2]["tags"] == ["ranks:weak"]
    text = format_table(list(rows.values()))
    assert "#### ranks, weak scaling" in text
    assert "strong scaling" not in text  # no row of that sweep
    line = next(x for x in text.splitlines() if "4x1" in x)
    assert "0.56" in line  # 1.0 / 1.8


def test_merge_command_writes_table_and_figures(tmp_path, capsys):
    rows = [row(ranks=1, tags=["baseline", "ranks:weak", "batch"])]
    rows += [row(ranks=n, step_s=1 + n / 4, tags=["ranks:weak"]) for n in (2, 4)]
    rows += [row(ranks=2, batch=4, step_s=0.7, tags=["ranks:strong", "batch"])]
    rows += [
        row("nt3", s, 2, step_s=1.0 + d * f, link="1gbps", delay=d, tags=["straggler"])
        for s, f in (("host", 1.0), ("overlap", 0.5))
        for d in (0.0, 0.1, 0.2)
    ]
    write_rows(tmp_path / "a", rows[:3])
    write_rows(tmp_path / "b", rows[3:])
    out = tmp_path / "merged"
    text = main(
        ["--merge", str(tmp_path / "a"), str(tmp_path / "b"), "--run-dir", str(out)]
    )
    assert "#### straggler" in text and "absorbed 100," in text  # overlap at 200 ms
    assert (out / "table.md").read_text().strip() == text.strip()
    for name in ("scaling.png", "batch.png", "straggler.png"):
        assert (out / name).stat().st_size > 1000
    assert not (out / "timeline.png").exists()  # no traces in these folders


def test_cluster_lists_one_line_per_configuration(tmp_path):
    argv = ["--models", "nt3", "--sweeps", "ranks", "--emit-cluster", str(tmp_path)]
    points = plan(parse(argv))
    flags = _sweep_flags(argv)
    assert flags == ["--models", "nt3", "--sweeps", "ranks"]
    files, cmds = cluster_lists(points, flags, tmp_path)
    lines = [
        ln
        for f in files
        for ln in f.read_text().splitlines()
        if ln and not ln.startswith("#")
    ]
    assert len(lines) == len(points)
    assert all(ln.startswith("--points ") and "--run-dir" in ln for ln in lines)
    assert "sbatch --array=0-0 -n 1 -c 1 scripts/slurm_array.sbatch" in cmds
    assert f"--merge {tmp_path}" in cmds
    assert (tmp_path / "submit.sh").exists()
    # The flags of a line, with the common ones, rebuild a plan that has the point.
    first = lines[0].split()
    again = parse([*first, *flags])
    assert again.points[0] in plan(again)


def test_table_says_which_rank_counts_ran_over_a_network():
    net = "real network link, {} nodes at 1gbit per node (local cluster, TCP)"
    rows = [
        row(ranks=1, tags=["ranks:weak"]) | {"nodes": 1, "link_label": "real shm"},
        row(ranks=2, tags=["ranks:weak"]) | {"nodes": 2, "link_label": net.format(2)},
        row(ranks=4, tags=["ranks:weak"]) | {"nodes": 4, "link_label": net.format(4)},
    ]
    lines = format_table(rows).splitlines()
    at = lines.index(f"2 ranks: {net.format(2)}")
    assert lines[at + 1] == f"4 ranks: {net.format(4)}"
    assert not any("real shm" in line for line in lines)
    assert "ranks:" not in format_table([row(ranks=2, tags=["ranks:weak"])])


def _sampled(r: dict, step: float, spread: float = 0.01) -> dict:
    """``r`` with 20 measured steps around ``step``."""
    steps = [step * (1 + spread * ((i % 5) - 2)) for i in range(20)]
    return r | {"step_s": step, "samples": {"step_s": steps}}


@pytest.mark.parametrize(
    "step,word",
    [
        (1.10, "PASS"),  # 100 of 200 ms absorbed: partly
        (0.95, "FAIL"),  # more than the whole delay absorbed
        (1.25, "FAIL"),  # none of it: the step grew by more than the delay
        (1.00, "UNDECIDED"),  # the interval holds the whole delay
    ],
)
def test_the_straggler_finding_is_decided_on_the_absorbed_delays_interval(step, word):
    kw = {"link": "1gbps", "tags": ["straggler"]}
    rows = [
        _sampled(row("nt3", "overlap", 2, **kw), 1.0),
        _sampled(row("nt3", "overlap", 2, delay=0.2, **kw), step),
        _sampled(row("nt3", "host", 2, **kw), 1.0),
        _sampled(row("nt3", "host", 2, delay=0.2, **kw), 1.2),
    ]
    recs = check_records(rows)
    (partly,) = [c for c in recs if c["claim"] == "partly"]
    assert partly["word"] == word, partly
    # Host does not pipeline: its absorbed delay is information only.
    assert [c["word"] for c in recs if c["strategy"] == "host"] == ["INFO"]


def test_the_gap_findings_read_the_timelines_shares():
    kw = {"tags": ["checkpoint"]}
    free = row("nt3", "overlap", 2, **kw) | {
        "free_shares": [0.9 + 0.01 * (i % 5) for i in range(30)]
    }
    ck = row("nt3", "overlap", 2, ckpt_every=3, **kw)
    ck["ckpt_bg_parts"] = [[0.099, 0.1], [0.095, 0.1], [0.1, 0.1], [0.098, 0.1]]
    little = row("nt3", "host", 2, ckpt_every=3, **kw)
    little["ckpt_bg_parts"] = [[0.02, 0.1], [0.03, 0.1], [0.01, 0.1]]
    words = {
        (c["claim"], c["strategy"]): c["word"]
        for c in check_records([free, ck, little, row("nt3", "host", 2, **kw)])
    }
    assert words[("free", "overlap")] == "PASS"
    assert words[("gaps", "overlap")] == "PASS"
    assert words[("gaps", "host")] == "FAIL"
