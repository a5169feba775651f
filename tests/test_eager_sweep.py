"""The parameter-server crossover sweep and ``--dataset digits`` of eager-SGD.

End to end on 2 ranks with tiny settings (the module launches its own mpiexec),
plus the crossover arithmetic on rows whose numbers are given.
"""

from __future__ import annotations

import json

import pytest

from tests.harness import python


def run(args: list[str], timeout: float = 400):
    """``python -m experiments.eager_sgd ARGS`` to its end."""
    return python(["-m", "experiments.eager_sgd", *args], timeout=timeout)


@pytest.mark.launches
def test_tiny_sweep_writes_table_json_and_figure(tmp_path):
    out = tmp_path / "sweep"
    proc = run(
        [
            "--sweep-model-size", "160", "320",
            "--sweep-ranks", "2",
            "--arms", "allreduce", "ps",
            "--steps", "3",
            "--eval-every", "3",
            "--reference-steps", "0",
            "--imbalance", "none",
            "--target-acc", "0.05",
            "--run-dir", str(out),
            "--no-progress",
        ]
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "| ranks | params MB | arm | samples/s | vs allreduce" in proc.stdout
    assert "2 ranks: " in proc.stdout and "ps / allreduce samples/s" in proc.stdout
    for name in ("sweep.md", "sweep.json", "sweep.png"):
        assert (out / name).exists(), name
    for f in (160, 320):
        for arm in ("allreduce", "ps"):
            assert (out / "np2" / f"f{f}" / f"{arm}-s0" / "summary.json").exists()
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["link"] == "real"
    rows = {(r["features"], r["arm"]): r for r in sweep["rows"]}
    assert set(rows) == {(f, a) for f in (160, 320) for a in ("allreduce", "ps")}
    # P1B2 1024-512-256: 1024 * features + 659,722 float32 parameters
    for (f, arm), r in rows.items():
        assert r["param_bytes"] == 4 * (1024 * f + 659_722)
        assert r["world_size"] == 2
        # allreduce hands the gradient to MPI; a push adds one version number
        extra = 4 if arm == "ps" else 0
        assert r["comm_bytes"] == r["param_bytes"] + extra
        factor = 2 * (2 - 1) if arm == "ps" else 2 * (2 - 1) / 2
        assert r["busiest_bytes"] == pytest.approx(factor * r["comm_bytes"])
    assert set(sweep["crossover"]) == {"2"}


def _row(size, pb, arm, tput):
    return {
        "world_size": size,
        "param_bytes": pb,
        "arm": arm,
        "seed": 0,
        "samples_per_s": tput,
        "median_step_s": 0.1,
        "time_to_target_s": None,
        "final_test_acc": 0.5,
        "comm_bytes": float(pb),
        "busiest_bytes": float(pb),
    }


def test_crossover_is_the_first_size_where_ps_falls_below():
    from research.studies.eager_sweep import crossover, format_sweep

    rows = [
        _row(4, 10e6, "allreduce", 100.0),
        _row(4, 10e6, "ps", 150.0),
        _row(4, 40e6, "allreduce", 80.0),
        _row(4, 40e6, "ps", 60.0),
        _row(4, 120e6, "allreduce", 40.0),
        _row(4, 120e6, "ps", 10.0),
        _row(2, 10e6, "allreduce", 100.0),
        _row(2, 10e6, "ps", 120.0),
    ]
    c = crossover(rows)
    assert c[4]["bytes"] == 40e6 and c[4]["below"] == 10e6
    assert c[4]["ratios"] == [(10e6, 1.5), (40e6, 0.75), (120e6, 0.25)]
    assert c[2]["bytes"] is None
    text = format_sweep(rows, 0.4)
    assert "4 ranks: the server falls below allreduce between 10.0 and 40.0 MB" in text
    assert "2 ranks: the server never fell below allreduce" in text
    assert "| 4 | 40.0 | ps | 60 | 0.75x |" in text
    assert text.startswith("link: real")
    assert format_sweep(rows, 0.4, "10gbps").startswith("link: emulated 10 Gb/s")


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--sweep", "--model", "resnet18"], "--sweep grows CANDLE P1B2"),
        (["--sweep-ranks", "1"], "at least 2 ranks"),
        (["--sweep-model-size", "100"], ">= 160"),
    ],
)
def test_bad_sweep_flags_exit_2_before_mpi(flags, message):
    proc = run(flags, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr


@pytest.mark.launches
def test_digits_trains_on_two_ranks(tmp_path):
    out = tmp_path / "digits"
    proc = run(
        [
            "--np", "2",
            "--dataset", "digits",
            "--arms", "allreduce", "solo",
            "--steps", "6",
            "--eval-every", "3",
            "--reference-steps", "0",
            "--imbalance", "random:k=1:seconds=0.01",
            "--run-dir", str(out),
            "--no-plots",
            "--no-progress",
        ]
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "time to 95% s" in proc.stdout  # the digits default target
    for arm in ("allreduce", "solo"):
        config = json.loads((out / f"{arm}-s0" / "config.json").read_text())
        assert config["dataset"].startswith("digits: ")
        assert config["config"]["model"]["options"]["pooled_size"] == 2
        summary = json.loads((out / f"{arm}-s0" / "summary.json").read_text())
        assert summary["steps"] == 6 and summary["world_size"] == 2
        assert 0.0 <= summary["final_test_acc"] <= 1.0
