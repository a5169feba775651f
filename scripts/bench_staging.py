"""What staging a GPU buffer through host memory costs, by each way of doing it:
one process, no network, nothing but the copies.

    python -m scripts.bench_staging [--mb 1,10,102.2] [--reps 9] [--json PATH]

On an H200 (2026-11-28, ``docs/results/gpu.md``) ``fused``, mpi4jax's allreduce
of GPU arrays staged through host memory by mpi4jax (MPICH is not CUDA-aware),
took 89.9 ms for ResNet-50's 102 MB gradient at 2 ranks, and ``host`` (the
arrays to host by JAX, the C++ ring, back) 36.1 ms, of which the ring alone
took 28.7. Whether the ring inside the fused step, staged through host by XLA's
host callback (``allreduce=ring`` on GPU arrays, ``research.comm.dense.ring``),
takes ``host``'s time or ``fused``'s depends on what each way of staging
costs; this measures it, per size, median of ``--reps`` interleaved calls
after one untimed call each:

* ``host-memcpy``: one ``np.copyto`` of the size on the host (the floor of a
  host copy; a round trip makes at least two);
* ``device-pass``: ``x * 2`` in ``jit`` (one pass over the buffer where it lives);
* ``pjrt-round-trip``: ``np.asarray(x)`` then ``jax.device_put`` of the result,
  waited for: what the ``host`` averager's copies cost;
* ``ring-staged-self``: the staged ring inside ``jit`` on a one-rank
  communicator: XLA's host callback (to host, Python, back) around the ring's
  copy of one rank;
* ``mpi4jax-self``: mpi4jax's ``allreduce`` on ``MPI.COMM_SELF`` inside
  ``jit``: mpi4jax's staging (``MPI4JAX_USE_CUDA_MPI`` unset) around one
  ``MPI_Allreduce`` of one rank, which is a host copy.

Each row also gives its ratio to ``pjrt-round-trip`` of the same size. On a
machine without a GPU it runs on the CPU, where "host" and "device" are the
same memory: the figures then say nothing about a GPU (the tests use it so).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from research.entry.cli import doc_parser

#: ResNet-50's gradient: 25,557,032 float32 (``docs/results/gpu.md``'s allreduce).
RESNET50_MB = 102.228128
VARIANTS = (
    "host-memcpy",
    "device-pass",
    "pjrt-round-trip",
    "ring-staged-self",
    "mpi4jax-self",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser("python -m scripts.bench_staging", __doc__)
    p.add_argument(
        "--mb",
        default=f"1,10,{RESNET50_MB}",
        help="comma-separated buffer sizes in MB of float32 (default %(default)s)",
    )
    p.add_argument("--reps", type=int, default=9, help="timed calls (%(default)s)")
    p.add_argument("--json", metavar="PATH", help="save the results as JSON here")
    args = p.parse_args(argv)
    try:
        args.mb = [float(s) for s in args.mb.split(",") if s.strip()]
    except ValueError:
        p.error(f"--mb: numbers separated by commas, got {args.mb!r}")
    if not args.mb or min(args.mb) <= 0:
        p.error("--mb: give at least one size, each above 0")
    if args.reps < 1:
        p.error("--reps must be >= 1")
    return args


def variants(n: int) -> dict[str, Any]:
    """Each variant as a function of no arguments that returns when done, on
    a buffer of ``n`` float32 on JAX's default device."""
    import jax
    import jax.numpy as jnp
    import mpi4jax
    import numpy as np
    from mpi4py import MPI

    from research.comm.dense import ring

    x = jax.device_put(jnp.arange(n, dtype=jnp.float32))
    src = np.ones(n, np.float32)
    dst = np.empty_like(src)
    twice = jax.jit(lambda v: v * 2.0)
    self_sum = jax.jit(lambda v: mpi4jax.allreduce(v, op=MPI.SUM, comm=MPI.COMM_SELF))
    one = MPI.COMM_SELF.Dup()  # the ring's own communicator
    ring_self = jax.jit(lambda v: ring.allreduce(v, op=MPI.SUM, comm=one, staged=True))

    def round_trip() -> None:
        jax.device_put(np.asarray(x)).block_until_ready()

    return {
        "host-memcpy": lambda: np.copyto(dst, src),
        "device-pass": lambda: twice(x).block_until_ready(),
        "pjrt-round-trip": round_trip,
        "ring-staged-self": lambda: ring_self(x).block_until_ready(),
        "mpi4jax-self": lambda: self_sum(x).block_until_ready(),
    }


def measure(mb: float, reps: int) -> dict[str, Any]:
    """The table of one size: each variant's median and its ratio."""
    n = max(1, round(mb * 1e6 / 4))
    fns = variants(n)
    for fn in fns.values():  # compile, fault the pages in
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for rep in range(reps):  # interleaved and rotated, as bench_allreduce
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
    rows = {k: {"median_ms": statistics.median(v) * 1e3} for k, v in times.items()}
    base = rows["pjrt-round-trip"]["median_ms"]
    for row in rows.values():
        row["ratio"] = row["median_ms"] / base if base > 0 else None
    return {"mb": n * 4 / 1e6, "floats": n, "reps": reps, "variants": rows}


def format_table(result: dict[str, Any]) -> str:
    sizes = result["sizes"]
    head = "| variant | " + " | ".join(f"{s['mb']:.1f} MB ms (x)" for s in sizes) + " |"
    lines = [head, "|---|" + "---|" * len(sizes)]
    for name in VARIANTS:
        cells = []
        for s in sizes:
            v = s["variants"][name]
            ratio = "-" if v["ratio"] is None else f"{v['ratio']:.2f}"
            cells.append(f"{v['median_ms']:.2f} ({ratio})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import jax

    dev = jax.devices()[0]
    result = {
        "platform": dev.platform,
        "device": getattr(dev, "device_kind", str(dev)),
        "jax": jax.__version__,
        "sizes": [],
    }
    for mb in args.mb:
        result["sizes"].append(measure(mb, args.reps))
        print(f"bench_staging: {mb:.1f} MB done", flush=True)
    print(
        f"Staging through host on {result['device']} ({result['platform']}), "
        f"median of {args.reps}; (x) is the ratio to pjrt-round-trip:"
    )
    print(format_table(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
