"""``experiments.train --dataset imagenet`` on 3 MPI ranks: it trains, records its
input wait and class index, and resumes from a checkpoint bit for bit.

A real ImageNet-format folder of real JPEGs (``scripts.make_imagenet_sample``),
real ranks under mpiexec, real DeepFreeze and Orbax checkpoints. The stopped
run is the uninterrupted one's first 6 steps (a constant rate: the schedule does not
depend on the run's length); the resumed run restores the pipeline's
position from the checkpoint and must end with the same parameters.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.make_imagenet_sample import make_sample
from tests.harness import python

pytestmark = pytest.mark.launches  # MPI jobs: not in make test-fast


def _args(data: Path, steps: int, np_: int = 3, saver: str = "deepfreeze") -> list[str]:
    return [
        *("-m", "experiments.train", "--np", str(np_), "--model", "cnn_small"),
        *("--dataset", "imagenet", "--data-dir", str(data)),
        *("--data-opt", "image_size=16", "--data-workers", "2"),
        *("--batch-size", "4", "--steps", str(steps), "--schedule", "constant"),
        *("--warmup-steps", "0", "--eval-every", "0", "--no-progress"),
        *("--checkpoint", saver, "--checkpoint-every", "3"),
        # One allreduce path for both runs: at 3 ranks the ring and MPI's own
        # allreduce add in different orders, and "auto" times them afresh in
        # each run (a resumed run adopts the interrupted one's choice).
        *("--strategy-opt", "allreduce=ring"),
    ]


def _train(cwd: Path, run: str, args: list[str]) -> dict:
    proc = python([*args, "--run-dir", run], cwd=cwd, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((cwd / run / "summary.json").read_text())


# DeepFreeze keeps each rank's position in its shard; orbax-async-rank0 keeps
# rank 0's, which every rank restores (the positions are the same dict).
@pytest.mark.parametrize("saver", ["deepfreeze", "orbax-async-rank0"])
def test_three_ranks_train_on_imagenet_and_resume_bit_for_bit(tmp_path, saver):
    data = tmp_path / "imagenet"
    make_sample(data, 3, 9, val_per_class=2, sizes=(40, 80))
    ref = _train(tmp_path, "ref", _args(data, 12, saver=saver))
    assert ref["steps"] == 12 and ref["world_size"] == 3
    assert ref["data"]["skipped"] >= 2 and ref["data"]["median_data_wait_s"] >= 0
    config = json.loads((tmp_path / "ref" / "config.json").read_text())
    assert config["data"]["classes"] == ["n00000000", "n00000001", "n00000002"]
    rows = [json.loads(x) for x in (tmp_path / "ref" / "metrics.jsonl").open()]
    assert all("data_wait_s" in r for r in rows if "loss" in r)

    first = _train(tmp_path, "run", _args(data, 6, saver=saver))
    assert first["steps"] == 6 and first["resumed_from"] is None
    resumed = _train(tmp_path, "run", _args(data, 12, saver=saver))
    assert resumed["resumed_from"] == 6 and resumed["steps"] == 12
    assert resumed["params_sha256"] == ref["params_sha256"]


def test_a_checkpoint_of_three_ranks_resumes_on_two_without_a_sample_twice(tmp_path):
    data = tmp_path / "imagenet"
    make_sample(data, 3, 8, val_per_class=1, sizes=(40, 60), odd=False)  # 24
    args = [*_args(data, 1), "--data-opt", "audit=true"]
    first = _train(tmp_path, "run", args)  # 12 samples: epoch 0's first half
    two = [*_args(data, 4, np_=2), "--data-opt", "audit=true"]
    resumed = _train(tmp_path, "run", two)  # 3 steps of 2 x 4: 12 + 12
    assert resumed["resumed_from"] == 1 and resumed["world_size"] == 2

    def stream(summary: dict, steps: int) -> list[int]:
        # The audit lists every batch the loader read, the device feed's
        # read-ahead too: the trained ones are the first ``steps``.
        audits = [r["audit"] for r in summary["data"]["per_rank"]]
        return [i for k in range(steps) for a in audits for i in a[k]]

    epoch0 = stream(first, 1) + stream(resumed, 3)[:12]
    assert sorted(epoch0) == list(range(24))  # none twice, none skipped
