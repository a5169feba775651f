"""The dataset container, the data error type and the registry of dataset loaders.

Every loader is a function ``loader(*, path, seed, **options) -> Dataset`` (or
another :class:`research.data.protocol.Data`) registered under a name with
:func:`register`. :func:`get_dataset` checks the name and the options before
calling it, so a typo in a command line fails with the list of what is valid
instead of a ``TypeError`` deep inside a loader. A loader of on-disk data may
register a cheap ``check(path, **options)`` too, which the launcher runs before
any rank starts (:func:`check_dataset`, ``research/entry/cli.py``).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from research.data.sharding import ShardedLoader, eval_batches


class DataError(ValueError):
    """A data file or folder is missing or malformed.

    The message names the file (and line, for text formats), says what is wrong and
    how to fix it, so it can be shown to the user as it is.
    """


@dataclasses.dataclass
class Dataset:
    """A classification dataset held in host memory, split into train and test.

    Attributes:
      train_x: training inputs, float32, shape ``(n_train, *input_shape)``.
      train_y: training labels, int32 in ``[0, num_classes)``, shape ``(n_train,)``.
      test_x: test inputs, float32, shape ``(n_test, *input_shape)``.
      test_y: test labels, int32, shape ``(n_test,)``.
      num_classes: number of classes.
      name: registry name of the dataset.
      input_shape: shape of one example, e.g. ``(32, 32, 3)`` or ``(60483, 1)``.
      meta: provenance (source files, options, scaling), written to ``config.json``.
    """

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    name: str
    input_shape: tuple[int, ...]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        # Models and the loader assume these dtypes; casting here (a no-op when the
        # loader got it right) keeps every loader honest in one place.
        self.train_x = np.asarray(self.train_x, dtype=np.float32)
        self.test_x = np.asarray(self.test_x, dtype=np.float32)
        self.train_y = np.asarray(self.train_y, dtype=np.int32)
        self.test_y = np.asarray(self.test_y, dtype=np.int32)
        self.input_shape = tuple(int(d) for d in self.input_shape)
        for split, x, y in (
            ("train", self.train_x, self.train_y),
            ("test", self.test_x, self.test_y),
        ):
            if x.shape[1:] != self.input_shape:
                raise ValueError(
                    f"{self.name}: {split}_x has example shape {x.shape[1:]}, "
                    f"expected {self.input_shape}"
                )
            if y.shape != (x.shape[0],):
                raise ValueError(
                    f"{self.name}: {split}_y has shape {y.shape}, "
                    f"expected ({x.shape[0]},)"
                )
            if y.size and (y.min() < 0 or y.max() >= self.num_classes):
                raise ValueError(
                    f"{self.name}: {split}_y outside [0, {self.num_classes})"
                )

    @property
    def n_train(self) -> int:
        """Number of training examples."""
        return int(self.train_x.shape[0])

    @property
    def n_test(self) -> int:
        """Number of test examples."""
        return int(self.test_x.shape[0])

    # -- research.data.protocol.Data ------------------------------------------------
    def example_batch(self) -> np.ndarray:
        """The first training input, ``(1, *input_shape)`` float32 (for init)."""
        return self.train_x[:1]

    def eval_batches(
        self, batch_size: int, rank: int, size: int
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Batches of this rank's slice of the test split (``eval_batches``)."""
        return eval_batches(self.test_x, self.test_y, batch_size, rank, size)

    def loader(
        self, *, batch_size: int, rank: int, size: int, seed: int, workers: int = 1
    ) -> ShardedLoader:
        """This rank's :class:`ShardedLoader` (in memory: ``workers`` unused)."""
        del workers
        return ShardedLoader(
            self.train_x, self.train_y, batch_size=batch_size, rank=rank,
            size=size, seed=seed,
        )  # fmt: skip

    def record(self) -> dict[str, Any]:
        """What ``config.json`` records: name, counts, shape (not ``meta``,
        which may hold a feature scaling per input)."""
        return {
            "name": self.name,
            "train_examples": self.n_train,
            "test_examples": self.n_test,
            "num_classes": self.num_classes,
            "input_shape": list(self.input_shape),
        }

    def describe(self) -> str:
        """One line saying what this dataset is, for logs and ``--help`` output."""
        mib = (self.train_x.nbytes + self.test_x.nbytes) / 2**20
        counts = np.bincount(self.train_y, minlength=self.num_classes)
        return (
            f"{self.name}: {self.n_train} train / {self.n_test} test examples of "
            f"shape {self.input_shape}, {self.num_classes} classes "
            f"(train per class {counts.min()}..{counts.max()}), "
            f"float32 inputs {mib:.1f} MiB"
        )


Loader = Callable[..., Any]
Check = Callable[..., None]
_REGISTRY: dict[str, Loader] = {}
_CHECKS: dict[str, Check] = {}


def _canonical(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def register(name: str, check: Check | None = None) -> Callable[[Loader], Loader]:
    """Decorator registering ``loader(*, path, seed, **options)`` under ``name``;
    ``check(path, **options)``, where given, raises :class:`DataError` for bad
    data cheaply (no decoding: it runs before any rank starts)."""

    def wrap(fn: Loader) -> Loader:
        key = _canonical(name)
        if key in _REGISTRY:
            raise ValueError(f"dataset {name!r} registered twice")
        _REGISTRY[key] = fn
        if check is not None:
            _CHECKS[key] = check
        return fn

    return wrap


def check_dataset(name: str, path: str | None, options: dict[str, Any]) -> str | None:
    """The first problem with an on-disk dataset's options or data as one line
    (its check hook's :class:`DataError`), or None; a dataset without a hook
    is checked where it is loaded."""
    check = _CHECKS.get(_canonical(name))
    if check is None:  # in memory or generated: checked where it is made
        return None
    try:
        _check_options(name, options)
        check(path=path, **options)
    except ValueError as e:  # DataError is one
        return str(e)
    return None


def list_datasets() -> list[str]:
    """Names accepted by :func:`get_dataset`, sorted."""
    return sorted(_REGISTRY)


def dataset_options(name: str) -> dict[str, Any]:
    """The options a dataset accepts, with their defaults.

    Args:
      name: a registered dataset name.

    Returns:
      ``{option: default}`` for every keyword beyond ``path`` and ``seed``.
    """
    fn = _lookup(name)
    return {
        p.name: p.default
        for p in inspect.signature(fn).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in ("path", "seed")
    }


def _lookup(name: str) -> Loader:
    try:
        return _REGISTRY[_canonical(name)]
    except KeyError:
        raise ValueError(
            f"unknown dataset {name!r}; valid names: {', '.join(list_datasets())}"
        ) from None


def get_dataset(
    name: str, *, path: str | None = None, seed: int = 0, **options: Any
) -> Any:
    """Builds or loads a dataset by name.

    Args:
      name: one of :func:`list_datasets` (case and ``-``/``_`` do not matter).
      path: data folder for on-disk datasets; ignored by synthetic ones.
      seed: seed of synthetic generation; on-disk loaders ignore it.
      **options: dataset-specific options, see :func:`dataset_options`.

    Returns:
      The :class:`Dataset` (in memory), or another :class:`~research.data.protocol.Data`
      (``imagenet``: streamed from disk).

    Raises:
      ValueError: unknown name or option.
      DataError: a file is missing or malformed.
    """
    fn = _lookup(name)
    _check_options(name, options)
    return fn(path=path, seed=seed, **options)


def _check_options(name: str, options: dict[str, Any]) -> None:
    valid = dataset_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"dataset {name!r} has no option(s) {', '.join(unknown)}; "
            f"valid options: {', '.join(f'{k}={v!r}' for k, v in valid.items())}"
        )
