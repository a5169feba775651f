"""Asynchronous parameter server: the baseline eager-SGD beats by 2.64x (PPoPP'20).

Rank ``root`` holds the parameters. Every rank (the root too) is a worker: it
pushes its gradient and pulls the parameters back, waiting only for the server,
never for the other workers. The server applies each push at once with the
optimizer it was bound to, so a worker's gradient is stale by the number of
updates other workers made since it pulled (``info.staleness``).

Usage::

    ps = ParameterServer(world.comm)
    ps.bind(params, update)          # every rank; update(params, grads) -> params
    for step in range(n):
        params, info = ps.push_pull(grads)
    params, info = ps.finish()       # collective: final parameters on every rank
    ps.close()

How it runs: the server is a task polled on the root's shared progress thread
(``research.comm.asynchronous.progress``): each poll probes for pushes (``Improbe``),
applies them and sends the parameters back; the thread sleeps between polls, woken at
once by the root's own push, which its worker hands over in memory. Workers wait
with sleeping tests (``wait_all``), never in a busy-polling blocking MPI call.
``finish``: each worker sends "done"; when the server has all of them, it
broadcasts the final parameters (``Ibcast``), so every message sent is received
before the end.

On an emulated link (``link="10gbps"``, :mod:`research.comm.link`) the
server's network port is the bottleneck a real one would be: each remote push
occupies the server's inbound direction for ``n / B + L`` after the previous
one, and is applied only when its transfer would have ended; each reply
occupies the outbound direction the same way and is sent only then (the port
is full duplex). The root's own worker hands its gradient over in memory and
pays nothing. The final broadcast in ``finish`` is not emulated (once per run).

With an optimizer as update, scale it for P pushes per step: a rate of lr / P and
a schedule P times as long keep the per-example rate of synchronous SGD
(:func:`optimizer_update` builds the update from an optax-style optimizer).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from mpi4py import MPI

from research.comm.asynchronous.progress import Poll, Task, get_progress, wait_all
from research.comm.dense.fusion import FlatLayout
from research.comm.faults import watchdog
from research.comm.info import CommInfo
from research.comm.link import Link
from research.trace import get_tracer

_TAG_PUSH, _TAG_PULL, _TAG_DONE = 11, 12, 13

Update = Callable[[Any, Any], Any]


def optimizer_update(tx: Any, params: Any) -> Update:
    """A server update from an optax-style ``tx`` (``init``/``update``), jitted.

    The optimizer state lives in the closure: the server is its only caller.
    """
    state = {"opt": tx.init(params)}

    @jax.jit
    def _step(params, opt_state, grads):
        updates, opt_state = tx.update(grads, opt_state, params)
        return jax.tree_util.tree_map(lambda p, u: p + u, params, updates), opt_state

    def update(params: Any, grads: Any) -> Any:
        params, state["opt"] = _step(params, state["opt"], grads)
        return params

    return update


class ParameterServer:
    """Asynchronous parameter server on rank ``root`` (see module docstring).

    Args:
      comm: an ``MPI.Intracomm`` or a ``World``; duplicated here (collective).
      root: the rank that holds the parameters (and also works).
      max_sleep: longest sleep between probes while idle, seconds.
      link: an emulated link for the server's port (a :class:`Link` or a spec
        such as ``"10gbps"``; ``"real"``: none). See the module docstring.
    """

    def __init__(
        self,
        comm: Any,
        *,
        root: int = 0,
        max_sleep: float = 5e-4,
        link: Link | str | None = "real",
    ) -> None:
        base = getattr(comm, "comm", comm)
        self._comm: MPI.Intracomm = base.Dup()
        self._comm.Set_name("research.ps")
        self.rank, self.size, self.root = (
            self._comm.Get_rank(),
            self._comm.Get_size(),
            root,
        )
        if not 0 <= root < self.size:
            raise ValueError(f"root must be a rank in 0..{self.size - 1}, got {root}")
        self._max_sleep = max_sleep
        self.link = Link.parse(link)
        self._tmpl: FlatLayout | None = None
        self._version = 0  # version of the parameters this worker holds
        self._finished = False
        self._closed = False
        # Root only: the server's state, shared with the root's compute thread.
        self._cond = threading.Condition()
        self._inbox: list[tuple[str, np.ndarray | None]] = []
        self._reply: tuple[np.ndarray, int, int] | None = None
        self._error: BaseException | None = None
        self._stop = False
        self._params: Any = None
        self._update: Update | None = None
        self._server_version = 0
        self._done = 0
        self._sends: list[tuple[MPI.Request, np.ndarray]] = []
        # Emulated link only: (time the transfer ends, source, buffer) in order,
        # and when the port's inbound and outbound directions are next free.
        self._arriving: list[tuple[float, int, np.ndarray]] = []
        self._leaving: list[tuple[float, int, np.ndarray]] = []
        self._in_free = self._out_free = 0.0
        self._final: np.ndarray | None = None
        self._bcast: MPI.Request | None = None
        self._stopped = threading.Event()

    @property
    def is_server(self) -> bool:
        return self.rank == self.root

    # -- public -------------------------------------------------------------------
    def bind(self, params: Any, update: Update) -> None:
        """Give the initial parameters (identical on every rank) and the update.

        Every rank calls it; only the root keeps ``params`` and runs ``update``
        (``update(params, grads) -> params``) on its progress thread.
        """
        if self._tmpl is not None:
            raise RuntimeError("ParameterServer.bind() called twice")
        self._tmpl = FlatLayout(params, extra=1)
        if self.is_server:
            self._params, self._update = params, update
            get_progress().add(_ServerTask(self))

    def push_pull(self, grads: Any) -> tuple[Any, CommInfo]:
        """Push this worker's gradient; return the parameters after its update.

        Returns:
          ``(params, info)``: ``info.round`` is the server version after this
          update, ``info.staleness`` how many other updates landed between this
          worker's last pull and its push, ``info.wait_s`` the time waiting.
        """
        tmpl = self._check_open()
        flat = tmpl.pack(grads, [float(self._version)])
        t0 = time.perf_counter()
        if self.is_server:
            with self._cond:
                self._inbox.append(("push", flat))
                get_progress().wake()
                with watchdog.watch("ps push-pull (own server)"):
                    while self._reply is None:
                        self._raise_if_failed()
                        self._cond.wait(0.5)
                params, version, staleness = self._reply
                self._reply = None
        else:
            reply = np.empty(tmpl.n + 1, tmpl.wire)
            reqs = [
                self._comm.Isend(flat, self.root, _TAG_PUSH),
                self._comm.Irecv(reply, self.root, _TAG_PULL),
            ]
            wait_all(reqs, what="ps push-pull", peers=[self.root])
            params, version = reply[:-1], int(reply[-1])
            staleness = version - 1 - self._version
        waited = time.perf_counter() - t0
        self._version = version
        info = CommInfo(
            bytes=int(flat.nbytes),
            contributors=1,
            staleness=staleness,
            wait_s=waited,
            round=version,
            extra={"server": self.root},
        )
        return tmpl.unpack(params), info

    def finish(self) -> tuple[Any, CommInfo]:
        """Collective end: the server's final parameters on every rank."""
        tmpl = self._check_open()
        t0 = time.perf_counter()
        if self.is_server:
            with self._cond:
                self._inbox.append(("done", None))
                get_progress().wake()
                with watchdog.watch("ps finish", detail="every worker's done"):
                    while self._final is None:
                        self._raise_if_failed()
                        self._cond.wait(0.5)
                final = self._final
        else:
            final = np.empty(tmpl.n + 1, tmpl.wire)
            done = np.zeros(1, np.int64)
            peers = [self.root]
            wait_all(
                [self._comm.Isend(done, self.root, _TAG_DONE)],
                what="ps done",
                peers=peers,
            )
            wait_all([self._comm.Ibcast(final, root=self.root)], what="ps final bcast")
        self._finished = True
        self._version = int(final[-1])
        info = CommInfo(
            bytes=int(final.nbytes),
            contributors=0,
            staleness=0,
            wait_s=time.perf_counter() - t0,
            round=self._version,
            extra={"server": self.root, "final": True},
        )
        return tmpl.unpack(final[:-1]), info

    def close(self) -> None:
        """Stop the server task and free the communicator. Idempotent.

        After :meth:`finish` this is local; before it, a worker still pushing
        would wait forever, so call ``finish`` on every rank first.
        """
        if self._closed:
            return
        self._closed = True
        if self.is_server and self._tmpl is not None:
            self._stop = True
            get_progress().wake()
            if not get_progress().in_thread:
                self._stopped.wait(5.0)
        if self._finished:
            self._comm.Free()

    def __enter__(self) -> ParameterServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- helpers ------------------------------------------------------------------
    def _check_open(self) -> FlatLayout:
        if self._closed or self._finished:
            raise RuntimeError("ParameterServer is finished or closed")
        if self._tmpl is None:
            raise RuntimeError("ParameterServer.bind(params, update) must come first")
        with self._cond:
            self._raise_if_failed()
        return self._tmpl

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(
                f"parameter server failed: {self._error}"
            ) from self._error

    # -- the server (root's progress thread) ----------------------------------------
    def _serve(self) -> bool:
        """One pass: local push, remote push, done messages, sends. True: progress."""
        if self._bcast is not None:
            return self._bcast.Test() or False
        progressed = False
        with self._cond:
            item = self._inbox.pop(0) if self._inbox else None
        if item is not None:
            kind, flat = item
            if kind == "push":
                params, version, staleness = self._apply(flat)
                with self._cond:
                    self._reply = (params, version, staleness)
                    self._cond.notify_all()
            else:
                self._done += 1
            progressed = True
        status = MPI.Status()
        msg = self._comm.Improbe(MPI.ANY_SOURCE, _TAG_PUSH, status)
        if msg is not None:
            buf = np.empty(self._tmpl.n + 1, self._tmpl.wire)
            msg.Recv(buf)
            self._arrive(status.Get_source(), buf)
            progressed = True
        now = time.perf_counter()
        while self._arriving and self._arriving[0][0] <= now:
            _, source, buf = self._arriving.pop(0)
            params, version, _ = self._apply(buf)
            reply = np.concatenate([params, [version]]).astype(self._tmpl.wire)
            self._leave(source, reply)
            progressed = True
        now = time.perf_counter()
        while self._leaving and self._leaving[0][0] <= now:
            _, source, reply = self._leaving.pop(0)
            self._sends.append((self._comm.Isend(reply, source, _TAG_PULL), reply))
            progressed = True
        msg = self._comm.Improbe(MPI.ANY_SOURCE, _TAG_DONE, status)
        if msg is not None:
            msg.Recv(np.empty(1, np.int64))
            self._done += 1
            progressed = True
        self._sends = [(r, b) for r, b in self._sends if not r.Test()]
        pending = self._sends or self._arriving or self._leaving
        if self._done == self.size and not pending:
            final = self._tmpl.pack(self._params, [float(self._server_version)])
            self._bcast = self._comm.Ibcast(final, root=self.root)
            with self._cond:
                self._final = final
                self._cond.notify_all()
            progressed = True
        return progressed

    def _arrive(self, source: int, buf: np.ndarray) -> None:
        """Queue a received push until its emulated transfer ends (now if real)."""
        start = max(time.perf_counter(), self._in_free)
        self._in_free = start + self.link.p2p(buf.nbytes)
        self._arriving.append((self._in_free, source, buf))

    def _leave(self, source: int, reply: np.ndarray) -> None:
        """Queue a reply until the outbound direction would have sent it."""
        start = max(time.perf_counter(), self._out_free)
        self._out_free = start + self.link.p2p(reply.nbytes)
        self._leaving.append((self._out_free, source, reply))

    def _apply(self, flat: np.ndarray) -> tuple[np.ndarray, int, int]:
        t0 = time.perf_counter()
        staleness = self._server_version - int(flat[-1])
        grads = self._tmpl.unpack(flat[:-1])
        self._params = self._update(self._params, grads)
        self._server_version += 1
        params = self._tmpl.pack(self._params)[:-1]
        get_tracer().complete(
            "ps update",
            "comm-bg",
            t0,
            time.perf_counter(),
            version=self._server_version,
            staleness=staleness,
        )
        return params, self._server_version, staleness


class _ServerTask(Task):
    """The root's server loop as a task polled on its progress thread."""

    def __init__(self, ps: ParameterServer) -> None:
        self.ps = ps
        self.max_sleep = ps._max_sleep

    def poll(self) -> Poll:
        ps = self.ps
        if ps._stop:
            ps._stopped.set()
            return Poll.FINISHED
        if not ps._serve():
            return Poll.IDLE
        if ps._bcast is not None and ps._bcast.Test():
            ps._stopped.set()
            return Poll.FINISHED
        return Poll.PROGRESSED

    def fail(self, exc: BaseException) -> None:
        with self.ps._cond:
            self.ps._error = exc
            self.ps._cond.notify_all()
        self.ps._stopped.set()
