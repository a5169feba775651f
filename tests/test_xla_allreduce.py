"""``allreduce=xla``: XLA's own collectives across the job's processes, on CPU.

JAX's distributed runtime started from the MPI world and gloo's collectives
(NCCL's on GPUs): the fused step as one program of all ranks, and the host
strategy's mean, train as the ring does, at a rank count that is a power of
two and one that is not. ``config.json`` names every rank's platform and
device, and the runtime that ran.
"""

from __future__ import annotations

import json

import pytest

from tests.harness import python

pytestmark = pytest.mark.launches  # MPI jobs: not in make test-fast

STEPS = 40


def train(tmp_path, np_: int, strategy: str, allreduce: str) -> dict:
    run_dir = tmp_path / f"{strategy}-{allreduce}-{np_}"
    args = ["-m", "experiments.train", "--np", str(np_), "--steps", str(STEPS)]
    args += ["--strategy", strategy, "--strategy-opt", f"allreduce={allreduce}"]
    args += ["--data-opt", "n_train=2048", "--no-progress", "--run-dir", str(run_dir)]
    proc = python(args, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {
        name: json.loads((run_dir / f"{name}.json").read_text())
        for name in ("config", "summary")
    }


@pytest.mark.parametrize("np_", [2, 3])
def test_xla_trains_to_the_rings_accuracy(tmp_path, np_):
    ring = train(tmp_path, np_, "fused", "ring")
    xla = train(tmp_path, np_, "fused", "xla")
    cfg = xla["config"]
    assert cfg["allreduce"]["path"] == "xla", cfg["allreduce"]
    assert cfg["xla_collectives"]["started"] is True
    assert cfg["xla_collectives"]["collectives"] == "gloo"
    assert ring["config"]["xla_collectives"] is None  # not started for the ring
    ring_acc, xla_acc = (r["summary"]["final_test_acc"] for r in (ring, xla))
    assert abs(xla_acc - ring_acc) <= 0.01, (xla_acc, ring_acc)
    assert xla_acc > 0.5  # it learned: the synthetic task's chance is 0.1
    # Every rank's platform and device, as JAX reports them.
    devs = cfg["devices"]
    assert len(devs) == np_ == cfg["world_size"]
    assert {d["platform"] for d in devs} == {"cpu"}
    assert [d["binding"]["local_rank"] for d in devs] == list(range(np_))
    assert all(d["device_kind"] == "cpu" for d in devs)
    if np_ == 3:  # the host strategy's mean through XLA too
        host = train(tmp_path, np_, "host", "xla")
        assert host["config"]["allreduce"]["path"] == "xla"
        assert abs(host["summary"]["final_test_acc"] - ring_acc) <= 0.01
