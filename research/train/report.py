"""What a run records about itself: ``config.json`` and ``summary.json`` records.

Kept apart from the loop so the loop reads whole; the functions take the run
(:class:`research.train.callback.Run`, the Trainer) and read only its public
attributes.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

import numpy as np

from research.comm.dense import xla as xla_collective
from research.rundir import versions
from research.steps.state import param_count, tree_bytes, tree_digest
from research.threads import xla_compute_threads
from research.train.callback import Run


def link_label(spec: str, world: Any = None) -> str:
    """What tables print about the link: emulated with its figures, or real
    (shared memory on one node; the network across nodes, with their count and,
    on a local cluster of ``research/localnet.py``, its links' rate)."""
    from research.comm.link import Link

    link = Link.parse(spec)
    topology = getattr(world, "topology", None)
    one_node = topology.nodes == 1 if topology is not None else _one_node()
    label = link.describe(node_local=one_node)
    if link.emulated or one_node or topology is None:
        return label
    return f"{label}, {topology.nodes} nodes{_local_rate()}"


def _local_rate() -> str:
    """`` at <rate> per node (local cluster)`` when the ranks run on the nodes of
    ``research/localnet.py`` (its state names the rate at start), else ``""``."""
    from research.localnet import DIR_ENV, Cluster, LocalnetError

    if not os.environ.get(DIR_ENV):
        return ""
    try:
        rate = Cluster.load().rates()
    except (LocalnetError, OSError, ValueError, TypeError):
        return ""
    return f" at {rate} per node (local cluster, TCP)"


def _one_node() -> bool | None:
    """Whether every rank runs on this node, as the launcher tells (None: unknown)."""
    local, size = os.environ.get("MPI_LOCALNRANKS"), os.environ.get("PMI_SIZE")
    if local and size:  # MPICH's hydra
        return local == size
    if "SLURM_NNODES" in os.environ:
        return os.environ["SLURM_NNODES"] == "1"
    return None


def nodes_record(world: Any) -> dict[str, Any] | None:
    """The world's nodes (count, ranks per node, host names), or None when the
    world was made without its topology."""
    topology = getattr(world, "topology", None)
    return topology.record() if topology is not None else None


def platform_record(t: Run) -> dict[str, Any]:
    """Each rank's platform, device and GPU binding
    (research.comm.process.devices), the computation dtype, and XLA's
    collectives where they run."""
    return {
        "devices": t.records.devices,
        "precision": {
            "flag": t.config.model.precision,
            "compute": str(getattr(t.model, "dtype", "float32")),
            "params_and_updates": "float32",
        },
        "xla_collectives": xla_collective.status() or None,
    }


def config_record(t: Run) -> dict[str, Any]:
    """The resolved configuration, world, model and versions (rank 0 writes it)."""
    return {
        "config": t.config,
        "world_size": t.world.size,
        # Which ranks share a node, and the nodes' host names (research.comm.world).
        "nodes": nodes_record(t.world),
        "strategy": {"name": t.strategy.name, "options": t.strategy.options},
        # Which allreduce ran and why (research.comm.dense: agreed by all ranks).
        "allreduce": t.strategy.allreduce_choice,
        **platform_record(t),
        "link": link_label(t.config.strategy.link, t.world),
        "imbalance": getattr(t.imbalance, "describe", lambda: t.imbalance.name)(),
        "model_params": param_count(t.state.params),
        "param_bytes": tree_bytes(t.state.params),
        "dataset": t.dataset.describe(),
        # The class index (imagenet: sorted wnids), counts, source.
        "data": t.dataset.record(),
        "total_steps": t.total_steps,
        "steps_per_epoch": t.loader.steps_per_epoch,
        # What sized XLA:CPU's compute pool (research.threads.thread_env), and
        # the pool this rank really has.
        "compute_threads": {
            **{v: os.environ.get(v) for v in ("PJRT_NPROC", "NPROC", "XLA_FLAGS")},
            "xla_eigen_threads": xla_compute_threads(),
        },
        "versions": versions(),
    }


def summary_record(t: Run) -> dict[str, Any]:
    """The numbers a table or figure needs. Collective (gathers every rank's)."""
    times = t.step_times[1:] or t.step_times  # step 1 includes compilation
    med = statistics.median(times) if times else float("nan")
    per_rank = t.world.allgather(med)
    # What a step costs apart from the rank's own injected delay: the waiting
    # for stragglers that a strategy does or avoids (imbalance studies).
    busy = [s - d for s, d in zip(t.step_times, t.delays)]
    busy = busy[1:] or busy
    busy_per_rank = t.world.allgather(statistics.median(busy) if busy else float("nan"))
    global_batch = t.config.batch_size * t.world.size
    last = t.evals[-1] if t.evals else {}
    summary = {
        "steps": t.step,
        "world_size": t.world.size,
        "nodes": nodes_record(t.world),
        "strategy": t.strategy.name,
        "allreduce": t.strategy.allreduce_choice,
        "model": t.config.model.name,
        "dataset": t.config.data.name,
        **platform_record(t),
        "link": link_label(t.config.strategy.link, t.world),
        "global_batch": global_batch,
        "median_step_s": med,
        "median_step_s_per_rank": per_rank,
        # median over ranks of each rank's median (step - own injected delay)
        "median_step_without_delay_s": statistics.median(busy_per_rank),
        "train_time_s": t.train_time,
        # Seconds from the run's start to its first step, on rank 0: set-up,
        # the strategy's start-up (adaptive compiles every candidate there).
        "start_s": t.start_s,
        "samples_per_s": global_batch * len(times) / max(sum(times), 1e-9),
        "final_test_acc": last.get("test_acc"),
        "final_test_loss": last.get("test_loss"),
        "params_sha256": tree_digest(t.state.params),
        "evals": t.evals,
    }
    if t.contributors:
        summary["mean_contributors"] = float(np.mean(t.contributors))
    summary.update(t.strategy.summary())  # the strategy's own record
    summary["data"] = data_record(t)
    summary["comm_watchdog"] = watchdog_record(t.world)
    for cb in t.callbacks:
        summary.update(cb.summary())
    if t.stop.stopped is not None:  # told to stop (research.train.preemption)
        summary["stopped"] = t.stop.stopped
    return summary


def data_record(t: Run) -> dict[str, Any]:
    """The input of every rank (collective): its median wait per step
    (``data_wait_s``, the first step left out), the images it skipped as
    undecodable (``research/data/imagenet/pipeline.py``) and its loader's
    own figures."""
    waits = t.data_waits[1:] or t.data_waits
    mine = {"median_data_wait_s": statistics.median(waits) if waits else None}
    mine.update(t.loader.summary())
    per_rank = t.world.allgather(mine)
    files = sorted({f for r in per_rank for f in r.get("skipped_files", ())})
    return {
        "median_data_wait_s": statistics.median(
            [
                r["median_data_wait_s"]
                for r in per_rank
                if r["median_data_wait_s"] is not None
            ]
            or [float("nan")]
        ),
        "skipped": sum(r.get("skipped", 0) for r in per_rank),
        "skipped_files": files,
        "eval_skipped": sum(r.get("eval_skipped", 0) for r in per_rank),
        "per_rank": per_rank,
    }


def watchdog_record(world: Any) -> dict[str, Any] | None:
    """The communication watchdog's setting and the longest quiet wait of any
    rank (``research.comm.faults.watchdog``). Collective."""
    from research.comm.faults import watchdog

    per_rank = world.allgather(watchdog.record())
    mine = [r for r in per_rank if r]
    if not mine:
        return None
    worst = max(mine, key=lambda r: r["longest_quiet_s"])
    return {
        **{k: worst[k] for k in ("setting", "timeout_s", "warn_s")},
        "longest_quiet_s": worst["longest_quiet_s"],
        "longest_quiet_in": worst["longest_quiet_in"],
        "longest_quiet_rank": per_rank.index(worst),
        "warnings": sum(r["warnings"] for r in mine),
    }


def progress_bar(t: Run):
    """Rank 0's tqdm bar on a terminal with ``--progress``; else None."""
    import sys

    if t.world.rank != 0 or not t.config.progress or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(
        total=t.total_steps,
        initial=t.step,
        desc="train",
        unit="step",
        dynamic_ncols=True,
        mininterval=0.5,
    )


def step_row(t: Run, m: dict, info: Any, phases: dict, dt: float) -> dict:
    """One step's row of ``metrics.jsonl``: loss, accuracy, rate, times, phases
    (``*_s``, the strategy's) and the communication record (``comm_*``).

    ``samples_per_s``: global samples per second of training time since the
    previous row (``t.logged``; the first row's includes compilation).
    """
    step0, time0 = t.logged
    rate = t.config.batch_size * t.world.size * (t.step - step0)
    row = {
        "step": t.step,
        "loss": float(m["loss"]),
        "acc": float(m["acc"]),
        "lr": float(t.schedule(t.step - 1)),
        "samples_per_s": rate / max(t.train_time - time0, 1e-9),
        "step_time": dt,
        "wall": time.perf_counter() - t.t_start,
        "train_time": t.train_time,
        **phases,
    }
    if info is not None:
        row.update({f"comm_{k}": v for k, v in info.as_dict().items()})
    return row


def rank_row(t: Run, info: Any, phases: dict, dt: float) -> dict:
    """The figures of a step row that are each rank's own (its step time,
    phases and communication record): what a rank other than 0 hands to
    TensorBoard's per-rank tags, without the loss and learning rate it would
    have to fetch (a schedule call costs 0.3 ms here)."""
    row = {"step": t.step, "step_time": dt, **phases}
    if info is not None:
        row.update({f"comm_{k}": v for k, v in info.as_dict().items()})
    return row


def eval_row(t: Run, ev: dict, t0: float) -> dict:
    """An evaluation's row (``kind: eval`` in ``metrics.jsonl``), ``t0`` its start."""
    return {
        "step": t.step,
        "epoch": t.step / t.loader.steps_per_epoch,
        "wall": t0 - t.t_start,
        "train_time": t.train_time,
        "eval_s": time.perf_counter() - t0,
        **ev,
    }


def say_eval(t: Run, row: dict) -> None:
    """One line per evaluation on rank 0, unless the progress bar shows it."""
    if not (sys.stderr.isatty() and t.config.progress):
        print(
            f"r0 | step {t.step}/{t.total_steps} test_acc {row['test_acc']:.4f} "
            f"test_loss {row['test_loss']:.4f}",
            flush=True,
        )
