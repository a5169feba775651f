"""The overlap study's plan of runs and its tables (no training here)."""

from __future__ import annotations

import json

import pytest

from experiments.overlap import parse
from research.studies.overlap import STRATEGIES, label, load_rows, plan
from research.studies.overlap_page import format_checks, format_table


def test_default_plan_per_world_size():
    args = parse([])
    assert plan(args, 1) == [("real", "host", None), ("real", "overlap", None)]
    two = plan(args, 2, "vgg16")
    real = [r for r in two if r[0] == "real"]
    # The default: the four strategies the targets need, DDP's 25 MiB bucket.
    assert [s for _, s, _ in real] == ["host", "fused", "layerwise", "overlap"]
    assert ("real", "layerwise", 25.0) in real
    assert [b for link, s, b in two if s == "layerwise"] == [25, 25]
    assert not any(s == "fused" for link, s, _ in two if link == "auto")
    assert not any(s == "overlap-fcx" for _, s, _ in two)
    # On request: the FC-activation exchange and the bucket sweep (information).
    more = parse(["--strategies", *STRATEGIES, "--sweep-models", "vgg16"])
    two = plan(more, 2, "vgg16")
    sweep = [b for link, s, b in two if link == "auto" and s == "layerwise"]
    assert sweep == [1, 4, 25, 100]
    assert ("auto", "overlap-fcx", None) in two
    # ResNet-50: no bucket sweep, no FC-activation exchange (one small fc).
    resnet = plan(more, 2, "resnet50")
    assert [b for link, s, b in resnet if s == "layerwise"] == [25, 25]
    assert not any(s == "overlap-fcx" for _, s, _ in resnet)
    four = plan(more, 4, "vgg16")
    assert [b for link, s, b in four if link == "auto" and s == "layerwise"] == [25]
    assert plan(parse(["--emulated-ranks", "2"]), 4, "vgg16") == [
        r for r in plan(args, 4, "vgg16") if r[0] == "real"
    ]


def _row(strategy, ranks, link_kind, step, bucket=None, run=None, hidden=0.5):
    """A row as run_point writes it, with 20 measured steps around ``step``
    (a spread of +-2%): comm half the step, exposed ``1 - hidden`` of that."""
    steps = [step * (1 + 0.02 * ((i % 5) - 2) / 2) for i in range(20)]
    comm = [t / 2 for t in steps]
    return {
        "model": "m",
        "strategy": strategy,
        "label": label(strategy, bucket),
        "bucket_mb": bucket,
        "ranks": ranks,
        "link": "real",
        "link_kind": link_kind,
        "run": run,
        "step_s": step,
        "compute_s": step / 2,
        "comm_s": step / 2,
        "exposed_s": step / 2 * (1 - hidden),
        "hidden": hidden,
        "samples": {
            "step_s": steps,
            "compute_s": comm,
            "comm_s": comm,
            "exposed_s": [c * (1 - hidden) for c in comm],
        },
        "opt_bytes": 2**20,
        "grad_bytes": 2**20,
        "biggest_stage_share": 0.5,
    }


def test_table_rows_sweep_and_reruns(tmp_path):
    rows = [
        _row("host", 1, "real", 1.0),
        _row("host", 2, "auto", 2.0),
        _row("layerwise", 2, "auto", 1.0, 4.0, run="lw"),
        _row("layerwise", 2, "auto", 1.6, 25.0),
        _row("host", 2, "auto", 4.0),  # a rerun: the later row counts
    ]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "lw").mkdir()
    (tmp_path / "lw" / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "step_time": t, "compute_s": 0.1}) + "\n"
            for s, t in ((1, 9.0), (2, 0.5), (3, 0.7))
        )
    )
    loaded = load_rows(tmp_path)
    assert len(loaded) == 4
    table = format_table(loaded, "m")
    assert "lw 4MB" in table and "layerwise" in table
    hosts = [line for line in table.splitlines() if line.startswith("| host |")]
    assert len(hosts) == 2 and hosts[1].split(" | ")[3].startswith("4000.0 [")
    # Re-derived with one step left out: median of 0.5 and 0.7.
    again = {r["label"]: r for r in load_rows(tmp_path, warmup=1)}
    assert abs(again["lw 4MB"]["step_s"] - 0.6) < 1e-9
    assert again["layerwise"]["step_s"] == 1.6  # no run folder: as recorded


def test_no_plots_is_the_spelling_and_no_figures_is_refused(capsys):
    from experiments.overlap import parse

    assert parse([]).plots is True
    assert parse(["--no-plots"]).plots is False
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit) as exc:  # the old spelling, never released
        parse(["--no-figures"])
    assert exc.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert len(err) == 1 and "unrecognized arguments: --no-figures" in err[0]


def test_checks_on_every_emulated_link_and_the_real_network_not_shared_memory():
    def rows(kind, nodes, overlap_step, hidden):
        out = [
            _row("host", p, kind, 2.0 * p) | {"nodes": nodes if p > 1 else 1}
            for p in (2, 4)
        ]
        for p in (2, 4):
            ov = _row("overlap", p, kind, overlap_step * p, hidden=hidden)
            out.append(ov | {"nodes": nodes if p > 1 else 1})
        return out

    label = "real network link, {} nodes at 1gbit per node (local cluster, TCP)"
    net = rows("real", 4, 1.0, 0.9)
    for r in net:
        r["nodes"] = r["ranks"]
        r["link_label"] = label.format(r["ranks"])
    emu = rows("1gbps", 1, 1.8, 0.5)
    checks = format_checks(net + emu, "m").splitlines()
    text = "\n".join(checks)
    # The real network gets the paper's targets: 2.0x host at 4 ranks passes.
    assert "PASS  2 ranks, real network, 2 nodes: overlap hides 90% [" in text
    assert "PASS  4 ranks, real network, 4 nodes: overlap 2.00x [" in text
    assert not any("2 ranks, real network, 2 nodes: overlap 2.00x" in c for c in checks)
    # An emulated link given as a spec, named by it: 1.11x host fails at 4 ranks.
    assert "FAIL  4 ranks, emulated 1gbps: overlap 1.11x [" in text
    assert any(
        c.startswith("FAIL  2 ranks, emulated 1gbps: overlap hides") for c in checks
    )
    assert not any("shared memory" in c for c in checks)
    table = format_table(net, "m")
    assert f"real link at 4 ranks: {label.format(4)}" in table
    # The same real rows on one node: information, no verdict.
    shm = rows("real", 1, 1.0, 0.9)
    checks = format_checks(shm, "m").splitlines()
    assert all(c.startswith("INFO") for c in checks), checks
    assert "INFO  4 ranks, real link: overlap 2.00x [" in "\n".join(checks)


def test_a_speedup_whose_interval_holds_the_target_is_undecided():
    host = _row("host", 4, "auto", 1.3)
    host["samples"]["step_s"] = [1.3 * (1 + 0.2 * ((i % 5) - 2)) for i in range(20)]
    ov = _row("overlap", 4, "auto", 1.0, hidden=0.95)
    checks = format_checks([host, ov], "m")
    assert "UNDECIDED  4 ranks, emulated: overlap 1.30x [" in checks
    # A row kept without its steps (before they were kept): nothing decided.
    old = [{k: v for k, v in r.items() if k != "samples"} for r in (host, ov)]
    assert all(
        c.startswith(("UNDECIDED", "INFO"))
        for c in format_checks(old, "m").splitlines()
    )
