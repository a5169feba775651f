"""Storage tiers: a fast node-local one and a persistent one, laid out alike.

``<root>/rank{r}/<step>/`` is rank r's shard of a step (an Orbax checkpoint),
``<root>/manifest.json`` lists the globally committed steps. Orbax writes
``<step>.orbax-checkpoint-tmp`` and renames it when complete; a flush writes
``<step>.flush-tmp`` and renames it. Names that are not plain integers are
never read, so a crash's leftovers are harmless, and :func:`clean_rank_dir`
removes them.

The fast tier is node-local, so on a shared node it sits where other users
could plant a folder or a link first: it is a *private* tier
(``research/privdir.py``). Its root is created ``0700`` and checked (ours, a
real folder, writable by nobody else) before every use: when opened
(:func:`open_fast_tier`), before each write and flush, and before a restore
reads it (:func:`agree_private`); its files are created ``0600``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
from pathlib import Path

from research import privdir
from research.checkpoint.integrity import remove_tree


@dataclasses.dataclass(frozen=True)
class Tier:
    """One storage level: ``name`` ("fast" or "persistent") and its root folder.

    ``private``: the root must pass ``privdir.check`` before every use, and
    files in it are created ``0600`` (the node-local fast tier).
    """

    name: str
    root: Path
    private: bool = False

    def problem(self) -> str | None:
        """Why this private tier must not be used now (one line), or None."""
        if not self.private:
            return None
        why = privdir.problem(self.root)
        return None if why is None else f"refusing {self.root}: {why}"

    def check(self) -> None:
        """Raise ``privdir.NotPrivateError`` when :meth:`problem` finds one."""
        why = self.problem()
        if why is not None:
            raise privdir.NotPrivateError(why)

    def rank_dir(self, rank: int) -> Path:
        return self.root / f"rank{rank}"

    def step_dir(self, rank: int, step: int) -> Path:
        return self.rank_dir(rank) / str(step)

    @staticmethod
    def rel(rank: int, step: int) -> str:
        """Shard path relative to a tier root, as recorded in the manifest."""
        return f"rank{rank}/{step}"


def default_fast_root(persistent_root: str | os.PathLike) -> Path:
    """A node-local folder for the fast tier, the same on every rank of a node.

    ``ckpt-<hash>`` in this user's private folder (``privdir.base()``:
    ``/dev/shm/research-<user>``, 0700, where it can be had), the hash derived
    from the persistent path so a resumed job finds its fast tier.
    """
    digest = hashlib.sha1(str(Path(persistent_root).resolve()).encode()).hexdigest()
    # Where versions before the private folder kept it (a killed run's is
    # memory nobody else frees): removed when it is ours, never followed.
    legacy = privdir.SHM / f"research-ckpt-{privdir.user_name()}-{digest[:12]}"
    if privdir.problem(legacy) is None:
        remove_tree(legacy)
    return privdir.base() / f"ckpt-{digest[:12]}"


def open_fast_tier(
    fast_dir: str | os.PathLike | None, persistent_root: str | os.PathLike
) -> tuple[Tier | None, str | None]:
    """The fast tier for ``fast_dir`` (``"auto"``, a folder, or None: none).

    The folder is created ``0700`` when absent and checked private (an
    existing one must be ours and writable by nobody else). Local to this rank:
    returns ``(tier, None)``, or ``(None, problem)`` with the problem in one
    line for the caller to agree on with the other ranks (``agree_private``).
    """
    if not fast_dir:
        return None, None
    try:
        if fast_dir == "auto":
            root = default_fast_root(persistent_root)
        else:
            root = Path(fast_dir).absolute()
        return Tier("fast", privdir.make(root), private=True), None
    except privdir.NotPrivateError as e:
        return None, f"{e}; remove it or choose another folder with --fast-dir"
    except OSError as e:
        return None, f"cannot create the fast tier {fast_dir}: {e}"


def agree_private(comm, tiers: list[Tier], problem: str | None = None) -> str | None:
    """Every rank checks its private tiers; all learn every rank's problem.

    Collective over ``comm`` (an mpi4py communicator). Returns None when every
    rank's tiers are usable, else one line (``rank r: refusing <folder>: ...``)
    that every rank raises, so no rank reads or writes a refused tier and no
    rank is left waiting in a collective another never joins.
    """
    if problem is None:
        problem = next((p for t in tiers if (p := t.problem())), None)
    by_problem: dict[str, list[int]] = {}
    for r, p in enumerate(comm.allgather(problem)):
        if p:
            by_problem.setdefault(p, []).append(r)
    if not by_problem:
        return None
    return "; ".join(
        f"rank{'s' * (len(rs) > 1)} {', '.join(map(str, rs))}: {p}"
        for p, rs in by_problem.items()
    )


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
