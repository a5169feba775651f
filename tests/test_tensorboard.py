"""TensorBoard scalars and XLA profiles of real runs, read back by the real server.

A run writes ``metrics.jsonl`` and, from the same rows, an event file; the
TensorBoard server (``tests/tensorboard_server.py``) reads the folder and the
test compares every tag with the row it came from. ``--profile`` files are read
by jax's own parser and listed by the server's profile plugin (xprof).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from research.rundir import read_metrics
from tests.harness import ROOT, python, run_env
from tests.tensorboard_server import TensorBoard

# tag -> metrics.jsonl key, for every step row (and the keys of a strategy's
# record when it has them)
STEP_TAGS = {
    "train/loss": "loss",
    "train/acc": "acc",
    "train/lr": "lr",
    "train/samples_per_s": "samples_per_s",
    "train/step_time": "step_time",
    "step/compute_s": "compute_s",
}
PHASE_TAGS = {
    "step/comm_exposed_s": "comm_exposed_s",
    "step/comm_busy_s": "comm_busy_s",
    "step/update_s": "update_s",
    "comm/bytes": "comm_bytes",
    "comm/contributors": "comm_contributors",
    "comm/staleness": "comm_staleness",
}
EVAL_TAGS = {"eval/test_acc": "test_acc", "eval/test_loss": "test_loss"}


def run(module: str, args: list[str], cwd: Path = ROOT, timeout: float = 400):
    proc = python(["-m", module, *args], cwd=cwd, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def close(a: float, b: float) -> bool:
    """Equal as TensorBoard stores it (float32)."""
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def check_against_rows(tb, run_name, rows, tags):
    """Each tag's points are exactly the rows' values at the rows' steps."""
    for tag, key in tags.items():
        want = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        got = tb.scalars(run_name, tag)
        assert [s for s, _ in got] == [s for s, _ in want], tag
        assert all(close(g, w) for (_, g), (_, w) in zip(got, want)), (tag, got, want)


def test_one_rank_scalars_checkpoint_and_profile(tmp_path):
    """Sparse top-k on 1 rank (every phase, bytes, density), DeepFreeze
    checkpoints (blocking time), steps 3-4 profiled and traced."""
    run_dir = tmp_path / "runs" / "sparse"
    proc = run(
        "experiments.train",
        [
            "--np", "1", "--data-opt", "n_train=256", "--data-opt", "n_test=64",
            "--steps", "6", "--batch-size", "16", "--eval-every", "3",
            "--log-every", "1", "--strategy", "sparse",
            "--strategy-opt", "density=0.1", "--checkpoint", "deepfreeze",
            "--checkpoint-every", "3", "--trace", "--profile", "3:2",
            "--run-dir", str(run_dir), "--no-progress",
        ],
    )  # fmt: skip
    where = run_dir / "plugins" / "profile" / "steps_3-4"
    assert f"r0 | jax.profiler: steps 3-4 (every rank) in {where}" in proc.stdout
    rows = read_metrics(run_dir)
    steps = [r for r in rows if r.get("kind") != "eval"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    # samples/s: global samples over training time since the previous row.
    for a, b in zip(steps, steps[1:]):
        rate = 16 * (b["step"] - a["step"]) / (b["train_time"] - a["train_time"])
        assert b["samples_per_s"] == pytest.approx(rate)
    summary = json.loads((run_dir / "summary.json").read_text())
    saves = summary["checkpoint"]["records"]
    assert [s["step"] for s in saves] == [3, 6]
    session = "sparse/steps_3-4"
    host = f"{socket.gethostname()}-rank0"
    with TensorBoard(tmp_path / "runs") as tb:
        assert tb.wait_for_runs({"sparse"}) == ["sparse"]
        tags = tb.tags("sparse")
        for tag in [*STEP_TAGS, *PHASE_TAGS, *EVAL_TAGS, "comm/density"]:
            assert tag in tags, (tag, sorted(tags))
        assert not any(t.startswith("per_rank/") for t in tags)  # one rank
        check_against_rows(
            tb,
            "sparse",
            steps,
            {
                **STEP_TAGS,
                **PHASE_TAGS,
                "comm/density": "comm_density",
                "step/select_s": "select_s",
            },
        )
        check_against_rows(tb, "sparse", evals, EVAL_TAGS)
        blocking = tb.scalars("sparse", "checkpoint/blocking_s")
        assert [s for s, _ in blocking] == [3, 6]
        assert all(close(g, s["blocking_s"]) for (_, g), s in zip(blocking, saves))
        density = tb.scalars("sparse", "comm/density")
        assert all(v == pytest.approx(0.1, abs=1e-3) for _, v in density)
        # The profile plugin lists the session with this rank as its host,
        # and converts it into a trace.
        assert session in tb.get("/data/plugin/profile/runs")
        hosts = tb.get("/data/plugin/profile/hosts", run=session, tag="trace_viewer")
        assert hosts == [{"hostname": host}]
        assert "trace_viewer@" in tb.get("/data/plugin/profile/run_tools", run=session)
        trace = tb.get(
            "/data/plugin/profile/data", run=session, tag="trace_viewer@", host=host
        )
        assert len(trace["traceEvents"]) > 100
    # jax's own parser: the captured steps, annotated with their numbers.
    import jax

    xplane = run_dir / "plugins" / "profile" / "steps_3-4" / f"{host}.xplane.pb"
    data = jax.profiler.ProfileData.from_file(str(xplane))
    marked = {
        dict(e.stats)["step_num"]: e.duration_ns / 1e9
        for p in data.planes
        for line in p.lines
        for e in line.events
        if e.name == "train"
    }
    assert sorted(marked) == [3, 4]
    assert not (run_dir / ".profile-rank0").exists()
    # Our timeline marks the same steps, around the same work.
    events = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    ours = {e["args"]["step_num"]: e for e in events if e.get("cat") == "profile"}
    assert sorted(ours) == [3, 4]
    for n, e in ours.items():
        assert e["name"] == f"jax.profiler step {n}" and e["args"]["step"] == n - 1
        assert marked[n] * 0.99 <= e["dur"] / 1e6 <= marked[n] + 0.05


@pytest.mark.launches
def test_eager_sgd_arms_side_by_side_with_per_rank_tags(tmp_path):
    """The done-when: a tiny eager-SGD job on 2 ranks; the server shows each arm
    as its own run with metrics.jsonl's values, and the ranks' own figures."""
    arms = ("allreduce", "solo", "majority")
    run(
        "experiments.eager_sgd",
        [
            "--np", "2", "--arms", *arms, "--steps", "6", "--eval-every", "3",
            "--log-every", "1", "--reference-steps", "0",
            "--imbalance", "random:k=1:seconds=0.02", "--target-acc", "0.05",
            "--profile", "3:1", "--profile-ranks", "1",
            "--run-dir", "runs/eager", "--no-progress",
        ],
        cwd=tmp_path,
    )  # fmt: skip
    out = tmp_path / "runs" / "eager"
    names = {f"{arm}-s0" for arm in arms}
    with TensorBoard(tmp_path / "runs") as tb:
        runs = {f"eager/{n}" for n in names}
        assert set(tb.wait_for_runs(runs)) == runs
        for name in names:
            rows = read_metrics(out / name)
            steps = [r for r in rows if r.get("kind") != "eval"]
            evals = [r for r in rows if r.get("kind") == "eval"]
            check_against_rows(tb, f"eager/{name}", steps, {**STEP_TAGS, **PHASE_TAGS})
            check_against_rows(tb, f"eager/{name}", evals, EVAL_TAGS)
            tags = tb.tags(f"eager/{name}")
            # One rank is held up 0.02 s each step: the ranks' delays differ,
            # so both have them, and they add up to the delay at every step.
            delays = [
                tb.scalars(f"eager/{name}", f"per_rank/step/delay_s/rank{r}")
                for r in (0, 1)
            ]
            assert [s for s, _ in delays[0]] == [r["step"] for r in steps]
            assert [s for s, _ in delays[1]] == [r["step"] for r in steps]
            for (_, d0), (_, d1) in zip(*delays):
                assert d0 + d1 == pytest.approx(0.02, abs=1e-6)
            # Rank 0's own copy is the row's value.
            check_against_rows(
                tb,
                f"eager/{name}",
                steps,
                {"per_rank/step/compute_s/rank0": "compute_s"},
            )
            assert "per_rank/step/compute_s/rank1" in tags
            assert "per_rank/train/loss/rank1" not in tags  # the run's figure only
        # Solo and majority rounds: each rank's staleness is its own.
        solo = tb.tags("eager/solo-s0")
        assert {"comm/staleness", "comm/contributors", "comm/mean_age"} <= solo
        layout = tb.get("/data/plugin/custom_scalars/layout", run="eager/solo-s0")
        charts = {c["title"] for cat in layout["category"] for c in cat["chart"]}
        assert "step/delay_s" in charts
        # --profile-ranks 1: rank 1's profile of step 3 alone, for every arm.
        listed = tb.get("/data/plugin/profile/runs")
        for name in names:
            assert f"eager/{name}/steps_3-3" in listed
            session = out / name / "plugins" / "profile" / "steps_3-3"
            files = sorted(p.name for p in session.iterdir())
            host = socket.gethostname()
            assert f"{host}-rank1.xplane.pb" in files
            assert not any("rank0" in f for f in files)


def test_profile_window_parse_and_problems():
    from research.train.profiling import ProfileWindow

    assert ProfileWindow.parse(None) is None and ProfileWindow.parse("") is None
    w = ProfileWindow.parse("20:3", "2,0")
    assert (w.start, w.last, w.ranks, w.session) == (20, 22, (0, 2), "steps_20-22")
    assert ProfileWindow.parse("5").count == 1
    for spec, ranks, needle in [
        ("x:3", "all", "--profile expects START:COUNT"),
        ("0:3", "all", "START counts from 1"),
        ("3:0", "all", "COUNT must be >= 1"),
        ("3:1", "1;2", "--profile-ranks expects"),
        ("3:1", "-1", "ranks are >= 0"),
    ]:
        with pytest.raises(ValueError, match=needle):
            ProfileWindow.parse(spec, ranks)
    assert "after the run's last step (10)" in w.problem(10, 4)
    assert "--profile-ranks 2: the job has ranks 0..1" in w.problem(30, 2)
    assert w.problem(30, 3) is None


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--profile", "3-5"], "--profile expects START:COUNT"),
        (["--profile", "4:2", "--profile-ranks", "3", "--steps", "6"], "ranks 0..0"),
    ],
)
def test_bad_profile_flags_one_line_exit_2(args, needle):
    proc = python(["-m", "experiments.train", "--np", "1", *args])
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_without_tensorboardx_one_line_and_the_run_goes_on(tmp_path):
    """tensorboardX missing (a package that fails to import, first on the
    path): one line says what to install; metrics and the run are as ever."""
    shim = tmp_path / "shim" / "tensorboardX"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = run_env(PYTHONPATH=f"{shim.parent}{os.pathsep}{ROOT}")
    run_dir = tmp_path / "run"
    proc = python(
        [
            "-m", "experiments.train", "--np", "1",
            "--data-opt", "n_train=128", "--data-opt", "n_test=32",
            "--steps", "2", "--batch-size", "16", "--log-every", "1",
            "--run-dir", str(run_dir), "--no-progress",
        ],
        env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    note = "TensorBoard scalars off: tensorboardX is not installed (pip install"
    assert proc.stdout.count(note) == 1, proc.stdout
    assert [r["step"] for r in read_metrics(run_dir)][:2] == [1, 2]
    assert not list(run_dir.glob("events.out.tfevents.*"))


def _events(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the run's event files, read by TensorBoard's own loader."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util.tensor_util import make_ndarray

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():  # scalars as tensors
            for v in event.summary.value:
                if v.metadata.plugin_data.plugin_name == "scalars":
                    value = float(make_ndarray(v.tensor))
                    out.setdefault(v.tag, []).append((event.step, value))
    return out


def test_per_rank_tags_gathered_just_before_close_are_written(tmp_path):
    """The end of a run gathers the ranks' figures and closes the board at once.
    On a loaded machine the writer thread reached the gathered figures after the
    close was queued: they were queued again behind it and lost (a run's last
    per-rank points: test_eager_sgd_arms_side_by_side failed so in a fresh-clone
    run of .ci/run). Here the writer thread is held until the close is queued."""
    pytest.importorskip("tensorboardX")
    import threading

    from research.train.tensorboard import EventWriter, _write_per_rank

    writer = EventWriter(tmp_path)
    held = threading.Event()
    writer.call(lambda _: held.wait(60))  # a writer thread that is behind
    gathered = [
        [(4, 1.0, {"step/delay_s": 0.02})],  # rank 0's figures
        [(4, 1.0, {"step/delay_s": 0.0})],  # rank 1's
    ]
    writer.call(_write_per_rank, set(), gathered)
    writer.close(timeout_s=0)  # queued behind them, as Trainer.run does
    held.set()
    writer.close()  # waits for the writer thread
    events = _events(tmp_path)
    assert events.get("per_rank/step/delay_s/rank0") == [(4, pytest.approx(0.02))]
    assert events.get("per_rank/step/delay_s/rank1") == [(4, 0.0)]
