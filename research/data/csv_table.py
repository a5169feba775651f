"""A validating reader of numeric CSV tables with one label column.

Every problem is a :class:`~research.data.base.DataError` naming the file, line and
column: a missing file, a header without the label column, a ragged row, a
non-numeric or non-finite cell. A first pass in Python checks each row's width and
collects the label cells; the numbers then come from ``np.loadtxt`` (numpy's C
parser), or from Python when only a narrow prefix of a wide file is kept. Only the
kept feature columns are parsed, so a bad cell outside them goes unnoticed.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from research.data.base import DataError


class Table(NamedTuple):
    """A CSV file read by :func:`read_table`.

    Attributes:
      x: float32 features, ``(rows, kept feature columns)``.
      labels: the label cell of each row, as text.
      lines: 1-based line number of each row, for error messages.
      names: the header's column names, None without a header.
      ncols: the file's column count.
    """

    x: np.ndarray
    labels: list[str]
    lines: list[int]
    names: list[str] | None
    ncols: int


def read_table(
    file: Path,
    *,
    dataset: str,
    how: str,
    header: bool,
    label: str | int,
    drop: tuple[str, ...] = (),
    features: int | None = None,
    ncols: int | None = None,
) -> Table:
    """Reads a comma-separated table of one label column and numeric features.

    Args:
      file: the CSV file.
      dataset: name used in error messages.
      how: how to get the file, appended to the "not found" message.
      header: whether line 1 names the columns.
      label: label column, by name (needs ``header``) or by 0-based index.
      drop: names of further non-feature columns (e.g. ``case_id``).
      features: keep only the first this many feature columns.
      ncols: required column count (e.g. that of the matching train file).

    Returns:
      The :class:`Table`.

    Raises:
      DataError: missing file, bad header, ragged row, non-numeric or non-finite
        cell, or no rows; the message names the file and the line.
    """
    if not file.exists():
        raise DataError(f"{dataset}: {file} not found; {how}")
    where = f"{dataset}: {file}"
    scan = _scan(file, where, header, label, drop, features, ncols)
    if scan.parser is None:
        raise DataError(f"{where} has no data rows; {how}")
    if scan.rows is not None:
        x = np.stack(scan.rows)
    else:
        x = _loadtxt(file, where, header, scan.parser)
    if x.shape[0] != len(scan.lines):
        raise DataError(f"{where}: read {x.shape[0]} rows but found {len(scan.lines)}")
    return Table(x, scan.labels, scan.lines, scan.names, scan.parser.ncols)


def _loadtxt(file: Path, where: str, header: bool, parser: _RowParser) -> np.ndarray:
    # numpy's C parser is 2-3x faster than splitting lines in Python, which
    # matters for the 60484-column NT3 files; when it fails, the Python parser
    # finds the line and column to report.
    cols = parser.cols
    try:
        x = np.loadtxt(
            file,
            dtype=np.float32,
            delimiter=",",
            comments=None,
            skiprows=int(header),
            usecols=range(cols.start, cols.stop) if isinstance(cols, slice) else cols,
            ndmin=2,
            encoding="utf-8",
        )
    except ValueError as e:
        _locate_error(file, parser)
        raise DataError(f"{where}: {e}") from e
    if not np.isfinite(x).all():
        _locate_error(file, parser)
        raise DataError(f"{where}: non-finite values")  # not reached: located above
    return x


def _blank(line: str) -> bool:
    # isspace stops at the first visible character; strip() would copy 0.5 MB.
    return not line or line.isspace()


class _Scan(NamedTuple):
    labels: list[str]
    lines: list[int]
    names: list[str] | None
    parser: _RowParser | None  # None when the file has no data rows
    rows: list[np.ndarray] | None  # parsed here when only a narrow prefix is kept


def _scan(
    file: Path,
    where: str,
    header: bool,
    label: str | int,
    drop: tuple[str, ...],
    features: int | None,
    ncols: int | None,
) -> _Scan:
    """Checks the header and every row's width and collects the label cells.

    When only a narrow prefix of the columns is kept (``features`` set small),
    also parses it: splitting off a prefix in Python beats letting ``loadtxt``
    tokenize every 60484-column line.
    """
    labels: list[str] = []
    lines: list[int] = []
    rows: list[np.ndarray] | None = None
    names: list[str] | None = None
    parser = None
    ref = "the training file" if ncols else ("the header" if header else "line 1")
    try:
        with open(file, encoding="utf-8", newline="") as f:
            for lineno, line in enumerate(f, start=1):
                if header and names is None:
                    names = [c.strip().strip('"') for c in line.rstrip().split(",")]
                    if ncols is not None and len(names) != ncols:
                        raise DataError(
                            f"{where} line 1: header has {len(names)} columns, "
                            f"expected {ncols} as in the training file"
                        )
                    ncols = len(names)
                    continue
                if _blank(line):
                    continue  # usually the trailing line; loadtxt skips it too
                if parser is None:
                    ncols = ncols or line.count(",") + 1
                    li, cols = _columns(where, names, ncols, label, drop, features)
                    parser = _RowParser(where, ncols, li, cols, header, ref)
                    rows = [] if parser.narrow else None
                labels.append(parser.label(lineno, line))
                lines.append(lineno)
                if rows is not None:
                    rows.append(parser.values(lineno, line))
    except UnicodeDecodeError as e:
        raise DataError(f"{where} is not a text CSV file ({e.reason})") from e
    except OSError as e:
        raise DataError(f"{where} cannot be read ({e.strerror})") from e
    return _Scan(labels, lines, names, parser, rows)


def _locate_error(file: Path, parser: _RowParser) -> None:
    """Parses ``file`` row by row in Python and raises the first located error."""
    with open(file, encoding="utf-8", newline="") as f:
        for lineno, line in enumerate(f, start=1):
            if not _blank(line) and not (parser.header and lineno == 1):
                parser.values(lineno, line.rstrip("\r\n"))


class _RowParser:
    """Splits one CSV line into its label cell and features, with located errors."""

    def __init__(
        self,
        where: str,
        ncols: int,
        li: int,
        cols: slice | list[int],
        header: bool,
        ref: str,
    ) -> None:
        self.where, self.ncols, self.li, self.cols = where, ncols, li, cols
        self.header, self.ref = header, ref
        # Splitting only as far as needed keeps a 512-feature read of a
        # 60484-column file fast; the full column count is checked separately.
        stop = max(cols.stop, li + 1) if isinstance(cols, slice) else ncols
        self.maxsplit = stop if stop < ncols else -1
        self.narrow = 4 * stop < ncols

    def label(self, lineno: int, line: str) -> str:
        """Checks the row's width and returns its label cell."""
        n = line.count(",") + 1  # a trailing newline holds no comma
        if n != self.ncols:
            raise DataError(
                f"{self.where} line {lineno}: ragged row of {n} columns; "
                f"expected {self.ncols} as in {self.ref}"
            )
        return line.split(",", self.li + 1)[self.li].strip().strip('"')

    def values(self, lineno: int, line: str) -> np.ndarray:
        """The row's features; raises DataError naming the first bad cell."""
        parts = line.split(",", self.maxsplit)
        cols = self.cols
        cells = parts[cols] if isinstance(cols, slice) else [parts[i] for i in cols]
        try:
            row = np.asarray(cells, dtype=np.float32)
            bad = -1 if np.isfinite(row).all() else int(np.argmin(np.isfinite(row)))
            what = "non-finite value"
        except ValueError:
            bad, what = _bad_cell(cells), "non-numeric cell"
        if bad >= 0:
            col = cols.start + bad if isinstance(cols, slice) else cols[bad]
            hint = "" if self.header or lineno > 1 else " (this format has no header)"
            raise DataError(
                f"{self.where} line {lineno} column {col + 1}: {what} "
                f"{cells[bad].strip()[:40]!r}; expected a number{hint}"
            )
        return row


def _columns(
    where: str,
    names: list[str] | None,
    ncols: int,
    label: str | int,
    drop: tuple[str, ...],
    features: int | None,
) -> tuple[int, slice | list[int]]:
    """Label column index and feature columns (a slice when contiguous)."""
    if isinstance(label, str):
        assert names is not None
        if label not in names:
            raise DataError(
                f"{where} line 1: header has no {label!r} column (starts "
                f"{','.join(names[:4])},...); expected the CANDLE header"
            )
        li = names.index(label)
        skip = {li} | {i for i, n in enumerate(names) if n in drop}
    else:
        li, skip = label, {label}
    cols = [i for i in range(ncols) if i not in skip]
    if not cols:
        raise DataError(f"{where}: no feature columns among {ncols} columns")
    if features is not None:
        if features < 1:
            raise ValueError(f"features must be >= 1 or None, got {features}")
        if features > len(cols):
            raise DataError(
                f"{where}: features={features} requested but the file has only "
                f"{len(cols)} feature columns"
            )
        cols = cols[:features]
    if cols == list(range(cols[0], cols[0] + len(cols))):
        return li, slice(cols[0], cols[0] + len(cols))
    return li, cols


def _bad_cell(cells: list[str]) -> int:
    """Index of the first cell that does not parse as a float."""
    for i, c in enumerate(cells):
        try:
            float(c)
        except ValueError:
            return i
    return -1
