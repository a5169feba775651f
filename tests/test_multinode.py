"""The multi-node tier: jobs across the nodes of a local cluster.

A cluster of 3 nodes (``research/localnet.py``: network namespaces with their
own hostname and /dev/shm, joined by 10 Gb/s shaped veth links; MPICH's mpiexec
on the first node starts ranks on the others through ``node-ssh``; ranks talk
TCP between nodes, shared memory within one) is made for this file and removed
after it. Where nodes cannot be made (not root, no ``ip netns``), every test
here is skipped with one line saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.harness import ROOT, python
from tests.node_faults import env_for

pytestmark = [
    pytest.mark.launches,  # MPI jobs: not in make test-fast
    # One worker: one local cluster (a module fixture).
    pytest.mark.xdist_group("test_multinode"),
]
NAME = f"t{os.getpid() % 100000}"  # this run's cluster, apart from a user's "rs"
#: Strategies whose result depends on timing (which gradients make a round).
TIMING_DEPENDENT = {"solo", "majority", "ps"}


@pytest.fixture(scope="module")
def cluster():
    from research.localnet import LocalnetError, check_can_run, down, up

    try:
        check_can_run()
    except LocalnetError as e:
        pytest.skip(f"multi-node tier skipped: {e}")
    made = up(3, rate="10gbit", name=NAME)
    try:
        yield made
    finally:
        down(NAME)
        # Nothing of it is left: namespaces, links, state.
        netns = subprocess.run(["ip", "netns"], capture_output=True, text=True)
        assert f"{NAME}-n" not in netns.stdout
        links = subprocess.run(["ip", "link"], capture_output=True, text=True)
        assert f"{NAME}-" not in links.stdout


def on_nodes(cluster, layout: list[int], args: list[str], timeout: float = 240,
             env: dict | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    """Run ``python ARGS`` with ``layout[i]`` ranks on node ``n{i+1}``."""
    where = [(f"n{i + 1}", n) for i, n in enumerate(layout) if n]
    mpiexec = Path(sys.executable).parent / "mpiexec"
    cmd = [*cluster.enter(where[0][0], cwd=str(ROOT)), str(mpiexec)]
    cmd += [*cluster.mpiexec_args(where), "-n", str(sum(layout)), sys.executable]
    return subprocess.run(
        [*cmd, *args],
        cwd=ROOT,
        env={**env_for(cluster), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _ok(proc: subprocess.CompletedProcess, what: str) -> None:
    assert proc.returncode == 0, (
        f"{what} exited {proc.returncode}\n--- stdout\n{proc.stdout[-5000:]}\n"
        f"--- stderr\n{proc.stderr[-5000:]}"
    )


@pytest.mark.parametrize("layout", ["2,2", "1,1,1", "2,1"])
def test_nodes_hierarchical_allreduce_and_fast_tier(cluster, layout):
    """tests/multinode/test_nodes.py at 2 nodes x 2 ranks, 3 x 1 and uneven 2+1."""
    sizes = [int(n) for n in layout.split(",")]
    proc = on_nodes(
        cluster,
        sizes,
        ["-m", "pytest", "tests/multinode/test_nodes.py", "-x", "-q"],
        env={
            "RESEARCH_UNDER_MPI": "1",
            "RESEARCH_EXPECTED_NP": str(sum(sizes)),
            "RESEARCH_EXPECTED_LAYOUT": layout,
        },
    )
    _ok(proc, f"tests/multinode/test_nodes.py on nodes {layout}")


def test_every_strategy_trains_across_nodes_as_on_one(cluster, tmp_path):
    """Each registered strategy, 6 steps at 4 ranks: on one node and on 2 nodes
    x 2 ranks. Replicas agree everywhere; deterministic strategies end where the
    one-node run ended (to float rounding: the allreduce may sum in another
    order across nodes)."""
    one, two = tmp_path / "one.npz", tmp_path / "two.npz"
    driver = "tests/multinode_driver.py"
    _ok(on_nodes(cluster, [4], [driver, str(one), str(tmp_path / "a")]), "one node")
    _ok(on_nodes(cluster, [2, 2], [driver, str(two), str(tmp_path / "b")]), "2 nodes")
    a, b = np.load(one), np.load(two)
    names = sorted({k.split(".")[0] for k in a.files})
    assert names == sorted({k.split(".")[0] for k in b.files})
    for name in names:
        for run in (a, b):
            assert len(set(run[f"{name}.crcs"].tolist())) == 1, f"{name}: replicas"
            assert np.isfinite(run[f"{name}.params"]).all(), name
        if name not in TIMING_DEPENDENT:
            np.testing.assert_allclose(
                b[f"{name}.params"], a[f"{name}.params"], rtol=1e-4, atol=1e-6,
                err_msg=f"{name}: 2 nodes differ from one",
            )  # fmt: skip


def test_checkpoint_of_two_nodes_restores_on_one(cluster, tmp_path):
    """Saved by 2 nodes x 2 ranks (each node's fast tier holds its ranks'
    shards), restored by 2 ranks on n1: n1's shards from its fast tier, n2's
    from the persistent tier, with no warning."""
    folder = str(tmp_path / "ck")
    _ok(on_nodes(cluster, [2, 2], ["tests/multinode_ckpt.py", "save", folder]), "save")
    _ok(on_nodes(cluster, [2], ["tests/multinode_ckpt.py", "restore", folder]), "load")
    for rank in (0, 1):
        got = json.loads((tmp_path / "ck" / f"restored-{rank}.json").read_text())
        assert got["step"] == 4 and got["host"] == "n1"
        assert sorted(got["tiers"]) == ["fast", "persistent"], got
        assert got["warnings"] == [], got


def test_train_with_hosts_resumes_on_fewer_nodes(cluster, tmp_path):
    """``python -m experiments.train --hosts n1,n2 --np 4`` (the user's command)
    checkpoints; the same run continued with ``--hosts n2 --np 2`` resumes.
    Both average with XLA's collectives (gloo over TCP between the nodes: JAX's
    coordinator at rank 0's address on the bridge)."""
    run_dir = tmp_path / "run"
    base = ["-m", "experiments.train", "--model", "candle_p1b2_tiny", "--dataset",
            "synthetic_tabular", "--data-opt", "features=256", "--batch-size", "4",
            "--eval-every", "0", "--checkpoint", "deepfreeze",
            "--checkpoint-every", "3", "--run-dir", str(run_dir),
            "--strategy", "fused", "--strategy-opt", "allreduce=xla"]  # fmt: skip
    env = env_for(cluster)
    first = python(
        [*base, "--hosts", "n1,n2", "--np", "4", "--steps", "6"], env=env, timeout=240
    )
    _ok(first, "experiments.train --hosts n1,n2 --np 4")
    config = json.loads((run_dir / "config.json").read_text())
    assert config["nodes"]["hosts"] == ["n1", "n2"]
    assert config["nodes"]["ranks_per_node"] == [2, 2]
    assert "real network link, 2 nodes at 10gbit" in config["link"]
    assert config["allreduce"]["path"] == "xla"
    coordinator = config["xla_collectives"]["coordinator"]
    assert not coordinator.startswith("127."), coordinator  # reachable from n2
    second = python(
        [*base, "--hosts", "n2", "--np", "2", "--steps", "9"], env=env, timeout=240
    )
    _ok(second, "experiments.train --hosts n2 --np 2 (resume)")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == 6 and summary["steps"] == 9
    assert summary["nodes"]["hosts"] == ["n2"]
