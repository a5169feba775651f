"""The tiny training runs every test uses, from one place.

* :func:`tiny_config` and :func:`tiny_flags`: the MLP of CANDLE P1B2 at 256
  features on 256 synthetic rows (32 to test), a few steps: what tests/mpi and
  the drivers train when they need a real run whose numbers they compare, as a
  ``TrainConfig`` and as ``python -m experiments.train`` flags;
* :func:`tiny_train`: a small ``python -m experiments.train`` command line
  (``cnn_small`` on synthetic images, 2 ranks) for tests that launch the CLI,
  and :data:`RESUME_ARGS`, the one the checkpoint-and-resume tests kill.

A test sets what it checks over them.
"""

from __future__ import annotations

from typing import Any

#: Plain SGD at a constant rate: each step applies lr times the averaged
#: gradient, which a test can compute again.
PLAIN_SGD: dict[str, Any] = {
    "schedule": "constant",
    "warmup_steps": 0,
    "lr": 0.05,
    "momentum": 0.0,
    "weight_decay": 0.0,
}


def tiny_config(run_dir: str, **fields: Any):
    """The tiny run's ``TrainConfig`` into ``run_dir`` (batch 4, no evaluation,
    no progress bar), ``fields`` set over it; ``data_options`` are merged, and
    ``strategy`` (a name), ``strategy_options`` and ``link`` make its
    ``StrategyConfig``, ``log_every``, ``trace`` and ``tensorboard`` its
    ``RecordsConfig``, ``comm_timeout`` its ``FaultConfig``."""
    from research.train.config import (
        DataConfig,
        ModelConfig,
        RecordsConfig,
        StrategyConfig,
        TrainConfig,
    )
    from research.train.faults import FaultConfig

    data = {"features": 256, "n_train": 256, "n_test": 32}
    data.update(fields.pop("data_options", {}))
    fields["strategy"] = StrategyConfig(
        fields.pop("strategy", "fused"),
        fields.pop("strategy_options", {}),
        fields.pop("link", "real"),
    )
    kept = ("log_every", "trace", "tensorboard")
    fields["records"] = RecordsConfig(**{k: fields.pop(k) for k in kept if k in fields})
    if "comm_timeout" in fields:
        fields["faults"] = FaultConfig(fields.pop("comm_timeout"))
    base: dict[str, Any] = dict(
        model=ModelConfig("candle_p1b2_tiny"),
        batch_size=4,
        eval_every=0,
        progress=False,
    )
    data_config = DataConfig(name="synthetic_tabular", options=data)
    return TrainConfig(**{**base, **fields}, data=data_config, run_dir=run_dir)


def tiny_flags(n_train: int = 256, n_test: int = 32, batch: int = 4) -> list[str]:
    """The tiny run's model and data as command-line flags, no progress bar."""
    return [
        *("--model", "candle_p1b2_tiny", "--dataset", "synthetic_tabular"),
        *("--data-opt", "features=256", "--data-opt", f"n_train={n_train}"),
        *("--data-opt", f"n_test={n_test}", "--batch-size", str(batch)),
        "--no-progress",
    ]


def tiny_train(*extra: str, np: int = 2, n_train: int = 512) -> list[str]:
    """The arguments of a small ``python -m experiments.train`` run: ``np``
    ranks, cnn_small on ``n_train`` synthetic images (64 to test), batch 16, no
    evaluation, no progress bar; then ``extra`` (a later flag wins)."""
    return [
        "-m", "experiments.train", "--np", str(np), "--model", "cnn_small",
        "--data-opt", f"n_train={n_train}", "--data-opt", "n_test=64",
        "--batch-size", "16", "--eval-every", "0", "--no-progress", *extra,
    ]  # fmt: skip


#: 60 ``host`` steps checkpointed by DeepFreeze every 5: the run that the
#: resume tests kill and start again (tests/test_train_resume.py,
#: tests/test_writer_killed.py).
RESUME_ARGS = tiny_train(
    "--steps", "60", "--strategy", "host",
    "--checkpoint", "deepfreeze", "--checkpoint-every", "5",
)  # fmt: skip
