"""``layerwise`` and ``overlap`` under MPI: exact synchronous SGD, as ``host``.

Each model trains a few steps with momentum and weight decay under ``host``,
``layerwise`` (small buckets, so several allreduces are in flight) and
``overlap``; an evaluation in the middle drains ``overlap``'s allgathers and
gathers its optimizer state, and the steps after it start again from the state.
The parameters must agree with ``host``'s to float tolerance and be identical
on every rank; the timeline must show every per-stage phase and the waits.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import jax
import numpy as np
import pytest

from research.steps.flat import ALIGN
from research.steps.state import tree_bytes
from research.train.config import (
    DataConfig,
    ModelConfig,
    RecordsConfig,
    StrategyConfig,
    TrainConfig,
)
from research.train.loop import Trainer

# Small inputs: the suite runs on 2 cores and its time is mostly compiles.
MODELS = {
    "resnet": (
        "resnet_tiny",
        {"stage_sizes": (1, 1), "width": 4, "image_size": 8},
        "synthetic_images",
        {"n_train": 256, "n_test": 32, "image_size": 8},
    ),
    "vgg": (
        "vgg_tiny",
        {"image_size": 8},
        "synthetic_images",
        {"n_train": 256, "n_test": 32, "image_size": 8},
    ),
    "candle": (
        "candle_p1b2_tiny",
        {},
        "synthetic_tabular",
        {"features": 256, "n_train": 256, "n_test": 32},
    ),
}
#: Run name -> (strategy, options). ``overlap-fcx`` (the FC-activation
#: exchange) runs where the model has dense stages beside others (vgg, whose
#: fc stages exchange while its conv stages shard) or only those (candle).
STRATEGIES = {
    "host": ("host", {}),
    "layerwise": ("layerwise", {"bucket_bytes": 8192}),
    "overlap": ("overlap", {}),
    "overlap-fcx": ("overlap", {"fc_exchange": True}),
}
FCX_MODELS = ("vgg", "candle")
STEPS = 4


def _checksum(tree) -> int:
    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]
    return zlib.crc32(b"".join(a.tobytes() for a in leaves))


def _train(world, tmp_path_factory, model: str, run: str) -> Trainer:
    name, model_options, dataset, data_options = MODELS[model]
    strategy, options = STRATEGIES[run]
    run_dir = world.bcast(
        str(tmp_path_factory.mktemp(f"{model}-{run}")) if world.rank == 0 else None
    )
    cfg = TrainConfig(
        model=ModelConfig(name, model_options),
        data=DataConfig(name=dataset, options=data_options),
        batch_size=4,
        steps=STEPS,
        eval_every=2,
        eval_batch_size=16,
        records=RecordsConfig(log_every=1, trace=True),
        strategy=StrategyConfig(strategy, options),
        lr=0.05,
        warmup_steps=1,
        momentum=0.9,
        weight_decay=5e-4,
        progress=False,
        run_dir=run_dir,
    )
    trainer = Trainer(cfg, world)
    trainer.init_params = jax.tree.map(np.array, trainer.state.params)
    trainer.run()
    return trainer


@pytest.fixture(scope="module", params=sorted(MODELS))
def runs(request, world, tmp_path_factory):
    runs = [s for s in STRATEGIES if s != "overlap-fcx" or request.param in FCX_MODELS]
    return {s: _train(world, tmp_path_factory, request.param, s) for s in runs}


def _close(a, b) -> None:
    for x, y in zip(
        jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True
    ):
        x, y = np.asarray(x), np.asarray(y)
        scale = max(1.0, float(np.max(np.abs(y), initial=0.0)))
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("strategy", ["layerwise", "overlap", "overlap-fcx"])
def test_equals_host_and_identical_on_all_ranks(world, runs, strategy):
    if strategy not in runs:
        pytest.skip("overlap-fcx runs only for FCX_MODELS")
    trainer, host = runs[strategy], runs["host"]
    assert trainer.step == host.step == STEPS
    assert jax.tree_util.tree_structure(trainer.state.params) == (
        jax.tree_util.tree_structure(host.state.params)
    )
    _close(trainer.state.params, host.state.params)
    # The drained optimizer state is the whole momentum, as host's.
    _close(trainer.state.opt_state, host.state.opt_state)
    sums = world.allgather(_checksum(trainer.state.params))
    assert len(set(sums)) == 1, f"{strategy}: parameters differ across ranks {sums}"
    # Training moved every parameter leaf, so agreeing is not vacuous.
    for now, then in zip(
        jax.tree_util.tree_leaves(trainer.state.params),
        jax.tree_util.tree_leaves(trainer.init_params),
        strict=True,
    ):
        assert not np.allclose(np.asarray(now), then, rtol=0, atol=1e-7)


def test_overlap_optimizer_state_is_sharded(world, runs):
    executor = runs["overlap"].strategy
    full = tree_bytes(runs["host"].state.opt_state)
    # 1/P of the momentum, plus padding (each leaf aligned to ALIGN items,
    # each rank's slice rounded up to ALIGN) and one step counter per stage.
    slack = sum(4 * ALIGN * (len(f.sizes) + world.size) + 8 for f in executor.flats)
    assert executor.opt_bytes * world.size <= full + world.size * slack
    if world.size > 1:
        assert executor.opt_bytes < full


def test_timeline_has_every_phase_and_wait(world, runs):
    for strategy in ("layerwise", "overlap"):
        trainer = runs[strategy]
        if world.rank != 0:
            continue
        trace = json.loads((Path(trainer.run_dir) / "trace.json").read_text())
        spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        assert {e["pid"] for e in spans} == set(range(world.size))
        for rank in range(world.size):
            names = {(e["name"], e["cat"]) for e in spans if e["pid"] == rank}
            for stage in trainer.strategy.stages:
                assert (f"forward {stage.name}", "compute") in names
                assert (f"backward {stage.name}", "compute") in names
                if strategy == "overlap":
                    for what in ("reduce-scatter", "allgather"):
                        assert (f"{what} {stage.name}", "comm-bg") in names
                        assert (f"wait {what} {stage.name}", "comm") in names
                    assert (f"update {stage.name}", "update") in names
            if strategy == "layerwise":
                assert any(
                    n.startswith("allreduce ") and c == "comm-bg" for n, c in names
                )
                assert any(
                    n.startswith("wait allreduce ") and c == "comm" for n, c in names
                )
        sizes = [
            e["args"]["bytes"]
            for e in spans
            if e["cat"] == "comm-bg" and e["name"].startswith("reduce-scatter")
        ]
        if strategy == "overlap":
            assert sizes and all(b > 0 for b in sizes)


def test_step_records(runs):
    for strategy in ("layerwise", "overlap"):
        trainer = runs[strategy]
        assert trainer.contributors == [trainer.world.size] * STEPS


def test_fc_exchange_sends_activations_not_gradients(world, runs):
    if "overlap-fcx" not in runs:
        pytest.skip("overlap-fcx runs only for FCX_MODELS")
    trainer, sharded = runs["overlap-fcx"], runs["overlap"]
    ex = trainer.strategy
    tapped = sorted(ex.staged.exchange)
    assert tapped and tapped == [s.index for s in ex.stages if s.exchangeable]
    # The exchanged stages' optimizer state is whole, the others' sharded.
    full = tree_bytes(runs["host"].state.opt_state)
    assert sharded.strategy.opt_bytes <= ex.opt_bytes
    if world.size > 1 and len(tapped) < len(ex.stages):
        assert ex.opt_bytes < full
    if world.rank != 0:
        return
    trace = json.loads((Path(trainer.run_dir) / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    params = trainer.state.params
    for rank in range(world.size):
        mine = [e for e in spans if e["pid"] == rank]
        names = {(e["name"], e["cat"]) for e in mine}
        for i in tapped:
            stage = ex.stages[i]
            assert (f"reduce-scatter {stage.name}", "comm-bg") not in names
            assert (f"allgather {stage.name}", "comm-bg") not in names
            assert (f"update {stage.name}", "update") in names
            # Each step hands MPI batch x (in + out) floats of the stage's
            # layers: their inputs, then their output errors.
            rows = trainer.config.batch_size
            for what, side in (("inputs", 0), ("errors", 1)):
                assert (f"wait allgather {what} {stage.name}", "comm") in names
                sent = [
                    e["args"]["bytes"]
                    for e in mine
                    if e["name"] == f"allgather {what} {stage.name}"
                ]
                width = sum(params[k]["kernel"].shape[side] for k in stage.tap_keys)
                assert sent == [4 * rows * width] * STEPS
