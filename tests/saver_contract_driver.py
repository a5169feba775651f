"""The saver contract as real MPI jobs (``tests/test_saver_contract.py``).

    mpiexec -n 2 python -m tests.saver_contract_driver crash ROOT SAVER...
    mpiexec -n 3 python -m tests.saver_contract_driver resume ROOT SAVER...

``crash``, for every saver named: save steps 2 and 4 (each committed before
``save``/``wait`` returns), restore step 4 with a second instance and compare
it bit for bit with the state saved; then start saving step 6 in a thread of
its own per saver, and once every saver has written its data for step 6 on
this rank (the ``"written"`` fault hook, where each one stops until the
process dies), SIGKILL every rank: step 6 is on disk, uncommitted. ``resume``
(at another world size): restore must give step 4, bit for bit; a save of
step 6 then commits over the crash's leftovers, and a restore gives it back.
Every rank prints ``RESULT {json}`` lines; ``--module M`` (with ``--path``)
registers the savers of an outside module first (by importing it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

from research.checkpoint import CheckpointConfig
from research.comm.world import get_world
from tests.checkpoint_state import host, identical, state_at

#: Seconds every saver has to reach ``written`` for step 6 (a hang guard).
REACH_S = 120


def result(world, **kw) -> None:
    line = json.dumps({"rank": world.rank, "size": world.size, **kw})
    print(f"r{world.rank} | RESULT {line}", flush=True)


def config(root: Path, saver: str) -> CheckpointConfig:
    return CheckpointConfig(
        saver=saver,
        directory=str(root / saver / "persistent"),
        fast_dir=str(root / saver / "fast"),
        fsync=False,
    )


def cmd_crash(world, root: Path, savers: list[str]) -> None:
    for saver in savers:
        ckpt = config(root, saver).create(world)
        for step in (2, 4):
            ckpt.save(step, state_at(step), extra={"at": step})
            ckpt.wait()
        ckpt.close()
        again = config(root, saver).create(world)
        back = again.restore(state_at(0))
        again.close()
        result(
            world,
            case="roundtrip",
            saver=saver,
            step=back.step,
            identical=identical(back.state, host(state_at(4))),
            extra=back.extra_for(world.rank),
        )
    # Step 6 of every saver, each stopped where its data is written.
    reached, threads = [], []
    for saver in savers:
        event = threading.Event()

        def hook(name, step, event=event):
            if name == "written" and step == 6:
                event.set()
                threading.Event().wait()  # until the process is killed

        ckpt = config(root, saver).create(world, fault_hook=hook)
        thread = threading.Thread(
            target=ckpt.save, args=(6, state_at(6)), name=f"save-{saver}", daemon=True
        )
        thread.start()
        reached.append(event)
        threads.append(thread)
        # One saver at a time: its save has written (or returned) on this rank
        # before the next starts, so no two savers' collectives interleave in
        # different orders on different ranks (concurrent starts hung here once:
        # two savers' step 6 never written on rank 0 in 120 s, under load).
        start = time.monotonic()
        while not event.is_set() and thread.is_alive():
            if time.monotonic() - start > REACH_S:
                break
            time.sleep(0.02)
    # Which ranks write depends on the saver (rank 0 alone, or every rank): go
    # once some rank has written each saver's step 6 and every rank has
    # written it or returned from save (a background writer gets a moment).
    deadline = time.monotonic() + REACH_S
    while True:
        mine = np.array(
            [
                [e.is_set(), e.is_set() or not t.is_alive()]
                for e, t in zip(reached, threads)
            ],
            np.int32,
        )
        late = int(time.monotonic() > deadline)
        some, every = np.empty(len(savers) + 1, np.int32), np.empty_like(mine[:, 1])
        world.comm.Allreduce(
            np.append(mine[:, 0], late).astype(np.int32), some, op=MPI.MAX
        )
        world.comm.Allreduce(np.ascontiguousarray(mine[:, 1]), every, op=MPI.MIN)
        if (some[:-1].all() and every.all()) or some[-1]:  # the same on every rank
            break
        time.sleep(0.05)
    time.sleep(0.5)
    written = [e.is_set() for e in reached]
    result(
        world,
        case="crash",
        written=dict(zip(savers, written)),
        ready=bool(some[:-1].all()),
    )
    world.comm.Barrier()
    os.kill(os.getpid(), signal.SIGKILL)


def cmd_resume(world, root: Path, savers: list[str]) -> None:
    for saver in savers:
        back = config(root, saver).create(world).restore(state_at(0))
        ok = back is not None and identical(back.state, host(state_at(4)))
        ckpt = config(root, saver).create(world)
        ckpt.save(6, state_at(6))
        ckpt.wait()
        ckpt.close()
        again = config(root, saver).create(world)
        last = again.restore(state_at(0))
        again.close()
        result(
            world,
            case="resume",
            saver=saver,
            step=None if back is None else back.step,
            identical=ok,
            after=last.step,
            after_identical=identical(last.state, host(state_at(6))),
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=("crash", "resume"))
    p.add_argument("root", type=Path)
    p.add_argument("savers", nargs="+")
    p.add_argument("--module")
    p.add_argument("--path")
    args = p.parse_args()
    if args.module:
        import importlib

        sys.path.insert(0, args.path)
        importlib.import_module(args.module)  # registers its savers
    world = get_world()
    {"crash": cmd_crash, "resume": cmd_resume}[args.cmd](world, args.root, args.savers)


if __name__ == "__main__":
    main()
