"""SparCML study: the sparse allreduce micro-benchmark and top-k training arms.

The logic behind ``python -m experiments.sparcml`` (see its docstring for the
paper, the claims and the commands). Everything here runs inside the MPI job.

Micro-benchmark (``research/studies/sparcml_bench.py``): every algorithm of
the sparse allreduce at each rank count and density, on the real link and on
an emulated one (``--bench-link``), with the bytes each sent against the cost
model's.

Communication-bound comparison (``--comm-bound``, ``sparcml_commbound``):
dense (``host``), top-k with error feedback and top-k with 4-bit values on
CANDLE P1B2 (29,540,618 parameters on ``synthetic_tabular`` shaped like the
real CSVs, which this machine cannot download) and ResNet-50 at 32x32, on each
``--cb-links`` link, one seed: step time, time to the model's target accuracy,
final accuracy, bytes per step. Where sparse training can win wall-clock is
where a step's dense allreduce costs more than the selection's memory pass and
the sparse allreduce: ``2 (P-1)/P x 4 d / bandwidth`` against about 2.3 passes
over ``4 d`` bytes (``research.comm.sparse.select``). On this 2-core machine
with 4 ranks the selection of P1B2's gradient (125 ms) costs about what 10
Gb/s takes to move it (142 ms by the link model), so sparse training ties
there at best; a 1 Gb/s link (1.4 s) is where it would win (measured figures
in ``experiments/sparcml.py``'s docstring).

The dense training arm (``host``) reports the bytes of its buffers, as ``host``
always does.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

from research.comm.link import Link
from research.studies.sparcml_arms import arm_config, load_arm, run_arm
from research.studies.sparcml_bench import SPARSE, bench_one, run_bench  # noqa: F401

RESNET50_DIM = 25_557_032
DENSITIES = (0.001, 0.01, 0.1, 0.5)
ARMS = ("dense", "topk_ef", "topk_noef", "topk_4bit")


# -- training arms ----------------------------------------------------------------
def combine_seeds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm's runs (one per seed) as one row: means, and the final accuracy's
    std over seeds (``final_acc_std``; 0 with one seed)."""
    accs = [r["final_test_acc"] for r in runs]
    reached = [r["time_to_target_s"] for r in runs]
    sent = [r["bytes_per_step"] for r in runs if r["bytes_per_step"] is not None]
    steps = [r["mean_step_s"] for r in runs if r["mean_step_s"] is not None]
    return {
        **runs[0],
        "seeds": [r["seed"] for r in runs],
        "final_test_acc": statistics.fmean(accs),
        "final_acc_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
        "final_accs": accs,
        # Mean over seeds that got there; None when none did.
        "time_to_target_s": (
            statistics.fmean([t for t in reached if t is not None])
            if any(t is not None for t in reached)
            else None
        ),
        "reached": sum(t is not None for t in reached),
        "mean_step_s": statistics.fmean(steps) if steps else None,
        "bytes_per_step": statistics.fmean(sent) if sent else None,
    }


def write_results(root: Path, data: dict[str, Any]) -> str:
    """``results.json`` (everything the page renders from) and ``table.md``
    (the page's part of the run, :mod:`research.studies.sparcml_page`)."""
    from research.studies.sparcml_page import render

    root.mkdir(parents=True, exist_ok=True)
    (root / "results.json").write_text(json.dumps(data, indent=1))
    text = "\n".join(render(root))
    (root / "table.md").write_text(text + "\n")
    return text


def _calibrate_missing(world, sizes: list[int]) -> None:
    """``auto``'s cost model measured on this machine for every rank count the
    experiment runs at, where none was, before anything uses it: the training
    arms too (``--skip-bench`` runs, such as ``--comm-bound``, used to train
    with the uncalibrated defaults on a fresh machine)."""
    from mpi4py import MPI

    from research.comm.sparse.calibration import ensure_calibrated

    for P in (p for p in sizes if 2 <= p <= world.size):
        sub = world.comm.Split(0 if world.rank < P else MPI.UNDEFINED, world.rank)
        if sub != MPI.COMM_NULL:
            ensure_calibrated(sub, say=lambda line: print(line, flush=True))
            sub.Free()
        world.barrier()


def run_experiment(cfg, root: Path, world) -> dict[str, Any]:
    """Benchmark, then the training arms; prints tables and checks on rank 0.

    ``cfg``: ``experiments.sparcml.Config`` (its ``train`` is every arm's base).
    """
    from research.train.report import link_label

    base = cfg.train
    link = Link.parse(cfg.bench_link)
    where, label = str(link), None
    if not link.emulated:  # --bench-link real: the emul columns repeat the real
        where = f"real network, {world.nodes} nodes" if world.nodes > 1 else "real"
        label = f"link: {link_label('real', world)} (emul ms: the same times)"
    _calibrate_missing(world, sorted({2, world.size}))
    bench: list[dict[str, Any]] = []
    heads: dict[str, str] = {}
    if not cfg.skip_bench:
        sizes = sorted({p for p in (2, world.size) if 2 <= p <= world.size})
        bench = run_bench(world, cfg.dim, sizes, tuple(cfg.densities), cfg.reps, link)
        for r in bench:
            r["dim"] = cfg.dim
        heads["bench_head"] = label or f"emulated link: {link.describe()}"
    results: list[dict[str, Any]] = []
    if cfg.arms:
        opts = {"scope": cfg.scope, "warmup_steps": cfg.sparse_warmup}
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in cfg.arms}
        for seed in cfg.seeds:
            for arm in cfg.arms:
                run = arm_config(
                    dataclasses.replace(base, seed=seed),
                    arm,
                    root,
                    density=cfg.train_density,
                    bits=cfg.bits,
                    **opts,
                )
                run_arm(run, arm, world)
                world.barrier()
                if world.rank == 0:
                    runs[arm].append(load_arm(Path(run.run_dir), cfg.target_acc))
        if world.rank == 0:
            results = [combine_seeds(runs[arm]) for arm in cfg.arms]
            heads["train_head"] = (
                f"training: {base.model.name}, {world.size} ranks, top-k density "
                f"{cfg.train_density:g} ({cfg.scope}), link {base.strategy.link}"
            )
    comm: list[dict[str, Any]] = []
    if cfg.comm_bound:
        from research.studies.sparcml_commbound import run_comm_bound

        comm = run_comm_bound(cfg, root, world)
        seeds = ", ".join(map(str, cfg.cb_seeds))
        heads["comm_head"] = (
            f"communication-bound training, {world.size} ranks, top-k density "
            f"{cfg.train_density:g}, {cfg.bits}-bit arm, {cfg.cb_steps} steps, "
            f"seed{'s' * (len(cfg.cb_seeds) > 1)} {seeds}"
        )
    data = {
        "where": where,
        "link": str(link),
        "target_acc": cfg.target_acc,
        **heads,
        "bench": bench,
        "train": results,
        "comm_bound": comm,
    }
    if world.rank == 0:
        from research.studies.sparcml_page import all_checks

        print(write_results(root, data), flush=True)
        checks = [f"{c['word']}  {c['text']}" for c in all_checks(data)]
        if cfg.plots:
            from research.studies.sparcml_plots import plot

            for path in plot(root, bench, results, link):
                print(f"wrote {path}", flush=True)
    else:
        checks = []
    return {"bench": bench, "train": results, "checks": checks}
