"""ImageNet as ArrayRecord shards: the record, the manifest, the split, the check.

``python -m scripts.imagenet_to_arrayrecord SRC DST`` writes, for each split,
``DST/<split>-<i>-of-<n>.array_record`` (every record its own chunk,
``group_size:1``, so any record is one read: random access without listing
a million files on a parallel file system) and ``DST/manifest.json``:

.. code-block:: json

    {"format": "research-imagenet-arrayrecord", "version": 1,
     "classes": ["n01440764", ...],
     "splits": {"train": {"records": 1281167, "per_class": [1300, ...],
                          "shards": [{"file": "train-00000-of-00128.array_record",
                                      "records": 10010, "bytes": 1103415296,
                                      "sha256": "..."}, ...]},
                "val": {...}}}

A record is ``RIN1``, the label (int32, little-endian), the length of the
source file's name (uint16), the name (UTF-8, relative to SRC) and the image
file's bytes as they were. :func:`check_manifest` (run before any rank
starts) compares every shard's size and record count with the manifest,
which finds a truncated or replaced shard without reading it;
``scripts.imagenet_to_arrayrecord --verify`` also compares checksums.
"""

from __future__ import annotations

import bisect
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from research.data.base import DataError

MANIFEST = "manifest.json"
FORMAT = "research-imagenet-arrayrecord"
VERSION = 1
MAGIC = b"RIN1"
_HEAD = struct.Struct("<4siH")
#: ArrayRecord's writer options: one record per chunk, for random access.
WRITER_OPTIONS = "group_size:1"


def encode(label: int, name: str, data: bytes) -> bytes:
    """One record: label, source name and the image file's bytes."""
    raw = name.encode()
    return _HEAD.pack(MAGIC, label, len(raw)) + raw + data


def decode_record(record: bytes) -> tuple[int, str, bytes]:
    """``(label, name, image bytes)`` of a record.

    Raises:
      DataError: not a record of this format.
    """
    if len(record) < _HEAD.size or record[:4] != MAGIC:
        raise DataError("imagenet: an ArrayRecord record without the RIN1 header")
    _, label, n = _HEAD.unpack_from(record)
    start = _HEAD.size
    return label, record[start : start + n].decode(), record[start + n :]


def shard_name(split: str, i: int, n: int) -> str:
    """``train-00003-of-00128.array_record``."""
    return f"{split}-{i:05d}-of-{n:05d}.array_record"


def read_manifest(root: Path) -> dict[str, Any]:
    """The manifest of a shard folder.

    Raises:
      DataError: missing, unreadable or of another format.
    """
    path = root / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"imagenet: {path} not found") from None
    except (OSError, ValueError) as e:
        raise DataError(
            f"imagenet: {path} is not a readable manifest ({e}); convert again "
            "(python -m scripts.imagenet_to_arrayrecord SRC DST)"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(f"imagenet: {path} is not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise DataError(
            f"imagenet: {path} is version {manifest.get('version')}, this code "
            f"reads version {VERSION}; convert again"
        )
    for split in ("train", "val"):
        if split not in manifest.get("splits", {}):
            raise DataError(f"imagenet: {path} has no {split!r} split")
    if not manifest.get("classes"):
        raise DataError(f"imagenet: {path} names no classes")
    return manifest


def _reader(path: Path):
    from array_record.python.array_record_module import ArrayRecordReader

    return ArrayRecordReader(str(path))


def check_manifest(root: Path) -> dict[str, Any]:
    """The manifest, after checking each shard's size and record count.

    Raises:
      DataError: the first shard that is missing, truncated or changed.
    """
    manifest = read_manifest(root)
    for split, info in manifest["splits"].items():
        total = 0
        for shard in info["shards"]:
            path = root / shard["file"]
            if not path.is_file():
                raise DataError(
                    f"imagenet: shard {path} is missing ({MANIFEST} lists it)"
                )
            size = path.stat().st_size
            if size != shard["bytes"]:
                raise DataError(
                    f"imagenet: shard {path} is {size} bytes, {MANIFEST} says "
                    f"{shard['bytes']}: truncated or changed; convert it again"
                )
            try:
                got = _reader(path).num_records()
            except Exception as e:  # the reader raises its own kinds
                raise DataError(f"imagenet: shard {path} cannot be read: {e}") from None
            if got != shard["records"]:
                raise DataError(
                    f"imagenet: shard {path} holds {got} records, {MANIFEST} says "
                    f"{shard['records']}: truncated or changed; convert it again"
                )
            total += got
        if total != info["records"] or total == 0:
            raise DataError(
                f"imagenet: {root / MANIFEST}: the {split} shards hold {total} "
                f"records, the manifest says {info['records']}"
            )
    return manifest


@dataclass
class RecordSplit:
    """One split as ArrayRecord shards, read through Grain's data source.

    Attributes:
      root: the shard folder.
      shards: shard file names, in order.
      counts: records per shard.
    """

    root: Path
    shards: tuple[str, ...]
    counts: tuple[int, ...]
    _source: Any = field(default=None, repr=False)
    _starts: list[int] = field(default_factory=list, repr=False)

    @classmethod
    def from_manifest(cls, root: Path, info: dict[str, Any]) -> RecordSplit:
        shards = tuple(s["file"] for s in info["shards"])
        return cls(root, shards, tuple(int(s["records"]) for s in info["shards"]))

    def __len__(self) -> int:
        return sum(self.counts)

    def _open(self) -> Any:
        if self._source is None:
            import grain

            paths = [str(self.root / s) for s in self.shards]
            self._source = grain.sources.ArrayRecordDataSource(paths)
            self._starts = list(np.cumsum((0, *self.counts[:-1])))
        return self._source

    def example(self, i: int) -> tuple[bytes, int]:
        """The image file's bytes and the class index of record ``i``."""
        label, _, data = decode_record(self._open()[i])
        return data, label

    def where(self, i: int) -> str:
        """Record ``i``'s shard and index in it, for messages."""
        self._open()
        k = bisect.bisect_right(self._starts, i) - 1
        return f"{self.root / self.shards[k]} record {i - self._starts[k]}"
