"""SparCML: sparse allreduce micro-benchmark and top-k training with error feedback.

Paper: C. Renggli, S. Ashkboos, M. Aghagolzadeh, D. Alistarh, T. Hoefler,
*SparCML: High-Performance Sparse Communication for Machine Learning*, SC19
(https://arxiv.org/abs/1802.08021). Claims: allreduce collectives for sparse
inputs of different sizes per process (recursive doubling; split-allgather with
a sparse or dense result) that switch to a dense representation when the merged
result fills in, usable non-blocking and with low-precision values, give
order-of-magnitude savings in communication time over dense allreduce for
sparse gradients, and top-k training with error feedback keeps the accuracy of
dense training.

What runs (one MPI job, ``research.studies.sparcml``): a micro-benchmark of every
algorithm (``ssar_rd``, ``ssar_sag``, ``dsar_sag``), ``auto`` and the dense
allreduce on a ResNet-50-sized vector (``--dim``) at densities 0.1-50%, on the
real link and an emulated 10 Gb/s one (``--bench-link``), bytes against the cost
model; and training with the ``sparse`` strategy: ``dense``, ``topk_ef`` (top-k
1% with error feedback), ``topk_noef`` and ``topk_4bit``: accuracy, time to
``--target-acc``, bytes per step. ``--comm-bound`` (opt-in, ~45 min) compares
dense and top-k on CANDLE P1B2 and ResNet-50 on 1 and 10 Gb/s links. It prints
the tables and PASS/FAIL/UNDECIDED checks and writes ``table.md``,
``results.json`` and figures. On 2 shared cores moving a byte costs about what
reading it costs, so top-k selection is dearer than what it saves on the real
link; the emulated links are where the claims can be checked.

Commands::

    python -m experiments.sparcml          # 4 ranks, both parts, ~6 minutes
    python -m experiments.sparcml --dim 1000000 --reps 1 --steps 40   # quick look
    python -m experiments.sparcml --arms            # benchmark only
    python -m experiments.sparcml --skip-bench      # training only
    python -m experiments.sparcml --skip-bench --arms --comm-bound
    python -m experiments.sparcml --np 8 --scope per-layer --bits 8
    # cluster: calibrate once per P on the nodes, then the real network link
    srun -n 16 python -m scripts.calibrate_sparse
    sbatch -N 4 --ntasks-per-node=4 scripts/slurm.sbatch experiments.sparcml \\
        --bench-link real --model resnet18 --steps 2000

Results: ``docs/results/sparcml.md``; earlier runs: ``docs/journal.md``.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from research.entry.cli import parse_config
from research.flags import CKPT, OUTPUT, flag, nested
from research.studies.presets import ExperimentConfig, start_job
from research.studies.sparcml import ARMS, DENSITIES, RESNET50_DIM, run_experiment
from research.studies.sparcml_commbound import COMM_BOUND
from research.train.config import (
    ModelConfig,
    RecordsConfig,
    StrategyConfig,
    TrainConfig,
)
from research.usage import UsageError, fail_usage

PROG = "python -m experiments.sparcml"
SPARCML, COMM = "SparCML", "communication-bound comparison (--comm-bound)"


def _train(model: str | None = None) -> TrainConfig:
    return TrainConfig(
        model=ModelConfig(model or "cnn_small"),
        steps=160,
        batch_size=32,
        eval_every=20,
        records=RecordsConfig(log_every=1),
        momentum=0.9,
        # Each arm sets its own strategy; host accepts the link.
        strategy=StrategyConfig("host", link="10gbps"),
    )


@dataclasses.dataclass
class Config(ExperimentConfig):
    """The micro-benchmark, the training arms and the comm-bound comparison."""

    train: TrainConfig = nested(_train)
    dim: int = flag(RESNET50_DIM, "benchmark vector; default %(default)s", SPARCML)
    densities: list[float] = flag(
        None, "benchmark densities", SPARCML, factory=lambda: list(DENSITIES)
    )
    reps: int = flag(3, "timed calls per point; default %(default)s", SPARCML)
    bench_link: str = flag("10gbps", "emulated link of the benchmark", SPARCML)
    skip_bench: bool = flag(False, "training only", SPARCML)
    arms: list[str] = flag(
        None,
        "training arms (none: benchmark only); default %(default)s",
        SPARCML,
        factory=lambda: list(ARMS),
        nargs="*",
        choices=ARMS,
    )
    train_density: float = flag(0.01, "top-k density of training", SPARCML)
    bits: int = flag(4, "bits of the low-precision arm", SPARCML, choices=(2, 4, 8))
    scope: str = flag("global", "top-k over", SPARCML, choices=("global", "per-layer"))
    sparse_warmup: int = flag(0, "dense steps before top-k", SPARCML)
    seeds: list[int] = flag(
        None,
        "training seeds, every arm each (mean +- std); default %(default)s",
        SPARCML,
        factory=lambda: [0, 1, 2],
    )
    target_acc: float = flag(0.8, "test accuracy to reach", SPARCML)
    comm_bound: bool = flag(
        False, "also train dense / top-k + EF / top-k 4-bit on big models", COMM
    )
    cb_models: list[str] = flag(
        None,
        "default %(default)s",
        COMM,
        factory=lambda: ["candle_p1b2", "resnet50"],
        choices=tuple(sorted(COMM_BOUND)),
    )
    cb_links: list[str] = flag(
        None, "default %(default)s", COMM, factory=lambda: ["1gbps", "10gbps", "real"]
    )
    cb_seeds: list[int] = flag(
        None,
        "seeds of the comparison, every arm each (the check pairs them); "
        "default %(default)s",
        COMM,
        factory=lambda: [0],
    )
    cb_steps: int = flag(60, "steps of each run", COMM)
    cb_eval_every: int = flag(10, "evaluate every N steps", COMM)
    cb_target: float | None = flag(
        None,
        "test accuracy to reach (default per model: P1B2 0.25, ResNet-50 0.6)",
        COMM,
        type=float,
    )
    plots: bool = flag(True, "skip the figures", OUTPUT, name="--no-plots")

    def problem(self) -> str | None:
        """The first problem with the values as one line, or None."""
        from research.comm.link import Link

        if self.dim < 1 or self.reps < 1:
            return "--dim and --reps must be >= 1"
        if not all(0 < d <= 1 for d in self.densities):
            return "--densities must lie in (0, 1]"
        if not 0 < self.train_density <= 1:
            return "--train-density must lie in (0, 1]"
        for name, spec in [("--bench-link", self.bench_link)] + [
            ("--cb-links", x) for x in self.cb_links
        ]:
            try:
                Link.parse(spec)
            except ValueError as e:
                return f"{name}: {e}"
        if self.cb_steps < 1:
            return "--cb-steps must be >= 1"
        return None


def get_config(model: str | None = None, paper_scale: bool = False) -> Config:
    """The default run (``cnn_small`` on the embedded task, 4 ranks)."""
    return Config(train=_train(model))


def parse(argv: list[str]) -> Config:
    return parse_config(argv, get_config, prog=PROG, doc=__doc__, hide=(CKPT,))


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse(argv)  # bad flags end here, before paying for MPI start-up
    cfg.launch.create("experiments.sparcml", argv, cfg.train.threads)
    world, root = start_job(cfg.train.threads, cfg.train.run_dir, "sparcml")
    try:
        return run_experiment(cfg, root, world)
    except UsageError as e:
        fail_usage(PROG, str(e))


if __name__ == "__main__":
    main()
