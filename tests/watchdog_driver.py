"""A real MPI job whose last rank stops taking part (tests/test_watchdog.py).

    mpiexec -n N python tests/watchdog_driver.py CASE TIMEOUT RUN_DIR

Every rank starts the watchdog with ``--comm-timeout TIMEOUT``, then runs three
healthy rounds of the case's collective. Then the last rank stops taking part:

* ``hang-host``: it sleeps outside any collective; the others wait in the host
  allreduce (the ring);
* ``freeze-fused``: it stops itself (SIGSTOP) like a frozen node; the others
  wait in the fused allreduce inside ``jit``;
* ``freeze-handles``: as above, the others wait on an asynchronous handle;
* ``freeze-solo``: as above, the others wait in a synchronous solo round;
* ``freeze-ps``: as above, after three pushes to the parameter server (rank
  0); the others then end the run (``finish``): the server waits for the
  frozen worker's "done", the other workers for the server's final broadcast;
* ``slow-fused``: it is slowed, not stopped: a child process stops and
  continues it in turns (0.5 s stopped, 0.01 s running) through a 128 MB fused
  ring allreduce in 16 KiB pieces that takes longer than the timeout; it must
  finish (exit 0).

Only the fault is injected; MPI, the collectives and the watchdog are the real
ones. The driver prints ``INJECTED <unix time>`` when the fault starts and, in
``slow-*``, ``QUIET <seconds>``: the longest quiet wait the watchdog saw.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

CASES = (
    "hang-host",
    "freeze-fused",
    "freeze-handles",
    "freeze-solo",
    "freeze-ps",
    "slow-fused",
)
#: Stopped, then running, seconds, while a rank is slowed down.
THROTTLE = (0.5, 0.01)


def throttle(pid: int) -> subprocess.Popen:
    """A child that stops and continues ``pid`` in turns until it ends."""
    stopped, running = THROTTLE
    code = (
        "import os, signal, time\n"
        f"pid = {pid}\n"
        "while True:\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGSTOP)\n"
        f"        time.sleep({stopped})\n"
        "        os.kill(pid, signal.SIGCONT)\n"
        f"        time.sleep({running})\n"
        "    except ProcessLookupError:\n"
        "        break\n"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def main() -> None:
    case, timeout, run_dir = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    assert case in CASES, case
    import jax
    import jax.numpy as jnp
    import numpy as np

    from research.comm.faults import failures, watchdog
    from research.comm.world import get_world

    world = get_world(comm_timeout=timeout)
    failures.set_dir(run_dir)
    last = world.rank == world.size - 1
    # 128 MB: 64 MB took 1.2 s on a fast day here, under the 2 s timeout.
    n = (128 << 20) // 4 if case.startswith("slow") else 1 << 16
    x = np.full(n, float(world.rank + 1), np.float32)
    want = world.size * (world.size + 1) / 2
    stall = None  # what the others call while the last rank is stopped

    if case == "hang-host":
        from research.comm.dense import HostAllreduce

        avg = HostAllreduce(world, allreduce="ring")

        def once() -> float:
            return float(avg.reduce({"x": x})[0]["x"][0]) * world.size
    elif case in ("freeze-fused", "slow-fused"):
        from research.comm.dense import FusedAllreduce

        avg = FusedAllreduce(world, allreduce="ring", segment_bytes=16 << 10)
        step = jax.jit(avg.average_in_jit)
        xj = jnp.asarray(x)

        def once() -> float:
            # As the fused executor does: the whole jitted step is watched.
            with watchdog.watch("fused step", detail=avg.path()):
                return float(step({"x": xj})["x"][0]) * world.size
    elif case == "freeze-handles":
        from research.comm.asynchronous.handles import AsyncComm

        comm = AsyncComm(world)

        def once() -> float:
            return float(comm.allreduce(x).wait()[0])
    elif case == "freeze-ps":
        from research.comm.ps import ParameterServer

        ps = ParameterServer(world.comm)
        # The server's parameters become the gradient pushed last: the value
        # a worker pulls back is its own or another's, 1..size.
        ps.bind({"x": x.copy()}, lambda params, grads: grads)
        stall = ps.finish

        def once() -> float:
            got = float(ps.push_pull({"x": x})[0]["x"][0])
            assert got in range(1, world.size + 1), got
            return want
    else:
        from research.comm.partial import PartialAllreduce

        pa = PartialAllreduce(world, mode="solo", full_every=1)

        def once() -> float:
            return float(pa.reduce({"x": x})[0]["x"][0]) * world.size

    for i in range(3):
        watchdog.set_step(i + 1)
        assert abs(once() - want) < 1e-3
    stall = stall or once
    watchdog.set_step(4)
    world.barrier()
    if world.rank == 0:
        print(f"INJECTED {time.time():.3f}", flush=True)
    if case.startswith("slow"):
        helper = throttle(os.getpid()) if last else None
        t0 = time.perf_counter()
        assert abs(once() - want) < 1e-3
        took = time.perf_counter() - t0
        if helper is not None:
            helper.kill()
            helper.wait()
            os.kill(os.getpid(), signal.SIGCONT)
        quiet = watchdog.record()["longest_quiet_s"]
        print(f"r{world.rank} QUIET {quiet:.1f} TOOK {took:.1f}", flush=True)
        world.barrier()
        return
    if last:
        if case.startswith("freeze"):
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(3600)
    stall()
    print(f"r{world.rank} | the collective finished: the watchdog missed it")


if __name__ == "__main__":
    main()
