"""MPI start-up, the world object, dedicated communicators and fail-fast abort.

MPI is initialised once per process with thread level MULTIPLE so that the
progress thread (``research.comm.progress``) may call MPI while the main thread
computes. Every background activity gets its own duplicated communicator: messages
of different subsystems can then never match each other.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

import mpi4py

mpi4py.rc.thread_level = "multiple"
mpi4py.rc.finalize = True
from mpi4py import MPI  # noqa: E402

from research.comm import devices, watchdog  # noqa: E402
from research.comm.env import env_rank, env_size, launched_by_mpi  # noqa: E402,F401

#: Seconds an aborting rank waits after printing, so the launcher can forward it.
ABORT_GRACE_S = 0.5
#: Seconds ``MPI_Abort`` is given before the rank exits by itself: it may hang
#: when the network is gone (it tells the launcher, which is unreachable).
ABORT_FALLBACK_S = 10.0


@dataclass(frozen=True)
class Topology:
    """Where a world's ranks run: which ranks share a node (memory).

    A node is what ``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`` groups: the
    ranks that can share memory. Nodes are numbered in the order of their
    lowest rank; ``hostnames`` is ``MPI_Get_processor_name`` of every rank.
    """

    node_of: tuple[int, ...]  # node index of every rank
    hostnames: tuple[str, ...]  # every rank's host name

    @property
    def nodes(self) -> int:
        return max(self.node_of) + 1 if self.node_of else 1

    @property
    def node_sizes(self) -> tuple[int, ...]:
        return tuple(self.node_of.count(n) for n in range(self.nodes))

    def ranks_of(self, node: int) -> tuple[int, ...]:
        return tuple(r for r, n in enumerate(self.node_of) if n == node)

    def record(self) -> dict:
        """For ``config.json`` and ``summary.json``."""
        return {
            "nodes": self.nodes,
            "ranks_per_node": list(self.node_sizes),
            "hosts": [self.hostnames[self.ranks_of(n)[0]] for n in range(self.nodes)],
            "node_of_rank": list(self.node_of),
        }

    @classmethod
    def single(cls, size: int = 1) -> Topology:
        return cls(node_of=(0,) * size, hostnames=(MPI.Get_processor_name(),) * size)


def topology_of(comm: MPI.Intracomm) -> tuple[Topology, MPI.Intracomm]:
    """The topology of ``comm`` and this rank's node communicator (collective).

    The node communicator is a ``Split_type(SHARED)`` of ``comm``: ranks of one
    node, ordered as in ``comm``.
    """
    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    lowest = node_comm.allreduce(comm.Get_rank(), op=MPI.MIN)
    rows = comm.allgather((lowest, MPI.Get_processor_name()))
    order = sorted({low for low, _ in rows})
    node_of = tuple(order.index(low) for low, _ in rows)
    return Topology(node_of=node_of, hostnames=tuple(h for _, h in rows)), node_comm


@dataclass(frozen=True)
class World:
    """The processes of one job: ``comm`` (a private dup of COMM_WORLD), rank, size.

    ``topology`` says which ranks share a node; ``node_comm`` holds this rank's
    node (a ``Split_type(SHARED)`` of ``comm``). Both are None for a world made
    by hand from a communicator alone.
    """

    comm: MPI.Intracomm
    rank: int
    size: int
    topology: Topology | None = None
    node_comm: MPI.Intracomm | None = field(default=None, compare=False, repr=False)
    _dups: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, comm: MPI.Intracomm) -> World:
        """A World around ``comm`` (already private to it), topology included
        (collective over ``comm``)."""
        topology, node_comm = topology_of(comm)
        return cls(
            comm=comm,
            rank=comm.Get_rank(),
            size=comm.Get_size(),
            topology=topology,
            node_comm=node_comm,
        )

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def nodes(self) -> int:
        """How many nodes the ranks run on (1 when unknown)."""
        return self.topology.nodes if self.topology else 1

    @property
    def node(self) -> int:
        """This rank's node index (0 when unknown)."""
        return self.topology.node_of[self.rank] if self.topology else 0

    @property
    def local_rank(self) -> int:
        """This rank's index among the ranks of its node."""
        return self.node_comm.Get_rank() if self.node_comm is not None else self.rank

    @property
    def local_size(self) -> int:
        """Ranks on this rank's node."""
        return self.node_comm.Get_size() if self.node_comm is not None else self.size

    def dup(self, name: str) -> MPI.Intracomm:
        """A communicator dedicated to one subsystem, created once per name.

        ``Dup`` is collective: every rank must ask for the same names in the same
        order (subsystems do so at construction, which all ranks run alike).
        """
        if name not in self._dups:
            comm = self.comm.Dup()
            comm.Set_name(f"research.{name}")
            self._dups[name] = comm
        return self._dups[name]

    def barrier(self) -> None:
        with watchdog.watch("world.barrier"):
            self.comm.Barrier()

    def allgather(self, obj):
        with watchdog.watch("world.allgather"):
            return self.comm.allgather(obj)

    def bcast(self, obj, root: int = 0):
        with watchdog.watch("world.bcast", peers=None if self.rank == root else [root]):
            return self.comm.bcast(obj, root=root)

    def log(self, *msg: object, all_ranks: bool = False) -> None:
        """Print with a rank prefix (``r0 | ...``); by default only rank 0 prints."""
        if all_ranks or self.rank == 0:
            print(f"r{self.rank} |", *msg, flush=True)


#: ``RESEARCH_ABORT_ON_ERROR=0`` keeps :func:`get_world` from installing the
#: abort hook (for a program that handles every rank's failures itself).
ABORT_ENV = "RESEARCH_ABORT_ON_ERROR"


def get_world(comm_timeout: float | str | None = None) -> World:
    """The world of this process; initialises MPI (thread level MULTIPLE) once.

    In a world of more than one rank it also installs
    :func:`install_abort_on_error`, so an uncaught exception on any rank ends the
    job instead of leaving the other ranks inside a collective forever (unless
    ``RESEARCH_ABORT_ON_ERROR=0``), and starts the communication watchdog
    (:mod:`research.comm.watchdog`): a wait that makes no progress for
    ``comm_timeout`` seconds (``"auto"``, the default: 180 s or 10x the slowest
    step; ``"off"``) ends the job with exit code 124. A world of one is left
    alone: nothing can wait for it. A rank started by a launcher dies with its
    parent (:mod:`research.comm.lifeline`).
    """
    world = _the_world()
    if comm_timeout is not None:
        watchdog.configure(comm_timeout)
    return world


@functools.lru_cache(maxsize=1)
def _the_world() -> World:
    if not MPI.Is_initialized():  # pragma: no cover - mpi4py initialises on import
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    from research.comm.malloc import keep_heap

    keep_heap()  # steps reuse their large buffers instead of faulting them in
    comm = MPI.COMM_WORLD.Dup()
    comm.Set_name("research.world")
    started = env_size()
    if started is not None and started > 1 and comm.Get_size() == 1:
        # srun without a PMI plugin MPI understands starts N singletons, each a
        # world of its own: N copies of the run writing into one folder.
        print(
            f"r{env_rank()} | error: the launcher started {started} processes but "
            "MPI sees a world of 1: under srun pass --mpi=pmi2 (or the plugin "
            "your MPI was built for, e.g. pmix); check `srun --mpi=list`",
            file=sys.stderr,
            flush=True,
        )
        os._exit(2)
    world = World.of(comm)
    if world.size > 1 and os.environ.get(ABORT_ENV, "1") != "0":
        install_abort_on_error()
    # One GPU per rank of a node, before JAX starts (research.comm.devices).
    devices.bind(world.local_rank, world.local_size)
    _start_watchdog(world)
    return world


def _start_watchdog(world: World) -> None:
    """Die with the launcher; watch communication (collective: a Dup)."""
    if launched_by_mpi():
        from research.comm import lifeline

        lifeline.die_with_parent()
    if world.size > 1 and watchdog.start(world.comm) is not None:
        # Registered after mpi4py's own handler, so it runs before MPI_Finalize.
        atexit.register(watchdog.stop)


#: Worlds wrapped around user communicators by :func:`as_world`, by handle.
_WRAPPED: dict[int, World] = {}


def as_world(where: World | MPI.Comm) -> World:
    """``where`` as a :class:`World`, so averagers take either.

    A World (or an object with its ``rank``, ``size`` and ``dup``) is returned
    as it is. An ``mpi4py`` intracommunicator
    (``MPI.COMM_WORLD``, or a sub-communicator of the ranks to average over)
    becomes a World around a private ``Dup`` of it, made once per communicator
    (collective over it the first time: every rank of it must make the same
    call), and, as :func:`get_world` does, installs the abort hook when it has
    more than one rank (``RESEARCH_ABORT_ON_ERROR=0`` opts out).

    Raises:
      TypeError: ``where`` is neither.
    """
    if isinstance(where, World) or all(
        hasattr(where, a) for a in ("rank", "size", "dup")
    ):
        return where  # a World, or an object that behaves as one
    if not isinstance(where, MPI.Intracomm):
        raise TypeError(
            f"expected a research World (get_world()) or an mpi4py "
            f"intracommunicator such as MPI.COMM_WORLD, got {type(where).__name__}"
        )
    key = MPI._handleof(where)
    if key not in _WRAPPED:
        comm = where.Dup()
        comm.Set_name("research.world")
        _WRAPPED[key] = World.of(comm)
        if comm.Get_size() > 1 and os.environ.get(ABORT_ENV, "1") != "0":
            install_abort_on_error()
        _start_watchdog(_WRAPPED[key])
    return _WRAPPED[key]


def abort(code: int = 1) -> None:
    """End the whole job now: MPI_Abort in a real world, ``os._exit`` when alone.

    First unlinks the MPICH shared-memory files this rank has mapped: an
    aborted job never reaches MPI_Finalize, which would remove them, and
    /dev/shm is memory. The other ranks keep their mappings (unlink only
    removes the name), so nothing breaks while the job is taken down.

    ``MPI_Abort`` may hang where the network is gone: the rank then exits by
    itself :data:`ABORT_FALLBACK_S` seconds later (:func:`exit_later`).
    """
    exit_later(code, ABORT_FALLBACK_S)
    with contextlib.suppress(ValueError, OSError):
        sys.stdout.flush()
        sys.stderr.flush()
    _unlink_my_shm()
    if (
        MPI.Is_initialized()
        and not MPI.Is_finalized()
        and MPI.COMM_WORLD.Get_size() > 1
    ):
        # The launcher forwards each rank's output through pipes and kills the
        # job as soon as it hears of the abort: give it a moment to forward
        # what this rank just printed (the traceback that says why), which was
        # otherwise lost now and then on a loaded machine.
        time.sleep(ABORT_GRACE_S)
        MPI.COMM_WORLD.Abort(code)
    os._exit(code)


def exit_later(code: int, seconds: float) -> None:
    """``os._exit(code)`` after ``seconds``, whatever this process is doing.

    A daemon thread does it; should no thread run again (a C call holding the
    GIL), the kernel's SIGALRM ends the process 5 s later (exit 142), where
    nothing else handles SIGALRM.
    """

    def later() -> None:
        time.sleep(seconds)
        os._exit(code)

    threading.Thread(target=later, name="research-exit-later", daemon=True).start()
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None):
            signal.alarm(int(seconds) + 5)


def _unlink_my_shm() -> None:
    from research.comm.env import SHM_DIR, SHM_PREFIXES

    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines:
        path = line.partition(f" {SHM_DIR}/")[2].removesuffix(" (deleted)")
        if path.startswith(SHM_PREFIXES):
            # Another rank of the node may have removed it first.
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(SHM_DIR, path))


def _from_mpi(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an exception it was raised from, is MPI's own error:
    mpi4py's, or the ring allreduce's (its message says so, see
    :data:`research.comm.failures.RING_MPI_ERROR`)."""
    from research.comm.failures import RING_MPI_ERROR

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, MPI.Exception) or RING_MPI_ERROR in str(exc):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def install_abort_on_error() -> None:
    """Make an uncaught exception in any thread of any rank end the whole job.

    Without this, one rank dying leaves the others blocked in a collective until
    the batch system's time limit. The traceback is printed with a rank prefix
    first, then MPI_Abort takes every rank down with a non-zero exit.
    """
    rank = MPI.COMM_WORLD.Get_rank() if MPI.Is_initialized() else env_rank()

    def _report(kind: str, exc_type, exc, tb) -> None:
        lines = "".join(traceback.format_exception(exc_type, exc, tb)).rstrip()
        prefixed = "\n".join(f"r{rank} | {line}" for line in lines.splitlines())
        print(
            f"r{rank} | {kind}: aborting the job\n{prefixed}",
            file=sys.stderr,
            flush=True,
        )

    def _record(exc_type, exc) -> None:
        from research.comm import failures

        line = "".join(traceback.format_exception_only(exc_type, exc)).strip()
        cause = failures.MPI_ERROR if _from_mpi(exc) else "exception"
        failures.record(cause, line.splitlines()[-1] if line else "", rank=rank)

    def _hook(exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt):
            abort(130)
        _report("uncaught exception", exc_type, exc, tb)
        _record(exc_type, exc)
        abort(1)

    def _thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        _report(
            f"uncaught exception in thread {args.thread.name if args.thread else '?'}",
            args.exc_type,
            args.exc_value,
            args.exc_traceback,
        )
        _record(args.exc_type, args.exc_value)
        abort(1)

    sys.excepthook = _hook
    threading.excepthook = _thread_hook
