"""The project on a GPU machine, checked and measured in one run (issue 41).

    python -m scripts.gpu_check [--out DIR] [--stages models,strategies,...]
    bash scripts/gpu_check.sh          # a lent GPU machine: install, then this

Stages, in this order, each writing into the run folder (default
``runs/gpu-<UTC time>``):

* ``machine``: the GPUs (``nvidia-smi``), JAX's devices and versions.
* ``models``: ResNet-50 (batch 128) training steps at 224x224, fp32 and
  bf16, the project's (``scripts.bench_gpu``, JAX) against torchvision's, one
  at a time with nothing else on the GPU; ``vgg`` (last, as the least needed)
  the same for VGG-16 (batch 64).
* ``strategies``: ``experiments.train`` (cnn_small, the embedded synthetic
  task) for every strategy at 1 and 2 ranks, on the GPU and, for the
  accuracy it must equal, on the CPU (``JAX_PLATFORMS=cpu``), ``--jobs`` runs
  at a time (their step times are concurrent ones: read them as a check that
  each runs, not as a benchmark).
* ``stop``: every strategy at 2 ranks on the GPU with DeepFreeze checkpoints,
  SIGTERM once it trains: it must exit 143 with the stop step checkpointed.
* ``allreduce``: ``scripts.bench_allreduce --xla`` on ResNet-50's 102 MB
  gradient as GPU arrays, 2 ranks (one GPU: its ranks share it, which XLA's
  collectives, NCCL, refuse: said in the table).
* ``eager_sgd``: ``make run``'s experiment, one seed, on the GPU.
* ``staging``: ``scripts.bench_staging``: what staging GPU buffers through
  host memory costs each way (JAX's transfers, the staged ring's host
  callback, mpi4jax's), one process, 1 to 102 MB.
* ``input``: ``scripts.bench_input``: the ImageNet pipeline per core and per
  worker count against torchvision's path, and ResNet-50 reading its files
  against the same run on synthetic data (can the host's cores feed the GPU?).
* ``stall``: ``scripts.gpu_stall``: rank 1 of a 2-rank training job stopped
  (SIGSTOP) on each allreduce path (fused with mpi4jax, fused with the staged
  ring, host); each job must end with exit 124 within ``--comm-timeout`` plus
  the bound, naming the collective, nothing of it left on the GPU.

Then ``table.md`` and ``checks.json`` (each of issue 41's GPU checks, met or
not), which ``python -m scripts.results DIR`` renders into
``docs/results/gpu.md``. ``--budget-s`` bounds the whole (stages that would
start after it are skipped and said so) and ``--deadline-s`` every job (one
still running then is ended, its process group with it), so that a lent
machine's minutes bring back what ran. ``--quick`` is the CPU rehearsal the
tests run: a tiny model, two strategies, no torch where it is not installed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from research.entry.cli import doc_parser
from research.strategies import registry
from scripts.gpu_jobs import Check, end_job, gpu_names, python_cmd

STAGES = (
    "machine",
    "models",
    "strategies",
    "stop",
    "allreduce",
    "eager_sgd",
    "vgg",
    "staging",
    "stall",
    "input",
)
#: Every registered strategy (``research.strategies``: options only, no MPI).
STRATEGIES = tuple(registry.names())
#: (model, batch) at 224x224 (the target: ``scripts.gpu_report.TARGET_RATIO``).
MODELS = {"models": (("resnet50", 128),), "vgg": (("vgg16", 64),)}
TRAIN_STEPS = 300


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = doc_parser("python -m scripts.gpu_check", __doc__)
    p.add_argument("--out", help="run folder (default runs/gpu-<UTC time>)")
    p.add_argument(
        "--stages",
        default=",".join(STAGES),
        help="comma-separated, of: " + ", ".join(STAGES) + " (default: all)",
    )
    p.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help="comma-separated, the strategies the strategies and stop stages run "
        "(default: all; e.g. adaptive to run one again)",
    )
    p.add_argument("--jobs", type=int, default=6, help="concurrent training runs")
    p.add_argument(
        "--budget-s",
        type=float,
        default=450.0,
        help="no stage starts after this many seconds (default %(default)s)",
    )
    p.add_argument(
        "--deadline-s",
        type=float,
        help="every job still running this many seconds after the start is ended "
        "(default: --budget-s + 240)",
    )
    p.add_argument("--install-log", help="scripts/install.sh's output, checked")
    p.add_argument(
        "--quick", action="store_true", help="the CPU rehearsal: tiny, two strategies"
    )
    args = p.parse_args(argv)
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = sorted(set(args.stages) - set(STAGES))
    if bad:
        p.error(f"--stages: unknown {', '.join(bad)}; choose from {', '.join(STAGES)}")
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    bad = sorted(set(args.strategies) - set(STRATEGIES))
    if bad or not args.strategies:
        p.error(
            f"--strategies: unknown {', '.join(bad) or '(none given)'}; "
            f"choose from {', '.join(STRATEGIES)}"
        )
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    if args.deadline_s is None:
        args.deadline_s = args.budget_s + 240.0
    return args


def stage_machine(c: Check) -> None:
    probe = (
        "import json, jax, flax, optax, mpi4py.MPI as M;"
        "import mpi4jax;"
        "d = jax.local_devices();"
        "print(json.dumps({'jax': jax.__version__, 'flax': flax.__version__,"
        "'optax': optax.__version__, 'backend': jax.default_backend(),"
        "'devices': [x.device_kind for x in d],"
        "'mpi': M.Get_library_version().splitlines()[0].strip(),"
        "'mpi4jax': mpi4jax.__version__,"
        "'mpi4jax_cuda': mpi4jax.has_cuda_support()}))"
    )
    out = subprocess.run(
        python_cmd("-c", probe),
        capture_output=True,
        text=True,
        env=c.env(),
        timeout=300,
    )
    info = {}
    if out.returncode == 0:
        info = json.loads(out.stdout.strip().splitlines()[-1])
    info["gpus"] = gpu_names()
    info["cores"] = os.cpu_count()
    if out.returncode != 0:
        info["error"] = out.stderr.strip().splitlines()[-1:]
    c.results["machine"] = info
    c.say(f"machine: {info.get('gpus') or 'no GPU'}, jax {info.get('jax')}")


def _on_gpu(c: Check) -> bool:
    return bool(c.results.get("machine", {}).get("gpus")) and not c.args.quick


def stage_models(c: Check, stage: str = "models") -> None:
    rows = c.results.setdefault("models_failed", [])
    out = c.root / "models.jsonl"
    models = MODELS[stage] if _on_gpu(c) else (("resnet_tiny", 8),)
    size = "224" if _on_gpu(c) else "32"
    steps = ["--steps", "10", "--warmup", "2"] if _on_gpu(c) else ["--steps", "2"]
    frameworks = ("torch", "jax") if _has_torchvision(c) else ("jax",)
    precisions = ("fp32", "bf16") if _on_gpu(c) else ("fp32",)
    for model, batch in models:
        for precision in precisions:
            for fw in frameworks:
                if fw == "torch" and model == "resnet_tiny":
                    continue
                name = f"bench-{fw}-{model}-{precision}"
                cmd = python_cmd(
                    "-m", "scripts.bench_gpu", "--framework", fw, "--model", model,
                    "--precision", precision, "--batch", str(batch),
                    "--image-size", size, *steps, "--json", str(out),
                )  # fmt: skip
                rc, secs = c.run(name, cmd)
                c.say(f"{stage}: {name} rc {rc} in {secs:.0f} s")
                if rc != 0:
                    rows.append({"framework": fw, "model": model, "error": rc})


def stage_vgg(c: Check) -> None:
    if _on_gpu(c):
        stage_models(c, "vgg")


def _has_torchvision(c: Check) -> bool:
    probe = subprocess.run(
        python_cmd("-c", "import torchvision"), capture_output=True, env=c.env()
    )
    return probe.returncode == 0


def _strategy_runs(c: Check) -> list[tuple[str, str, int]]:
    """``(platform, strategy, ranks)`` to run."""
    if c.args.quick:  # a dense and a partial strategy, 1 and 2 ranks
        return [("cpu", "fused", 1), ("cpu", "solo", 2)]
    platforms = ("gpu", "cpu") if _on_gpu(c) else ("cpu",)
    return [(p, s, n) for s in c.args.strategies for n in (1, 2) for p in platforms]


def _train_cmd(run_dir: Path, strategy: str, ranks: int, steps: int) -> list[str]:
    return python_cmd(
        "-m", "experiments.train", "--np", str(ranks), "--strategy", strategy,
        "--steps", str(steps), "--no-progress", "--run-dir", str(run_dir),
    )  # fmt: skip


def _platform_env(platform: str, ranks: int) -> dict[str, str]:
    if platform == "cpu":
        return {"JAX_PLATFORMS": "cpu"}
    # Several jobs share the GPU at once: a small share each.
    return {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.04"}


def stage_strategies(c: Check) -> None:
    steps = 40 if c.args.quick else TRAIN_STEPS

    def one(job: tuple[str, str, int]) -> dict[str, Any]:
        platform, strategy, ranks = job
        name = f"{platform}-{strategy}-np{ranks}"
        run_dir = c.root / "strategies" / name
        rc, secs = c.run(
            name,
            _train_cmd(run_dir, strategy, ranks, steps),
            **_platform_env(platform, ranks),
        )
        return {"platform": platform, "strategy": strategy, "ranks": ranks,
                "rc": rc, "wall_s": secs, **_read_run(run_dir)}  # fmt: skip

    c.results["strategies"] = _pool(c, one, _strategy_runs(c), "strategies")


def _read_run(run_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        s = json.loads((run_dir / "summary.json").read_text())
        cfg = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return out
    out["acc"] = s.get("final_test_acc")
    out["median_step_ms"] = 1e3 * s.get("median_step_s", float("nan"))
    out["samples_per_s"] = s.get("samples_per_s")
    out["stopped"] = s.get("stopped")
    devs = cfg.get("devices") or []
    out["platforms"] = sorted({d.get("platform") for d in devs})
    out["device"] = sorted({d.get("device_kind") for d in devs})
    out["gpus"] = [d.get("cuda_visible_devices") for d in devs]
    out["allreduce"] = (cfg.get("allreduce") or {}).get("path")
    return out


def _pool(c: Check, fn: Any, jobs: list, what: str) -> list[dict[str, Any]]:
    rows = []
    with concurrent.futures.ThreadPoolExecutor(c.args.jobs) as ex:
        for row in ex.map(fn, jobs):
            rows.append(row)
            c.say(
                f"{what}: {row['platform']} {row['strategy']} np{row['ranks']} "
                f"rc {row['rc']} in {row['wall_s']:.0f} s"
            )
    return rows


def stage_stop(c: Check) -> None:
    platform = "gpu" if _on_gpu(c) else "cpu"
    strategies = ("fused",) if c.args.quick else c.args.strategies

    def one(strategy: str) -> dict[str, Any]:
        name = f"stop-{platform}-{strategy}"
        run_dir = c.root / "stop" / name
        cmd = _train_cmd(run_dir, strategy, 2, 1_000_000)
        cmd += ["--checkpoint", "deepfreeze", "--checkpoint-every", "1000000"]
        t = time.monotonic()
        if c.left() < 60:
            c.results["cut"].append(name)
            rc, took = None, float("nan")
        else:
            proc = c.start(name, cmd, **_platform_env(platform, 2))
            rc, took = _stop_when_training(proc, run_dir / "metrics.jsonl", c.left())
        return {"platform": platform, "strategy": strategy, "ranks": 2, "rc": rc,
                "stop_s": took, "wall_s": time.monotonic() - t,
                **_read_run(run_dir)}  # fmt: skip

    c.results["stop"] = _pool(c, one, list(strategies), "stop")


def _stop_when_training(
    proc: subprocess.Popen, metrics: Path, limit: float
) -> tuple[int, float]:
    """SIGTERM once ``metrics`` holds a training row past step 5 (or after
    ``limit`` - 45 s); ``(rc, seconds from the signal to the exit)``; the
    process group is killed where it outlives 40 s more."""
    end = time.monotonic() + max(limit - 45.0, 5.0)
    while proc.poll() is None and time.monotonic() < end:
        if _trained(metrics, 5):
            break
        time.sleep(0.5)
    if proc.poll() is not None:
        return proc.returncode, float("nan")
    t = time.monotonic()
    rc = end_job(proc, 40.0, group=False)
    return rc, time.monotonic() - t


def _trained(metrics: Path, step: int) -> bool:
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return False
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("kind", "step") == "step" and row.get("step", 0) >= step:
            return True
    return False


def stage_allreduce(c: Check) -> None:
    out = c.root / "allreduce.json"
    cmd = python_cmd("-m", "scripts.bench_allreduce", "--ranks", "2", "--xla")
    cmd += ["--json", str(out)]
    if not _on_gpu(c):
        cmd += ["--model", "resnet_tiny", "--reps", "2"]
    rc, secs = c.run("allreduce", cmd, timeout=300)
    c.results["allreduce_rc"] = rc
    c.say(f"allreduce: rc {rc} in {secs:.0f} s")


def stage_staging(c: Check) -> None:
    cmd = python_cmd(
        "-m", "scripts.bench_staging", "--json", str(c.root / "staging.json")
    )
    if not _on_gpu(c):
        cmd += ["--mb", "1", "--reps", "2"]
    rc, secs = c.run("staging", cmd, timeout=120)
    c.results["staging_rc"] = rc
    c.say(f"staging: rc {rc} in {secs:.0f} s")


def stage_stall(c: Check) -> None:
    out = c.root / "stall.json"
    paths = "fused-mpi" if c.args.quick else "fused-mpi,fused-ring,host"
    cmd = python_cmd("-m", "scripts.gpu_stall", "--paths", paths, "--json", str(out))
    cmd += ["--out", str(c.root / "stall"), "--comm-timeout", "15"]
    env = {} if _on_gpu(c) else {"JAX_PLATFORMS": "cpu"}
    rc, secs = c.run("stall", cmd, timeout=100 * len(paths.split(",")), **env)
    c.results["stall_rc"] = rc
    c.say(f"stall: rc {rc} in {secs:.0f} s")


def stage_input(c: Check) -> None:
    """``scripts.bench_input``: the ImageNet pipeline per core and per worker
    count against torchvision's, and ResNet-50 reading it against synthetic
    data (on the GPU: can the host's cores feed it?)."""
    cmd = python_cmd("-m", "scripts.bench_input", "--json", str(c.root / "input.json"))
    if _on_gpu(c):
        cmd += ["--images", "800", "--workers", "0", "1", "4", "8", "15"]
        cmd += ["--train-workers", "8"]
        cmd += ["--loader-images", "2048", "--train-batch", "128", "--steps", "30"]
    else:
        cmd += ["--images", "40", "--files", "20", "--rounds", "1", "--size", "64"]
        cmd += ["--workers", "0", "1", "--loader-images", "64", "--batch", "8"]
        cmd += ["--model", "cnn_small", "--steps", "3"]
    rc, secs = c.run("input", cmd, timeout=360)
    c.results["input_rc"] = rc
    c.say(f"input: rc {rc} in {secs:.0f} s")


def stage_eager_sgd(c: Check) -> None:
    run_dir = c.root / "eager_sgd"
    cmd = python_cmd("-m", "experiments.eager_sgd", "--seeds", "0", "--no-progress")
    cmd += ["--run-dir", str(run_dir)]
    rc, secs = c.run("eager_sgd", cmd, timeout=300)
    c.results["eager_sgd_rc"] = rc
    c.say(f"eager_sgd: rc {rc} in {secs:.0f} s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from research.provenance import record_job
    from research.rundir import default_run_dir

    root = Path(args.out or default_run_dir("gpu")).absolute()
    root.mkdir(parents=True, exist_ok=True)
    c = Check(root, args)
    record_job(root, "gpu", world_size=1, module="scripts.gpu_check")
    stages = {
        "machine": stage_machine,
        "models": stage_models,
        "strategies": stage_strategies,
        "stop": stage_stop,
        "allreduce": stage_allreduce,
        "eager_sgd": stage_eager_sgd,
        "vgg": stage_vgg,
        "staging": stage_staging,
        "stall": stage_stall,
        "input": stage_input,
    }
    if "machine" not in args.stages:
        args.stages.insert(0, "machine")  # every other stage reads it
    for name in args.stages:
        if time.monotonic() - c.t0 > args.budget_s:
            c.results["skipped"].append(name)
            c.say(f"{name}: skipped, past --budget-s {args.budget_s:.0f}")
            continue
        c.say(f"{name}: start")
        stages[name](c)
    from scripts.gpu_report import write_report

    checks = write_report(root, c.results, args.install_log)
    (root / "results.json").write_text(json.dumps(c.results, indent=1, default=str))
    c.say(f"done: {root} ({sum(ch['met'] for ch in checks)}/{len(checks)} checks met)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
