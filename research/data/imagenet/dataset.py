"""ImageNet as the trainer reads it (research.data.protocol.Data): splits, loader."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from research.data.base import DataError
from research.data.imagenet import layout, records
from research.data.imagenet.pipeline import Skips, StreamLoader, eval_batches
from research.data.sharding import eval_slice


def options_problem(image_size: int, eval_examples: int, prefetch_batches: int):
    """A one-line problem with the dataset's options, or None."""
    if not isinstance(image_size, int) or image_size < 8:
        return f"imagenet: image_size must be an int >= 8, got {image_size!r}"
    if not isinstance(eval_examples, int) or eval_examples < 0:
        return f"imagenet: eval_examples must be >= 0 (0: all), got {eval_examples!r}"
    if not isinstance(prefetch_batches, int) or prefetch_batches < 1:
        return f"imagenet: prefetch_batches must be >= 1, got {prefetch_batches!r}"
    return None


def is_records(root: Path) -> bool:
    """Whether ``root`` holds ArrayRecord shards (a manifest) or the folders."""
    return (root / records.MANIFEST).is_file()


def resolve(path: str | None) -> Path:
    """The data folder, or DataError when none is given or it is not one."""
    if not path:
        raise DataError(f"imagenet: no data folder given (--data-dir); {layout.HOW}")
    root = Path(path).expanduser()
    if not root.is_dir():
        raise DataError(f"imagenet: {root} is not a folder; {layout.HOW}")
    return root


class ImageNetData:
    """ImageNet (or any folder of its layout) streamed from disk by Grain.

    Args:
      root: the data folder (folders or shards).
      image_size: the side of training and evaluation images.
      eval_examples: evaluate on the first this many of the val split (0: all).
      val_labels: the flat val split's labels file (layout.py's default).
      prefetch_batches: host batches decoded ahead by each rank's workers.
      audit: the loaders keep the example indices they hand out.
    """

    name = "imagenet"

    def __init__(
        self,
        root: Path,
        *,
        image_size: int = 224,
        eval_examples: int = 0,
        val_labels: str | None = None,
        prefetch_batches: int = 2,
        audit: bool = False,
    ) -> None:
        self.root, self.image_size = root, image_size
        self.prefetch, self.audit = prefetch_batches, audit
        if is_records(root):
            manifest = records.check_manifest(root)
            self.classes = list(manifest["classes"])
            self.train = records.RecordSplit.from_manifest(
                root, manifest["splits"]["train"]
            )
            self.val = records.RecordSplit.from_manifest(
                root, manifest["splits"]["val"]
            )
            source = "arrayrecord"
        else:
            self.classes, self.train, self.val = layout.scan_folder(root, val_labels)
            source = "folder"
        self.num_classes = len(self.classes)
        self.input_shape = (image_size, image_size, 3)
        n_val = len(self.val)
        self.n_eval = min(n_val, eval_examples) if eval_examples else n_val
        self._workers = 1
        self._eval_skips: Skips | None = None
        self.meta: dict[str, Any] = {
            "source": source,
            "path": str(root),
            "train_examples": len(self.train),
            "val_examples": n_val,
            "eval_examples": self.n_eval,
            "image_size": image_size,
            "host_dtype": "uint8",
            "normalize": "on the device, ImageNet mean/std (models/inputs.py)",
            "classes": self.classes,  # the class index: sorted wnids
        }

    def example_batch(self) -> np.ndarray:
        """A zero image ``(1, S, S, 3)`` uint8: what the loader gives, for init."""
        return np.zeros((1, *self.input_shape), np.uint8)

    def loader(
        self, *, batch_size: int, rank: int, size: int, seed: int, workers: int = 1
    ) -> StreamLoader:
        """This rank's training loader (``pipeline.StreamLoader``)."""
        self._workers = workers
        self._eval_skips = Skips(rank, "evaluation leaves it out")
        loader = StreamLoader(
            self.train, batch_size=batch_size, rank=rank, size=size, seed=seed,
            image_size=self.image_size, workers=workers,
            prefetch_batches=self.prefetch, audit=self.audit,
        )  # fmt: skip
        loader.eval_skips = self._eval_skips
        return loader

    def eval_batches(
        self, batch_size: int, rank: int, size: int
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Centre-cropped batches of this rank's slice of the first
        ``eval_examples`` val images (undecodable ones left out, counted)."""
        if self._eval_skips is None:
            self._eval_skips = Skips(rank, "evaluation leaves it out")
        part = eval_slice(self.n_eval, rank, size)
        return eval_batches(
            self.val, part.start, part.stop, batch_size=batch_size,
            image_size=self.image_size, workers=self._workers,
            skips=self._eval_skips,
        )  # fmt: skip

    def record(self) -> dict[str, Any]:
        """``meta``: source, counts, image size and the class index (wnids)."""
        return {"name": self.name, **self.meta}

    def describe(self) -> str:
        """One line: counts, classes, source, image size."""
        return (
            f"imagenet: {len(self.train)} train / {self.n_eval} eval images "
            f"(of {len(self.val)} val), {self.num_classes} classes, "
            f"{self.meta['source']} at {self.root}, {self.image_size}x"
            f"{self.image_size} uint8 crops"
        )
