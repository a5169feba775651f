"""End-to-end smoke test of ``python -m experiments.deepfreeze`` at toy size.

Two ranks, a small MLP, one round of short windows: the experiment must start
its MPI job itself, print the table with every saver and the targets, and
leave the job's results and all three figures in the run folder. A run folder
written before the savers' rename (2026-11-25) gives the same table.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness import python


@pytest.mark.launches
def test_default_pipeline_at_toy_size(tmp_path):
    cmd = [
        "-m",
        "experiments.deepfreeze",
        "--np",
        "2",
        "--sweep-ranks",
        "--rounds",
        "1",
        "--window",
        "4",
        "--settle",
        "2",
        "--minor-rounds",
        "1",
        "--interval",
        "4",
        "--intervals",
        "2",
        "--batch-size",
        "8",
        "--model-opt",
        "features=256",
        "--data-opt",
        "features=256",
        "--data-opt",
        "n_train=256",
        "--run-dir",
        "runs/df",  # relative, run from another folder, as users type it
    ]
    shm_before = _shm_entries()
    proc = python(cmd, cwd=tmp_path, timeout=400)
    root = tmp_path / "runs" / "df"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from research.checkpoint.savers import list_savers

    for name in list_savers():  # every saver, by default
        assert f"| {name} |" in proc.stdout
    assert "DeepFreeze's blocking against rank0-blocking's" in proc.stdout
    assert "in flight (checkpoint every step, policy skip)" in proc.stdout
    main = json.loads((root / "main-np2.json").read_text())
    assert main["ranks"] == 2 and main["savers"]["deepfreeze"]["restore_s"] > 0
    # --bind core (the default) with one thread per rank: one core each.
    assert [len(cores) for cores in main["cpu_affinity"]] == [1, 1]
    for fig in (
        "overhead_vs_interval.png",
        "blocking_vs_ranks.png",
        "timeline.png",
        "timeline_excerpt.json",
        "table.md",
    ):
        assert (root / fig).exists(), fig
    # Fast tiers and transfer files are memory: a finished run removes its own.
    assert _shm_entries() - shm_before == set()
    _old_words_give_the_same_table(root, tmp_path / "old")
    # The page from the kept job files alone, and --check on it.
    from scripts.results import render
    from scripts.results.check import check

    page = render([root], tmp_path / "repo").read_text()
    assert "| deepfreeze |" in page and "DeepFreeze's blocking against" in page
    assert check(tmp_path / "repo")[0] == 0


def _old_words_give_the_same_table(root: Path, old: Path) -> None:
    """The job file as written before 2026-11-25: "strategy", "strategies",
    rank0-sync and orbax-sync."""
    from research.studies.deepfreeze_page import format_table, load_results

    old.mkdir()
    text = (root / "main-np2.json").read_text()
    for new, was in (
        ('"savers"', '"strategies"'),
        ('"saver"', '"strategy"'),
        ("rank0-blocking", "rank0-sync"),
        ("orbax-blocking", "orbax-sync"),
    ):
        text = text.replace(new, was)
    assert "rank0-blocking" not in text and '"strategies"' in text
    (old / "main-np2.json").write_text(text)
    assert format_table(load_results(old)[0]) == format_table(load_results(root)[0])


def _shm_entries() -> set[str]:
    from tests.harness import node_local_entries

    return node_local_entries()


def test_unwritable_fast_tier_is_one_line_before_launch(tmp_path):
    cmd = ["-m", "experiments.deepfreeze", "--fast-dir", "/proc/nope"]
    proc = python(cmd, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert (
        len(errors) == 1 and "--fast-dir '/proc/nope' cannot be written" in (errors[0])
    ), proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing started


def _main_job(ci: list[float], raw: float = -0.024) -> dict:
    """A main job file's fields the targets read: DeepFreeze at ``ci``."""

    def arm(saver, overhead, ci, diff=None):
        return {
            "saver": saver,
            "interval": 10,
            "overhead": overhead,
            "overhead_ci90": ci,
            "diff_ci90": diff,
            "periods": 10,
            "raw_overhead": overhead + raw,
            "raw_ci90": None,
            "cost_s": 0.02,
        }

    by = {
        "blocking_s": [0.001, 0.0011, 0.0009],
        "writer_cpu_s_per_mb": [7e-4] * 4,
        "median_blocking_s": 0.001,
        "bytes_per_rank": [1e7, 1e7],
    }
    slow = {
        "blocking_s": [0.1, 0.11, 0.12],
        "median_blocking_s": 0.11,
        "bytes_per_rank": [4e7, 0],
    }
    none = arm("none", 0.0, None)
    none.update(raw_overhead=raw, raw_ci90=[raw - 0.01, raw + 0.01])
    return {
        "interval": 10,
        "model": "m",
        "ranks": 4,
        "reference_step_s": 0.28,
        "window": 10,
        "settle": 4,
        "arms": {
            "none": none,
            "deepfreeze@10": arm("deepfreeze", sum(ci) / 2, ci),
            "rank0-blocking@10": arm(
                "rank0-blocking", 0.07, [0.055, 0.086], [0.033, 0.057]
            ),
        },
        "savers": {
            "deepfreeze": {"by_interval": {"10": by}, "restore_s": 0.5},
            "rank0-blocking": {"by_interval": {"10": slow}, "restore_s": 0.4},
        },
    }


@pytest.mark.parametrize(
    "ci,word",
    [([0.021, 0.031], "PASS"), ([0.04, 0.054], "UNDECIDED"), ([0.052, 0.07], "FAIL")],
)
def test_the_five_percent_target_reads_the_intervals_upper_end(ci, word):
    from research.studies.deepfreeze_page import format_table

    text = format_table(_main_job(ci))
    line = next(x for x in text.splitlines() if "every 10 steps:" in x)
    assert line.startswith(word), line
    # The placebo's bias is stated beside the figure it corrects.
    assert "the placebo's own -2.4% [-3.4%, -1.4%] taken out" in line
    assert "PASS  DeepFreeze's blocking against rank0-blocking's: 0.9%" in text
    assert "PASS  DeepFreeze's writer CPU per MB: 0.70 ms" in text
    assert "PASS  DeepFreeze overhead lowest of all savers" in text
