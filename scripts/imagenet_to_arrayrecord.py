"""ImageNet's folder layout to ArrayRecord shards, resumable and checked.

    python -m scripts.imagenet_to_arrayrecord SRC DST [--per-shard 1250]
    python -m scripts.imagenet_to_arrayrecord --verify DST

SRC is the folder layout ``--dataset imagenet`` reads (``train/<wnid>/*.JPEG``;
``val/<wnid>/`` or a flat ``val/`` with its labels file,
``research/data/imagenet/layout.py``). DST gets, for each split, shards of
``--per-shard`` images each (the last one shorter), every image file's bytes
as they were with its label and name (``research/data/imagenet/records.py``),
in the folder source's order: record ``i`` is the folder source's example
``i``, so both sources give a run the same batches. The class index (sorted
train wnids) goes into ``DST/manifest.json``, written last.

Resumable: each shard is written to a temporary name and renamed when whole,
with a small sidecar (``DST/.parts/<shard>.json``: records, bytes, sha256)
beside it; run the same command again after an interruption and it keeps
the finished shards whose sidecar matches and writes the rest. Checked: the
manifest is assembled from the sidecars after every shard was read back
(record count); ``--verify DST`` compares every shard's size and sha256 with
the manifest (``--dataset imagenet`` checks sizes and counts at start-up).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from research.data.base import DataError
from research.data.imagenet import layout, records

PARTS = ".parts"
PLAN = "plan.json"
DEFAULT_PER_SHARD = 1250  # ImageNet's train split: 1,025 shards of ~140 MB


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _plan(src: Path, classes: list[str], splits: dict[str, Any], per: int) -> dict:
    """What a conversion writes: a resumed one must find the same plan."""
    return {
        "src": str(src.resolve()),
        "per_shard": per,
        "classes": classes,
        "splits": {name: len(split) for name, split in splits.items()},
    }


def _write_shard(split: Any, lo: int, hi: int, path: Path) -> dict[str, Any]:
    """Examples ``[lo, hi)`` of ``split`` as one shard at ``path`` (atomic)."""
    from array_record.python.array_record_module import (
        ArrayRecordReader,
        ArrayRecordWriter,
    )

    tmp = path.with_name(path.name + ".tmp")
    writer = ArrayRecordWriter(str(tmp), records.WRITER_OPTIONS)
    try:
        for i in range(lo, hi):
            data, label = split.example(i)
            writer.write(records.encode(label, split.files[i], data))
    finally:
        writer.close()
    reader = ArrayRecordReader(str(tmp))
    got = reader.num_records()
    reader.close()
    if got != hi - lo:
        raise DataError(f"{tmp}: wrote {hi - lo} records, read back {got}")
    os.replace(tmp, path)
    return {
        "file": path.name,
        "records": hi - lo,
        "bytes": path.stat().st_size,
        "sha256": _sha256(path),
    }


def _done(dst: Path, name: str, records_due: int) -> dict[str, Any] | None:
    """A finished shard's sidecar, if it and the shard agree with the plan."""
    side = dst / PARTS / f"{name}.json"
    shard = dst / name
    try:
        info = json.loads(side.read_text())
    except (OSError, ValueError):
        return None
    if info.get("records") != records_due or not shard.is_file():
        return None
    if shard.stat().st_size != info.get("bytes"):
        return None
    return info


def convert(src: Path, dst: Path, per_shard: int, val_labels: str | None) -> dict:
    """Writes (or completes) the shards and the manifest; returns the manifest."""
    classes, train, val = layout.scan_folder(src, val_labels)
    splits = {"train": train, "val": val}
    dst.mkdir(parents=True, exist_ok=True)
    (dst / PARTS).mkdir(exist_ok=True)
    plan = _plan(src, classes, splits, per_shard)
    plan_path = dst / PARTS / PLAN
    if plan_path.is_file():
        old = json.loads(plan_path.read_text())
        if old != plan:
            raise DataError(
                f"{dst} holds a conversion of another source or --per-shard "
                f"({plan_path}); give an empty DST or the same SRC and options"
            )
    else:
        plan_path.write_text(json.dumps(plan))
    (dst / records.MANIFEST).unlink(missing_ok=True)  # written last, when whole
    total = len(train) + len(val)
    done_images, t0, out = 0, time.perf_counter(), {}
    for name, split in splits.items():
        n = len(split)
        count = max(1, -(-n // per_shard))
        shards, kept = [], 0
        for i in range(count):
            lo, hi = i * per_shard, min(n, (i + 1) * per_shard)
            file = records.shard_name(name, i, count)
            info = _done(dst, file, hi - lo)
            if info is None:
                info = _write_shard(split, lo, hi, dst / file)
                (dst / PARTS / f"{file}.json").write_text(json.dumps(info))
            else:
                kept += 1
            shards.append(info)
            done_images += hi - lo
            rate = done_images / max(time.perf_counter() - t0, 1e-9)
            print(
                f"{name}: shard {i + 1}/{count} ({done_images}/{total} images, "
                f"{rate:.0f} images/s, {kept} kept from before)",
                file=sys.stderr,
                flush=True,
            )
        per_class = [int((split.labels == k).sum()) for k in range(len(classes))]
        out[name] = {"records": n, "per_class": per_class, "shards": shards}
    manifest = {
        "format": records.FORMAT,
        "version": records.VERSION,
        "source": str(src.resolve()),
        "classes": classes,
        "splits": out,
    }
    tmp = dst / (records.MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, dst / records.MANIFEST)
    records.check_manifest(dst)  # sizes and counts, as a run checks them
    return manifest


def verify(dst: Path) -> int:
    """Every shard's size, count and sha256 against the manifest; the shards."""
    manifest = records.check_manifest(dst)
    n = 0
    for info in manifest["splits"].values():
        for shard in info["shards"]:
            got = _sha256(dst / shard["file"])
            if got != shard["sha256"]:
                raise DataError(
                    f"imagenet: shard {dst / shard['file']} has sha256 {got[:12]}..., "
                    f"{records.MANIFEST} says {shard['sha256'][:12]}...: changed "
                    "since conversion; convert again"
                )
            n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m scripts.imagenet_to_arrayrecord",
        description=__doc__.split("\n\n")[0],
        epilog="Run again after an interruption: finished shards are kept.",
    )
    p.add_argument("src", nargs="?", help="the folder layout (train/, val/)")
    p.add_argument("dst", nargs="?", help="the shard folder to write")
    p.add_argument(
        "--per-shard", type=int, default=DEFAULT_PER_SHARD,
        help="images per shard; default %(default)s",
    )  # fmt: skip
    p.add_argument(
        "--val-labels", default=None,
        help="a flat val/'s labels file (default: val_labels.txt)",
    )  # fmt: skip
    p.add_argument(
        "--verify", metavar="DST", default=None,
        help="check a shard folder's sizes and checksums, write nothing",
    )  # fmt: skip
    args = p.parse_args(argv)
    try:
        if args.verify:
            if args.src or args.dst:
                p.error("--verify DST takes no SRC DST")
            n = verify(Path(args.verify))
            print(f"{args.verify}: {n} shards match {records.MANIFEST}")
            return 0
        if not (args.src and args.dst):
            p.error("give SRC DST (or --verify DST)")
        if args.per_shard < 1:
            p.error(f"--per-shard must be >= 1, got {args.per_shard}")
        src, dst = Path(args.src), Path(args.dst)
        if not src.is_dir():
            p.error(f"SRC {src} is not a folder")
        if dst.resolve() == src.resolve():
            p.error("DST must differ from SRC")
        t0 = time.perf_counter()
        manifest = convert(src, dst, args.per_shard, args.val_labels)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    shards = sum(len(s["shards"]) for s in manifest["splits"].values())
    counts = ", ".join(f"{k} {v['records']}" for k, v in manifest["splits"].items())
    print(
        f"{dst}: {shards} shards ({counts} images, {len(manifest['classes'])} "
        f"classes) in {time.perf_counter() - t0:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
