"""One rank per GPU: the binding for fake layouts, and the platform's defaults.

No GPU here: :func:`research.comm.process.devices.plan` takes the node's GPU list, the
JAX CUDA plugin and the environment as arguments, so every layout a cluster
has is checked as the ranks of its nodes would compute it.
"""

from __future__ import annotations

import dataclasses

import pytest

from research.comm.process import devices
from research.comm.world import Topology

PLUGIN = "jax-cuda13-plugin 0.11.2"


def bind_node(gpus, local_size, environ=None):
    """The bindings of every rank of one node."""
    return [
        devices.plan(r, local_size, environ or {}, gpus, PLUGIN)
        for r in range(local_size)
    ]


def test_two_ranks_share_one_gpu_and_split_its_memory():
    a, b = bind_node(["0"], 2)
    assert (a.platform, a.gpu, b.gpu) == ("gpu", "0", "0")
    assert a.shared_by == b.shared_by == 2
    assert a.mem_fraction == b.mem_fraction == 0.375  # JAX's 0.75, split
    env = devices.environment(a, {})
    assert env == {
        "CUDA_VISIBLE_DEVICES": "0",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.375",
    }


def test_four_ranks_on_four_gpus_each_take_their_own():
    bound = bind_node(["0", "1", "2", "3"], 4)
    assert [b.gpu for b in bound] == ["0", "1", "2", "3"]
    assert all(b.shared_by == 1 and b.mem_fraction is None for b in bound)
    assert devices.environment(bound[2], {}) == {"CUDA_VISIBLE_DEVICES": "2"}


def test_two_nodes_bind_by_node_local_rank():
    # 4 ranks in blocks of 2 on 2 nodes of 2 GPUs each: ranks 1 and 3 are the
    # second rank of their node and take its GPU 1.
    topo = Topology(node_of=(0, 0, 1, 1), hostnames=("n1", "n1", "n2", "n2"))
    got = []
    for rank in range(4):
        mine = topo.ranks_of(topo.node_of[rank])
        b = devices.plan(mine.index(rank), len(mine), {}, ["0", "1"], PLUGIN)
        got.append((topo.hostnames[rank], b.gpu, b.shared_by))
    assert got == [("n1", "0", 1), ("n1", "1", 1), ("n2", "0", 1), ("n2", "1", 1)]


def test_three_ranks_on_two_gpus_deal_round_robin():
    bound = bind_node(["0", "1"], 3)
    assert [(b.gpu, b.shared_by) for b in bound] == [("0", 2), ("1", 1), ("0", 2)]
    assert [b.mem_fraction for b in bound] == [0.375, None, 0.375]


def test_the_users_device_list_and_memory_settings_win():
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.2"}
    gpus = devices.visible_gpus(env)
    assert gpus == ["2", "3"]
    bound = [devices.plan(r, 4, env, gpus, PLUGIN) for r in range(4)]
    assert [b.gpu for b in bound] == ["2", "3", "2", "3"]
    assert all(b.mem_fraction is None for b in bound)  # theirs stands
    assert devices.environment(bound[1], env) == {"CUDA_VISIBLE_DEVICES": "3"}


@pytest.mark.parametrize("listed", ["", "-1"])
def test_an_empty_device_list_means_no_gpu(listed):
    env = {"CUDA_VISIBLE_DEVICES": listed}
    assert devices.visible_gpus(env) == []
    assert devices.plan(0, 2, env, None, PLUGIN).platform == "cpu"


def test_cpu_where_jax_cannot_use_the_gpus():
    no_plugin = devices.plan(0, 2, {}, ["0"], None)
    assert no_plugin.platform == "cpu"
    assert "no CUDA plugin" in no_plugin.reason and "--cuda" in no_plugin.reason
    forced = devices.plan(0, 2, {"JAX_PLATFORMS": "cpu"}, ["0"], PLUGIN)
    assert (forced.platform, forced.reason) == ("cpu", "JAX_PLATFORMS=cpu")
    assert devices.plan(0, 2, {"JAX_PLATFORMS": "cuda,cpu"}, ["0"], PLUGIN).gpu == "0"
    assert devices.environment(no_plugin, {}) == {}


def test_mpi4jax_is_told_whether_the_mpi_takes_device_buffers():
    b = devices.plan(0, 1, {}, ["0"], PLUGIN)
    staged = devices.environment(dataclasses.replace(b, cuda_aware_mpi=False), {})
    assert staged["MPI4JAX_USE_CUDA_MPI"] == "0"
    aware = devices.environment(dataclasses.replace(b, cuda_aware_mpi=True), {})
    assert aware["MPI4JAX_USE_CUDA_MPI"] == "1"
    theirs = {"MPI4JAX_USE_CUDA_MPI": "0"}
    kept = devices.environment(dataclasses.replace(b, cuda_aware_mpi=True), theirs)
    assert "MPI4JAX_USE_CUDA_MPI" not in kept
    assert devices.cuda_aware_mpi() is False  # the mpich wheel: host buffers only


def test_this_machine_runs_on_the_cpu():
    platform, why = devices.planned_platform()
    assert platform == "cpu", why


def test_cpu_flags_apply_on_the_cpu_only(monkeypatch):
    from models.xla_cpu import FLAG
    from research.threads import xla_thread_flags

    monkeypatch.setenv("XLA_FLAGS", f"--xla_dump_to=/tmp/x {FLAG}")
    on_gpu = xla_thread_flags(1, platform="gpu").split()
    assert on_gpu == ["--xla_dump_to=/tmp/x"]  # ours out, the user's kept
    monkeypatch.setenv("XLA_FLAGS", "")
    on_cpu = xla_thread_flags(1, platform="cpu").split()
    assert "--xla_cpu_multi_thread_eigen=false" in on_cpu


def test_the_matmul_kernel_gradient_is_the_cpus(monkeypatch):
    from models import conv

    assert conv.set_weight_grad("auto") in conv.MODES
    assert conv.get_weight_grad() == "matmul"  # JAX runs on the CPU here


@pytest.mark.parametrize(
    "strategy, options, platform, checkpoint, wanted",
    [
        ("fused", {"allreduce": "xla"}, "cpu", "none", True),
        ("host", {"allreduce": "xla"}, "cpu", "deepfreeze", True),
        ("fused", {}, "cpu", "none", False),  # auto on the CPU: not timed
        ("fused", {}, "gpu", "none", True),  # auto on GPUs: a candidate
        ("host", {"allreduce": "auto"}, "gpu", "orbax-blocking", False),
        ("fused", {"allreduce": "ring"}, "gpu", "none", False),
        ("adaptive", {"allreduce": "xla"}, "cpu", "none", True),  # its dense one
        ("solo", {}, "gpu", "none", False),
    ],
)
def test_when_xlas_runtime_starts(strategy, options, platform, checkpoint, wanted):
    """The strategy's options say whether a run needs JAX's distributed
    runtime; the saver whether it may run beside it (no list of names)."""
    from research.checkpoint.savers import beside_xla_runtime
    from research.comm.dense import xla
    from research.strategies.registry import make_options

    want = make_options(strategy, options).xla_runtime(platform)
    assert xla.wanted(want, beside_xla_runtime(checkpoint)) is wanted
