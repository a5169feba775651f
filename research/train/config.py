"""The typed configuration of one training run."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class TrainConfig:
    """Everything that defines a run; written resolved to ``config.json``.

    Steps: ``steps`` when positive, else ``epochs`` times the steps of one epoch.
    """

    model: str = "cnn_small"
    model_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    dataset: str = "synthetic_images"
    data_dir: str | None = None
    data_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    batch_size: int = 32  # per rank
    steps: int = 0
    epochs: float = 1.0
    lr: float = 0.05  # per 256 examples of global batch when scale_lr
    scale_lr: bool = False
    schedule: str = "cosine"
    warmup_steps: int = 20
    momentum: float = 0.9
    weight_decay: float = 5e-4
    seed: int = 0
    strategy: str = "fused"
    strategy_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    eval_every: int = 100
    eval_batch_size: int = 256
    log_every: int = 10
    trace: bool = False
    trace_max_events: int = 200_000
    threads: int = 1
    run_dir: str = ""
    progress: bool = True
    # Checkpointing (research.checkpoint): a strategy name or "none"; every N
    # steps and after the last one; resume from the newest committed step.
    checkpoint: str = "none"
    checkpoint_every: int = 100
    resume: bool = True
