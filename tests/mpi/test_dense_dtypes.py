"""``fused`` and ``host`` average every dtype a gradient tree may hold, at any size.

Expectations come from an independent float64 mean of every rank's inputs
(gathered with mpi4py), and bad options are refused before any communication.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mpi4py import MPI

from research.comm.registry import get_averager


def test_world_size_is_what_the_launcher_asked_for(world):
    want = os.environ.get("RESEARCH_EXPECTED_NP")
    if want is not None:
        assert world.size == int(want)


def tree_of(rank: int) -> dict:
    n = 70_001  # above the ring's minimum bytes, not divisible by 2, 3 or 4
    base = np.arange(n) % 17 + rank + 1.0
    return {
        "f32": jnp.asarray(base, jnp.float32),
        "f64_numpy": base.astype(np.float64),  # float32 in jax without x64
        "c64": jnp.asarray(base * (1 + 2j), jnp.complex64),
        "bf16": jnp.asarray(base, jnp.bfloat16),
        "f16": jnp.asarray(base[:5], jnp.float16),
        "small": jnp.asarray(base[:3], jnp.float32),
    }


@pytest.mark.parametrize("name", ["fused", "host"])
def test_every_dtype_averages(world, name):
    av = get_averager(name, world)
    mine = tree_of(world.rank)
    out = av.reduce(mine)[0] if name == "host" else jax.jit(av.average_in_jit)(mine)
    everyone = world.comm.allgather({k: np.asarray(v) for k, v in mine.items()})
    for k in mine:
        want = np.mean([np.asarray(t[k], np.complex128) for t in everyone], axis=0)
        got = np.asarray(out[k])
        assert got.shape == np.shape(mine[k]), k
        tol = {"bf16": 1e-2, "f16": 1e-3}.get(k, 1e-6)
        np.testing.assert_allclose(got.astype(np.complex128), want, rtol=tol, err_msg=k)
    # Every rank holds the same bits.
    digests = world.comm.allgather([np.asarray(out[k]).tobytes() for k in sorted(out)])
    assert all(d == digests[0] for d in digests)


def test_bad_segment_bytes_is_refused_before_communicating(world):
    for bad in (-1, 0, 2**40, 1.5):
        with pytest.raises(ValueError, match="segment_bytes"):
            get_averager("fused", world, segment_bytes=bad)
    world.comm.Barrier()  # every rank raised locally; nobody waits in a collective


def test_ring_decision_is_shared_and_recorded(world):
    fused, host = get_averager("fused", world), get_averager("host", world)
    choices = world.comm.allgather((fused.allreduce_choice, host.allreduce_choice))
    assert all(c == choices[0] for c in choices)
    if world.size > 1:
        assert choices[0][0].split(":")[0] in ("ring", "MPI_Allreduce")
    flags = world.comm.allgather((fused.uses_ring(), host.uses_ring()))
    assert len(set(flags)) == 1
    assert MPI.COMM_WORLD.Get_size() == world.size
