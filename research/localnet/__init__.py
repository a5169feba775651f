"""A cluster on one box: nodes as network namespaces joined by shaped links.

A *node* here is what a cluster node is to MPI: its own hostname, its own
``/dev/shm`` (memory that only its processes share) and one network interface
whose bytes cross a link of a set rate. It is made of

* a network namespace ``<name>-<host>`` with ``eth0`` (a veth pair whose other end
  is a port of the bridge ``<name>-br`` in the root namespace) and ``lo``;
* a *holder* process, ``sleep infinity`` inside that network namespace and in
  new UTS, IPC and mount namespaces: the hostname is the host's name, ``/dev/shm``
  is a tmpfs of the node's own, System V IPC is the node's own. Everything that
  runs on the node enters the holder's namespaces (``nsenter``), so a job's ranks
  and a later job on the same node see the same ``/dev/shm``;
* ``tc tbf`` on both ends of the veth: each node's link carries ``rate`` bits per
  second in each direction, like a full-duplex NIC. This kernel has no ``netem``,
  so there is no added latency: a message costs what the veth, the bridge and
  TCP cost (measured in ``docs/results/network.md``).

Addresses: every address lives inside a namespace this module made (the nodes'
``eth0``, ``10.X.Y.Z/24``); the bridge and the root-side veths get none (and no
IPv6 link-local either), so the box's own network is never touched. Names
resolve through ``/etc/netns/<name>-<host>/hosts``, which ``ip netns exec``
mounts over ``/etc/hosts`` in the node.

MPI across the nodes: MPICH's ``mpiexec`` runs on the first node (as a batch
script runs on a job's first node) with ``-launcher ssh -launcher-exec
scripts/cluster/node-ssh -iface eth0``; ``node-ssh`` stands in for ssh and
enters the node named like the host. ``UCX_TLS=tcp,self``: otherwise UCX finds
shared memory across the namespaces and no byte crosses the link; ranks of one
node still talk through MPICH's own shared memory in their node's ``/dev/shm``.
Open MPI's ``mpirun`` (a site MPI, ``scripts/install.sh --site-mpi``) needs
``--mca plm_rsh_agent node-ssh``, ``--mca oob_tcp_if_include eth0``, ``--mca
btl_tcp_if_include eth0`` and ``--mca btl tcp,self,vader``
(:meth:`Cluster.openmpi_args`); Debian's Open MPI 4.1 ran across the nodes so.

The package: :mod:`~research.localnet.cluster` (nodes, their state, faults),
:mod:`~research.localnet.hosts` (host lists for launchers), ``__main__`` (the
command line).

Usage (root; ``scripts/cluster/localnet.sh`` runs ``python -m research.localnet``)::

    scripts/cluster/localnet.sh up 2 --rate 1gbit   # nodes n1, n2
    scripts/cluster/localnet.sh status
    .venv/bin/python -m experiments.train --hosts n1,n2 --np 4
    scripts/cluster/localnet.sh rate n2 10gbit       # change a link while it runs
    scripts/cluster/localnet.sh link n2 down         # faults: link, freeze, kill
    scripts/cluster/localnet.sh down                 # removes all of it

The state (nodes, holders' pids, rate) is kept in ``/run/research-localnet/<name>``
(``RESEARCH_LOCALNET_DIR`` names it for the launcher and ``node-ssh``).
"""

from research.localnet.cluster import (
    DEFAULT_NAME,
    DIR_ENV,
    MPI_ENV,
    NODE_SSH,
    STATE_ROOT,
    Cluster,
    LocalnetError,
    Node,
    check_can_run,
    down,
    parse_rate,
    tbf_args,
    up,
)
from research.localnet.hosts import find_cluster, parse_hosts

__all__ = [
    "DEFAULT_NAME",
    "DIR_ENV",
    "MPI_ENV",
    "NODE_SSH",
    "STATE_ROOT",
    "Cluster",
    "LocalnetError",
    "Node",
    "check_can_run",
    "down",
    "find_cluster",
    "parse_hosts",
    "parse_rate",
    "tbf_args",
    "up",
]
