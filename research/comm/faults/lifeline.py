"""Nothing left behind: a rank, a writer or an mpiexec dies with what started it.

A job is a tree: ``python -m experiments.X`` (the launcher) -> ``mpiexec`` ->
``hydra_pmi_proxy`` on each node (started over ssh, or our ``node-ssh``) ->
ranks -> checkpoint writer processes. Killing any level from outside
(SIGKILL, a node lost, the batch system) must not leave the levels below it
running, blocked in a collective forever:

* :func:`die_with_parent` (Linux ``PR_SET_PDEATHSIG``): the kernel sends
  SIGKILL to this process when its parent ends. Ranks set it when the world
  starts, so a proxy that dies takes its ranks with it; the launcher sets it for
  its ``mpiexec`` (:func:`lifeline_preexec`); writer processes set it for their
  rank (``research.checkpoint.writer``). The parent is the *thread* that forked,
  so it is set only for children forked from a thread that lives as long as
  the process (the main thread).
* :func:`parent_gone`: whether the process that started this one has gone
  (reparented since). The watchdog thread checks it every second, so a rank
  whose parent died before the kernel's signal could be armed still ends.

A local ``mpiexec`` killed with SIGKILL already takes its proxies and ranks with
it (the proxy sees its control connection close); a remote proxy behind a link
that is down cannot see that, and ends with its ranks once their watchdog fires.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1
_parent: int | None = None


def _prctl_pdeathsig(sig: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent ends.

    Also remembers the parent for :func:`parent_gone`, and exits at once when
    the parent has already gone (the signal would never come). True where the
    kernel took it (Linux).
    """
    global _parent
    parent = os.getppid()
    armed = _prctl_pdeathsig(sig)
    if os.getppid() != parent:  # gone before we could arm it
        os._exit(1)
    _parent = parent
    return armed


def parent_gone() -> bool:
    """True when the parent remembered by :func:`die_with_parent` has ended."""
    return _parent is not None and os.getppid() != _parent


def exit_orphaned(rank: int) -> None:
    """End a rank whose launcher is gone: one line, then ``os._exit`` (no MPI:
    the peers it would tell are as lost as its parent)."""
    print(
        f"r{rank} | its launcher (pid {_parent}) is gone: exiting",
        file=sys.stderr,
        flush=True,
    )
    os._exit(1)


def lifeline_preexec() -> Callable[[], None]:
    """A ``preexec_fn`` for a child that must not outlive this process (the
    launcher's mpiexec): SIGKILL when it ends.

    It runs in the child between fork and exec; the launcher calls ``Popen``
    from its main thread, which lives as long as the launcher does.
    """
    me = os.getpid()

    def arm() -> None:
        _prctl_pdeathsig(signal.SIGKILL)
        if os.getppid() != me:  # the launcher died before it was armed
            os._exit(1)

    return arm
