"""SparCML study: the sparse allreduce micro-benchmark and top-k training arms.

The logic behind ``python -m experiments.sparcml`` (see its docstring for the
paper, the claims and the commands). Everything here runs inside the MPI job.

Micro-benchmark: for each rank count P (a sub-communicator of the first P
ranks; the others wait), density and algorithm, every rank contributes its own
uniformly random indices (``density * dim`` of them, seeded by rank) and calls
``sparse_allreduce``; the time of a call is the slowest rank's, the median over
``reps`` after one warm-up. Two links from the same calls:

* real: the measured time (shared memory on one machine; the network where
  the ranks span nodes, ``--hosts``);
* emulated (``--bench-link``, 10 Gb/s by default): each rank's time becomes
  ``measured + bytes it sent / payload rate + messages x latency`` (the merges
  are CPU work between the transfers: ``research.comm.link``), the call's
  the slowest rank's: what the ``sparse`` strategy's sleep yields on that link
  (``research.comm.sparse.strategy``), computed rather than slept so the
  benchmark does not take the emulated seconds. ``auto`` on the emulated link
  is the algorithm ``cost.choose`` picks from the calibrated model with the
  link's latency and bandwidth put in (alpha + L, beta = 8 / B, the dense
  allreduce's bandwidth term a ring's 2 (P-1)/P x 8 / B), timed as measured.

Communication-bound comparison (``--comm-bound``, ``sparcml_comm``):
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

Bytes: each algorithm's mean bytes sent per rank (``SparseStats.bytes_sent``)
against ``cost.predicted_bytes`` for the allgathered counts (``auto``'s row:
the algorithm it took on the real link). The dense allreduce counts as a
bandwidth-optimal one, 2 (P-1)/P x vector bytes; the ``dense`` training arm
(``host``) reports the bytes of its buffers instead, as ``host`` always does.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from research.comm.link import Link

RESNET50_DIM = 25_557_032
DENSITIES = (0.001, 0.01, 0.1, 0.5)
ARMS = ("dense", "topk_ef", "topk_noef", "topk_4bit")
SPARSE = ("ssar_rd", "ssar_sag", "dsar_sag")


# -- micro-benchmark --------------------------------------------------------------
def _emulated(dt: float, sent: int, messages: int, link: Link) -> float:
    """A call that took ``dt`` on one node, on ``link``: its own time (the
    merges are CPU work between the transfers) plus the link's."""
    return dt + link.sparse(sent, messages)


def bench_one(
    comm, dim: int, densities: tuple[float, ...], reps: int, link: Link, log
) -> list[dict[str, Any]]:
    """Rows of the benchmark on ``comm`` (collective on it)."""
    from research.comm.sparse import ALGORITHMS, SparseVector, sparse_allreduce
    from research.comm.sparse.calibration import agreed_model, ensure_calibrated
    from research.comm.sparse.cost import choose, predicted_bytes
    from research.comm.sparse.strategy import link_model

    P, rank = comm.Get_size(), comm.Get_rank()
    ensure_calibrated(comm)  # a no-op after _calibrate_missing
    model = agreed_model(comm)
    emu_model = link_model(model, link, P)
    rows = []
    for density in densities:
        t_density = time.perf_counter()
        rng = np.random.default_rng([rank, int(density * 1e6)])
        idx = np.flatnonzero(rng.random(dim, dtype=np.float32) < density)
        vec = SparseVector(idx, rng.standard_normal(idx.size, np.float32), dim)
        del idx
        counts = comm.allgather(vec.nnz)
        timed: dict[str, dict[str, Any]] = {}
        for alg in (*ALGORITHMS, "auto"):
            real, emu = [], []
            for rep in range(reps + 1):  # the first is a warm-up
                comm.Barrier()
                t0 = time.perf_counter()
                _, stats = sparse_allreduce(comm, vec, alg, return_stats=True)
                dt = time.perf_counter() - t0
                got = comm.allgather((dt, stats.bytes_sent, stats.messages))
                if rep:
                    real.append(max(g[0] for g in got))
                    emu.append(max(_emulated(*g, link) for g in got))
            chosen = stats.algorithm
            timed[alg] = {
                "P": P,
                "density": density,
                "algorithm": alg,
                "chosen": chosen,
                "real_s": float(np.median(real)),
                "emulated_s": float(np.median(emu)),
                "bytes": statistics.fmean(g[1] for g in got),
                "model_bytes": float(predicted_bytes(chosen, counts, dim, P)),
            }
        # auto on the emulated link: the link model's choice, as measured.
        pick = choose(emu_model, counts, dim, vec.index_bytes, 4)
        timed["auto"]["chosen_emulated"] = pick
        timed["auto"]["emulated_s"] = timed[pick]["emulated_s"]
        for r in timed.values():
            log(
                f"P={P} density={density:g} {r['algorithm']:>8}: real "
                f"{1e3 * r['real_s']:.1f} ms, {link} {1e3 * r['emulated_s']:.1f} ms, "
                f"{r['bytes'] / 1e6:.2f} MB sent (model {r['model_bytes'] / 1e6:.2f})"
                + (f" -> {r['chosen']}" if r["algorithm"] == "auto" else "")
            )
        rows.extend(timed.values())
        del vec
        log(f"P={P} density={density:g}: {time.perf_counter() - t_density:.1f} s")
    return rows


def _sleeping_barrier(comm) -> None:
    # Ranks outside the sub-communicator wait here; MPICH's blocking barrier
    # polls, and on shared cores that would slow the ranks being measured.
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.005)


def run_bench(
    world, dim: int, sizes: list[int], densities, reps: int, link: Link
) -> list[dict[str, Any]]:
    """The benchmark at every size in ``sizes`` (<= world size); rows on rank 0."""
    from mpi4py import MPI

    rows: list[dict[str, Any]] = []
    for P in sizes:
        sub = world.comm.Split(0 if world.rank < P else MPI.UNDEFINED, world.rank)
        if sub != MPI.COMM_NULL:
            mine = bench_one(sub, dim, densities, reps, link, world.log)
            if sub.Get_rank() == 0:  # every member holds the same rows
                rows += mine
            sub.Free()
        _sleeping_barrier(world.comm)
    gathered = world.comm.gather(rows, root=0)
    return [r for part in gathered for r in part] if world.rank == 0 else []


def bench_checks(
    rows: list[dict[str, Any]], link: Link, where: str | None = None
) -> list[str]:
    """The issue's micro-benchmark targets, PASS/FAIL with numbers, on ``link``
    (named ``where`` in the lines, default its spec)."""
    where = where or str(link)
    out: list[str] = []
    if not rows:
        return out
    P = 4 if any(r["P"] == 4 for r in rows) else max(r["P"] for r in rows)
    at = {(r["P"], r["density"], r["algorithm"]): r for r in rows}

    def check(ok: bool, text: str) -> None:
        out.append(f"{'PASS' if ok else 'FAIL'}  {text}")

    for density, limit in ((0.001, 0.1), (0.01, 0.3)):
        if (P, density, "dense") in at:
            ratio = (
                at[P, density, "auto"]["emulated_s"]
                / at[P, density, "dense"]["emulated_s"]
            )
            check(
                ratio <= limit,
                f"{where}, P={P}, density {density:g}: sparse (auto) / dense time "
                f"{ratio:.3f} <= {limit}",
            )
    for r in (r for r in rows if r["algorithm"] == "auto"):
        key = (r["P"], r["density"])
        best = min(at[(*key, a)]["emulated_s"] for a in (*SPARSE, "dense"))
        ratio = r["emulated_s"] / best
        check(
            ratio <= 1.10,
            f"{where}, P={key[0]}, density {key[1]:g}: auto / best fixed "
            f"{ratio:.2f} <= 1.10 (auto took {r['chosen_emulated']})",
        )
        if key[1] >= 0.1:
            dense = r["emulated_s"] / at[(*key, "dense")]["emulated_s"]
            check(dense <= 1.05, f"  and auto / dense {dense:.2f} <= 1.05")

    def bytes_ratio(r: dict[str, Any]) -> float:
        if r["model_bytes"] == 0:
            return 1.0 if r["bytes"] == 0 else float("inf")
        return r["bytes"] / r["model_bytes"]

    worst = max(rows, key=lambda r: abs(np.log(max(bytes_ratio(r), 1e-12))))
    ratio = bytes_ratio(worst)
    check(
        1 / 1.05 <= ratio <= 1.05,
        f"measured bytes / model within 1.05x at every point (worst {ratio:.3f}: "
        f"P={worst['P']} density {worst['density']:g} {worst['algorithm']})",
    )
    return out


def format_bench(
    rows: list[dict[str, Any]], link: Link, label: str | None = None
) -> str:
    """The benchmark table; ``label`` names the link in its head (default the
    emulated link's description)."""
    lines = [
        f"{'P':>2} {'density':>8} {'algorithm':>9} {'real ms':>9} {'/dense':>7} "
        f"{'emul ms':>9} {'/dense':>7} {'MB/rank':>8} {'model':>8}  chosen"
    ]
    at = {(r["P"], r["density"], r["algorithm"]): r for r in rows}
    for r in rows:
        d = at[r["P"], r["density"], "dense"]
        chosen = ""
        if r["algorithm"] == "auto":
            chosen = f"real: {r['chosen']}, emulated: {r['chosen_emulated']}"
        lines.append(
            f"{r['P']:>2} {r['density']:>8g} {r['algorithm']:>9} "
            f"{1e3 * r['real_s']:9.2f} {r['real_s'] / d['real_s']:7.3f} "
            f"{1e3 * r['emulated_s']:9.2f} {r['emulated_s'] / d['emulated_s']:7.3f} "
            f"{r['bytes'] / 1e6:8.3f} {r['model_bytes'] / 1e6:8.3f}  {chosen}"
        )
    head = label or f"emulated link: {link.describe()}"
    return head + "\n" + "\n".join(lines)


# -- training arms ----------------------------------------------------------------
def arm_config(base, arm: str, run_dir: Path, *, density: float, bits: int, **opts):
    """The TrainConfig of one training arm."""
    if arm == "dense":
        strategy, options = "host", {}
    else:
        options = {
            "density": density,
            "error_feedback": arm != "topk_noef",
            "bits": bits if arm == "topk_4bit" else 0,
            **opts,
        }
        strategy = "sparse"
    return dataclasses.replace(
        base,
        strategy=strategy,
        strategy_options=options,
        run_dir=str(run_dir / f"{arm}-s{base.seed}"),
    )


def run_arm(cfg, arm: str, world) -> dict[str, Any]:
    from research.train.loop import Trainer

    trainer = Trainer(cfg, world)
    if world.rank == 0:
        print(
            f"r0 | arm {arm}: {trainer.total_steps} steps -> {cfg.run_dir}", flush=True
        )
    return trainer.run()


def load_arm(run_dir: Path, target_acc: float) -> dict[str, Any]:
    """An arm's numbers from its folder: accuracy, time to target, bytes per step."""
    from research.rundir import read_metrics
    from research.studies.eager_sgd import load_run

    out = load_run(run_dir, target_acc)
    rows = read_metrics(run_dir)
    sent = [r["comm_bytes"] for r in rows if "comm_bytes" in r and "step_time" in r]
    out["bytes_per_step"] = statistics.fmean(sent) if sent else None
    out["curve"] = [(e["step"], e["test_acc"]) for e in rows if e.get("kind") == "eval"]
    # Median ms per step of each phase the executor reports (step 1 compiles):
    # the common keys (research.train.executors.PHASES) and top-k's selection.
    keys = {"compute": "compute_s", "select": "select_s", "comm": "comm_busy_s"}
    keys["update"] = "update_s"
    out["phases_ms"] = {
        name: 1e3 * statistics.median(vals)
        for name, key in keys.items()
        if (vals := [r[key] for r in rows if r.get(key) is not None and r["step"] > 1])
    }
    return out


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


def format_train(results: list[dict[str, Any]], target_acc: float) -> str:
    n = max((len(r.get("seeds", [0])) for r in results), default=1)
    lines = [
        f"{'arm':>10} {'final acc':>15} {'to ' + format(target_acc, 'g'):>10} "
        f"{'ms/step':>8} {'MB/step/rank':>12}   ({n} seed{'s' * (n > 1)}: mean"
        f"{' +- std' * (n > 1)})"
    ]
    for r in results:
        t, b = r["time_to_target_s"], r["bytes_per_step"]
        reached = r.get("reached", 1)
        to = "-" if t is None else f"{t:.1f} s" + (f" ({reached}/{n})" * (reached < n))
        acc = f"{r['final_test_acc']:.4f}" + (
            f" +- {r.get('final_acc_std', 0.0):.4f}" if n > 1 else ""
        )
        lines.append(
            f"{r['arm']:>10} {acc:>15} {to:>10} "
            f"{1e3 * (r['mean_step_s'] or float('nan')):8.1f} "
            f"{('-' if b is None else f'{b / 1e6:.4f}'):>12}"
        )
    return "\n".join(lines)


def gap_interval(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float]:
    """Mean accuracy gap ``a - b`` in points and its ~95% half-width (2 standard
    errors over the seeds, Welch; 0 when either arm has one seed)."""
    gap = 100 * (a["final_test_acc"] - b["final_test_acc"])
    na, nb = len(a.get("final_accs", [0])), len(b.get("final_accs", [0]))
    if na < 2 or nb < 2:
        return gap, 0.0
    se = math.sqrt(
        (100 * a["final_acc_std"]) ** 2 / na + (100 * b["final_acc_std"]) ** 2 / nb
    )
    return gap, 2 * se


def verdict(lo: float, hi: float, limit: float, above: bool = False) -> str:
    """PASS/FAIL when the whole interval is on one side of ``limit``, else
    UNDECIDED. ``above``: the target is ``>= limit`` (else ``<= limit``)."""
    if above:
        lo, hi, limit = -hi, -lo, -limit
    if hi <= limit:
        return "PASS"
    if lo > limit:
        return "FAIL"
    return "UNDECIDED"


def train_checks(results: list[dict[str, Any]]) -> list[str]:
    """The accuracy targets as intervals over seeds: PASS or FAIL only when the
    whole ~95% interval of the gap is on one side of the target."""
    by = {r["arm"]: r for r in results}
    out = []

    def line(text: str, gap: float, half: float, limit: float, above=False) -> str:
        n = len(by["dense"].get("seeds", [0])) if "dense" in by else 1
        word = verdict(gap - half, gap + half, limit, above)
        how = f"gap {gap:.2f} +- {half:.2f} points (2 s.e., {n} seeds)"
        if half == 0:
            word, how = "UNDECIDED", f"gap {gap:.2f} points (one seed: noise unknown)"
        return f"{word}  {text}: {how}"

    if "dense" in by and "topk_ef" in by:
        gap, half = gap_interval(by["dense"], by["topk_ef"])
        out.append(
            line("top-k 1% + error feedback within 0.5 points of dense", gap, half, 0.5)
        )
    if "topk_ef" in by and "topk_noef" in by:
        gap, half = gap_interval(by["topk_ef"], by["topk_noef"])
        out.append(
            line(
                "without error feedback visibly worse (>= 1 point)",
                gap,
                half,
                1.0,
                True,
            )
        )
    return out


def write_results(
    root: Path, bench, results, checks: list[str], text: str, comm=()
) -> None:
    root.mkdir(parents=True, exist_ok=True)
    data = {"bench": bench, "train": results, "comm_bound": list(comm)}
    (root / "results.json").write_text(json.dumps({**data, "checks": checks}, indent=1))
    (root / "table.md").write_text(text + "\n")


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
    text = []
    if not cfg.skip_bench:
        sizes = sorted({p for p in (2, world.size) if 2 <= p <= world.size})
        bench = run_bench(world, cfg.dim, sizes, tuple(cfg.densities), cfg.reps, link)
        for r in bench:
            r["dim"] = cfg.dim
        if world.rank == 0:
            text.append(f"micro-benchmark, dim {cfg.dim}, {cfg.reps} reps")
            text.append(format_bench(bench, link, label))
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
            text.append(
                f"training: {base.model}, {world.size} ranks, top-k density "
                f"{cfg.train_density:g} ({cfg.scope}), link {base.link}"
            )
            text.append(format_train(results, cfg.target_acc))
    comm: list[dict[str, Any]] = []
    if cfg.comm_bound:
        from research.studies.sparcml_comm import (
            comm_bound_checks,
            format_comm_bound,
            run_comm_bound,
        )

        comm = run_comm_bound(cfg, root, world)
        if world.rank == 0:
            text.append(
                f"communication-bound training, {world.size} ranks, top-k density "
                f"{cfg.train_density:g}, {cfg.bits}-bit arm, {cfg.cb_steps} steps, "
                f"seed {cfg.seeds[0]}"
            )
            text.append(format_comm_bound(comm))
    checks = bench_checks(bench, link, where) + train_checks(results)
    if comm:
        checks += comm_bound_checks(comm)
    if world.rank == 0:
        report = "\n\n".join(text) + "\n\nchecks:\n" + "\n".join(checks)
        print(report, flush=True)
        write_results(root, bench, results, checks, report, comm)
        if cfg.plots:
            from research.studies.sparcml_plots import plot

            for path in plot(root, bench, results, link):
                print(f"wrote {path}", flush=True)
    return {"bench": bench, "train": results, "checks": checks}
