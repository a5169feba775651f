"""``scripts.bench_compute``'s timing loop (the PyTorch worker needs torch, an
optional dependency, so its process is exercised by running the script)."""

from __future__ import annotations

import jax.numpy as jnp

from scripts.bench_compute import _interleaved


def test_interleaved_times_local_and_remote_steps_in_turn():
    order = []

    def local():
        order.append("local")
        return jnp.ones(3)

    def remote(settle):
        order.append(("remote", settle))
        return 0.25  # seconds, as measured by the other process

    times = _interleaved({"jax": local}, reps=5, settle=0.0, remote={"torch": remote})
    assert times["torch"] == 250.0 and times["jax"] >= 0
    # Two warm-up calls of the local step, then the two alternate, rotating.
    assert order[:2] == ["local", "local"]
    timed = ["local" if o == "local" else "remote" for o in order[2:]]
    assert timed == ["local", "remote", "remote", "local"] * 2 + ["local", "remote"]
