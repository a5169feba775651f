"""The local cluster's command line and host lists (research/localnet.py).

Making nodes for real is tests/test_multinode.py's; here what needs no root:
rates, host lists, the refusals, and that a failed ``up`` leaves nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from research import localnet
from research.entry.launch import placement
from research.localnet import cluster as cluster_mod
from research.usage import UsageError
from tests.harness import python

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "scripts" / "cluster" / "localnet.sh"


def test_rates_in_tc_units():
    assert localnet.parse_rate("1gbit") == 1e9
    assert localnet.parse_rate("10Gbit") == 1e10
    assert localnet.parse_rate("2.5mbit") == 2.5e6
    for bad in ("1gbps", "fast", "0gbit", "-1mbit", ""):
        with pytest.raises(localnet.LocalnetError, match="bad rate"):
            localnet.parse_rate(bad)
    args = localnet.tbf_args("10gbit")
    assert args[:3] == ["tbf", "rate", "10gbit"]
    assert int(args[args.index("burst") + 1]) == 1_250_000  # 1 ms of 10 Gb/s
    small = localnet.tbf_args("1mbit")
    assert int(small[small.index("burst") + 1]) == 64 * 1024  # a TSO segment


@pytest.mark.parametrize(
    ("spec", "np_", "want"),
    [
        ("n1,n2", 4, [("n1", 2), ("n2", 2)]),
        ("n1,n2", 3, [("n1", 2), ("n2", 1)]),  # blocks, the first one more
        ("n1,n2,n3", 3, [("n1", 1), ("n2", 1), ("n3", 1)]),
        ("n1:3,n2:1", 4, [("n1", 3), ("n2", 1)]),
        (" n1 , n2 ", 2, [("n1", 1), ("n2", 1)]),
    ],
)
def test_host_lists(spec, np_, want):
    assert localnet.parse_hosts(spec, np_) == want


@pytest.mark.parametrize(
    ("spec", "np_", "message"),
    [
        ("", 2, "at least one host"),
        ("n1,n1", 2, "twice"),
        ("n1:2,n2", 3, "every host or none"),
        ("n1:2,n2:2", 3, "places 4 ranks but --np is 3"),
        ("n1:0,n2:2", 2, "bad rank count"),
        ("n1,n2,n3", 2, "fewer than the 3 hosts"),
    ],
)
def test_bad_host_lists(spec, np_, message):
    with pytest.raises(ValueError, match=message):
        localnet.parse_hosts(spec, np_)


def test_fewer_ranks_than_hosts_take_the_first_hosts():
    """A sweep's 1 and 2 ranks over 4 nodes: one rank per node, from n1."""
    assert placement("n1,n2,n3,n4", 1) == [("n1", 1)]
    assert placement("n1,n2,n3,n4", 2) == [("n1", 1), ("n2", 1)]
    with pytest.raises(UsageError, match="places"):
        placement("n1:1,n2:1", 3)


def test_hosts_are_checked_before_launch():
    cmd = ["-m", "experiments.train", "--hosts", "n1:2,n2:2", "--np", "3"]
    proc = python(cmd, timeout=120)
    assert proc.returncode == 2
    assert "places 4 ranks but --np is 3" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_not_root_is_refused_in_one_line():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root to drop to another user (setpriv)")
    proc = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            str(SCRIPT),
            "--name",
            "tnr",
            "up",
            "2",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "localnet: error: needs root (network namespaces, veth pairs and tc): "
        "run as root, e.g. `sudo scripts/cluster/localnet.sh up 2`"
    )


def test_commands_on_a_cluster_that_is_not_there():
    proc = subprocess.run(
        [str(SCRIPT), "--name", "tnone", "status"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "no local cluster at /run/research-localnet/tnone" in proc.stderr
    assert "localnet.sh up 2" in proc.stderr


def test_a_failed_up_leaves_nothing():
    """A bad shared-memory size makes the first node's holder fail after the
    bridge, namespace and link exist: everything made is removed again."""
    try:
        localnet.check_can_run()
    except localnet.LocalnetError as e:
        pytest.skip(f"cannot make nodes here: {e}")
    name = f"tf{os.getpid() % 10000}"
    with pytest.raises(localnet.LocalnetError, match="did not start"):
        localnet.up(2, name=name, shm_size="not-a-size")
    assert cluster_mod._leftovers(name) == {"netns": [], "links": []}
    assert not localnet.Cluster.folder(name).exists()
    assert not list(Path("/etc/netns").glob(f"{name}-*"))
