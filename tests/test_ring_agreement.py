"""Ranks agree on the allreduce they run (issue: a rank that cannot load the ring).

The reproduction: an MPMD job where rank 0 cannot build the native ring (its
cache folder cannot be created) and ranks 1-2 can. Each rank choosing alone left
rank 0 in ``MPI_Allreduce`` and the others in the ring's ``MPI_Sendrecv``, and
the job hung. Now the three agree when the averager is built: every rank uses
MPI's own allreduce, the results are right, and the reason is recorded. With
every rank able to, the ring runs (its own call counter, which the fallback
cannot raise, says so).
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.test_mpi import COMPILE_CACHE_ENV, ROOT, mpiexec

SCRIPT = """
import sys
import jax, jax.numpy as jnp, numpy as np
from research.comm import ring
from research.comm.registry import get_averager
from research.comm.world import get_world

world = get_world()
assert world.size == 3, world.size
x = {"w": jnp.full((1_000_000,), float(world.rank + 1), jnp.float32),
     "b": jnp.arange(5.0) * (world.rank + 1)}
want = {"w": np.full(1_000_000, 2.0, np.float32), "b": np.arange(5.0) * 2.0}
fused = get_averager("fused", world)
got = jax.jit(fused.average_in_jit)(x)
host = get_averager("host", world)
got_host, _ = host.reduce(x)
for out in (got, got_host):
    for k in want:
        np.testing.assert_allclose(np.asarray(out[k]), want[k], rtol=1e-6)
print(f"RESULT r{world.rank} {fused.uses_ring()} {host.uses_ring()} "
      f"calls={ring.ring_calls()} | {fused.allreduce_choice}", flush=True)
"""


def _run(per_rank_env: list[dict[str, str]], timeout: float = 120):
    env = dict(os.environ, **COMPILE_CACHE_ENV)
    env.update(
        XLA_FLAGS="--xla_cpu_multi_thread_eigen=false", NPROC="1", PYTHONPATH=str(ROOT)
    )
    cmd = [mpiexec()]
    for i, extra in enumerate(per_rank_env):
        if i:
            cmd.append(":")
        pairs = [f"{k}={v}" for k, v in extra.items()]
        cmd += ["-n", "1", "env", *pairs, sys.executable, "-c", SCRIPT]
    return subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def results(proc) -> dict[int, str]:
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT r"):
            rank, rest = line[len("RESULT r") :].split(" ", 1)
            out[int(rank)] = rest
    return out


def test_a_rank_without_the_ring_makes_every_rank_use_mpi():
    proc = _run([{"RESEARCH_NATIVE_CACHE": "/proc/no-such-dir"}, {}, {}])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = results(proc)
    assert sorted(got) == [0, 1, 2], proc.stdout
    for rank, line in got.items():
        assert line.startswith("False False calls=0 | MPI_Allreduce"), (rank, line)
        assert "rank 0: " in line and "/proc/no-such-dir" in line, line
        assert "rank 1:" not in line and "rank 2:" not in line, line
    assert "r0 | MPI_Allreduce: the ring could not be used" in proc.stderr


def test_the_ring_runs_when_every_rank_can():
    proc = _run([{}, {}, {}])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = results(proc)
    assert sorted(got) == [0, 1, 2], proc.stdout
    for line in got.values():
        assert line.startswith("True True calls="), line
        # The 4 MB leaf went through the ring in the host path (the fused call
        # runs inside XLA, counted too): at least one ring reduction each.
        assert int(line.split("calls=")[1].split()[0]) >= 2, line
        assert "| ring:" in line
