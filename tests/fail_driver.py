"""A real training job in which one rank fails in a chosen phase (test_failures).

    mpiexec -n N python tests/fail_driver.py RUN_DIR PHASE RANK STEP

Tracing is on. At step STEP, rank RANK fails in PHASE:

* ``data``: loading the batch raises;
* ``step``: a host callback inside the jitted gradient step raises;
* ``average``: the partial collective's progress-thread task raises (solo);
* ``callback``: ``Callback.on_step_end`` raises;
* ``checkpoint-thread``: DeepFreeze's background thread raises after a commit;
* ``writer``: DeepFreeze's writer process of the rank is killed (SIGKILL);
* ``eval``: the evaluation step raises;
* ``rundir``: writing ``metrics.jsonl`` raises (rank 0 writes it).

Only the failure is injected: MPI, the loop, the checkpointer and its writer
process are the real ones. The driver prints ``INJECTED <unix time>`` when it
injects, so the test can time how long the job takes to end after that.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from tests.tiny import tiny_config

PHASES = (
    "data",
    "step",
    "average",
    "callback",
    "checkpoint-thread",
    "writer",
    "eval",
    "rundir",
)


def injected(rank: int, phase: str) -> RuntimeError:
    print(f"INJECTED {time.time():.3f}", flush=True)
    return RuntimeError(f"injected failure on rank {rank} in phase {phase}")


def main() -> None:
    from research.checkpoint import CheckpointConfig
    from research.comm.world import get_world
    from research.entry.run import run_training
    from research.train.checkpointing import CheckpointCallback
    from research.train.loop import Callback

    run_dir, phase, fail_rank, fail_step = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    assert phase in PHASES, phase
    rank = get_world().rank
    mine = rank == fail_rank
    now = {"trainer": None}

    class Tick(Callback):
        def on_train_start(self, trainer) -> None:
            now["trainer"] = trainer

        def on_step_end(self, trainer, step: int) -> None:
            if mine and step == fail_step and phase == "callback":
                raise injected(rank, phase)
            if mine and step == fail_step and phase == "writer":
                from research.checkpoint.writer import WriterProcess

                print(f"INJECTED {time.time():.3f}", flush=True)
                os.kill(WriterProcess.shared().proc.pid, signal.SIGKILL)

    def due() -> bool:  # the loop has completed fail_step steps
        return mine and now["trainer"] is not None and now["trainer"].step == fail_step

    cfg = tiny_config(
        run_dir,
        data_options={"n_train": 512, "n_test": 64},
        batch_size=8,
        steps=fail_step + 40,
        eval_every=fail_step if phase == "eval" else 0,
        log_every=1,
        strategy="solo" if phase == "average" else "host",
        trace=True,
    )
    callbacks: list = [Tick()]
    if phase in ("checkpoint-thread", "writer"):

        def hook(event: str, step: int) -> None:
            # After the commit round, outside any reporting: the thread breaks.
            if (
                mine
                and phase == "checkpoint-thread"
                and event == "committed"
                and (step == fail_step)
            ):
                raise injected(rank, phase)

        ck = CheckpointConfig(saver="deepfreeze", every=2)
        callbacks.append(CheckpointCallback(ck, fault_hook=hook))

    if phase == "data":
        from research.data.sharding import ShardedLoader

        next_batch = ShardedLoader.next_batch

        def failing_next_batch(self):
            if due():
                raise injected(rank, phase)
            return next_batch(self)

        ShardedLoader.next_batch = failing_next_batch
    elif phase == "step":
        import jax
        import jax.numpy as jnp

        from research.steps import jitted as steps

        grad_step = steps.grad_step

        def boom(x):
            raise injected(rank, phase)

        def failing_grad_step(state, x, y):
            if due():
                f = jax.jit(
                    lambda v: jax.pure_callback(
                        boom, jax.ShapeDtypeStruct((), jnp.float32), v
                    )
                )
                jax.block_until_ready(f(jnp.float32(1)))
            return grad_step(state, x, y)

        steps.grad_step = failing_grad_step
    elif phase == "average":
        from research.comm.partial import PartialAllreduce

        advance = PartialAllreduce._advance

        def failing_advance(self):
            if due():
                raise injected(rank, phase)
            return advance(self)

        PartialAllreduce._advance = failing_advance
    elif phase == "eval":
        from research.steps import jitted as steps

        eval_step = steps.eval_step

        def failing_eval_step(state, x, y):
            if due():
                raise injected(rank, phase)
            return eval_step(state, x, y)

        steps.eval_step = failing_eval_step
    elif phase == "rundir":
        from research.rundir import MetricsWriter

        write = MetricsWriter.write

        def failing_write(self, row):
            if due() and row.get("step") == fail_step:
                raise injected(rank, phase)
            return write(self, row)

        MetricsWriter.write = failing_write

    run_training(cfg, "fail", callbacks=callbacks)


if __name__ == "__main__":
    main()
