"""Cost of running a step stage by stage: staged vs monolithic gradient.

For each model it times, in one process, with warm-up and interleaved
repetitions (the order alternates every repetition), the median of:

* ``monolithic`` (the baseline): ``research.steps.jitted.grad_step``, one jitted
  program for forward, loss and backward;
* ``staged``: ``research.steps.stages.StagedGrad.grad``, one jitted forward and
  one jitted backward per stage (stem, each block or layer group, head) plus the
  loss, with the residuals handed between them as device arrays;

and prints the ratio staged / monolithic (target: at most 1.10). ``--diagnose``
adds what explains a gap: the forward alone both ways (monolithic: the loss
without its gradient), the staged backward alone, ``one-group`` (all stages as
one group: forward and backward are two programs with the residuals between
them, but there are no stage boundaries), and the dispatch cost (the staged
step's host time on a batch of one, not waiting for results: mostly Python and
dispatch).

Both variants run in the same process, so XLA uses the same thread pool and the
same flags for both; ``--cpus N`` pins the process to the first N allowed cores
and ``--single-thread`` turns off XLA's multi-threaded Eigen (one thread per op).
The machine's load average is printed with the results: on a shared machine,
rerun when it is quiet.

Run ``python -m scripts.bench_stages`` (defaults: resnet50 and vgg16 at 64x64,
batch 8, 5 repetitions; about two minutes on two quiet cores, mostly
compilation). Measured figures and what explained a gap are in
``research/steps/stages.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from research.entry.cli import doc_parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser("python -m scripts.bench_stages", __doc__)
    p.add_argument("--models", default="resnet50,vgg16", help="comma-separated")
    p.add_argument("--batch", type=int, default=8, help="examples per step (8)")
    p.add_argument("--image-size", type=int, default=64, help="height = width (64)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions (5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls (2)")
    p.add_argument("--cpus", type=int, default=0, help="pin to N cores (0: all)")
    p.add_argument(
        "--single-thread", action="store_true", help="XLA Eigen single-threaded"
    )
    p.add_argument("--diagnose", action="store_true", help="also time the parts")
    args = p.parse_args(argv)
    if args.reps < 1 or args.batch < 1 or args.warmup < 1:
        p.error("--reps, --batch and --warmup must be positive")
    return args


def _setup(args: argparse.Namespace) -> None:
    """CPU affinity and XLA flags, before jax is imported."""
    if args.cpus:
        allowed = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, allowed[: args.cpus])
    if args.single_thread:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false"
    from models import xla_cpu

    xla_cpu.apply()  # the models' XLA:CPU flag, as the experiments' ranks get it


def _state(model, batch: int):
    """TrainState and a batch from numpy draws (no RNG program to compile)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from research.steps.state import TrainState

    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, *model.input_shape)).astype(np.float32)
    y = rng.integers(0, model.num_classes, size=batch).astype(np.int32)
    shapes = jax.eval_shape(
        lambda x: model.init({"params": jax.random.key(0)}, x, train=False), x[:1]
    )

    def fill(path, leaf):
        key = jax.tree_util.keystr(path)
        if key.endswith("['var']") or key.endswith("['scale']"):
            return jnp.ones(leaf.shape, leaf.dtype)
        fan_in = np.prod(leaf.shape[:-1]) if key.endswith("['kernel']") else 25.0
        draw = rng.normal(size=leaf.shape).astype(np.float32) / np.sqrt(fan_in)
        return jnp.asarray(draw, leaf.dtype)

    variables = jax.tree_util.tree_map_with_path(fill, shapes)
    state = TrainState.create(
        apply_fn=model.apply,
        params=variables["params"],
        tx=optax.sgd(0.1),
        batch_stats=variables.get("batch_stats", {}),
        rng=jax.random.PRNGKey(1),
    )
    return state, jnp.asarray(x), jnp.asarray(y)


def bench_model(name: str, args: argparse.Namespace) -> dict[str, float]:
    """Median seconds per variant for one model."""
    import jax
    import optax

    import models
    from research.steps.jitted import grad_step
    from research.steps.stages import StagedGrad, group_stages

    model = models.get_model(name, num_classes=10, image_size=args.image_size)
    state, x, y = _state(model, args.batch)
    staged = StagedGrad(model)

    def mono_loss(state, x, y):
        rngs = {"dropout": jax.random.fold_in(state.rng, state.step)}
        variables = {"params": state.params}
        mutable = []
        if jax.tree_util.tree_leaves(state.batch_stats):
            variables["batch_stats"] = state.batch_stats
            mutable = ["batch_stats"]
        logits, _ = model.apply(variables, x, train=True, rngs=rngs, mutable=mutable)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    mono_fwd = jax.jit(mono_loss)

    def staged_bwd():
        staged.forward(state, x, y)
        jax.block_until_ready(staged._saved)
        t = time.perf_counter()
        jax.block_until_ready(list(staged.backward()))
        return time.perf_counter() - t

    variants = {
        "monolithic": lambda: jax.block_until_ready(grad_step(state, x, y)),
        "staged": lambda: jax.block_until_ready(staged.grad(state, x, y)),
    }
    if args.diagnose:
        variants["mono-forward"] = lambda: jax.block_until_ready(mono_fwd(state, x, y))
        variants["staged-forward"] = lambda: jax.block_until_ready(
            (staged.forward(state, x, y), staged._saved)
        )
        variants["staged-backward"] = staged_bwd
        whole = StagedGrad(model, group_stages(staged.stages, [len(staged.stages)]))
        variants["one-group"] = lambda: jax.block_until_ready(whole.grad(state, x, y))
    names = list(variants)
    for v in names:
        t = time.perf_counter()
        for _ in range(args.warmup):
            variants[v]()
        print(f"  {name} {v}: warm-up {time.perf_counter() - t:.1f} s", flush=True)
    times: dict[str, list[float]] = {v: [] for v in names}
    for rep in range(args.reps):
        for v in names if rep % 2 == 0 else reversed(names):
            t = time.perf_counter()
            own = variants[v]()
            elapsed = time.perf_counter() - t
            times[v].append(own if isinstance(own, float) else elapsed)
            own = None  # freed here, not inside the next variant's timing
    result = {v: statistics.median(ts) for v, ts in times.items()}
    if args.diagnose:
        # Host time of a staged step whose programs do (almost) nothing to wait
        # for: a batch of one, timed without blocking on the results.
        small = StagedGrad(model, staged.stages)
        x1, y1 = x[:1], y[:1]
        jax.block_until_ready(small.grad(state, x1, y1))
        host = []
        for _ in range(args.reps):
            t = time.perf_counter()
            out = small.grad(state, x1, y1)
            host.append(time.perf_counter() - t)
            jax.block_until_ready(out)
        result["staged-dispatch"] = statistics.median(host)
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _setup(args)
    import jax

    cores = len(os.sched_getaffinity(0))
    print(
        f"jax {jax.__version__}, {cores} cores, XLA_FLAGS="
        f"{os.environ.get('XLA_FLAGS', '')!r}, batch {args.batch}, "
        f"{args.image_size}x{args.image_size}, median of {args.reps}",
        flush=True,
    )
    rows = []
    for name in args.models.split(","):
        load = os.getloadavg()[0]
        result = bench_model(name.strip(), args)
        rows.append((name, result, load, os.getloadavg()[0]))
    print(f"\n{'model':<10} {'variant':<16} {'median s':>9} {'/ mono':>7}")
    for name, result, before, after in rows:
        for v, sec in result.items():
            ratio = sec / result["monolithic"]
            print(f"{name:<10} {v:<16} {sec:9.4f} {ratio:7.3f}")
        print(f"{name:<10} load average {before:.2f} before, {after:.2f} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
