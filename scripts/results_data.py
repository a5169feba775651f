"""Keeping a run's small files beside its results page (``scripts.results``).

A run folder holds far more than a page needs (timelines, checkpoints,
TensorBoard events, every step's metrics); :func:`place` copies what the
page's module keeps (``KEEP``), with ``run.json``, ``note.md`` and the
figures, into ``docs/results/NAME[/SECTION]/run<i>/``, and writes there
``files.json``: the run folder's name, what was kept (with sizes), what was
too big and what was left out (by name, counted).
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import tempfile
from pathlib import Path

#: Never copied, whatever a glob matches: timelines, checkpoints, events.
NEVER = ("trace.json", "trace-*.json", "checkpoints", "events.out.tfevents*",
         "plugins", "*.orbax-checkpoint-tmp", "*.tmp")  # fmt: skip
#: A kept file larger than this is left out (and said so in files.json).
MAX_FILE = 2 * 2**20


def _never(rel_path: str) -> bool:
    parts = rel_path.split("/")
    return any(fnmatch.fnmatch(p, pat) for p in parts for pat in NEVER)


def _kept(src: Path, keep: tuple[str, ...]) -> list[str]:
    names = {"run.json", "note.md"}
    for pattern in (*keep, "*.png"):
        names |= {p.relative_to(src).as_posix() for p in src.glob(pattern)}
    return sorted(n for n in names if (src / n).is_file() and not _never(n))


def copy_run(src: Path, dest: Path, keep: tuple[str, ...], note: str | None) -> None:
    """Copy ``src``'s small files into ``dest`` (made anew) and describe them."""
    kept, left = {}, {}
    names = _kept(src, keep)
    dest.mkdir(parents=True)
    for name in names:
        size = (src / name).stat().st_size
        if size > MAX_FILE and name not in keep:
            left[name] = f"{size} bytes, over {MAX_FILE}"
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / name, dest / name)
        kept[name] = size
    others: dict[str, int] = {}
    for p in sorted(src.rglob("*")):
        name = p.relative_to(src).as_posix()
        if p.is_file() and name not in kept and name not in left:
            base = p.name if not _never(name) else next(
                x for x in name.split("/") if any(fnmatch.fnmatch(x, n) for n in NEVER)
            )  # fmt: skip
            others[base] = others.get(base, 0) + 1
    record = {"run_folder": src.name, "kept": kept, "too_big": left,
              "left_out": others}  # fmt: skip
    (dest / "files.json").write_text(json.dumps(record, indent=1) + "\n")
    if note:
        (dest / "note.md").write_text(note.strip() + "\n")


def place(srcs: list[Path], base: Path, keep: tuple[str, ...], notes) -> list[Path]:
    """The data folders ``base/run1..N`` for ``srcs`` (in order): a source
    already there stays, the others are copied (``notes``: one per source);
    any other ``run*`` folder and figure left in ``base`` goes."""
    dests = [base / f"run{i}" for i in range(1, len(srcs) + 1)]
    with tempfile.TemporaryDirectory() as t:
        staged: list[Path | None] = []
        for src, dest, note in zip(srcs, dests, notes, strict=True):
            if src.absolute() == dest.absolute() and note is None:
                staged.append(None)
                continue
            tmp = Path(t) / dest.name
            if (src / "files.json").is_file():  # a data folder already: as it is
                shutil.copytree(src, tmp)
                if note:
                    (tmp / "note.md").write_text(note.strip() + "\n")
            else:
                copy_run(src, tmp, keep, note)
            staged.append(tmp)
        base.mkdir(parents=True, exist_ok=True)
        for child in base.iterdir():
            stale = re.fullmatch(r"run\d+", child.name) and child not in dests
            if stale or child.suffix == ".png":  # the layout before data were kept
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        for tmp, dest in zip(staged, dests, strict=True):
            if tmp is not None:
                if dest.exists():
                    shutil.rmtree(dest)
                shutil.move(str(tmp), dest)
    return dests
