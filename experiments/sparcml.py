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

What runs (one MPI job, ``research/studies/sparcml.py``):

* micro-benchmark: every algorithm (``ssar_rd``, ``ssar_sag``, ``dsar_sag``),
  ``auto`` and the dense allreduce on a ResNet-50-sized float32 vector
  (``--dim``, 25,557,032) at densities 0.1%, 1%, 10%, 50%, at 2 ranks and at
  the job's size (4; 8 with ``--np 8``), on the real link and an emulated
  10 Gb/s link (``--bench-link``; times derived from each rank's real bytes and
  messages, see the study's docstring); bytes sent per rank against the cost
  model. The cost model is calibrated first for each P if no calibration file
  exists (``python -m scripts.calibrate_sparse``).
* training: the ``sparse`` strategy (``research.comm.sparse.strategy``) on
  ``cnn_small``, same steps for every arm: ``dense`` (host allreduce),
  ``topk_ef`` (top-k 1% with error feedback), ``topk_noef`` (without it) and
  ``topk_4bit`` (top-k 1% + error feedback + 4-bit values): final accuracy,
  time to ``--target-acc``, bytes per step. The arms run on the emulated
  10 Gb/s link by default (``--link real`` for plain shared memory), where the
  strategy's ``auto`` judges by that link (on shared memory it picks the dense
  allreduce for a model this small).

* ``--comm-bound`` (opt-in, ~45 min here): the communication-bound comparison
  of ``research/studies/sparcml_comm.py``: dense, top-k 1% + EF
  and top-k 1% + EF with 4-bit values on CANDLE P1B2 (29.5M parameters, an MLP
  with little compute per byte) and ResNet-50 at 32x32, on emulated 1 and 10
  Gb/s links and the real one (labelled), one seed, 60 steps by default: step
  time, time to a target accuracy, final accuracy, and a check that top-k is
  faster to the target than dense on each emulated link.

It prints both tables and the issue's targets as PASS/FAIL checks, and writes
``table.md``, ``results.json``, ``time_vs_density.png`` (with the model's
crossover marked) and ``accuracy.png`` to the run folder.

Commands::

    # laptop, the default (~6 minutes on 2 cores): 4 ranks, both parts
    python -m experiments.sparcml
    # quick look: a smaller vector, fewer steps
    python -m experiments.sparcml --dim 1000000 --reps 1 --steps 40
    # only one part
    python -m experiments.sparcml --arms            # benchmark only
    python -m experiments.sparcml --skip-bench      # training only
    # the communication-bound comparison alone (P1B2, ResNet-50)
    python -m experiments.sparcml --skip-bench --arms --comm-bound
    # selection cost at real model sizes, and ResNet-50 steps sparse vs host
    flock /work/bench.lock python -m scripts.bench_select --exact
    # 8 ranks (benchmark at 2 and 8), per-layer top-k, 8-bit values
    python -m experiments.sparcml --np 8 --scope per-layer --bits 8
    # cluster: calibrate once per P on the nodes, then the real network link
    srun -n 16 python -m scripts.calibrate_sparse
    sbatch -N 4 --ntasks-per-node=4 scripts/slurm.sbatch experiments.sparcml \\
        --bench-link real --model resnet18 --steps 2000

Measured on this 2-core CPU machine, 2026-11-24, nothing else running (every
timing under ``flock /work/bench.lock``). Earlier figures, taken
under load, are in ``docs/journal.md``.

Selection (``python -m scripts.bench_select``, 2 ranks selecting at once): ms,
slowest rank, median::

    model        dim          select  1 pass  /pass  dense AR  /dense  sparse AR
    ResNet-50     25,557,032    22.0     6.2   3.55      14.9    1.48      13.2
    VGG-16       138,357,544    92.1    29.7   3.10      51.0    1.81      74.0
    CANDLE P1B2   29,540,618    24.4     6.2   3.90      11.4    2.14      10.9

The one-pass selection returns the same top-k set as ``jax.lax.top_k`` (ties
to the lower index), exactly k entries; the sample put 1.17-1.18 k candidates
before the trim. ``jax.lax.top_k`` took 1545 ms for ResNet-50 where the
selection took 49.5 ms in an earlier run under load (journal). The selection
still costs more than the dense allreduce of the same gradient on shared
memory (1.5-2.1x): here moving a byte between ranks costs about what reading it
costs.

ResNet-50 step, ``sparse`` 1% + EF against ``host`` on the real link
(``scripts.bench_select``'s second part, 2 ranks, 32x32, batch 8, 1000
classes, same run): host 289 ms, sparse 293 ms; sparse / host 1.013 and 1.015
in the two counted rounds (target <= 1.15: met).

Communication-bound training (``--skip-bench --arms --comm-bound
--cb-models candle_p1b2 --cb-steps 50``, 4 ranks on the 2 cores, top-k 1%;
seed 0 on three links, seeds 1 and 2 on 10 Gb/s; evaluated every 10 steps)::

    link    arm        seed  ms/step  reached 0.25       final acc  MB/step/rank
    10gbps  dense       0      343    13.3 s (step 40)   0.3040     118.2
    10gbps  topk_ef     0      309    12.2 s (step 40)   0.2770       8.2
    10gbps  dense       1      356    10.4 s (step 30)   0.3620     118.2
    10gbps  topk_ef     1      292    11.6 s (step 40)   0.3070       8.1
    10gbps  dense       2      306    11.9 s (step 40)   0.3070     118.2
    10gbps  topk_ef     2      265    13.0 s (step 50)   0.2590       8.1
    1gbps   dense       0     1688    66.0 s (step 40)   0.3040     118.2
    1gbps   topk_ef     0      349    13.8 s (step 40)   0.2770       8.2
    real    dense       0      215     8.6 s (step 40)   0.3040     118.2
    real    topk_ef     0      302    12.0 s (step 40)   0.2770       8.2

Where sparse training wins wall-clock here, and where it cannot:

* 1 Gb/s: top-k wins outright, 4.8x faster to the target (13.8 s against 66.0 s).
  The dense step pays 1418 ms of allreduce; top-k's 69 ms selection and 104 ms
  sparse allreduce replace it.
* 10 Gb/s: the sparse step is faster in every seed (10-18%: 309/343, 292/356,
  265/306 ms). Its 66-73 ms selection costs less than the 88-98 ms that the
  smaller allreduce saves. But top-k reaches 0.25 one evaluation later than
  dense in two of three seeds, so it is faster to the target only with seed 0
  (12.2 s against 13.3 s). Its accuracy after 50 steps is 2.7-5.5 points lower.
  The end-to-end claim at 10 Gb/s is not reproduced at this length: the check
  prints PASS for seed 0 and FAIL for seeds 1 and 2, each with these phases.
* Real shared-memory link: dense wins (215 against 302 ms), since moving a byte
  costs what selecting it costs.

ResNet-50 at 32x32 is compute-bound here: journal, 2026-11-24, top-k 2300
against dense 2070 ms per step at 10 Gb/s, under load.

Collective micro-benchmark (default command, 2026-11-24, nothing else running, 4
ranks, ResNet-50-sized vector; ``docs/results/sparcml.md``): on the emulated
10 Gb/s link the sparse allreduce (``auto``) takes 0.015 of the dense
allreduce's time at 0.1% density and 0.096 at 1%; dense wins at 50%; bytes
match the model within 1.05x. The order-of-magnitude claim holds for the
collective at 0.1-1% density. ``auto`` picks the fastest at 7 of 8 points; at
4 ranks and 10% it took ``ssar_sag`` on the emulated link, 2.24x slower than
``dsar_sag`` (also 1.9x in a run just before; on 2026-11-23 it picked right at
all 8). Why the model mispredicts there is not yet established.

Accuracy (``cnn_small``, 160 steps, 3 seeds, 2026-11-23; the selection picks
the same set now, so these hold): dense 0.9085 +- 0.0072, top-k 1% + EF 0.9004
+- 0.0068, without EF 0.8859 +- 0.0055. The check now prints the gap with two
standard errors and says UNDECIDED when that interval contains the target:
0.81 +- 1.14 points against 0.5 is undecided at 3 seeds; telling 0.81 from 0.5
at that noise (std 0.7 per arm) would take about 40 seeds per arm. Without EF
the drop is 1.45 +- 1.01 points: UNDECIDED against >= 1 point too.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from research.cli import nested, parse_config
from research.launch import UsageError, fail_usage, maybe_relaunch
from research.studies.presets import ExperimentConfig, start_job
from research.studies.sparcml import ARMS, DENSITIES, RESNET50_DIM, run_experiment
from research.studies.sparcml_comm import COMM_BOUND
from research.train.config import CKPT, OUTPUT, TrainConfig, flag

PROG = "python -m experiments.sparcml"
SPARCML, COMM = "SparCML", "communication-bound comparison (--comm-bound)"


def _train(model: str | None = None) -> TrainConfig:
    return TrainConfig(
        model=model or "cnn_small",
        steps=160,
        batch_size=32,
        eval_every=20,
        log_every=1,
        momentum=0.9,
        link="10gbps",
        strategy="host",  # each arm sets its own; host accepts the link
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
    maybe_relaunch("experiments.sparcml", argv, cfg.np, cfg.train.threads)
    world, root = start_job(cfg.train.threads, cfg.train.run_dir, "sparcml")
    try:
        return run_experiment(cfg, root, world)
    except UsageError as e:
        fail_usage(PROG, str(e))


if __name__ == "__main__":
    main()
