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
  is measured as itself, every call: the counts allgathered, the algorithm
  ``cost.choose`` picks from the calibrated model with the link's latency
  and bandwidth put in (alpha + L, beta = 8 / B, the dense allreduce's
  bandwidth term a ring's 2 (P-1)/P x 8 / B), that algorithm run; its time
  on the link is its own plus the link's for what it sent, as every other
  algorithm's. The checks compare those measured times, never the choice.

Every point keeps its timed calls (``real_reps``, ``emulated_reps``), from
which the page's medians and their intervals come
(:mod:`research.studies.sparcml_page`).

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
                "real_reps": real,
                "emulated_reps": emu,
                "bytes": statistics.fmean(g[1] for g in got),
                "model_bytes": float(predicted_bytes(chosen, counts, dim, P)),
            }
        # auto on the emulated link, measured as itself: the counts gathered,
        # the link model's choice made and that algorithm run, every call.
        emu, pick = [], None
        for rep in range(reps + 1):  # the first is a warm-up
            comm.Barrier()
            t0 = time.perf_counter()
            nnz = comm.allgather(vec.nnz)
            pick = choose(emu_model, nnz, dim, vec.index_bytes, 4)
            _, stats = sparse_allreduce(comm, vec, pick, return_stats=True)
            dt = time.perf_counter() - t0
            # The counts' allgather: P - 1 messages of 8 bytes from each rank.
            sent, messages = stats.bytes_sent + 8 * (P - 1), stats.messages + P - 1
            got = comm.allgather((dt, sent, messages))
            if rep:
                emu.append(max(_emulated(*g, link) for g in got))
        timed["auto"]["chosen_emulated"] = pick
        timed["auto"]["emulated_s"] = float(np.median(emu))
        timed["auto"]["emulated_reps"] = emu
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
