"""Inside a job on the local cluster's nodes (tests/test_multinode.py launches it
at several layouts): the world knows its nodes, each node has its own /dev/shm,
bytes cross the shaped link, and the hierarchical allreduce is exact."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import jax
import numpy as np
import pytest

from research.comm.dense import FusedAllreduce, HostAllreduce
from tests.rank_trees import assert_mean, exact_mean, rank_tree

LAYOUT = [int(n) for n in os.environ["RESEARCH_EXPECTED_LAYOUT"].split(",")]


def test_the_world_knows_its_nodes(world):
    topo = world.topology
    assert topo.node_sizes == tuple(LAYOUT)
    assert world.nodes == len(LAYOUT)
    # Ranks are placed in blocks, node by node (research.localnet.parse_hosts).
    want = [n for n, size in enumerate(LAYOUT) for _ in range(size)]
    assert list(topo.node_of) == want
    assert world.node == want[world.rank]
    assert world.local_size == LAYOUT[world.node]
    assert world.local_rank == want[: world.rank].count(world.node)
    hosts = topo.record()["hosts"]
    assert hosts == [f"n{i + 1}" for i in range(len(LAYOUT))]
    assert socket.gethostname() == hosts[world.node]


def test_each_node_has_its_own_shm(world):
    marker = Path("/dev/shm") / f"research-test-node-{os.getpid()}"
    names = world.allgather(marker.name)
    if world.local_rank == 0:
        marker.write_text(str(world.node))
    world.barrier()
    try:
        seen = {n for n in names if (Path("/dev/shm") / n).exists()}
        leaders = [r for r in range(world.size) if r == min(world.topology.ranks_of(
            world.topology.node_of[r]))]  # fmt: skip
        mine = {names[r] for r in leaders if world.topology.node_of[r] == world.node}
        assert seen == mine, (world.rank, seen, mine)
    finally:
        world.barrier()
        if world.local_rank == 0:
            marker.unlink()


def _tx_bytes() -> int:
    return int(Path("/sys/class/net/eth0/statistics/tx_bytes").read_text())


def test_bytes_cross_the_link(world):
    """UCX over TCP: an allreduce between nodes moves its bytes through eth0
    (with UCX's shared-memory transports they would not cross the link)."""
    avg = HostAllreduce(world, allreduce="mpi")
    grads = {"g": np.ones(2**20, np.float32)}  # 4 MB
    world.barrier()
    before = _tx_bytes()
    avg.reduce(grads)
    world.barrier()
    sent = world.comm.allreduce(_tx_bytes() - before if world.local_rank == 0 else 0)
    if world.nodes > 1:
        assert sent >= 4e6, f"only {sent} bytes left the nodes"


@pytest.mark.parametrize("kind", ["host", "fused"])
def test_hierarchical_allreduce_is_exact(world, kind):
    tree = rank_tree(world.rank)
    if kind == "host":
        out, _ = HostAllreduce(world, allreduce="hierarchical").reduce(tree)
    else:
        avg = FusedAllreduce(world, allreduce="hierarchical", bucket_bytes=16_384)
        out = jax.jit(avg.average_in_jit)(tree)
    assert_mean(out, tree, exact_mean(world, tree))
    # Every rank ends with the same bits (the leader's, broadcast).
    digests = world.allgather([np.asarray(x).tobytes() for x in jax.tree.leaves(out)])
    assert all(d == digests[0] for d in digests)
    # Integer-valued floats sum exactly in any order: the same as the flat path.
    ints = {"x": np.full(5000, float(world.rank + 1), np.float32)}
    got, _ = HostAllreduce(world, allreduce="hierarchical").reduce(ints)
    np.testing.assert_array_equal(got["x"], np.float32(sum(range(1, world.size + 1))
                                                       / world.size))  # fmt: skip


def test_auto_times_hierarchical_across_nodes_and_agrees(world):
    avg = HostAllreduce(world)
    tree = {"g": np.full(300_000, float(world.rank), np.float32)}
    out, _ = avg.reduce(tree)
    np.testing.assert_allclose(out["g"], np.mean(range(world.size)), rtol=1e-6)
    choice = avg.allreduce_choice
    assert world.allgather(choice["path"]) == [choice["path"]] * world.size
    candidates = set(choice["candidates"])
    if world.nodes > 1 and max(LAYOUT) > 1:
        assert "hierarchical" in candidates
        assert {f"{p}_s" for p in candidates} <= set(choice["measured"])
        fastest = min(candidates, key=lambda p: choice["measured"][f"{p}_s"])
        assert choice["path"] == fastest
    else:
        assert "hierarchical" not in candidates


def test_deepfreeze_fast_tier_is_node_local(world, tmp_path_factory):
    """DeepFreeze's fast tier is each node's /dev/shm: a rank's shard is there on
    its own node's ranks and on no other node (tests/test_multinode.py restores
    such a checkpoint on another layout)."""
    from research.checkpoint import CheckpointConfig

    shared = world.bcast(str(tmp_path_factory.mktemp("ck")) if world.rank == 0 else 0)
    cfg = CheckpointConfig(saver="deepfreeze", directory=shared, fsync=False)
    ck = cfg.create(world, shared)
    ck.save(4, {"w": np.full(1000, float(world.rank), np.float32)})
    ck.wait()
    assert ck.committed_steps() == [4]
    fast = ck.tiers[0]
    assert str(fast.root).startswith("/dev/shm/")
    paths = world.allgather(str(fast.step_dir(world.rank, 4)))
    for r, path in enumerate(paths):
        here = Path(path).exists()
        assert here == (world.topology.node_of[r] == world.node), (r, path)
    world.barrier()
    ck.close()
