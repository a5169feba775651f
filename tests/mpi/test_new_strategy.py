"""A new strategy is one module and one test: this file is the test.

The module is written here into a temporary folder, outside the project: a
strategy's options dataclass registered with ``@register``, its option a field
with its range beside it, and the one object it makes. Importing the module
makes its name known; nothing in the project names it, yet the option check,
the Trainer and ``research.averaging`` all take it. It is ``host``'s mean scaled by
``factor``: with plain SGD, ``factor=0.5`` at learning rate 2L must train the
same parameters as ``host`` at L, on every rank. (The built-in local SGD,
``research/strategies/local_sgd.py``, is the same shape: one module, one test.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np

from tests.tiny import tiny_config

MODULE = '''
import dataclasses

import jax

from research.options import Range, option
from research.strategies.host import Host, HostOptions
from research.strategies.registry import register


@register("scaled_mean")
@dataclasses.dataclass(frozen=True)
class ScaledMeanOptions(HostOptions):
    factor: float = option(1.0, Range(gt=0))

    def create(self, world):
        return ScaledMean(world, self)


class ScaledMean(Host):
    """``host``'s mean times ``factor``."""

    def __init__(self, world, options):
        factor = options.factor
        super().__init__(world, HostOptions())
        self.options, self.factor = options, factor

    def reduce(self, grads):
        mean, info = super().reduce(grads)
        return jax.tree.map(lambda g: g * self.factor, mean), info
'''


def _train(world, tmp: Path, strategy: str, options: dict, lr: float):
    from research.train.loop import Trainer

    cfg = tiny_config(
        str(tmp / strategy),
        data_options={"n_train": 128},
        batch_size=8,
        steps=4,
        eval_every=100,
        lr=lr,
        momentum=0.0,
        weight_decay=0.0,
        warmup_steps=0,
        strategy=strategy,
        strategy_options=options,
    )
    trainer = Trainer(cfg, world)
    trainer.run()
    return trainer.state.params


def test_a_strategy_from_one_outside_module(world, tmp_path_factory):
    import importlib

    from research.strategies import registry
    from research.strategies.registry import problem as check_options

    folder = world.bcast(
        str(tmp_path_factory.mktemp("strategy")) if world.rank == 0 else None
    )
    if world.rank == 0:
        (Path(folder) / "scaled_mean_strategy.py").write_text(MODULE)
    world.barrier()
    sys.path.insert(0, folder)
    try:
        importlib.import_module("scaled_mean_strategy")  # registers it
        assert check_options("scaled_mean", {"factor": 0.5}) is None
        assert "no option 'fctor'" in check_options("scaled_mean", {"fctor": 0.5})
        low = check_options("scaled_mean", {"factor": -1.0})
        assert "factor=-1.0 must be > 0" in low
        tmp = Path(folder)
        scaled = _train(world, tmp, "scaled_mean", {"factor": 0.5}, lr=0.2)
        host = _train(world, tmp, "host", {}, lr=0.1)
        for a, b in zip(jax.tree.leaves(scaled), jax.tree.leaves(host), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
        import research

        with research.averaging("scaled_mean", world, factor=2.0) as avg:
            out, _ = avg({"g": np.full(4, float(world.rank), np.float32)})
        want = 2.0 * np.mean(np.arange(world.size))
        np.testing.assert_allclose(out["g"], want, rtol=1e-6)
    finally:
        sys.path.remove(folder)
        registry.forget("scaled_mean")
