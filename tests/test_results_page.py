"""``python -m scripts.results``: whole pages and named sections, from run folders
made here with their ``table.md``, ``run.json`` and figures (no training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.results import BEGIN, END, main, render, render_section, sections

NET = "Real network (local cluster)"


def _job(**over) -> dict:
    job = {
        "experiment": "overlap",
        "command": "python -m experiments.overlap --ranks 2",
        "job": None,
        "started_utc": "2026-11-26 10:00:00",
        "ended_utc": "2026-11-26 10:04:00",
        "host": "vm",
        "cpu": "AMD EPYC",
        "cores": 2,
        "memory_gib": 23.5,
        "load_average": [1.5, 1.0, 0.5],
        "load_average_end": [2.5, 1.0, 0.5],
        "commit": "abc123",
        "world_size": 2,
    }
    return {**job, **over}


def _run(tmp: Path, name: str, table: str, jobs: list[dict], pngs=("speedup",)):
    root = tmp / "runs" / name
    root.mkdir(parents=True)
    (root / "table.md").write_text(table)
    (root / "run.json").write_text(json.dumps({"jobs": jobs}))
    for png in pngs:
        (root / f"{png}.png").write_bytes(b"\x89PNG " + name.encode())
    return root


def _net_jobs() -> list[dict]:
    link = "real network link, {} nodes at 1gbit per node (local cluster, TCP)"
    return [
        _job(
            host="n1",
            command="python -m experiments.overlap --hosts n1,n2,n3,n4 --run-dir "
            "runs/o --run-dir /abs/runs/o --point",  # as the driver's jobs record it
            world_size=n,
            hosts=hosts,
            network=link.format(n),
        )
        for n, hosts in ((2, ["n1", "n2"]), (4, ["n1", "n2", "n3", "n4"]))
    ]


def test_a_section_replaces_only_itself(tmp_path):
    docs = tmp_path / "docs"
    shm = _run(tmp_path, "overlap-shm", "shared memory table\n", [_job()])
    (page,) = render([shm], docs, note="nothing else running")
    before = page.read_text()
    assert "shared memory table" in before and "nothing else running" in before

    net = _run(tmp_path, "overlap-net", "network table 1\n", _net_jobs(), ("a", "b"))
    assert render_section([net], docs, NET, note="load 4") == page
    text = page.read_text()
    assert text.startswith(before.rstrip("\n"))  # the page's own part as it was
    assert text.count(BEGIN.format(NET)) == 1 and text.count(END.format(NET)) == 1
    block = sections(text)[NET]
    assert f"## {NET}" in block and "- network table 1" in block and "load 4" in block
    assert f'--section "{NET}"' in block  # how to regenerate it
    # The nodes and their link, from run.json.
    assert "2/4 nodes (n1, n2, n3, n4; real network link, 4 nodes at 1gbit" in block
    assert "each node AMD EPYC, 2 cores" in block
    assert "`python -m experiments.overlap --hosts n1,n2,n3,n4 --run-dir runs/o` (" in (
        block
    )
    # Figures under the section's own folder; the page's own are untouched.
    assert "![a](overlap/real-network-local-cluster/a.png)" in block
    assert (
        (docs / "overlap/real-network-local-cluster/b.png")
        .read_bytes()
        .endswith(b"overlap-net")
    )
    assert (docs / "overlap/speedup.png").read_bytes().endswith(b"overlap-shm")

    # Again with other runs: replaced in place, its old figures gone.
    emu = _run(tmp_path, "overlap-emu", "emulated table\n", [_job()], ("c",))
    net2 = _run(tmp_path, "overlap-net2", "network table 2\n", _net_jobs(), ())
    render_section([net2, emu], docs, NET, note=["ten", "one node"])
    again = page.read_text()
    assert again.startswith(before.rstrip("\n"))
    block = sections(again)[NET]
    assert "network table 1" not in again and "- network table 2" in block
    assert "### Run 1" in block and "### Run 2" in block
    assert block.index("ten") < block.index("one node")
    assert not (docs / "overlap/real-network-local-cluster/a.png").exists()
    assert (docs / "overlap/real-network-local-cluster/run2/c.png").is_file()


def test_sections_survive_each_other_and_a_whole_page_render(tmp_path):
    docs = tmp_path / "docs"
    shm = _run(tmp_path, "overlap-shm", "old page\n", [_job()])
    render([shm], docs)
    net = _run(tmp_path, "overlap-net", "net\n", _net_jobs(), ("n",))
    other = _run(tmp_path, "overlap-other", "other\n", [_job()], ("o",))
    render_section([net], docs, NET)
    render_section([other], docs, "Another one")
    render_section([net], docs, NET)  # replacing the first keeps the second
    text = (docs / "overlap.md").read_text()
    assert list(sections(text)) == [NET, "Another one"]

    new = _run(tmp_path, "overlap-new", "new page\n", [_job()], ("fresh",))
    (page,) = render([new], docs)
    text = page.read_text()
    assert "old page" not in text and "- new page" in text
    assert list(sections(text)) == [NET, "Another one"]
    assert text.index("new page") < text.index(BEGIN.format(NET))
    # The page's own old figure is gone, the sections' are kept.
    assert not (docs / "overlap/speedup.png").exists()
    assert (docs / "overlap/fresh.png").is_file()
    assert (docs / "overlap/real-network-local-cluster/n.png").is_file()
    assert (docs / "overlap/another-one/o.png").is_file()


def test_a_section_of_a_page_not_yet_written_gets_the_head(tmp_path):
    net = _run(tmp_path, "overlap-net", "net\n", _net_jobs())
    page = render_section([net], tmp_path / "docs", NET)
    text = page.read_text()
    assert text.startswith("# SC18") and "experiments/overlap.py" in text
    assert list(sections(text)) == [NET]


@pytest.mark.parametrize(
    "title,message",
    [
        ("", "one line"),
        ("a --> b", "one line"),
        ("!!!", "letters or digits"),
        ("Run 1", None),  # "run-1" is fine
        ("run1", "runN"),
    ],
)
def test_bad_titles_are_one_line_and_exit_2(tmp_path, capsys, title, message):
    net = _run(tmp_path, "overlap-net", "net\n", _net_jobs())
    code = main([str(net), "--out", str(tmp_path / "docs"), "--section", title])
    if message is None:
        assert code == 0
        return
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "docs").exists()


def test_a_section_takes_one_experiment_and_notes_match_the_runs(tmp_path, capsys):
    net = _run(tmp_path, "overlap-net", "net\n", _net_jobs())
    eager = _run(tmp_path, "eager", "e\n", [_job(experiment="eager_sgd")])
    docs = str(tmp_path / "docs")
    assert main([str(net), str(eager), "--out", docs, "--section", NET]) == 2
    assert "one page" in capsys.readouterr().err
    notes = ["--note", "a", "--note", "b", "--note", "c"]
    assert main([str(net), "--out", docs, "--section", NET, *notes]) == 2
    assert "3 --note lines for 1 run folders" in capsys.readouterr().err
    assert main([str(net), "--out", docs, "--section", NET, "--note", "x"]) == 0
    assert capsys.readouterr().out.startswith("wrote ")


def test_run_json_records_the_nodes_when_given(tmp_path):
    from research.provenance import read_jobs, record_job

    record_job(tmp_path, "overlap", 1)
    nodes = {"hosts": ["n1", "n2"], "network": "real network link, 2 nodes"}
    record_job(tmp_path, "overlap", 2, nodes=nodes)
    one, two = read_jobs(tmp_path)
    assert "hosts" not in one and "network" not in one
    assert two["hosts"] == ["n1", "n2"] and two["world_size"] == 2
    assert two["network"] == "real network link, 2 nodes"


def test_a_fenced_log_in_a_table_stays_as_written():
    from scripts.results import _as_markdown

    table = "a note\n```\n[install] ok: jax | mpi4jax\nplain line\n```\nafter"
    assert _as_markdown(table) == [
        "- a note",
        "```",
        "[install] ok: jax | mpi4jax",
        "plain line",
        "```",
        "- after",
    ]


def test_run_json_takes_the_commit_it_is_given(tmp_path, monkeypatch):
    """A working tree sent to a lent GPU machine carries an earlier commit's git:
    ``RESEARCH_COMMIT`` names the code's own (scripts/gpu_check.sh passes it)."""
    from research.provenance import read_jobs, record_job

    monkeypatch.delenv("RESEARCH_COMMIT", raising=False)
    record_job(tmp_path, "gpu", 1)
    monkeypatch.setenv("RESEARCH_COMMIT", "09a8396+changes")
    record_job(tmp_path, "gpu", 1)
    mine, given = read_jobs(tmp_path)
    assert given["commit"] == "09a8396+changes"
    assert mine["commit"] != "09a8396+changes"
