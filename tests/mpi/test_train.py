"""Trainer under MPI: both averaging styles agree, replicas stay identical."""

from __future__ import annotations

import zlib

import jax
import numpy as np
import pytest

from research.train.config import (
    DataConfig,
    ModelConfig,
    RecordsConfig,
    StrategyConfig,
    TrainConfig,
)
from research.train.loop import Trainer
from tests.tiny import PLAIN_SGD, tiny_config


def _checksum(tree) -> int:
    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]
    return zlib.crc32(b"".join(a.tobytes() for a in leaves))


def _train(world, tmp_path_factory, strategy: str, steps: int = 6):
    run_dir = world.bcast(
        str(tmp_path_factory.mktemp(strategy)) if world.rank == 0 else None
    )
    # A one-stage ResNet on 8x8 images: BatchNorm statistics are exercised while
    # XLA:CPU compiles the steps in seconds (the suite's time is mostly compiles).
    cfg = TrainConfig(
        model=ModelConfig("resnet_tiny", {"stage_sizes": (1,), "width": 4}),
        data=DataConfig(
            name="synthetic_images",
            options={"n_train": 256, "n_test": 64, "image_size": 8},
        ),
        batch_size=8,
        steps=steps,
        eval_every=0,
        records=RecordsConfig(log_every=1, trace=True),
        strategy=StrategyConfig(strategy),
        lr=0.05,
        warmup_steps=2,
        progress=False,
        run_dir=run_dir,
    )
    trainer = Trainer(cfg, world)
    summary = trainer.run()
    return trainer, summary


@pytest.fixture(scope="module")
def runs(world, tmp_path_factory):
    return {s: _train(world, tmp_path_factory, s) for s in ("fused", "host")}


def test_replicas_identical(world, runs):
    for name, (trainer, _) in runs.items():
        sums = world.allgather(_checksum(trainer.state.params))
        assert len(set(sums)) == 1, f"{name}: parameters differ across ranks {sums}"


def test_fused_equals_staged(runs):
    a = jax.tree_util.tree_leaves(runs["fused"][0].state.params)
    b = jax.tree_util.tree_leaves(runs["host"][0].state.params)
    for x, y in zip(a, b):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-4, atol=2e-5)


def test_summary_and_files(world, runs):
    import json
    from pathlib import Path

    trainer, summary = runs["host"]
    assert summary["steps"] == 6 and summary["world_size"] == world.size
    assert 0.0 <= summary["final_test_acc"] <= 1.0
    if world.rank == 0:
        run_dir = Path(trainer.run_dir)
        for name in ("config.json", "metrics.jsonl", "summary.json", "trace.json"):
            assert (run_dir / name).exists(), name
        trace = json.loads((run_dir / "trace.json").read_text())
        pids = {e["pid"] for e in trace["traceEvents"]}
        assert pids == set(range(world.size))
        names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
        assert {
            "load batch",
            "forward+backward",
            "average",
            "update",
            "evaluate",
        } <= names


def test_solo_restart_applies_every_gradient_exactly_once(world, tmp_path_factory):
    """Checkpoint mid-run with gradients carried, restart, every one applied once.

    Plain SGD (constant lr, no momentum or decay) makes the final parameters
    ``p0 - lr / P * (sum of every gradient applied)``; the gradients each rank
    computes are recorded on the way (the real jitted step runs). The last rank
    is held up each step, so solo rounds run without it and it carries
    gradients: the checkpoint must be taken after a drain, or they are lost.
    """
    from research.checkpoint.config import CheckpointConfig
    from research.imbalance import parse_imbalance
    from research.steps import jitted as steps
    from research.train.checkpointing import CheckpointCallback

    if world.size < 2:
        pytest.skip("needs two ranks")
    run_dir = world.bcast(
        str(tmp_path_factory.mktemp("solo-restart")) if world.rank == 0 else None
    )
    computed = []
    grad_step = steps.grad_step

    def recording_grad_step(state, x, y):
        out = grad_step(state, x, y)
        computed.append(jax.tree.map(np.asarray, out[0]))
        return out

    def trainer(total: int) -> Trainer:
        cfg = tiny_config(
            run_dir,
            data_options={"n_train": 512, "n_test": 64},
            batch_size=8,
            steps=total,
            strategy="solo",
            strategy_options={"full_every": None},
            **PLAIN_SGD,
        )
        late = f"fixed:ranks={world.size - 1}:seconds=0.01"
        ck = CheckpointConfig(saver="deepfreeze", every=6, fast_dir=None, final=True)
        return Trainer(
            cfg,
            world,
            imbalance=parse_imbalance(late, size=world.size),
            callbacks=[CheckpointCallback(ck)],
        )

    steps.grad_step = recording_grad_step
    try:
        first = trainer(6)
        p0 = jax.tree.map(np.asarray, first.state.params)
        first.run()
        second = trainer(12)
        second.run()
    finally:
        steps.grad_step = grad_step
    assert second.callbacks[-1].resumed_from == 6
    assert len(computed) == 12  # 6 before the checkpoint, 6 after the restart
    mine = jax.tree.map(lambda *g: np.sum(g, axis=0, dtype=np.float64), *computed)
    everyone = jax.tree.map(lambda a: world.comm.allreduce(a), mine)
    final = jax.tree.map(np.asarray, second.state.params)
    expected = jax.tree.map(lambda p, g: p - 0.05 / world.size * g, p0, everyone)
    for got, want in zip(jax.tree.leaves(final), jax.tree.leaves(expected)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert len(set(world.allgather(_checksum(second.state.params)))) == 1


def test_trace_analysis(world, runs):
    # The analyzer on real multi-rank traces: each rank's averaging calls are
    # matched across ranks by occurrence, with their bytes and ring bandwidth.
    from research.trace_analysis import analyze

    if world.rank != 0:
        return
    res = analyze(runs["host"][0].run_dir)
    assert res["world_size"] == world.size
    assert [r["steps"] for r in res["ranks"]] == [6] * world.size
    assert res["unmatched_collectives"] == 0
    assert [c["step"] for c in res["collectives"] if c["name"] == "average"] == list(
        range(6)
    )
    assert [s["basis"] for s in res["steps"]] == ["collective"] * 6
    if world.size > 1:
        inner = [c for c in res["collectives"] if c["name"] == "allreduce-host"]
        # One per step, and the BatchNorm statistics' sync before the final
        # evaluation (the same host averager, research.train.evaluate).
        assert len(inner) == 6 + 1
        assert all(c["bytes"] > 0 and c["bus_bw_Bps"] > 0 for c in inner)
        assert all(s["straggler"] in range(world.size) for s in res["steps"])
    fused = analyze(runs["fused"][0].run_dir)
    assert fused["stages"] == []
    assert [s["basis"] for s in fused["steps"]] == ["compute"] * 6
