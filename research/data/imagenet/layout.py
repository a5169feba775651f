"""Where ImageNet's images are: the folder layout, its labels, and the cheap check.

A data folder (``--data-dir``) is one of:

* the **folder layout**: ``train/<wnid>/*.JPEG`` (one folder per class, named
  by its WordNet id, e.g. ``n01440764``) and, for evaluation, either
  ``val/<wnid>/*.JPEG`` or a flat ``val/*.JPEG`` with a labels file: one
  ``FILE WNID`` (or ``FILE,WNID``) line per image, ``val_labels.txt`` beside
  ``val/`` unless ``--data-opt val_labels=PATH`` names another; Kaggle's
  ``LOC_val_solution.csv`` (``ImageId,PredictionString``) is read as well;
* **ArrayRecord shards** made from it by ``python -m scripts.imagenet_to_arrayrecord``:
  a ``manifest.json`` and its shards (``research/data/imagenet/records.py``).

The class index is the sorted list of train wnids, the same on every rank and
in every run (``config.json`` records it). Image files are the ones ending in
``.JPEG``, ``.jpeg``, ``.jpg`` or ``.png`` (any case); other files are ignored.

:func:`check_folder` is what the launcher runs before any rank starts
(``research/entry/cli.py``): it lists the class folders and opens each until it
finds one image, and reads the labels file, but lists no train image it does not
need; a problem is one line naming the file. :func:`scan_folder` lists every
image (each rank does, once): on a parallel file system prefer the shards.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from research.data.base import DataError

IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
LABEL_FILES = ("val_labels.txt", "LOC_val_solution.csv")
HOW = (
    "point --data-dir at a folder holding train/<wnid>/*.JPEG and val/ (see "
    "research/data/imagenet/layout.py), or at ArrayRecord shards with their "
    "manifest.json (python -m scripts.imagenet_to_arrayrecord)"
)


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_SUFFIXES) and not name.startswith(".")


@dataclass(frozen=True)
class FolderSplit:
    """One split of the folder layout: files and their class indices.

    Attributes:
      root: the data folder.
      files: paths relative to ``root``, in a fixed order.
      labels: class index of each file, int32.
    """

    root: Path
    files: tuple[str, ...]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.files)

    def example(self, i: int) -> tuple[bytes, int]:
        """The file's bytes and the class index of example ``i``."""
        with open(self.root / self.files[i], "rb") as f:
            return f.read(), int(self.labels[i])

    def where(self, i: int) -> str:
        """Example ``i``'s file, for messages."""
        return str(self.root / self.files[i])


def classes_of(root: Path) -> list[str]:
    """The sorted class folders (wnids) under ``root/train``.

    Raises:
      DataError: no ``train/`` or no class folder in it.
    """
    train = root / "train"
    if not train.is_dir():
        raise DataError(f"imagenet: {train} not found; {HOW}")
    wnids = sorted(e.name for e in os.scandir(train) if e.is_dir())
    if not wnids:
        raise DataError(
            f"imagenet: {train} holds no class folders (expected train/<wnid>/"
            "*.JPEG, one folder per class)"
        )
    return wnids


def _first_image(folder: Path) -> str | None:
    with os.scandir(folder) as it:
        for e in it:
            if _is_image(e.name) and e.is_file():
                return e.name
    return None


def _images(folder: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(folder) if _is_image(e.name))


def labels_file(root: Path, given: str | None) -> Path | None:
    """The flat val split's labels file: ``given`` (relative to ``root`` or
    absolute), else the first of :data:`LABEL_FILES` beside ``val/``."""
    if given:
        path = Path(given).expanduser()
        return path if path.is_absolute() else root / path
    for name in LABEL_FILES:
        if (root / name).is_file():
            return root / name
    return None


def read_labels(path: Path, wnids: list[str]) -> dict[str, int]:
    """``{file name: class index}`` from a labels file (see the module docstring).

    Raises:
      DataError: unreadable, a malformed line, or a wnid that is no train class.
    """
    index = {w: k for k, w in enumerate(wnids)}
    out: dict[str, int] = {}
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"imagenet: labels file {path} cannot be read: {e}") from None
    for n, line in enumerate(lines, start=1):
        line = line.strip()
        if not line or (n == 1 and line.lower().startswith("imageid")):
            continue
        parts = line.replace(",", " ").split()
        if len(parts) < 2:
            raise DataError(
                f"imagenet: {path}:{n}: expected 'FILE WNID', got {line[:60]!r}"
            )
        name, wnid = parts[0], parts[1]
        if wnid not in index:
            raise DataError(
                f"imagenet: {path}:{n}: {wnid!r} is not a class of train/ "
                f"({len(wnids)} classes, {wnids[0]} .. {wnids[-1]})"
            )
        if not _is_image(name):  # Kaggle's CSV names images without a suffix
            name += ".JPEG"
        out[name] = index[wnid]
    if not out:
        raise DataError(f"imagenet: labels file {path} lists no image")
    return out


def _val_layout(root: Path, wnids: list[str], labels: str | None):
    """``("folders", class folders)`` or ``("flat", labels file)``."""
    val = root / "val"
    if not val.is_dir():
        raise DataError(
            f"imagenet: {val} not found: evaluation needs val/<wnid>/*.JPEG or a "
            "flat val/ with a labels file (val_labels.txt)"
        )
    folders = sorted(e.name for e in os.scandir(val) if e.is_dir())
    if folders:
        known = set(wnids)
        for w in folders:
            if w not in known:
                raise DataError(
                    f"imagenet: {val / w} is not a class of train/ (a val folder "
                    "must be named as one of the train folders)"
                )
        return "folders", folders
    path = labels_file(root, labels)
    if path is None or not path.is_file():
        raise DataError(
            f"imagenet: {val} is flat (no class folders) and "
            f"{path or root / LABEL_FILES[0]} is missing: give a labels file of "
            "'FILE WNID' lines (--data-opt val_labels=PATH)"
        )
    return "flat", path


def check_folder(root: Path, labels: str | None = None) -> list[str]:
    """The cheap check of a folder layout (see the module docstring); returns
    the class wnids.

    Raises:
      DataError: the first problem, naming its file.
    """
    wnids = classes_of(root)
    for w in wnids:
        if _first_image(root / "train" / w) is None:
            raise DataError(
                f"imagenet: class folder {root / 'train' / w} holds no images "
                "(.JPEG); remove it or put its images back"
            )
    kind, where = _val_layout(root, wnids, labels)
    if kind == "folders":
        for w in where:
            if _first_image(root / "val" / w) is None:
                raise DataError(f"imagenet: {root / 'val' / w} holds no images")
    else:
        _match_flat(root, read_labels(where, wnids), where)
    return wnids


def _match_flat(root: Path, labels: dict[str, int], path: Path) -> list[str]:
    """The flat val images, sorted, each with a label; raises on a mismatch."""
    files = _images(root / "val")
    if not files:
        raise DataError(f"imagenet: {root / 'val'} holds no images")
    unlabelled = [f for f in files if f not in labels]
    if unlabelled:
        raise DataError(
            f"imagenet: {root / 'val' / unlabelled[0]} has no line in {path} "
            f"({len(unlabelled)} of {len(files)} val images unlabelled): the "
            "labels file does not match val/"
        )
    present = set(files)
    missing = [f for f in labels if f not in present]
    if missing:
        raise DataError(
            f"imagenet: {path} lists {missing[0]}, which is not in {root / 'val'} "
            f"({len(missing)} listed images missing): the labels file does not "
            "match val/"
        )
    return files


def scan_folder(
    root: Path, labels: str | None = None
) -> tuple[list[str], FolderSplit, FolderSplit]:
    """``(wnids, train, val)`` of a folder layout, every image listed.

    Raises:
      DataError: as :func:`check_folder`.
    """
    wnids = check_folder(root, labels)
    files, ys = [], []
    for k, w in enumerate(wnids):
        names = _images(root / "train" / w)
        files += [f"train/{w}/{n}" for n in names]
        ys += [k] * len(names)
    train = FolderSplit(root, tuple(files), np.asarray(ys, np.int32))
    kind, where = _val_layout(root, wnids, labels)
    files, ys = [], []
    if kind == "folders":
        index = {w: k for k, w in enumerate(wnids)}
        for w in where:
            names = _images(root / "val" / w)
            files += [f"val/{w}/{n}" for n in names]
            ys += [index[w]] * len(names)
    else:
        table = read_labels(where, wnids)
        names = _match_flat(root, table, where)
        files = [f"val/{n}" for n in names]
        ys = [table[n] for n in names]
    val = FolderSplit(root, tuple(files), np.asarray(ys, np.int32))
    return wnids, train, val
