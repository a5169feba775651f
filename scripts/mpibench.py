"""What the benchmarks that start themselves under mpiexec share.

``scripts.bench_allreduce`` and ``scripts.bench_watchdog`` run as one program in
two roles: started plainly, :func:`main` relaunches the module under mpiexec once
per rank count (``--ranks 2,4``; ``--hosts``, where the script has it, places
the ranks on nodes; bad counts or hosts are one line and exit 2), each job
writing its table as JSON to a temporary file, and saves them all
(``{"runs": [...]}``) to ``--json``; started by mpiexec, it times in the job
(the script's ``run_under_mpi``) and rank 0 prints the table and saves it.
Both average the tree of :func:`gradient_shapes`: ResNet-50's parameters
(25.6M float32, 102 MB), or another model's (``--model``).
``scripts.bench_link`` (:func:`drop_values`, :func:`root_on_path`) and
``scripts.bench_handles`` (:func:`root_on_path`) launch their own jobs.

Not a benchmark itself: nothing to run here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

# Before jax is imported anywhere: one XLA thread per rank, or the ranks' Eigen
# pools fight over the same cores and the timings measure the scheduler.
PINNED = {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false", "NPROC": "1"}
ROOT = Path(__file__).resolve().parent.parent


# -- the gradient tree ---------------------------------------------------------


def resnet50_shapes() -> dict[str, tuple[int, ...]]:
    """ResNet-50 (v1.5, 1000 classes) parameter shapes, without flax."""
    shapes: dict[str, tuple[int, ...]] = {"stem/conv": (7, 7, 3, 64)}
    shapes["stem/bn/scale"] = shapes["stem/bn/bias"] = (64,)
    cin = 64
    for stage, (blocks, width) in enumerate(
        zip((3, 4, 6, 3), (64, 128, 256, 512), strict=True)
    ):
        for b in range(blocks):
            pre = f"stage{stage}/block{b}"
            for j, (k, ci, co) in enumerate(
                ((1, cin, width), (3, width, width), (1, width, 4 * width))
            ):
                shapes[f"{pre}/conv{j}"] = (k, k, ci, co)
                shapes[f"{pre}/bn{j}/scale"] = shapes[f"{pre}/bn{j}/bias"] = (co,)
            if b == 0:
                shapes[f"{pre}/proj"] = (1, 1, cin, 4 * width)
                shapes[f"{pre}/proj_bn/scale"] = (4 * width,)
                shapes[f"{pre}/proj_bn/bias"] = (4 * width,)
            cin = 4 * width
    shapes["fc/kernel"] = (2048, 1000)
    shapes["fc/bias"] = (1000,)
    return shapes


def gradient_shapes(synthetic: bool, model: str = "resnet50") -> tuple[object, str]:
    """ShapeDtypeStructs of ``model``'s parameters (ResNet-50's by default), and
    where they came from. ``synthetic``: ResNet-50's built-in list, without
    Flax (where ``models/`` cannot be used)."""
    import jax
    import jax.numpy as jnp

    if not synthetic:
        try:
            import models

            built = models.get_model(model)
            x = jnp.zeros((1, *built.input_shape), jnp.float32)
            variables = jax.eval_shape(
                lambda: built.init(jax.random.PRNGKey(0), x, train=False)
            )
            return variables["params"], f"models.get_model({model!r})"
        except Exception as exc:  # noqa: BLE001 - any failure: use the built-in list
            if model != "resnet50":
                raise
            print(
                f"models/ unusable ({exc!r}); using built-in ResNet-50 shapes",
                file=sys.stderr,
            )
    tree = {
        k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in resnet50_shapes().items()
    }
    return tree, "built-in ResNet-50 shapes"


def add_tree_args(p: argparse.ArgumentParser) -> None:
    """``--model`` and ``--synthetic``: whose gradient the benchmark averages."""
    import models

    p.add_argument(
        "--model",
        default="resnet50",
        choices=models.list_models(),
        metavar="NAME",
        help="average this model's gradient (default resnet50, the papers'; "
        f"one of {', '.join(models.list_models())}: a small one for a quick run)",
    )
    p.add_argument(
        "--synthetic",
        action="store_true",
        help="use the built-in ResNet-50 shapes even if models/ exists",
    )


def check_tree_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.synthetic and args.model != "resnet50":
        p.error(f"--synthetic is ResNet-50's built-in shapes, not --model {args.model}")


# -- launching -----------------------------------------------------------------


def drop_values(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """``argv`` without ``flags`` and their values (``--f v`` and ``--f=v``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        elif not a.startswith(tuple(f + "=" for f in flags)):
            out.append(a)
    return out


def root_on_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the checkout first on PYTHONPATH (``-m scripts.X`` resolves)."""
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), env.get("PYTHONPATH")])
    )
    return env


def run_or_launch(
    module: str, ranks: int, argv: list[str] | None, bench: Callable[[], None]
) -> None:
    """Inside an MPI job, ``bench()``; else start ``python -m module`` with the
    same arguments under this environment's mpiexec on ``ranks`` ranks and
    exit with its status."""
    from research.comm.process.env import launched_by_mpi

    if launched_by_mpi():
        bench()
        return
    from research.entry.launch import mpiexec_path

    cmd = [mpiexec_path(), "-n", str(ranks)]
    cmd += [sys.executable, "-m", module, *(sys.argv[1:] if argv is None else argv)]
    raise SystemExit(subprocess.call(cmd, cwd=ROOT, env=root_on_path(dict(os.environ))))


def relaunch(
    module: str, args: argparse.Namespace, argv: list[str], env: Mapping[str, str]
) -> list[dict]:
    """Run ``module`` under mpiexec once per rank count; collect the tables.

    ``env`` is the jobs' environment before
    :func:`research.comm.process.malloc.launch_env` (which gives every rank our malloc,
    as ``research.entry.launch.relaunch`` does); ``args.ranks`` the rank counts,
    ``args.hosts`` (if the script has it) the nodes to place them on. Bad counts or
    hosts: one line and exit 2 before any job starts.
    """
    from research.comm.process.malloc import launch_env

    env = root_on_path(launch_env(dict(env)))
    forward = drop_values(argv, ("--json", "--ranks", "--hosts"))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for np_, launcher, extra in _launchers(module, args):
            out = Path(tmp) / f"np{np_}.json"
            cmd = [*launcher, sys.executable, "-m", module, *forward]
            cmd += ["--json", str(out)]
            proc = subprocess.run(cmd, cwd=ROOT, env={**env, **extra})
            if proc.returncode != 0:
                raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}")
            results.append(json.loads(out.read_text()))
    return results


def _launchers(
    module: str, args: argparse.Namespace
) -> list[tuple[int, list[str], dict[str, str]]]:
    """``(ranks, launcher, its environment)`` per rank count of ``--ranks``."""
    from research.entry.launch import launch_command
    from research.usage import USAGE_EXIT, UsageError

    try:
        counts = [int(r) for r in args.ranks.split(",") if r.strip()]
    except ValueError:
        counts = []
    try:
        if not counts or min(counts) < 1:
            raise UsageError(f"--ranks {args.ranks!r}: give rank counts >= 1, e.g. 2,4")
        return [(n, *launch_command(n, getattr(args, "hosts", ""))) for n in counts]
    except UsageError as e:
        print(f"{module}: error: {e}", file=sys.stderr)
    raise SystemExit(USAGE_EXIT)


def main(
    module: str,
    argv: list[str] | None,
    parse_args: Callable[[list[str]], argparse.Namespace],
    run_under_mpi: Callable[[argparse.Namespace], dict],
    format_table: Callable[[dict], str],
    job_env: Callable[[argparse.Namespace], dict[str, str]] | None = None,
) -> int:
    """A self-relaunching benchmark's entry point (see the module docstring).

    ``job_env(args)`` is the environment the jobs start with (default: this
    process's, unbuffered, with XLA pinned to one thread per rank).
    """
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from research.comm.process.env import launched_by_mpi

    if not launched_by_mpi():
        env = (
            job_env(args)
            if job_env
            else dict(os.environ, PYTHONUNBUFFERED="1", **PINNED)
        )
        results = relaunch(module, args, argv, env)
        if args.json:
            Path(args.json).write_text(json.dumps({"runs": results}, indent=2))
        return 0
    result = run_under_mpi(args)
    from research.comm.world import get_world

    if get_world().is_root:
        print(format_table(result), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
    return 0
