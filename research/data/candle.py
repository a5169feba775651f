"""CANDLE Pilot1 benchmarks NT3 and P1B2 from their CSV files.

NT3 (normal vs tumor, 2 classes): ``nt_train2.csv`` (1120 rows) and
``nt_test2.csv`` (280 rows), headerless; column 0 is the class (0 or 1), columns
1..60483 are expression values. CANDLE's ``nt3.py`` reads them with
``pd.read_csv(header=None)`` and max-abs scales the features.

P1B2 (cancer type from somatic SNPs, 10 classes): ``P1B2.train.csv`` (3000 rows)
and ``P1B2.test.csv`` (1000 rows) have a header row. CANDLE's ``p1b2.py`` reads
them with ``pd.read_csv`` (header inferred), takes the class from the column named
``cancer_type``, drops ``case_id`` and ``cancer_type`` and keeps the rest as
features (``iloc[:, 2:]`` in its ``load_data2``: column 0 is ``case_id``, column 1
``cancer_type``, then 28204 features). This loader finds both columns by name, so
it also reads files whose column order differs. CANDLE one-hot encodes the class
with ``pd.get_dummies`` (sorted distinct values); here integer classes are kept
as they are and other values are numbered in sorted order.

Both loaders fit the scaling on the training split only (CANDLE fits it on train
and test together, which leaks test statistics).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from research.data.base import DataError, Dataset, register
from research.data.csv_table import read_table

NT3_FILES = ("nt_train2.csv", "nt_test2.csv")
NT3_HOW = (
    "download nt_train2.csv and nt_test2.csv from "
    "ftp://ftp.mcs.anl.gov/pub/candle/public/benchmarks/Pilot1/normal-tumor/ "
    "into the data folder (--data-dir)"
)
P1B2_FILES = ("P1B2.train.csv", "P1B2.test.csv")
P1B2_HOW = (
    "download P1B2.train.csv and P1B2.test.csv from "
    "http://ftp.mcs.anl.gov/pub/candle/public/benchmarks/P1B2/ "
    "into the data folder (--data-dir)"
)
SCALINGS = ("std", "minmax", "maxabs", "none")


def _folder(dataset: str, path: str | None, how: str) -> Path:
    if path is None:
        raise DataError(f"{dataset}: no data folder given; {how}")
    root = Path(path).expanduser()
    if not root.is_dir():
        raise DataError(f"{dataset}: data folder {root} does not exist; {how}")
    return root


def _int_labels(
    labels: list[str], lines: list[int], file: Path, dataset: str, num_classes: int
) -> np.ndarray | None:
    """Labels as ints, or None if some label is not an integer."""
    out = np.empty(len(labels), dtype=np.int32)
    for k, (s, lineno) in enumerate(zip(labels, lines)):
        try:
            v = float(s)
        except ValueError:
            return None
        if not v.is_integer():
            return None
        if not 0 <= v < num_classes:
            raise DataError(
                f"{dataset}: {file} line {lineno}: label {s!r} is outside "
                f"[0, {num_classes}); pass num_classes if the data has more classes"
            )
        out[k] = int(v)
    return out


def _scale(train: np.ndarray, test: np.ndarray, kind: str) -> dict[str, Any]:
    """Scales both splits in place with statistics of ``train``."""
    if kind not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {kind!r}")
    if kind == "none":
        return {"scaling": kind}
    if kind == "std":
        shift, scale = train.mean(axis=0), train.std(axis=0)
    elif kind == "minmax":
        shift = train.min(axis=0)
        scale = train.max(axis=0) - shift
    else:
        shift, scale = np.zeros(train.shape[1], np.float32), np.abs(train).max(axis=0)
    # A constant feature (common in sparse SNP data) would divide by zero.
    scale = np.where(scale > 0, scale, 1).astype(np.float32)
    for x in (train, test):
        x -= shift.astype(np.float32)
        x /= scale
    return {"scaling": kind}


@register("candle_nt3")
def load_nt3(
    *,
    path: str | None = None,
    seed: int = 0,
    features: int | None = None,
    scaling: str = "maxabs",
    num_classes: int = 2,
) -> Dataset:
    """Loads CANDLE NT3 from ``nt_train2.csv`` and ``nt_test2.csv`` in ``path``.

    Reading the full files (about 0.8 GB of text) takes several seconds per file
    and peaks at twice the 0.3 GB of the float32 result.

    Args:
      path: folder holding both files.
      seed: ignored; the files fix the order.
      features: keep only the first this many features (laptop runs); all if None.
      scaling: ``"maxabs"`` (as CANDLE), ``"std"``, ``"minmax"`` or ``"none"``,
        fit on the training split.
      num_classes: labels must lie in ``[0, num_classes)``.

    Returns:
      Inputs of shape ``(features, 1)`` for NT3's Conv1D layers.

    Raises:
      DataError: missing or malformed file.
    """
    del seed
    root = _folder("candle_nt3", path, NT3_HOW)
    kw = dict(dataset="candle_nt3", how=NT3_HOW, header=False, label=0)
    split: list[tuple[np.ndarray, np.ndarray]] = []
    ncols = None
    for name in NT3_FILES:
        file = root / name
        # ncols: the test file must be as wide as the train file, even when only
        # the first `features` columns are kept.
        t = read_table(file, features=features, ncols=ncols, **kw)
        ncols = t.ncols
        y = _int_labels(t.labels, t.lines, file, "candle_nt3", num_classes)
        if y is None:
            bad = next(i for i, s in enumerate(t.labels) if not _is_int(s))
            raise DataError(
                f"candle_nt3: {file} line {t.lines[bad]} column 1: label "
                f"{t.labels[bad]!r} is not an integer class"
            )
        split.append((t.x, y))
    (tx, ty), (vx, vy) = split
    meta = {"path": str(root), "features": tx.shape[1], **_scale(tx, vx, scaling)}
    k = tx.shape[1]
    return Dataset(
        tx[:, :, None], ty, vx[:, :, None], vy, num_classes, "candle_nt3", (k, 1),
        meta=meta,
    )  # fmt: skip


def _is_int(s: str) -> bool:
    try:
        return float(s).is_integer()
    except ValueError:
        return False


@register("candle_p1b2")
def load_p1b2(
    *,
    path: str | None = None,
    seed: int = 0,
    features: int | None = None,
    scaling: str = "std",
    num_classes: int = 10,
) -> Dataset:
    """Loads CANDLE P1B2 from ``P1B2.train.csv`` and ``P1B2.test.csv`` in ``path``.

    Args:
      path: folder holding both files.
      seed: ignored; the files fix the order.
      features: keep only the first this many feature columns (CANDLE's
        ``feature_subsample``); all (28204) if None.
      scaling: ``"std"``, ``"minmax"``, ``"maxabs"`` or ``"none"``, fit on train.
      num_classes: integer classes must lie in ``[0, num_classes)``; named classes
        may number at most this many.

    Returns:
      Inputs of shape ``(features,)``; ``meta["classes"]`` maps class index to the
      file's value when classes are named.

    Raises:
      DataError: missing or malformed file, or a test class unseen in training.
    """
    del seed
    root = _folder("candle_p1b2", path, P1B2_HOW)
    kw = dict(
        dataset="candle_p1b2", how=P1B2_HOW, header=True, label="cancer_type",
        drop=("case_id",), features=features,
    )  # fmt: skip
    files = [root / name for name in P1B2_FILES]
    train = read_table(files[0], **kw)
    test = read_table(files[1], ncols=train.ncols, **kw)
    names, test_names = train.names, test.names
    if test_names != names:
        i = next(i for i, (a, b) in enumerate(zip(names, test_names)) if a != b)
        raise DataError(
            f"candle_p1b2: {files[1]} line 1: column {i + 1} is {test_names[i]!r} "
            f"but {names[i]!r} in {files[0].name}; both files need the same columns"
        )
    tx, tl, tlines = train.x, train.labels, train.lines
    vx, vl, vlines = test.x, test.labels, test.lines
    ty = _int_labels(tl, tlines, files[0], "candle_p1b2", num_classes)
    vy = _int_labels(vl, vlines, files[1], "candle_p1b2", num_classes)
    meta: dict[str, Any] = {"path": str(root), "features": tx.shape[1]}
    if ty is None or vy is None:
        classes = sorted(set(tl))
        if len(classes) > num_classes:
            raise DataError(
                f"candle_p1b2: {files[0]} has {len(classes)} distinct cancer_type "
                f"values, more than num_classes={num_classes}"
            )
        index = {c: i for i, c in enumerate(classes)}
        for s, lineno in zip(vl, vlines):
            if s not in index:
                raise DataError(
                    f"candle_p1b2: {files[1]} line {lineno}: cancer_type {s!r} "
                    f"does not occur in {files[0].name}"
                )
        ty = np.array([index[s] for s in tl], np.int32)
        vy = np.array([index[s] for s in vl], np.int32)
        meta["classes"] = classes
    meta.update(_scale(tx, vx, scaling))
    return Dataset(
        tx, ty, vx, vy, num_classes, "candle_p1b2", (tx.shape[1],), meta=meta
    )
