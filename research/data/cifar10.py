"""CIFAR-10 from the official python pickle batches (``cifar-10-python.tar.gz``).

The archive extracts to ``cifar-10-batches-py/`` holding ``data_batch_1`` ..
``data_batch_5`` (10000 images each) and ``test_batch``. Each is a Python 2 pickle
of a dict with ``b"data"``: uint8 ``(N, 3072)``, one image per row as 1024 red,
then 1024 green, then 1024 blue values, each plane row-major 32x32, and
``b"labels"``: N ints in ``[0, 10)``.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np

from research.data.base import DataError, Dataset, register

FOLDER = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
HOW_TO_GET = (
    "download cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html "
    "and extract it into the data folder (--data-dir)"
)


def _reconstruct() -> Any:
    core = getattr(np, "_core", None) or np.core  # numpy 2 moved numpy.core
    return core.multiarray._reconstruct


class _BatchUnpickler(pickle.Unpickler):
    """Unpickles only dicts, lists, bytes and numpy arrays.

    A pickle can run arbitrary code when loaded; a data folder is not trusted
    code, so only the globals that a numpy array and protocol-2 bytes need are
    allowed (real batches reference ``numpy.core.multiarray._reconstruct``).
    """

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy", "ndarray"): lambda: np.ndarray,
        ("numpy", "dtype"): lambda: np.dtype,
        ("_codecs", "encode"): lambda: __import__("codecs").encode,
    }

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._ALLOWED[(module, name)]()
        except KeyError:
            raise pickle.UnpicklingError(
                f"global {module}.{name} not allowed"
            ) from None


def _resolve_folder(path: str | None) -> Path:
    if path is None:
        raise DataError(f"cifar10: no data folder given; {HOW_TO_GET}")
    root = Path(path).expanduser()
    if not root.is_dir():
        raise DataError(f"cifar10: data folder {root} does not exist; {HOW_TO_GET}")
    if (root / FOLDER).is_dir():
        return root / FOLDER
    if root.name == FOLDER or (root / TRAIN_FILES[0]).exists():
        return root
    hint = HOW_TO_GET
    if (root / "cifar-10-python.tar.gz").exists():
        hint = f"extract it first: tar xzf {root / 'cifar-10-python.tar.gz'} -C {root}"
    raise DataError(f"cifar10: {root / FOLDER} not found; {hint}")


def read_batch(file: Path) -> tuple[np.ndarray, np.ndarray]:
    """Reads one CIFAR-10 batch file.

    Args:
      file: path of e.g. ``data_batch_1``.

    Returns:
      ``(data, labels)``: uint8 ``(N, 3072)`` and int32 ``(N,)``, as stored.

    Raises:
      DataError: the file is missing, not a CIFAR-10 pickle, or inconsistent.
    """
    if not file.exists():
        raise DataError(f"cifar10: {file} not found; {HOW_TO_GET}")
    try:
        with open(file, "rb") as f:
            # encoding="bytes": the batches are Python 2 pickles whose str keys and
            # raw array buffers must stay bytes.
            batch = _BatchUnpickler(f, encoding="bytes").load()
    except Exception as e:  # pickle raises many types on corrupt input
        raise DataError(
            f"cifar10: {file} is not a readable CIFAR-10 pickle ({e}); "
            f"re-extract it: {HOW_TO_GET}"
        ) from e
    if not isinstance(batch, dict):
        raise DataError(f"cifar10: {file} holds a {type(batch).__name__}, not a dict")
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    missing = {"data", "labels"} - set(batch)
    if missing:
        raise DataError(
            f"cifar10: {file} lacks key(s) {sorted(missing)}; found {sorted(batch)}"
        )
    data = batch["data"]
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8):
        raise DataError(f"cifar10: {file}: b'data' must be a uint8 numpy array")
    if data.ndim != 2 or data.shape[1] != 3072:
        raise DataError(
            f"cifar10: {file}: b'data' has shape {data.shape}, expected (N, 3072)"
        )
    try:
        labels = np.asarray(batch["labels"], dtype=np.int64)
    except (TypeError, ValueError) as e:
        raise DataError(f"cifar10: {file}: b'labels' are not integers ({e})") from e
    if labels.shape != (data.shape[0],):
        raise DataError(
            f"cifar10: {file}: {labels.size} labels for {data.shape[0]} images"
        )
    bad = np.flatnonzero((labels < 0) | (labels > 9))
    if bad.size:
        raise DataError(
            f"cifar10: {file}: label {labels[bad[0]]} at index {bad[0]} "
            "is outside [0, 10)"
        )
    return data, labels.astype(np.int32)


def _to_nhwc(data: np.ndarray) -> np.ndarray:
    # Rows are channel planes (CHW); models here take NHWC.
    x = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return x.astype(np.float32) / np.float32(255.0)


@register("cifar10")
def load_cifar10(
    *, path: str | None = None, seed: int = 0, normalize: bool = True
) -> Dataset:
    """Loads CIFAR-10 (50000 train, 10000 test) as NHWC float32.

    Args:
      path: the ``cifar-10-batches-py`` folder or the folder containing it.
      seed: ignored; the files fix the order.
      normalize: subtract the per-channel mean and divide by the per-channel std,
        both measured on the training images (else values are in ``[0, 1]``).

    Returns:
      The dataset, ``input_shape`` ``(32, 32, 3)``; ``meta`` holds mean and std.

    Raises:
      DataError: the folder or a batch file is missing or malformed.
    """
    del seed
    folder = _resolve_folder(path)
    parts = [read_batch(folder / name) for name in TRAIN_FILES]
    train_x = _to_nhwc(np.concatenate([d for d, _ in parts]))
    train_y = np.concatenate([y for _, y in parts])
    test_data, test_y = read_batch(folder / TEST_FILE)
    test_x = _to_nhwc(test_data)
    meta: dict[str, Any] = {"path": str(folder), "normalize": normalize}
    if normalize:
        mean = train_x.mean(axis=(0, 1, 2), dtype=np.float64).astype(np.float32)
        std = train_x.std(axis=(0, 1, 2), dtype=np.float64).astype(np.float32)
        std = np.where(std > 0, std, np.float32(1.0))  # a constant channel stays 0
        for x in (train_x, test_x):
            x -= mean
            x /= std
        meta.update(mean=mean.tolist(), std=std.tolist())
    return Dataset(
        train_x, train_y, test_x, test_y, 10, "cifar10", (32, 32, 3), meta=meta
    )
