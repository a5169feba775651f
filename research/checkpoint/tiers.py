"""Storage tiers: a fast node-local one and a persistent one, laid out alike.

``<root>/rank{r}/<step>/`` is rank r's shard of a step (an Orbax checkpoint),
``<root>/manifest.json`` lists the globally committed steps. Orbax writes
``<step>.orbax-checkpoint-tmp`` and renames it when complete; a flush writes
``<step>.flush-tmp`` and renames it. Names that are not plain integers are
never read, so a crash's leftovers are harmless, and :func:`clean_rank_dir`
removes them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import hashlib
import os
import tempfile
from pathlib import Path

from research.checkpoint.integrity import remove_tree


@dataclasses.dataclass(frozen=True)
class Tier:
    """One storage level: ``name`` ("fast" or "persistent") and its root folder."""

    name: str
    root: Path

    def rank_dir(self, rank: int) -> Path:
        return self.root / f"rank{rank}"

    def step_dir(self, rank: int, step: int) -> Path:
        return self.rank_dir(rank) / str(step)

    @staticmethod
    def rel(rank: int, step: int) -> str:
        """Shard path relative to a tier root, as recorded in the manifest."""
        return f"rank{rank}/{step}"


def default_fast_root(persistent_root: str | os.PathLike) -> Path:
    """A node-local folder for the fast tier, the same on every rank of a job.

    ``/dev/shm`` (memory) when writable, else ``$TMPDIR``; the subfolder is
    derived from the persistent path so a resumed job finds its fast tier.
    """
    base = Path("/dev/shm")
    if not (base.is_dir() and os.access(base, os.W_OK)):
        base = Path(os.environ.get("TMPDIR") or tempfile.gettempdir())
    digest = hashlib.sha1(str(Path(persistent_root).resolve()).encode()).hexdigest()[
        :12
    ]
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        user = str(os.getuid())
    return base / f"research-ckpt-{user}-{digest}"


def local_steps(tier: Tier, rank: int) -> list[int]:
    """Steps whose shard directory this rank has (committed locally), ascending."""
    d = tier.rank_dir(rank)
    if not d.is_dir():
        return []
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit() and p.is_dir())


def clean_rank_dir(tier: Tier, rank: int, keep: set[int]) -> list[Path]:
    """Remove this rank's temporary leftovers and every step not in ``keep``."""
    d = tier.rank_dir(rank)
    removed: list[Path] = []
    if not d.is_dir():
        return removed
    for p in d.iterdir():
        if p.name.isdigit() and int(p.name) in keep:
            continue
        remove_tree(p)
        removed.append(p)
    return removed


def dir_bytes(path: str | os.PathLike) -> int:
    """Total size of the files under ``path`` (0 when absent)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(dirpath, f))
    return total
