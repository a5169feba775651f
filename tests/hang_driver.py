"""A real training job in which one rank's step never ends (test_stop_deadline).

    mpiexec -n N python tests/hang_driver.py RUN_DIR RANK STEP

At step STEP, rank RANK's jitted gradient waits on a host callback that sleeps
for an hour: its main thread waits inside XLA, where no Python signal handler
runs, and the other ranks wait for it in their allreduce. The watchdog is off,
so only the stop deadline (research.train.preemption) can end the job after a
SIGTERM. The driver prints ``HUNG <unix time>`` when the rank is stuck.
"""

from __future__ import annotations

import sys
import time

from tests.tiny import tiny_config


def main() -> None:
    import jax
    import jax.numpy as jnp

    from research.comm.world import get_world
    from research.entry.run import run_training
    from research.steps import jitted as steps
    from research.train.loop import Callback

    run_dir, hang_rank, hang_step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    mine = get_world().rank == hang_rank
    now = {"trainer": None}

    class Tick(Callback):
        def on_train_start(self, trainer) -> None:
            now["trainer"] = trainer

    def stuck(x):
        print(f"HUNG {time.time():.3f}", flush=True)
        time.sleep(3600)
        return x

    grad_step = steps.grad_step

    def hanging_grad_step(state, x, y):
        if mine and now["trainer"] is not None and now["trainer"].step == hang_step:
            f = jax.jit(
                lambda v: jax.pure_callback(stuck, jax.ShapeDtypeStruct((), v.dtype), v)
            )
            jax.block_until_ready(f(jnp.float32(1)))
        return grad_step(state, x, y)

    steps.grad_step = hanging_grad_step
    cfg = tiny_config(
        run_dir,
        data_options={"n_train": 512, "n_test": 64},
        batch_size=8,
        steps=hang_step + 1000,
        strategy="host",
        comm_timeout="off",
    )
    run_training(cfg, "hang", callbacks=[Tick()])


if __name__ == "__main__":
    main()
