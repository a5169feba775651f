"""Bytes this process's communication moved: how the watchdog sees a slow link.

Two counters, both read by the watchdog thread while a wait is quiet, never on
the hot path:

* :func:`tcp_bytes`: payload bytes received and bytes acknowledged by the peer,
  summed over this process's TCP connections (``getsockopt(TCP_INFO)``:
  ``tcpi_bytes_received``, ``tcpi_bytes_acked``, Linux 4.6+). Ranks on
  different nodes talk TCP (UCX's ``tcp`` transport, Open MPI's ``btl/tcp``),
  so a collective crawling over a slow link shows here while it runs, however
  long it takes. Received bytes count from :data:`MIN_RECEIVED` on; acknowledged
  ones only from :data:`MIN_ACKED`: a frozen peer's kernel still acknowledges
  small messages (keep-alives) sent to it until its buffers are full.
* :func:`ring_bytes`: bytes the native ring allreduce (:mod:`research.comm.dense.ring`)
  has received so far, counted in its C code after every piece, so progress
  inside a jitted step is visible; :func:`ring_peers` the neighbours it is
  exchanging with right now.

Ranks of one node talk through shared memory, which no counter shows: there a
stall is a peer process that stopped, and only the collective's end counts.
"""

from __future__ import annotations

import os
import socket
import struct
import sys

#: Received bytes that count as progress (a keep-alive is tens of bytes).
MIN_RECEIVED = 16 * 1024
#: Acknowledged bytes that count as progress (see the module docstring).
MIN_ACKED = 64 * 1024
# struct tcp_info: tcpi_bytes_acked and tcpi_bytes_received (u64 each) follow
# 8 bytes of u8 fields, 24 u32 fields and pacing_rate, max_pacing_rate (u64).
_ACKED_AT = 120
_INFO_LEN = 136


def tcp_bytes() -> tuple[int, int] | None:
    """``(received, acknowledged)`` bytes over this process's TCP sockets, or
    None where the kernel does not say (no ``/proc``, an old kernel)."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    rx = ack = 0
    seen = False
    for name in fds:
        fd = int(name)
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if s.type != socket.SOCK_STREAM or s.family not in (
                socket.AF_INET,
                socket.AF_INET6,
            ):
                continue
            info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_LEN)
        except OSError:
            continue
        finally:
            s.close()
        if len(info) < _INFO_LEN:
            continue
        acked, received = struct.unpack_from("QQ", info, _ACKED_AT)
        rx, ack, seen = rx + received, ack + acked, True
    return (rx, ack) if seen else (0, 0)


def _ring_state() -> dict | None:
    ring = sys.modules.get("research.comm.dense.ring")
    if ring is None:
        return None
    return ring._state if "bytes" in ring._state else None


def ring_bytes() -> int | None:
    """Bytes the native ring received so far in this process (None: not loaded)."""
    state = _ring_state()
    return int(state["bytes"]()) if state else None


def ring_peers() -> tuple[int, int] | None:
    """``(prev, next)``: the ranks a ring allreduce in progress receives from
    and sends to (None: no ring allreduce running now)."""
    state = _ring_state()
    if not state:
        return None
    packed = int(state["peers"]())
    if packed < 0:
        return None
    return packed >> 32, packed & 0xFFFFFFFF


class NodeBoard:
    """When each rank of this node last saw its bytes move, in memory the
    node's ranks share (an MPI shared window over them).

    A rank waiting in shared memory for its node's leader, which moves the
    node's bytes over the network (MPICH's own allreduce across nodes, the
    hierarchical allreduce), has no bytes of its own to show; it reads the
    leader's here. Only this job's ranks write it: other traffic on the node
    never counts.

    Args:
      comm: the world's communicator (collective over it: a ``Split_type``
        and a shared window).
    """

    def __init__(self, comm) -> None:
        import numpy as np
        from mpi4py import MPI

        self.node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.index, n = self.node.Get_rank(), self.node.Get_size()
        self.win = MPI.Win.Allocate_shared(
            8 * n if self.index == 0 else 0, 8, comm=self.node
        )
        buf, _ = self.win.Shared_query(0)
        self.times = np.frombuffer(buf, dtype=np.float64, count=n)
        self.times[self.index] = 0.0
        self.node.Barrier()  # every slot written before anyone reads one

    def moved(self, when: float) -> None:
        """This rank's bytes moved at ``when`` (``time.monotonic()``)."""
        self.times[self.index] = when

    def latest(self) -> float:
        """The latest time any rank of the node saw its bytes move."""
        return float(self.times.max())
