"""SparCML study: the sparse allreduce micro-benchmark (part of ``sparcml``).

Run by :func:`research.studies.sparcml.run_experiment` (``python -m
experiments.sparcml``) inside the MPI job; its table and checks go into the
experiment's report.

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
  (``research.comm.sparse.mean``), computed rather than slept so the
  benchmark does not take the emulated seconds. ``auto`` on the emulated link
  is the algorithm ``cost.choose`` picks from the calibrated model with the
  link's latency and bandwidth put in (alpha + L, beta = 8 / B, the dense
  allreduce's bandwidth term a ring's 2 (P-1)/P x 8 / B), timed as measured.

Bytes: each algorithm's mean bytes sent per rank (``SparseStats.bytes_sent``)
against ``cost.predicted_bytes`` for the allgathered counts (``auto``'s row:
the algorithm it took on the real link). The dense allreduce counts as a
bandwidth-optimal one, 2 (P-1)/P x vector bytes; the ``dense`` training arm
(``host``) reports the bytes of its buffers instead, as ``host`` always does.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from research.comm.link import Link

SPARSE = ("ssar_rd", "ssar_sag", "dsar_sag")


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
    from research.comm.sparse.mean import link_model

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
