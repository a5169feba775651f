"""What TensorBoard scalars cost a run: the same training with and without them.

One MPI job (``--np`` ranks) trains ``--model`` on the embedded synthetic task
with ``--strategy`` (default ``solo``: the most tags, per-rank figures that
differ) for ``--steps`` steps, alternately with ``--tensorboard`` and
``--no-tensorboard``, in ``--rounds`` rounds (the order alternates; round 0 is
a warm-up and is left out), at each ``--log-every`` (1: a row, and so an event,
every step; 10: the default). Per run: rank 0's median step (step 1 left out)
and the wall time of ``Trainer.run`` (evaluations, their per-rank gathers and
the writer's close included). The result per ``--log-every`` is the median over
rounds of on / off, with the rounds' range: the noise floor is the range. Beside
it, what the scalars themselves take, free of that noise: every rank's training
thread inside the board's calls plus rank 0's writer thread CPU, as a share of
the ranks' training time.

    flock /work/bench.lock python -m scripts.bench_tensorboard   # 4 ranks
    python -m scripts.bench_tensorboard --np 2 --steps 100 --rounds 3

Run folders and ``results.json`` go to ``--out`` (default
``runs/bench_tensorboard-<time>``). Measured figures: the docstring of
``research/train/tensorboard.py`` and docs/journal.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench_tensorboard",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--np", type=int, default=4, help="ranks; default %(default)s")
    p.add_argument("--model", default="cnn_small", help="default %(default)s")
    p.add_argument("--strategy", default="solo", help="default %(default)s")
    p.add_argument("--steps", type=int, default=300, help="default %(default)s")
    p.add_argument("--rounds", type=int, default=5, help="default %(default)s")
    p.add_argument(
        "--log-every", type=int, nargs="+", default=[1, 10], help="default 1 10"
    )
    p.add_argument("--eval-every", type=int, default=100, help="default %(default)s")
    p.add_argument("--out", default="", help="folder of the runs and results.json")
    args = p.parse_args(argv)
    if args.rounds < 2 or args.steps < 3 or args.np < 1:
        p.error("--rounds must be >= 2 (round 0 is a warm-up), --steps >= 3, --np >= 1")
    return args


def run_one(world, root: Path, args, log_every: int, on: bool, rnd: int) -> dict:
    from research.train.config import (
        ModelConfig,
        RecordsConfig,
        StrategyConfig,
        TrainConfig,
    )
    from research.train.loop import Trainer

    cfg = TrainConfig(
        model=ModelConfig(args.model),
        strategy=StrategyConfig(args.strategy),
        steps=args.steps,
        records=RecordsConfig(log_every=log_every, tensorboard=on),
        eval_every=args.eval_every,
        progress=False,
        run_dir=str(root / f"r{rnd}-log{log_every}-{'on' if on else 'off'}"),
    )
    world.barrier()
    t0 = time.perf_counter()
    trainer = Trainer(cfg, world)
    summary = trainer.run()
    wall = time.perf_counter() - t0
    # The scalars' own CPU: every rank's training thread in the board's calls,
    # rank 0's writer thread; over every rank's training time.
    board = trainer.records.board
    own = sum(world.allgather(getattr(board, "cost_s", 0.0)))
    writer = getattr(board, "writer", None)
    own += writer.cpu_s if writer is not None else 0.0
    trained = sum(world.allgather(trainer.train_time))
    return {
        "round": rnd,
        "log_every": log_every,
        "tensorboard": on,
        "median_step_s": summary["median_step_s"],
        "run_s": wall,
        "scalars_cpu_s": own,
        "train_time_s": trained,
    }


def ratios(runs: list[dict], log_every: int, key: str) -> list[float]:
    """Per measured round: on / off of ``key``."""
    out = []
    rounds = sorted({r["round"] for r in runs if r["round"] > 0})
    for rnd in rounds:
        pick = {
            r["tensorboard"]: r[key]
            for r in runs
            if r["round"] == rnd and r["log_every"] == log_every
        }
        out.append(pick[True] / pick[False])
    return out


def report(runs: list[dict], args) -> str:
    lines = [
        f"{args.np} ranks, {args.model}, {args.strategy}, {args.steps} steps, "
        f"{args.rounds - 1} measured rounds (+1 warm-up)",
        "| log every | median step off (ms) | on / off | run time off (s) | on / off "
        "| scalars' own CPU |",
        "|---|---|---|---|---|---|",
    ]
    for every in args.log_every:
        off = [r for r in runs if r["log_every"] == every and not r["tensorboard"]]
        off = [r for r in off if r["round"] > 0]
        cells = [str(every)]
        for key, scale, fmt in (("median_step_s", 1e3, ".2f"), ("run_s", 1, ".2f")):
            base = statistics.median(r[key] for r in off) * scale
            rs = ratios(runs, every, key)
            cells.append(f"{base:{fmt}}")
            cells.append(f"{statistics.median(rs):.3f} [{min(rs):.3f}, {max(rs):.3f}]")
        on = [r for r in runs if r["log_every"] == every and r["tensorboard"]]
        share = [r["scalars_cpu_s"] / r["train_time_s"] for r in on if r["round"]]
        cells.append(f"{100 * statistics.median(share):.3f}% of training time")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    from research.entry.launch import maybe_relaunch
    from research.studies.presets import start_job

    maybe_relaunch("scripts.bench_tensorboard", argv, args.np)
    world, root = start_job(1, args.out or None, "bench_tensorboard")
    runs = []
    for rnd in range(args.rounds):
        for i, every in enumerate(args.log_every):
            order = (False, True) if (rnd + i) % 2 == 0 else (True, False)
            for on in order:
                runs.append(run_one(world, root, args, every, on, rnd))
    if world.rank == 0:
        text = report(runs, args)
        print(text, flush=True)
        (root / "results.json").write_text(
            json.dumps({"args": vars(args), "runs": runs, "table": text}, indent=2)
        )


if __name__ == "__main__":
    main()
