"""An executor declares what it calls on its averager; a strategy lacking it is
refused by name when the executor is made, before any step."""

from __future__ import annotations

import pytest

from research.comm.base import Averager
from research.train.executors import StepContext, make_executor, missing_members
from research.train.layerwise import BucketAllreduce


class _Half(Averager):
    """Names the layerwise executor but can only plan buckets."""

    name = "half"
    executor = "layerwise"
    size = 2

    def plan(self, sizes):
        return [[i] for i in range(len(sizes))]


def test_a_strategy_without_what_its_executor_calls_is_refused_by_name():
    assert missing_members(_Half(), BucketAllreduce) == ["allreduce"]
    with pytest.raises(TypeError) as e:
        make_executor(_Half(), StepContext(world_size=2, optimizer=None))
    assert "executor 'layerwise', which calls allreduce on its averager" in str(e.value)
    assert "BucketAllreduce" in str(e.value) and "_Half" in str(e.value)
