"""The parameter-server crossover sweep of eager-SGD (``--sweep``): model size x ranks.

One MPI job per rank count (``--sweep-ranks``); in each, for every model size
(``--sweep-model-size``: the input features of CANDLE P1B2, whose 1024-512-256
MLP then has ``1024 * features + 659,722`` parameters, 118 MB at the real 28,204)
the experiment's arms run one after the other on the same synthetic tabular task,
each size in its own folder ``<root>/np<P>/f<features>/`` laid out like a normal
``experiments.eager_sgd`` run. :func:`collect` reads them all back (rank 0 or
later, no MPI) into one row per (ranks, size, arm) with the bytes each step really
moved; :func:`crossover` finds, per rank count, the model size from which the
parameter server's throughput falls below allreduce's.

Bytes: ``comm MB/rank`` is the mean ``CommInfo.bytes`` of the logged steps, what a
rank handed to MPI (allreduce, solo, majority: the gradient buffer; parameter
server: one push, and the pull that answers it has the same size). ``busiest MB``
is what the busiest rank's link carries per step: for the server 2 (P - 1) of
those messages (every other worker's push in, its parameters out; the root's own
worker hands over in memory), for an allreduce the 2 (P - 1) / P of the
reduce-scatter + allgather algorithm MPICH uses for large buffers.

Flags other than the sweep's pass to every job unchanged, so a link option
(``--link``) given to the experiment reaches every arm; ``sweep.json`` records
what ``--link`` was (``"real"``: the real link, shared memory here). On an
emulated link every arm pays its algorithm's time on that link: allreduce, solo
and majority their ring allreduce, the parameter server each push and reply
through its one port, one after another (``research.comm.ps``).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from research.studies.eager_sgd import ARMS, base_config, load_run, run_arms
from research.train.config import TrainConfig

#: P1B2 input features: 3.7, 11 and 36 MB of float32 parameters.
DEFAULT_FEATURES = (256, 2048, 8192)
DEFAULT_RANKS = (2, 4)
#: The real P1B2 (29,540,618 parameters, 118 MB) for ``--sweep-model-size``.
PAPER_FEATURES = 28204
#: Parser defaults in sweep mode (flags given explicitly still win): a short run
#: per arm that still reaches the target, so time to target is measured, not
#: extrapolated. P1B2 at lr 0.5 passes 40% test accuracy after ~20 steps of a
#: global batch of 32 at 4096 features (measured here); batch 16 keeps compute
#: small beside the messages, as on an accelerator, where the crossover matters.
SWEEP_DEFAULTS: dict[str, Any] = {
    "model.name": "candle_p1b2",
    "data.name": "synthetic_tabular",
    "batch_size": 16,
    "steps": 16,
    "lr": 0.5,
    "momentum": 0.7,
    "warmup_steps": 2,
    "eval_every": 4,
    "target_acc": 0.4,
    "reference_steps": 4,
    "records.trace": False,
}
#: Examples of the synthetic task per size (train, test): enough for 16 steps
#: of 8 ranks x 16 without repeats, small enough that 8 ranks at 118 MB hold it.
SWEEP_DATA = {"n_train": 2048, "n_test": 256}


def check_sweep_flags(cfg: Any) -> str | None:
    """The first problem with the sweep's flags as one line, or None."""
    if cfg.train.model.name != "candle_p1b2":
        return (
            "--sweep grows CANDLE P1B2 (--sweep-model-size is its input features): "
            f"leave --model out (got {cfg.train.model.name!r})"
        )
    if any(f < 160 for f in cfg.sweep_model_size):
        return (
            "--sweep-model-size: input features must be >= 160 "
            "(the task's 16 driver features x 10 classes)"
        )
    if any(p < 2 for p in cfg.sweep_ranks):
        return "--sweep-ranks: a parameter server needs at least 2 ranks"
    return None


def size_config(base: TrainConfig, features: int) -> TrainConfig:
    """``base`` with P1B2 and its synthetic task at ``features`` inputs."""
    import dataclasses

    return dataclasses.replace(
        base,
        model=dataclasses.replace(
            base.model, options={**base.model.options, "features": features}
        ),
        data=dataclasses.replace(
            base.data,
            options={**SWEEP_DATA, **base.data.options, "features": features},
        ),
    )


def run_sweep_job(cfg: Any, root: Path, world) -> None:
    """Every size of the sweep at this world's size, into ``root/np<P>/f<F>``
    (``cfg``: ``experiments.eager_sgd.Config``)."""
    base = base_config(cfg)
    job = root / f"np{world.size}"
    for features in cfg.sweep_model_size:
        folder = job / f"f{features}"
        spec = run_arms(cfg, size_config(base, features), folder, world)
        if world.rank == 0:
            (folder / "imbalance.txt").write_text(spec + "\n")
            print(f"r0 | sweep np{world.size} f{features} done", flush=True)
    world.barrier()


# -- reading the sweep back (rank 0 or later) ----------------------------------------
def _comm_bytes(run_dir: Path) -> float | None:
    from research.rundir import read_metrics

    vals = [
        r["comm_bytes"]
        for r in read_metrics(run_dir)
        if r.get("kind") != "eval" and "comm_bytes" in r
    ]
    return statistics.fmean(vals) if vals else None


def busiest_bytes(arm: str, message: float, size: int) -> float:
    """Bytes per step through the busiest rank's link (see the module docstring)."""
    if arm == "ps":
        return 2 * (size - 1) * message
    return 2 * (size - 1) / size * message


def collect(root: str | Path, target_acc: float) -> list[dict[str, Any]]:
    """One row per (ranks, features, arm, seed) found under ``root``.

    With several ``--seeds`` each seed is a row; :func:`crossover` averages them.
    """
    rows = []
    for job in sorted(Path(root).glob("np*/f*")):
        for run in sorted(job.iterdir()):
            if not (run / "summary.json").exists() or run.name.startswith("bal"):
                continue
            row = load_run(run, target_acc)
            config = json.loads((run / "config.json").read_text())
            message = _comm_bytes(run)
            row.update(
                features=int(job.name[1:]),
                param_bytes=int(config["param_bytes"]),
                comm_bytes=message,
                busiest_bytes=(
                    None
                    if message is None
                    else busiest_bytes(row["arm"], message, row["world_size"])
                ),
            )
            rows.append(row)
    return sorted(
        rows,
        key=lambda r: (r["world_size"], r["param_bytes"], ARMS.index(r["arm"])),
    )


def crossover(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per rank count: the smallest measured model at which ps < allreduce.

    Returns ``{P: {"bytes": B or None, "below": b or None, "ratios": [...]}}``:
    ``B`` the first model size (parameter bytes) where the server's samples/s
    fall below allreduce's, ``b`` the largest size below it where the server
    still led (the crossover lies between), ``ratios`` ps / allreduce samples/s
    per size.
    """
    out: dict[int, dict[str, Any]] = {}
    for size in sorted({r["world_size"] for r in rows}):
        ratios = []
        for pb in sorted({r["param_bytes"] for r in rows if r["world_size"] == size}):
            by: dict[str, list[float]] = {}
            for r in rows:
                if r["world_size"] == size and r["param_bytes"] == pb:
                    by.setdefault(r["arm"], []).append(r["samples_per_s"])
            by = {arm: statistics.fmean(v) for arm, v in by.items()}  # over seeds
            if "ps" in by and "allreduce" in by:
                ratios.append((pb, by["ps"] / by["allreduce"]))
        first = next((pb for pb, q in ratios if q < 1.0), None)
        below = [pb for pb, q in ratios if q >= 1.0 and (first is None or pb < first)]
        out[size] = {
            "bytes": first,
            "below": max(below) if below else None,
            "ratios": ratios,
        }
    return out


def _mb(v: float | None) -> str:
    return "-" if v is None else f"{v / 1e6:.1f}"


def link_line(link: str | None) -> str:
    """Which link the sweep ran on, for its table and figure."""
    from research.train.report import link_label

    return f"link: {link_label(link or 'real')}"


def format_sweep(
    rows: list[dict[str, Any]], target_acc: float, link: str | None = None
) -> str:
    """The sweep's table (Markdown) and one crossover line per rank count."""
    head = [
        "ranks",
        "params MB",
        "arm",
        "samples/s",
        "vs allreduce",
        "median step ms",
        f"time to {target_acc:.0%} s",
        "final acc",
        "comm MB/rank",
        "busiest MB/step",
    ]
    lines = [link_line(link), ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ref = {
        (r["world_size"], r["param_bytes"], r["seed"]): r["samples_per_s"]
        for r in rows
        if r["arm"] == "allreduce"
    }
    seeds = len({r["seed"] for r in rows}) > 1
    for r in rows:
        base = ref.get((r["world_size"], r["param_bytes"], r["seed"]))
        t = r["time_to_target_s"]
        acc = r["final_test_acc"]
        cells = [
            str(r["world_size"]),
            _mb(r["param_bytes"]),
            r["arm"] + (f" s{r['seed']}" if seeds else ""),
            f"{r['samples_per_s']:.0f}",
            f"{r['samples_per_s'] / base:.2f}x" if base else "-",
            f"{r['median_step_s'] * 1e3:.0f}",
            "-" if t is None else f"{t:.1f}",
            "-" if acc is None else f"{acc:.3f}",
            _mb(r["comm_bytes"]),
            _mb(r["busiest_bytes"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    for size, c in crossover(rows).items():
        ratios = ", ".join(f"{pb / 1e6:.1f} MB {q:.2f}x" for pb, q in c["ratios"])
        if c["bytes"] is None:
            where = "the server never fell below allreduce"
        elif c["below"] is None:
            where = "the server was below allreduce from the smallest model on"
        else:
            where = (
                f"the server falls below allreduce between {c['below'] / 1e6:.1f} "
                f"and {c['bytes'] / 1e6:.1f} MB"
            )
        lines.append(f"\n{size} ranks: {where} (ps / allreduce samples/s: {ratios})")
    return "\n".join(lines)


def write_sweep(
    root: str | Path, target_acc: float, link: str | None = None
) -> list[dict[str, Any]]:
    """Collect the sweep under ``root``; write ``sweep.json`` and ``sweep.md``."""
    root = Path(root)
    rows = collect(root, target_acc)
    cross = crossover(rows)
    (root / "sweep.json").write_text(
        json.dumps(
            {
                "target_acc": target_acc,
                "link": link,
                "rows": rows,
                "crossover": {str(k): v for k, v in cross.items()},
            },
            indent=2,
        )
        + "\n"
    )
    (root / "sweep.md").write_text(format_sweep(rows, target_acc, link) + "\n")
    return rows
