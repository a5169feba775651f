"""The ``adaptive`` strategy under MPI: exact switches, resume in every phase,
the guard, measured decisions and the one-call form.

* A forced switch (``plan``) ends in the same parameters, bit for bit, as a
  run of the new strategy alone started from the state at the switch, with
  what the old one carried: top-k from a dense state; dense from a top-k state
  whose residual is added to the first gradient (written here independently).
* A run checkpointed in any phase (dense, top-k, top-k at another density
  with the residual handed over, dense after the fold) resumes to the same
  bits as one that never stopped; a run resumed inside a partial phase resumes
  it and switches on schedule, carrying what solo carried into dense.
* The guard fires where it must (top-k keeping one entry in thousands) and not
  where it must not (half the entries).
* Under a straggler the model's decisions move to solo, the same on every
  rank (the policy's whole state equal), each a metrics row.
* The one call applies every gradient exactly once across switches from
  partial and from top-k (the carried gradients, the folded residual).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import research
from research.checkpoint.config import CheckpointConfig
from research.rundir import read_metrics
from research.strategies.host import HostOptions
from research.train.callback import Callback
from research.train.checkpointing import CheckpointCallback
from research.train.config import (
    DataConfig,
    ModelConfig,
    RecordsConfig,
    StrategyConfig,
    TrainConfig,
)
from research.train.loop import Trainer


def _config(run_dir: str, total: int, strategy: str, **kw) -> TrainConfig:
    base = dict(
        model=ModelConfig("candle_p1b2_tiny"),
        data=DataConfig(
            name="synthetic_tabular",
            options={"features": 256, "n_train": 256, "n_test": 32},
        ),
        batch_size=8,
        steps=total,
        eval_every=0,
        records=RecordsConfig(log_every=1),
        strategy=StrategyConfig(strategy, kw.pop("strategy_options", {})),
        schedule="constant",
        warmup_steps=0,
        lr=0.05,
        weight_decay=0.0,  # so the standalone top-k run is the same optimizer
        progress=False,
        run_dir=run_dir,
    )
    base.update(kw)
    return TrainConfig(**base)


def _dir(world, tmp_path_factory, name: str) -> str:
    return world.bcast(str(tmp_path_factory.mktemp(name)) if world.rank == 0 else None)


def _adaptive(plan: str, **kw) -> dict:
    return {"plan": plan, "allreduce": "ring", "interval": 50, **kw}


class _Capture(Callback):
    """The state and data position after ``at`` steps (drained: the residual
    published, nothing in flight; a drain changes no parameter)."""

    def __init__(self, at: int) -> None:
        self.at, self.state, self.position = at, None, None

    def on_step_end(self, trainer, step):
        if step == self.at:
            trainer.drain()
            self.state = jax.tree.map(np.array, trainer.state)
            self.position = trainer.loader.position


class _StartFrom(Callback):
    """Start a run from a captured state (parameters, optimizer, step, data)."""

    def __init__(self, capture: _Capture, residual: bool) -> None:
        self.capture, self.residual = capture, residual

    def on_train_start(self, trainer):
        got = self.capture.state
        strategy = dict(trainer.state.strategy)
        if self.residual:
            strategy["residual"] = jax.numpy.asarray(got.strategy["residual"])
        state = trainer.state.replace(
            params=got.params,
            opt_state=got.opt_state,
            batch_stats=got.batch_stats,
            step=got.step,
            rng=got.rng,
            strategy=strategy,
        )
        trainer.restore(jax.device_put(state), self.capture.at, self.capture.position)


def _add_once(world, extra):
    """``host`` whose first gradient gets ``extra`` added (the carried residual)."""
    host = HostOptions(allreduce="ring").create(world)
    host.fold(jax.tree.map(np.array, extra))  # copies: fold adds into them
    return host


def _same(a, b) -> bool:
    return all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


@pytest.mark.parametrize("order", ["dense-to-topk", "topk-to-dense"])
def test_a_forced_switch_equals_the_new_strategy_from_there(
    world, tmp_path_factory, order
):
    at, total = 3, 6
    old, new = ("host", "sparse:0.05") if order == "dense-to-topk" else (
        "sparse:0.05", "host",
    )  # fmt: skip
    capture = _Capture(at)
    cfg = _config(
        _dir(world, tmp_path_factory, "a"),
        total,
        "adaptive",
        strategy_options=_adaptive(f"{old}@0,{new}@{at}", densities="0.05"),
    )
    adaptive = Trainer(cfg, world, callbacks=[capture])
    adaptive.run()
    rows = [r for r in read_metrics(cfg.run_dir) if r.get("kind") == "switch"]
    if world.rank == 0:
        assert [(r["step"], r["from"], r["to"]) for r in rows] == [(at, old, new)]
    if new == "host":  # the residual folded into the first dense gradient
        unravel = ravel_pytree(capture.state.params)[1]
        extra = unravel(capture.state.strategy["residual"])
        assert np.any(np.asarray(capture.state.strategy["residual"]) != 0)
        ref_cfg = _config(_dir(world, tmp_path_factory, "r"), total, "host")
        reference = Trainer(
            ref_cfg,
            world,
            strategy=_add_once(world, extra),
            callbacks=[_StartFrom(capture, residual=False)],
        )
        assert not np.any(np.asarray(adaptive.state.strategy["residual"]))
    else:
        ref_cfg = _config(
            _dir(world, tmp_path_factory, "r"),
            total,
            "sparse",
            strategy_options={"density": 0.05},
        )
        reference = Trainer(
            ref_cfg, world, callbacks=[_StartFrom(capture, residual=True)]
        )
    reference.run()
    assert int(reference.state.step) == int(adaptive.state.step) == total
    assert _same(adaptive.state.params, reference.state.params), order
    assert _same(adaptive.state.opt_state, reference.state.opt_state), order


PLAN = "host@0,sparse:0.05@3,sparse:0.02@6,host@9"


PLAN_TOTAL = 12
PLAN_OPTIONS = _adaptive(PLAN, densities="0.05,0.02")


@pytest.fixture(scope="module")
def whole(world, tmp_path_factory):
    """The plan's run that never stopped, made once for every stop below."""
    trainer = Trainer(
        _config(_dir(world, tmp_path_factory, "w"), PLAN_TOTAL, "adaptive",
                strategy_options=PLAN_OPTIONS),
        world,
    )  # fmt: skip
    trainer.run()
    return jax.tree.map(np.array, trainer.state)


@pytest.mark.parametrize("stop", [2, 5, 8, 10])  # dense, top-k, other k, after fold
def test_resumes_bit_identical_in_every_phase(world, tmp_path_factory, whole, stop):
    total, opts = PLAN_TOTAL, PLAN_OPTIONS
    folder = _dir(world, tmp_path_factory, "s")
    ck = CheckpointConfig(
        every=stop, directory=f"{folder}/ck", fast_dir=None, fsync=False
    )
    first = Trainer(
        _config(folder, stop, "adaptive", strategy_options=opts),
        world,
        callbacks=[CheckpointCallback(ck)],
    )
    first.run()
    resume = CheckpointCallback(ck)
    second = Trainer(
        _config(folder, total, "adaptive", strategy_options=opts),
        world,
        callbacks=[resume],
    )
    second.run()
    assert resume.resumed_from == stop
    assert _same(second.state.params, whole.params), stop
    assert _same(second.state.opt_state, whole.opt_state), stop
    np.testing.assert_array_equal(
        np.asarray(second.state.strategy["residual"]), whole.strategy["residual"]
    )


@pytest.mark.parametrize("to", ["host", "sparse:0.05"])
def test_a_partial_phase_carries_over_and_resumes(world, tmp_path_factory, to):
    """Rank 1 is late every step: solo's rounds run without it, its gradients
    are carried; the switch at step 4 takes them back into host's first
    gradient, or into top-k's residual (no round); a run resumed inside the
    solo phase goes on with solo and switches on schedule; the replicas stay
    equal."""
    from research.imbalance import FixedImbalance

    folder = _dir(world, tmp_path_factory, "p")
    opts = _adaptive(f"solo@0,{to}@4", densities="0.05")
    ck = CheckpointConfig(every=2, directory=f"{folder}/ck", fast_dir=None, fsync=False)
    slow = FixedImbalance([1], 0.05)
    first = Trainer(
        _config(folder, 2, "adaptive", strategy_options=opts),
        world,
        imbalance=slow,
        callbacks=[CheckpointCallback(ck)],
    )
    first.run()
    # No checkpoint in the resumed run: its drain would deliver what the
    # switch must deliver itself.
    resume = CheckpointCallback(dataclasses.replace(ck, every=100))
    second = Trainer(
        _config(folder, 6, "adaptive", strategy_options=opts),
        world,
        imbalance=slow,
        callbacks=[resume],
    )
    second.run()
    assert resume.resumed_from == 2
    sums = world.allgather(float(np.sum(ravel_pytree(second.state.params)[0])))
    assert len(set(sums)) == 1, sums
    if world.rank == 0:
        steps = [r for r in read_metrics(folder) if "comm_method" in r]
        assert [r["comm_method"] for r in steps if r["step"] in (3, 4, 5, 6)] == [
            "solo", "solo", to, to,
        ]  # fmt: skip
        (switch,) = [r for r in read_metrics(folder) if r.get("kind") == "switch"]
        assert (switch["step"], switch["from"], switch["to"]) == (4, "solo", to)
        carry = [r for r in read_metrics(folder) if r.get("kind") == "carry"]
        assert [r["step"] for r in carry] == [4], carry  # rank 1's, taken back
        assert carry[0]["gradients"] >= 1, carry


@pytest.mark.parametrize(("density", "fires"), [(1e-4, True), (0.5, False)])
def test_guard_leaves_topk_that_holds_back_too_much(
    world, tmp_path_factory, density, fires
):
    """k = 2 of the model's 19,226 entries: the residual keeps nearly all of
    every gradient and its norm keeps growing (2.0, 2.5, 3.2 and 3.7 times the
    gradient's at steps 4, 8, 12 and 16 in one process), so the guard, set to
    2.2, goes back to dense (at the step after it measured) and folds the
    residual in; with half the entries sent the residual stays near zero."""
    label = f"sparse:{density:g}"
    cfg = _config(
        _dir(world, tmp_path_factory, "g"),
        13,
        "adaptive",
        strategy_options=_adaptive(
            f"{label}@0", densities=f"{density:g}", interval=4, max_lag=2.2
        ),
    )
    trainer = Trainer(cfg, world)
    summary = trainer.run()
    ad = summary["adaptive"]
    assert (ad["guard_fired"] > 0) == fires, ad
    assert (ad["final"] == "host") == fires, ad
    lag = ad["estimates"][label]["delay"]
    if world.rank == 0:
        rows = read_metrics(cfg.run_dir)
        rows = [r for r in rows if r.get("kind") in ("switch", "decision")]
        if fires:
            guard = [r for r in rows if r["reason"] == "guard"]
            assert guard and guard[0]["step"] in (5, 9), rows
            assert "gradients > max_lag 2.2" in guard[0]["why"]
        else:
            assert rows == [] and lag < 0.5, (rows, lag)
    if fires:
        assert not np.any(np.asarray(trainer.state.strategy["residual"]))


def test_measured_decisions_agree_and_are_recorded(world, tmp_path_factory):
    """The model on real timings: under a straggler from the start (one rank
    held 0.15 s each step, a tiny model whose steps take milliseconds) dense
    waits for it every step and solo does not: the model moves to solo, every
    rank at the same step with the same state; each switch a metrics row, the
    model's rows and the time per method in summary.json."""
    from research.imbalance import RandomImbalance

    cfg = _config(
        _dir(world, tmp_path_factory, "m"),
        24,
        "adaptive",
        strategy_options={
            "candidates": "host,sparse,solo",
            "densities": "0.05",
            "dense_steps": 2,
            "staleness": 4,
        },
    )
    late = RandomImbalance(1, 0.15, world.size, start=0)
    trainer = Trainer(cfg, world, imbalance=late)
    summary = trainer.run()
    policy = trainer.strategy.policy
    vectors = world.allgather(np.asarray(policy.agreed()))
    assert all(np.array_equal(v, vectors[0], equal_nan=True) for v in vectors)
    ad = summary["adaptive"]
    assert sum(ad["steps"].values()) == 24 and ad["probes"] == 0, ad
    assert set(ad["seconds"]) == {"host", "sparse:0.05", "solo"}
    assert ad["startup"]["candidates"]["solo"]["bytes"] > 0, ad["startup"]
    if world.rank == 0:
        rows = [r for r in read_metrics(cfg.run_dir) if r.get("kind")]
        switches = [r for r in rows if r["kind"] == "switch"]
        assert switches and switches[0]["to"] == "solo", rows
        assert switches[0]["reason"] == "model", switches
        model = [r for r in rows if r["kind"] == "model"]
        assert len(model) >= 10 and all(len(r["arrive_ms"]) == world.size
                                        for r in model)  # fmt: skip


SHAPES = {"b": (30,), "w": (40, 30)}


def _grads(rank: int, step: int) -> dict:
    rng = np.random.default_rng([rank, step])
    return {k: rng.integers(-8, 9, s).astype(np.float32) for k, s in SHAPES.items()}


@pytest.mark.parametrize(
    "plan",
    [
        "solo@0,host@3",
        "sparse:0.1@0,sparse:0.05@2,host@4",
        "solo@0,sparse:0.1@2,host@4",
    ],
)
def test_the_one_call_applies_every_gradient_once(world, plan):
    """Small integers: exact sums. Whatever solo's rounds carried and top-k held
    back, the results sum to every rank's every gradient over P."""
    calls = 6
    avg = research.averaging(
        "adaptive", world, plan=plan, densities="0.1,0.05", allreduce="ring"
    )
    applied = {k: np.zeros(s) for k, s in SHAPES.items()}
    sent = {k: np.zeros(s) for k, s in SHAPES.items()}
    methods = []
    for step in range(calls):
        if world.rank == 1:
            time.sleep(0.02)  # late: solo's rounds run without this rank
        g = _grads(world.rank, step)
        out, info = avg(g)
        methods.append(info.extra["method"])
        for k in SHAPES:
            applied[k] += np.asarray(out[k], np.float64)
            sent[k] += g[k]
    assert avg.drain() is None  # host at the end: nothing held
    avg.close()
    every = world.allgather(sent)
    for k in SHAPES:
        want = sum(e[k] for e in every) / world.size
        np.testing.assert_allclose(applied[k], want, rtol=1e-6, atol=1e-4)
    switches = [s for s, _ in (p.split("@") for p in plan.split(","))]
    assert methods[-1] == "host" and methods[0] == switches[0]
