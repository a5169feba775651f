"""A tiny training run for tests that build a Trainer themselves.

The MLP of CANDLE P1B2 at 256 features on 256 synthetic rows (32 to test), a
few steps: what tests/mpi and the drivers train when they need a real run
whose numbers they compare. :func:`tiny_config` gives its config, and
:func:`tiny_flags` the same run as ``python -m experiments.train`` flags; a
test sets what it checks over them.
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
    no progress bar), ``fields`` set over it; ``data_options`` are merged."""
    from research.train.config import TrainConfig

    data = {"features": 256, "n_train": 256, "n_test": 32}
    data.update(fields.pop("data_options", {}))
    base: dict[str, Any] = dict(
        model="candle_p1b2_tiny",
        dataset="synthetic_tabular",
        batch_size=4,
        eval_every=0,
        progress=False,
    )
    return TrainConfig(**{**base, **fields}, data_options=data, run_dir=run_dir)


def tiny_flags(n_train: int = 256, n_test: int = 32, batch: int = 4) -> list[str]:
    """The tiny run's model and data as command-line flags, no progress bar."""
    return [
        *("--model", "candle_p1b2_tiny", "--dataset", "synthetic_tabular"),
        *("--data-opt", "features=256", "--data-opt", f"n_train={n_train}"),
        *("--data-opt", f"n_test={n_test}", "--batch-size", str(batch)),
        "--no-progress",
    ]
