"""The timeline around your own phases: every rank's compute and communication.

    mpiexec -n 2 python examples/timeline.py --run-dir runs/ex-trace
    python -m scripts.analyze_trace runs/ex-trace   # compute, comm, overlap, gaps

Spans on named tracks (compute, comm, update, ...) are appended to each rank's
``trace/rank<r>.json``, valid JSON even if the run dies; at the end rank 0
merges them into ``trace.json`` (open it in https://ui.perfetto.dev). Our own
collectives (here the ``host`` allreduce) record their spans with their bytes
by themselves once a tracer is set.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
from _common import batches, digits, host_step, init

import research
from research.comm.world import get_world
from research.trace import Tracer, get_tracer, set_tracer


def main(run_dir: str, steps: int) -> Path:
    world = get_world()
    tracer = Tracer.start(
        Path(run_dir), rank=world.rank, size=world.size, comm=world.comm
    )
    set_tracer(tracer)  # library code finds it with get_tracer()
    (x, y), _ = digits(world.rank, world.size)
    model, params, tx, opt = init()
    avg = research.averaging("host", world)  # on the host: its calls are traced
    grad, update = host_step(model, tx)
    for s in range(steps):
        with get_tracer().span("data", track="data", step=s):
            xb, yb = batches(x, y, 32, s)
        with get_tracer().span("forward+backward", track="compute", step=s):
            g = jax.block_until_ready(grad(params, xb, yb))  # host time = work
        g, info = avg(g)
        with get_tracer().span("update", track="update", step=s):
            params, opt = jax.block_until_ready(update(params, opt, g))
    tracer.close()  # collective: rank 0 merges every rank into trace.json
    world.log(f"{steps} steps traced -> {Path(run_dir) / 'trace.json'}")
    return Path(run_dir) / "trace.json"


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", required=True)
    p.add_argument("--steps", type=int, default=50)
    a = p.parse_args()
    main(a.run_dir, a.steps)
