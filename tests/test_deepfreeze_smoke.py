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
    assert "target: DeepFreeze blocking" in proc.stdout
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


def _old_words_give_the_same_table(root: Path, old: Path) -> None:
    """The job file as written before 2026-11-25: "strategy", "strategies",
    rank0-sync and orbax-sync."""
    from research.studies.deepfreeze import format_table, load_results

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
