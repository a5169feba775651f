"""What training reads of a dataset, whatever kind it is: one small protocol.

An in-memory :class:`research.data.base.Dataset` and a streamed one (ImageNet,
``research/data/imagenet/``) both give the trainer the same five things, so
the loop, evaluation and checkpoints never ask which kind they hold::

    data = get_dataset("imagenet", path=DIR, image_size=112)
    state = create_train_state(model, data.example_batch(), tx, seed)
    loader = data.loader(batch_size=32, rank=r, size=P, seed=0, workers=4)
    x, y = loader.next_batch()                  # this rank's share of a step
    saved = loader.position                     # JSON; into every checkpoint
    loader.set_position(saved)                  # resume (also at another P
                                                #   where the loader says so)
    for x, y in data.eval_batches(256, r, P):   # this rank's share of eval
        ...
    loader.summary(); loader.close()
    data.describe(); data.record()              # a line; config.json's record

Inputs are host numpy arrays: float32 for the in-memory datasets, uint8
``(B, H, W, 3)`` images for ImageNet, which the models' stems normalise on the
device (``models/inputs.py``). Nothing here imports MPI or JAX: rank and size
come in as ints.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import numpy as np


class Loader(Protocol):
    """Endless training batches of one rank, resumable from :attr:`position`.

    Attributes:
      steps_per_epoch: steps per pass over the training split (a float where
        a step's batch may straddle two epochs).
    """

    steps_per_epoch: float

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """The next ``(x, y)`` of this rank."""
        ...

    @property
    def position(self) -> dict[str, Any]:
        """Where the next batch comes from, JSON-serializable."""
        ...

    def set_position(self, position: Mapping[str, Any]) -> None:
        """Continue from a saved :attr:`position`; ValueError if it does not fit."""
        ...

    def close(self) -> None:
        """Stop whatever reads ahead (threads); safe on an error path."""
        ...

    def summary(self) -> dict[str, Any]:
        """This rank's figures for ``summary.json`` (e.g. skipped images)."""
        ...


class Data(Protocol):
    """A dataset as the trainer reads it.

    Attributes:
      name: the registry name.
      num_classes: classes of the labels.
      input_shape: one example's shape.
      meta: provenance written to ``config.json`` (files, options, classes).
    """

    name: str
    num_classes: int
    input_shape: tuple[int, ...]
    meta: dict[str, Any]

    def example_batch(self) -> np.ndarray:
        """One input ``(1, *input_shape)`` of the loader's dtype (for init)."""
        ...

    def eval_batches(
        self, batch_size: int, rank: int, size: int
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Batches of this rank's disjoint share of the evaluation split."""
        ...

    def loader(
        self,
        *,
        batch_size: int,
        rank: int,
        size: int,
        seed: int,
        workers: int = 1,
    ) -> Loader:
        """This rank's training loader at the start of epoch 0."""
        ...

    def describe(self) -> str:
        """One line saying what the dataset is."""
        ...

    def record(self) -> dict[str, Any]:
        """What ``config.json`` records of it (small: counts, source, classes)."""
        ...
