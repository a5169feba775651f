"""The hierarchical allreduce: within each node, then between nodes, then back.

Three collectives on three communicators, every byte crossing the network once
per node instead of once per rank:

1. ``MPI_Reduce`` (sum) within each node to the node's first rank (its
   *leader*), over shared memory;
2. ``MPI_Allreduce`` (sum) among the leaders, one per node, over the network;
3. ``MPI_Bcast`` within each node from its leader.

It is exact at any layout, uneven nodes included (2 + 1 ranks): every rank ends
with the leader's bits. Its sum is ordered differently from the ring's and
MPI's flat allreduce (node by node), so the three differ in the last bits of a
float sum; a run keeps one path throughout (:mod:`research.comm.dense.choose`).

Horovod's hierarchical allreduce and NCCL's trees over nodes are the same idea;
they also split the node's buffer among its ranks so that every rank's NIC
works (reduce-scatter in the node, one allreduce per local rank between nodes,
allgather in the node), which needs the same number of ranks on every node.
Here a node has one link (``research/localnet.py``), so the leader form loses
nothing and takes any layout.

On the host the buckets of one average are pipelined (:func:`host_allreduce_all`):
every bucket's reduce in the node is started at once (``MPI_Ireduce``), each
leader starts a bucket's allreduce between nodes as soon as its reduce is done
and its broadcast as soon as that is done, so the node's shared-memory phases
of one bucket overlap the network phase of another. Inside ``jit`` (mpi4jax
has no non-blocking calls) the three run one after the other per bucket.

Usage::

    comms = NodeComms.split(comm)           # collective over comm, once
    host_allreduce(buf, comms)              # numpy buffer, summed in place
    host_allreduce_all(bufs, comms)         # several, pipelined
    y = jit_allreduce(x, comms)             # inside jax.jit (mpi4jax)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpi4py import MPI


@dataclass(frozen=True)
class NodeComms:
    """This rank's node communicator and, on a node's leader, the leaders'.

    Attributes:
      node: the ranks of this rank's node (``Split_type(SHARED)``), the leader
        (lowest rank of the parent communicator) first.
      leaders: one rank per node (None on the other ranks).
    """

    node: MPI.Intracomm
    leaders: MPI.Intracomm | None

    @property
    def is_leader(self) -> bool:
        return self.node.Get_rank() == 0

    @classmethod
    def split(cls, comm: MPI.Intracomm) -> NodeComms:
        """Split ``comm`` into nodes and leaders (collective over ``comm``)."""
        rank = comm.Get_rank()
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        node.Set_name(f"{comm.Get_name()}.node")
        color = 0 if node.Get_rank() == 0 else MPI.UNDEFINED
        leaders = comm.Split(color, key=rank)
        if leaders == MPI.COMM_NULL:
            leaders = None
        else:
            leaders.Set_name(f"{comm.Get_name()}.leaders")
        return cls(node=node, leaders=leaders)


def host_allreduce(buf: Any, comms: NodeComms, op: MPI.Op = MPI.SUM) -> None:
    """Sum the numpy buffer ``buf`` over every rank of the parent communicator,
    in place, hierarchically."""
    if comms.is_leader:
        comms.node.Reduce(MPI.IN_PLACE, buf, op=op, root=0)
        if comms.leaders is not None and comms.leaders.Get_size() > 1:
            comms.leaders.Allreduce(MPI.IN_PLACE, buf, op=op)
    else:
        comms.node.Reduce(buf, None, op=op, root=0)
    comms.node.Bcast(buf, root=0)


def host_allreduce_all(bufs: list[Any], comms: NodeComms, op: MPI.Op = MPI.SUM) -> None:
    """Sum every numpy buffer of ``bufs`` in place, hierarchically, pipelined.

    The calls on each communicator come in bucket order on every rank (MPI
    matches non-blocking collectives by order). A non-leader posts a bucket's
    broadcast only once its reduce has sent the bucket (a buffer must not be
    written while a send from it is pending).
    """
    node, leaders = comms.node, comms.leaders
    if comms.is_leader:
        reduces = [node.Ireduce(MPI.IN_PLACE, b, op=op, root=0) for b in bufs]
    else:
        reduces = [node.Ireduce(b, None, op=op, root=0) for b in bufs]
    across = leaders is not None and leaders.Get_size() > 1
    bcasts: list[Any] = []
    if not comms.is_leader:
        for req, b in zip(reduces, bufs):
            req.Wait()
            bcasts.append(node.Ibcast(b, root=0))
        MPI.Request.Waitall(bcasts)
        return
    sums: list[Any] = []
    for i, (req, b) in enumerate(zip(reduces, bufs)):
        req.Wait()
        sums.append(leaders.Iallreduce(MPI.IN_PLACE, b, op=op) if across else None)
        # Broadcast, in order, every earlier bucket whose sum is complete.
        while len(bcasts) < i and (
            sums[len(bcasts)] is None or sums[len(bcasts)].Test()
        ):
            bcasts.append(node.Ibcast(bufs[len(bcasts)], root=0))
    for j in range(len(bcasts), len(bufs)):
        if sums[j] is not None:
            sums[j].Wait()
        bcasts.append(node.Ibcast(bufs[j], root=0))
    MPI.Request.Waitall(bcasts)


def jit_allreduce(x: Any, comms: NodeComms, op: MPI.Op = MPI.SUM) -> Any:
    """The sum of ``x`` over every rank, hierarchically, inside ``jax.jit``
    (mpi4jax's reduce, allreduce and bcast, in one ordered chain)."""
    import mpi4jax

    x = mpi4jax.reduce(x, op=op, root=0, comm=comms.node)
    if comms.is_leader and comms.leaders is not None and comms.leaders.Get_size() > 1:
        x = mpi4jax.allreduce(x, op=op, comm=comms.leaders)
    return mpi4jax.bcast(x, root=0, comm=comms.node)
