"""Private folders for what the project puts in shared places of a node.

Cluster nodes are shared between users, and ``/dev/shm`` and ``$TMPDIR`` are
writable by all of them: a name in them that others can predict (the fast
tier, the transfer files between a rank and its writer) is a name another user
can take first, as a folder they own or a link to somewhere else. So
everything node-local the project writes lives under one folder per user,
:func:`base`:

1. ``/dev/shm/research-<user>`` (memory; the fast tier's purpose; another
   memory file system with ``$RESEARCH_SHM_DIR``, e.g. where a container's
   ``/dev/shm`` is small), else
2. ``$XDG_RUNTIME_DIR/research`` where the system provides that folder, else
3. ``$TMPDIR/research-<user>`` (``/tmp`` without ``$TMPDIR``),

the first one that is private, created ``0700`` when absent. A folder is
private when it is a real folder (not a symbolic link), belongs to this
process's effective user, and neither its group nor others may write in it
(:func:`problem`, the one definition of the check). The check runs every time
a folder is used, not only when it is created: a candidate that fails it is
refused with one line naming it and what is wrong (a warning, and the next
candidate is used), and a folder the user named (``--fast-dir``) that fails it
is an error (:class:`NotPrivateError`). Files are created ``0600`` with
``O_CREAT | O_EXCL | O_NOFOLLOW`` (:func:`create_file`): a link planted at the
name is never followed. Sweeps of leftovers remove only files this user owns
(:func:`owned`).

Usage::

    from research import privdir

    root = privdir.base()                 # e.g. /dev/shm/research-alice, 0700
    fd = privdir.create_file(root / "x")  # 0600, fails on a planted link
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
import tempfile
import warnings
from pathlib import Path

#: Where node-local data goes first (memory), unless ``$RESEARCH_SHM_DIR``.
SHM = Path("/dev/shm")


def shm_dir() -> Path:
    """``$RESEARCH_SHM_DIR``, else ``/dev/shm``."""
    return Path(os.environ.get("RESEARCH_SHM_DIR") or SHM)


class NotPrivateError(PermissionError):
    """A folder that must be private is not; the message is one line naming it."""


class PrivateDirWarning(UserWarning):
    """A candidate folder was refused (named, with why) and another one used."""


def user_name(uid: int | None = None) -> str:
    """The name of ``uid`` (default: the effective user), or the number."""
    uid = os.geteuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # no passwd entry in some containers
        return str(uid)


def problem(path: str | os.PathLike, *, allow_root: bool = False) -> str | None:
    """What makes ``path`` unfit as a private folder, in words, or None.

    Private: a folder (not a symbolic link to one) owned by this process's
    effective user (or root, with ``allow_root``), writable by neither its
    group nor others.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "it does not exist"
    except OSError as e:
        return f"it cannot be examined ({e.strerror or e})"
    if stat.S_ISLNK(st.st_mode):
        return f"it is a symbolic link (to {os.readlink(path)})"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a folder"
    me = os.geteuid()
    if st.st_uid != me and not (allow_root and st.st_uid == 0):
        return (
            f"it belongs to {user_name(st.st_uid)} (uid {st.st_uid}), not to you "
            f"({user_name(me)}, uid {me})"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"others may write in it (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def check(path: str | os.PathLike, *, allow_root: bool = False) -> Path:
    """``path`` when it is private (see :func:`problem`).

    Raises:
      NotPrivateError: one line naming the folder and what is wrong.
    """
    why = problem(path, allow_root=allow_root)
    if why is not None:
        raise NotPrivateError(f"refusing {os.fspath(path)}: {why}")
    return Path(path)


def make(path: str | os.PathLike) -> Path:
    """Create ``path`` (``0700``, missing parents as ``mkdir -p`` would) unless it
    exists, then :func:`check` it: an existing folder must be private already."""
    path = Path(path)
    with contextlib.suppress(FileExistsError):
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, 0o700)  # umask can only take bits away
    return check(path)


def candidates() -> list[Path]:
    """The folders :func:`base` may use, in order of preference (see the module)."""
    user = user_name()
    out = []
    shm = shm_dir()
    if shm.is_dir():
        out.append(shm / f"research-{user}")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    # Only where the system made it for us: a value exported from another node
    # may name a folder that is missing here or is not ours.
    if xdg and os.path.isabs(xdg) and problem(xdg) is None:
        out.append(Path(xdg) / "research")
    out.append(Path(tempfile.gettempdir()) / f"research-{user}")
    return out


def base() -> Path:
    """This user's private folder for node-local data, created and checked now.

    A candidate that exists and is not private (another user made it first, or
    it is writable by others) is refused with a :class:`PrivateDirWarning`
    naming it, and the next one is used.

    Raises:
      NotPrivateError: no candidate is usable (each one's problem, in one line).
    """
    refused = []
    for path in candidates():
        try:
            make(path)
        except NotPrivateError as e:
            refused.append(str(e))
            warnings.warn(str(e), PrivateDirWarning, stacklevel=2)
        except OSError as e:  # not writable here (read-only, full): not a refusal
            refused.append(f"cannot create {path}: {e.strerror or e}")
        else:
            return path
    raise NotPrivateError(
        "; ".join(refused) + "; set TMPDIR to a folder of yours that others "
        "cannot write in"
    )


def existing_bases() -> list[Path]:
    """The candidates that exist and are private (for sweeps; creates nothing)."""
    return [p for p in candidates() if problem(p) is None]


def create_file(path: str | os.PathLike, mode: int = 0o600) -> int:
    """A new file at ``path`` opened for reading and writing, as a descriptor.

    ``O_CREAT | O_EXCL | O_NOFOLLOW``: fails (``FileExistsError``) when anything,
    a symbolic link included, is already at that name, so a planted link is
    never followed. The caller closes the descriptor.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, mode)


def owned(path: str | os.PathLike) -> bool:
    """Whether ``path`` itself (not what a link points to) belongs to this user."""
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    """``python -m research.privdir FOLDER...``: make each one private (0700
    when created) or print why it is refused, one line, and exit 1 (for
    shell scripts, so they apply the same check)."""
    import sys

    for path in sys.argv[1:] if argv is None else argv:
        try:
            make(path)
        except OSError as e:
            print(f"privdir: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
