"""A real multi-process job for the checkpoint fault tests (test_checkpoint_faults).

    mpiexec -n 2 python -m tests.checkpoint_driver save DIR --kill all \
        --kill-event write-started --kill-step 30
    mpiexec -n 2 python -m tests.checkpoint_driver restore DIR
    mpiexec -n 2 python -m tests.checkpoint_driver errors DIR

``save`` trains the deterministic stand-in state of ``tests.checkpoint_state``
with DeepFreeze checkpoints every ``--every`` steps; with ``--kill`` the named
rank (or every rank) SIGKILLs itself when its checkpoint thread reaches
``--kill-event`` of ``--kill-step`` (in the middle of a write or a flush).
``restore`` restores, checks the state bit for bit against a replay of that
many steps, then saves once more (leftovers of a crash must not get in the
way). ``errors`` injects a full disk on the last rank, then a tier path that
is a file, and reports where each failure surfaced. Every rank prints one
``RESULT {json}`` line per outcome.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path

from research.checkpoint import CheckpointError
from research.checkpoint.deepfreeze import DeepFreeze
from research.comm.world import get_world
from tests.checkpoint_state import advance, identical, initial, state_at


def result(world, **kw) -> None:
    print(
        f"r{world.rank} | RESULT " + json.dumps({"rank": world.rank, **kw}), flush=True
    )


def make(world, root: Path, **kw) -> DeepFreeze:
    return DeepFreeze(world, root / "persistent", fast_dir=root / "fast", **kw)


def cmd_save(world, args) -> None:
    kill_ranks = (
        range(world.size)
        if args.kill == "all"
        else ([int(args.kill)] if args.kill is not None else [])
    )

    def hook(event: str, step: int) -> None:
        if (
            world.rank in kill_ranks
            and event == args.kill_event
            and step == args.kill_step
        ):
            print(f"r{world.rank} | KILL at {event} of step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    ckpt = make(
        world,
        args.dir,
        fault_hook=hook,
        keep=args.keep,
        keep_fast_tier=args.keep_fast_tier,
    )
    s = initial(args.scale)
    for k in range(1, args.steps + 1):
        s = advance(s)
        if k % args.every == 0:
            ckpt.save(k, s, extra={"data": {"k": k}})
        time.sleep(args.step_time)
    ckpt.close()
    result(world, saved=ckpt.committed_steps())


def cmd_restore(world, args) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = make(world, args.dir)
        r = ckpt.restore(state_at(0, args.scale))
    for w in caught:
        print(f"WARNING {w.message}", file=sys.stderr, flush=True)
    if r is None:
        result(world, step=None)
        ckpt.close()
        return
    same = identical(r.state, state_at(r.step, args.scale))
    ckpt.save(r.step + 1, advance(r.state))  # the directory is usable again
    ckpt.close()
    result(
        world,
        step=r.step,
        identical=same,
        tiers=r.tiers,
        problems=r.problems,
        extra=r.extra_for(world.rank),
        after=ckpt.committed_steps(),
    )


def _surface(world, ckpt: DeepFreeze, name: str, steps: int = 6) -> None:
    """Keep training and checkpointing until the failure is raised; report where."""
    s = initial()
    where, message, at = "never", "", None
    # Every rank makes every save call (as a training loop that logged the error
    # and went on would): the first error each rank sees is what is reported.
    for k in range(1, steps + 1):
        s = advance(s)
        try:
            ckpt.save(k, s)
        except CheckpointError as e:
            if not message:
                where, at, message = "save", k, str(e)
        time.sleep(0.05)
    try:
        ckpt.wait()
    except CheckpointError as e:
        if not message:
            where, at, message = "wait", None, str(e)
    result(
        world,
        case=name,
        surfaced=where,
        at=at,
        error=message,
        committed=ckpt.committed_steps(),
    )
    # One more checkpoint, whose failure (where a tier is broken) no rank has
    # raised yet; then rank 0 raises every failure it holds and the others
    # none, so the ranks reach close() with different failures left to raise.
    # close() must still meet on every rank (it once raised before its barrier
    # on one rank and left the others waiting there), then raise what is left.
    with contextlib.suppress(CheckpointError):
        ckpt.save(steps + 1, advance(s))
    if world.rank == 0:
        while True:
            try:
                ckpt.wait()
                break
            except CheckpointError:
                continue
    try:
        ckpt.close()
        closed = "ok"
    except CheckpointError:
        closed = "raised"
    result(world, case=f"{name}-close", closed=closed)


def cmd_errors(world, args) -> None:
    last = world.size - 1

    def full_disk(event: str, step: int) -> None:
        # What a full /dev/shm or file system raises from inside the writer.
        if world.rank == last and event == "write-begin" and step == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    _surface(world, make(world, args.dir / "enospc", fault_hook=full_disk), "enospc")
    # A tier where a directory is expected but a file sits: fails even for root,
    # which ignores permission bits.
    root = args.dir / "notdir"
    if world.rank == last:
        (root / "persistent").mkdir(parents=True, exist_ok=True)
        (root / "persistent" / f"rank{last}").write_text("not a directory")
    world.barrier()
    _surface(world, make(world, root), "notdir")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.checkpoint_driver")
    p.add_argument("cmd", choices=("save", "restore", "errors"))
    p.add_argument("dir", type=Path)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--scale", type=int, default=1)
    p.add_argument("--step-time", type=float, default=0.02)
    p.add_argument("--kill", default=None, help="rank to kill, or 'all'")
    p.add_argument("--kill-event", default="write-started")
    p.add_argument("--kill-step", type=int, default=30)
    p.add_argument("--keep-fast-tier", action="store_true")
    args = p.parse_args(argv)
    world = get_world()
    {"save": cmd_save, "restore": cmd_restore, "errors": cmd_errors}[args.cmd](
        world, args
    )


if __name__ == "__main__":
    main()
