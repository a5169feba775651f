"""Datasets: seeded synthetic tasks (the default), real on-disk formats, sharding.

``get_dataset(name, path=..., seed=..., **options)`` returns a :class:`Dataset`
(``list_datasets()`` names them, ``dataset_options(name)`` gives their options):

* ``synthetic_images``, ``synthetic_tabular``, ``synthetic_nt3``: learnable seeded
  tasks shaped like CIFAR-style images, CANDLE P1B2 and CANDLE NT3 (synthetic.py);
* ``cifar10``: the python pickle batches (cifar10.py);
* ``candle_nt3``, ``candle_p1b2``: the CANDLE CSV files (candle.py);
* ``digits``: the UCI handwritten digits inside scikit-learn's wheel, an optional
  dependency (digits.py);
* ``imagenet``: ImageNet's folder layout or ArrayRecord shards, streamed by a
  Grain pipeline, uint8 crops (imagenet/).

Every dataset gives the trainer the same few things (``protocol.py``: an
example batch, this rank's evaluation batches, a resumable loader), whether it
is held in memory or streamed.

Missing or malformed files raise :class:`DataError` (a ``ValueError``) naming the
file and line. ``ShardedLoader`` feeds one MPI rank its disjoint shard of each
epoch and resumes from a saved ``position``; ``eval_batches`` splits a test set
over ranks. Pure numpy: rank and size come in as ints, nothing imports MPI or jax.
"""

from research.data import (  # noqa: F401  (registration)
    candle,
    cifar10,
    digits,
    imagenet,
    synthetic,
)
from research.data.base import (
    DataError,
    Dataset,
    check_dataset,
    dataset_options,
    get_dataset,
    list_datasets,
    register,
)
from research.data.sharding import ShardedLoader, eval_batches, eval_slice

__all__ = [
    "DataError",
    "Dataset",
    "ShardedLoader",
    "check_dataset",
    "dataset_options",
    "eval_batches",
    "eval_slice",
    "get_dataset",
    "list_datasets",
    "register",
]
