"""The communication watchdog's cost on a healthy step (``make bench``, issue 30).

In one MPI job (2 ranks by default) it averages a ResNet-50 gradient (25.6M
float32, 102 MB; another model's with ``--model``) with each dense strategy's
one call (:func:`dense_strategies`: those whose options are the dense
mean's), watched as its training step is:

* ``fused``: the mean inside ``jit`` (``allreduce=auto``), the whole call
  watched as the fused step is (``research/strategies/fused.py``);
* ``host``: numpy buckets on the host, its own watch inside;

in blocks with the watchdog running (its thread looking once a second, the
roll call's thread polling every 0.5 s, every watch recorded, the ring's byte
counter read) and with it stopped (no thread at all; a watch is one attribute
test), the blocks alternating in a rotating order so that load hits both alike.
Each call's time is that of the slowest rank (median over the calls). The
overhead is the ratio on/off per path; it is judged against the noise measured
in the same run: the larger of 2%, either side's spread (interquartile range
over calls, relative to the median) and how far the even and the odd "off"
blocks' medians differ. Then what one look of the watchdog thread costs (rank
0, the thread running): with nothing watched, with a call watched, and reading
this process's TCP counters (what a look adds once a wait has been quiet for a
second).

Run ``python -m scripts.bench_watchdog`` (it starts itself under mpiexec) or
``mpiexec -n 2 python -m scripts.bench_watchdog``. XLA is pinned to one thread
per rank.
"""

from __future__ import annotations

import argparse
import os

from research.entry.cli import doc_parser
from scripts import mpibench
from scripts.mpibench import PINNED, gradient_shapes


def dense_strategies() -> tuple[str, ...]:
    """The strategies whose one call is the dense mean of the gradients: those
    whose options are the dense mean's (``DenseOptions``: fused, host)."""
    from research.strategies import registry
    from research.strategies.fused import DenseOptions

    return tuple(
        n
        for n in registry.names()
        if issubclass(registry.options_class(n), DenseOptions)
    )


PATHS = dense_strategies()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser("python -m scripts.bench_watchdog", __doc__)
    p.add_argument("--ranks", default="2", help="comma-separated rank counts")
    p.add_argument("--blocks", type=int, default=8, help="blocks of each (default 8)")
    p.add_argument("--calls", type=int, default=4, help="calls per path per block")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per path")
    mpibench.add_tree_args(p)
    p.add_argument("--json", metavar="PATH", help="save all numbers as JSON here")
    args = p.parse_args(argv)
    mpibench.check_tree_args(p, args)
    if args.blocks < 1 or args.calls < 1 or args.warmup < 0:
        p.error("--blocks and --calls must be >= 1, --warmup >= 0")
    return args


def run_under_mpi(args: argparse.Namespace) -> dict:
    """Time both paths with the watchdog on and off; the table (every rank)."""
    for k, v in PINNED.items():
        os.environ.setdefault(k, v)
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np

    from research.comm.faults import traffic, watchdog
    from research.comm.world import abort, get_world
    from research.strategies import registry

    world = get_world()
    comm = world.comm
    shapes, source = gradient_shapes(args.synthetic, args.model)
    rng = np.random.default_rng(world.rank)
    tree = jax.tree.map(
        lambda s: jnp.asarray(rng.standard_normal(s.shape, np.float32)), shapes
    )
    strategies = {name: registry.create(name, world) for name in PATHS}
    calls = {name: (lambda s=s: s(tree)) for name, s in strategies.items()}
    for fn in calls.values():
        for _ in range(args.warmup):
            fn()

    def set_watchdog(on: bool) -> None:
        if on and watchdog.get() is None:
            watchdog.start(comm, abort)  # collective: the roll call's Dup, the board
        elif not on and watchdog.get() is not None:
            watchdog.stop()
        comm.Barrier()

    times = {(p, on): [] for p in PATHS for on in (True, False)}
    off_blocks: list[list[float]] = []
    for block in range(2 * args.blocks):
        on = (block + block // 2) % 2 == 0  # on off off on on off ...
        set_watchdog(on)
        mine = []
        for _ in range(args.calls):
            for name in PATHS if block % 2 else PATHS[::-1]:
                comm.Barrier()
                t0 = time.perf_counter()
                calls[name]()
                slowest = max(comm.allgather(time.perf_counter() - t0))
                times[name, on].append(slowest)
                mine.append(slowest)
        if not on:
            off_blocks.append(mine)
    set_watchdog(True)

    table = {}
    for (name, on), ts in times.items():
        q1, med, q3 = np.percentile(ts, [25, 50, 75])
        table[f"{name}-{'on' if on else 'off'}"] = {
            "median_s": float(med),
            "min_s": float(np.min(ts)),
            "iqr_rel": float((q3 - q1) / med),
            "calls": len(ts),
        }
    halves = [[t for b in off_blocks[i::2] for t in b] for i in (0, 1)]
    even, odd = (float(np.median(h)) if h else None for h in halves)
    odd = odd or even
    twins = float(abs(even - odd) / min(even, odd))
    overhead = {}
    for name in PATHS:
        on, off = table[f"{name}-on"], table[f"{name}-off"]
        noise = max(0.02, twins, on["iqr_rel"], off["iqr_rel"])
        ratio = on["median_s"] / off["median_s"]
        overhead[name] = {"ratio": ratio, "noise": noise, "within": ratio <= 1 + noise}
    return {
        "ranks": world.size,
        "tree": source,
        "bytes": int(sum(x.size for x in jax.tree.leaves(tree)) * 4),
        "blocks": args.blocks,
        "calls_per_block": args.calls,
        "loadavg_1min": os.getloadavg()[0],
        "paths": {n: s.mean.path() for n, s in strategies.items()},
        "variants": table,
        "twin_off_blocks_rel": twins,
        "overhead": overhead,
        "tick_us": tick_costs(watchdog, traffic) if world.is_root else None,
    }


def tick_costs(watchdog, traffic, n: int = 2000) -> dict[str, float]:
    """Microseconds of one look of the watchdog (this rank's, running)."""
    import time

    dog = watchdog.get()

    def per_call(fn, reps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps * 1e6

    out = {"nothing_watched": per_call(lambda: dog.check(time.monotonic()), n)}
    with watchdog.watch("bench: one call watched"):
        out["a_call_watched"] = per_call(lambda: dog.check(time.monotonic()), n)
    out["reading_tcp"] = per_call(traffic.tcp_bytes, max(1, n // 10))

    def enter_exit() -> None:
        with watchdog.watch("bench: enter and leave"):
            pass

    out["watch_enter_exit"] = per_call(enter_exit, n)
    return out


def format_table(result: dict) -> str:
    lines = [
        f"ranks={result['ranks']}  {result['bytes'] / 1e6:.1f} MB ({result['tree']}); "
        f"{result['blocks']} blocks on and off, {result['calls_per_block']} calls "
        f"per path each; load {result['loadavg_1min']:.1f}",
        f"  {'variant':12s} {'median ms':>10s} {'min ms':>8s} {'spread':>7s}  path",
    ]
    for name, row in result["variants"].items():
        path = result["paths"][name.rsplit("-", 1)[0]]
        lines.append(
            f"  {name:12s} {row['median_s'] * 1e3:10.1f} {row['min_s'] * 1e3:8.1f} "
            f"{row['iqr_rel']:7.1%}  {path}"
        )
    for name, o in result["overhead"].items():
        verdict = "within noise" if o["within"] else "NOT within noise"
        lines.append(
            f"  watchdog: {name} {o['ratio']:.3f}x with it running "
            f"(noise {o['noise']:.0%}): {verdict}"
        )
    tick = result.get("tick_us")
    if tick:
        lines.append(
            f"  one look of the watchdog thread (once a second): "
            f"{tick['nothing_watched']:.1f} us with nothing watched, "
            f"{tick['a_call_watched']:.1f} us with a call watched, "
            f"+{tick['reading_tcp']:.0f} us reading TCP once a wait is quiet 1 s; "
            f"a watch entered and left: {tick['watch_enter_exit']:.1f} us"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return mpibench.main(
        "scripts.bench_watchdog", argv, parse_args, run_under_mpi, format_table
    )


if __name__ == "__main__":
    raise SystemExit(main())
