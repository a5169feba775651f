"""SC18 overlap: gradient averaging hidden behind the backward and forward passes.

Paper: S. Lee, A. Agrawal, P. Balaprakash, A. Choudhary, W. Liao, *Communication-
Efficient Parallelization Strategy for Deep Convolutional Neural Network
Training*, MLHPC@SC18 (authors' code: github.com/NU-CUCIS/pcnn). Claims: with
each layer's reduce-scatter started as its gradient appears, a sharded update and
allgathers that the next forward pass waits for layer by layer, VGG-16 and
ResNet-50 scale to 8192 Cori KNL cores with 2516x and 2734x speedups (baseline
not stated; most likely one process).

What runs: for each rank count (one mpiexec job each) and model, a few training
steps with each strategy: ``host`` (blocking allreduce after the backward pass),
``fused`` (inside the jitted step), ``layerwise`` (DDP buckets), ``overlap`` (the
SC18 scheme; ``research.strategies.overlap``) and, for VGG-16, ``overlap-fcx`` (fc
stages exchange activations instead of gradients; on request), on the real
(shared-memory) link and an emulated one (``auto``: where host's allreduce takes
as long as its compute). One table per model (step, compute, communication,
hidden fraction, speedup over ``host``, efficiency, optimizer memory; medians
over 20 measured steps a run, with 90% intervals), the targets decided on those
intervals (PASS, FAIL, UNDECIDED) and figures. Default (about 15 minutes on
the quiet 2-core machine, 30 with another session's tests beside it): full
VGG-16 and ResNet-50 on 32x32 inputs, ranks 1, 2, 4, host, fused, layerwise
and overlap. On 2 shared cores moving bytes costs the CPU time the computation
needs, so on the real link overlap can hide the waiting, not the copying; the
emulated link is where the claims can be checked.

Commands::

    python -m experiments.overlap                           # the default above
    python -m experiments.overlap --ranks 2 --models resnet50 --steps 3 \\
        --strategies host overlap --links real auto          # a quick look
    python -m experiments.overlap --ranks 2 4 --models vgg16 \\
        --strategies host overlap overlap-fcx --sweep-models vgg16   # fc, buckets
    python -m experiments.overlap --ranks 4 --emulated-ranks 4 --sweep-ranks 4 \\
        --bucket-mb 0.5 2 8 32 --models resnet50 --sweep-models resnet50
    # paper scale in a batch job (the launcher's world size; ImageNet-size inputs)
    sbatch -N 64 --ntasks-per-node=4 scripts/slurm.sbatch experiments.overlap \\
        --paper-scale
    # the steps on ImageNet's images: ArrayRecord shards once (every run opens
    # the data again: a manifest, not a scan of 1.28M files), then
    python -m scripts.imagenet_to_arrayrecord /data/imagenet /scratch/imagenet-ar
    sbatch -N 64 --ntasks-per-node=4 --cpus-per-task=16 scripts/slurm.sbatch \\
        experiments.overlap --paper-scale --dataset imagenet \\
        --data-dir /scratch/imagenet-ar --data-workers 8

The inputs: by default random images of ``--image-size`` (the data change
neither a step's compute nor its communication, which is what is timed).
``--dataset imagenet --data-dir DIR`` reads ImageNet instead (crops of
``--image-size``, its 1000 classes the folder's): the input pipeline's wait
then joins each step (``data_wait_s`` in the rows) and its decoding threads
share the host's cores, as in a real run; a hidden fraction measured so is
what a training job gets.

Results: ``docs/results/overlap.md``; earlier runs: ``docs/journal.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from research.entry.cli import override, parse_config
from research.entry.launch import relaunch
from research.flags import OUTPUT, flag, flag_of
from research.studies.overlap import (
    DEFAULT_STRATEGIES,
    LINKED,
    MODELS,
    STRATEGIES,
    figures,
    report,
    run_point,
)
from research.studies.presets import HOSTS_HELP
from research.train.config import DataConfig
from research.usage import UsageError

PROG = "python -m experiments.overlap"
RUNS, OUT, DATA = "runs", "output", "data"
#: The inputs a step can time: random images, or ImageNet's crops.
DATASETS = ("synthetic_images", "imagenet")

#: --paper-scale: ImageNet-size inputs, the paper's batch (flags still win).
PAPER: dict[str, Any] = dict(
    image_size=224, num_classes=1000, batch_size=32, steps=20, warmup=5
)


@dataclasses.dataclass
class Config:
    """The models, strategies, rank counts and links of the study."""

    models: list[str] = flag(
        None,
        "models (vgg16, resnet50 with the reduced options above; any other "
        "registered model with its defaults and --image-size); default %(default)s",
        RUNS,
        factory=lambda: list(MODELS),
    )
    strategies: list[str] = flag(
        None,
        "of " + ", ".join(STRATEGIES) + "; default %(default)s (overlap-fcx, "
        "information only, on request: the default ends within about 15 minutes "
        "with 20 measured steps a run)",
        RUNS,
        factory=lambda: list(DEFAULT_STRATEGIES),
    )
    ranks: list[int] = flag(
        None, "default %(default)s", RUNS, factory=lambda: [1, 2, 4]
    )
    hosts: str = flag("", HOSTS_HELP, RUNS, metavar="HOSTS")
    links: list[str] = flag(
        None,
        "real, auto (comm = host's compute) or a spec like 10gbps:2us; "
        "default %(default)s",
        RUNS,
        factory=lambda: ["real", "auto"],
    )
    emulated_ranks: list[int] = flag(
        None,
        "world sizes that also run the emulated link(s); default %(default)s",
        RUNS,
        factory=lambda: [2, 4],
    )
    bucket_mb: list[float] = flag(
        None,
        "layerwise bucket sweep (MiB), on the emulated link at --sweep-ranks; "
        "25 elsewhere; default %(default)s",
        RUNS,
        factory=lambda: [1.0, 4.0, 25.0, 100.0],
    )
    sweep_ranks: list[int] = flag(
        None, "default %(default)s", RUNS, factory=lambda: [2]
    )
    sweep_models: list[str] = flag(
        None,
        "models that get the layerwise bucket sweep (information only; e.g. "
        "vgg16); default %(default)s",
        RUNS,
        factory=list,
    )
    steps: int = flag(
        22,
        "steps per run; default %(default)s: 20 measured after the warm-up, "
        "enough for an interval over the steps",
        RUNS,
    )
    warmup: int = flag(
        2,
        "steps left out (compilation; overlap's first step, which has no "
        "allgather to wait for); default %(default)s",
        RUNS,
    )
    batch_size: int = flag(2, "per rank; default %(default)s", RUNS)
    image_size: int = flag(32, "default %(default)s", RUNS)
    num_classes: int = flag(10, "default %(default)s", RUNS)
    threads: int = flag(1, "compute threads per rank; default %(default)s", RUNS)
    paper_scale: bool = flag(
        False,
        "ImageNet-size inputs (for clusters): 224x224, 1000 classes, random or, "
        "with --dataset imagenet --data-dir DIR, ImageNet's crops and classes",
        RUNS,
    )
    # The data flags are experiments.train's (one definition, DataConfig's).
    dataset: str = flag_of(
        DataConfig,
        "name",
        help="the steps' inputs (see above): random images of --image-size and "
        "--num-classes, or imagenet (--data-dir; crops of --image-size, its "
        "classes); default %(default)s",
        group=DATA,
        choices=DATASETS,
    )
    data_dir: str | None = flag_of(
        DataConfig,
        "dir",
        help="imagenet's folder: its layout or ArrayRecord shards",
        group=DATA,
    )
    data_options: dict[str, Any] = flag_of(
        DataConfig,
        "options",
        help="imagenet option, repeatable (e.g. prefetch_batches=4; the size "
        "is --image-size)",
        group=DATA,
    )
    data_workers: int = flag_of(DataConfig, "workers", group=DATA)
    plots: bool = flag(True, "skip the figures", OUTPUT, name="--no-plots")
    trace: bool = flag(
        True,
        "write timelines (the figures' timeline excerpt reads them)",
        OUTPUT,
        negatable=True,
    )
    run_dir: str | None = flag(
        None, "run folder (default runs/overlap-<timestamp>)", OUT, type=str
    )
    report_only: bool = flag(
        False,
        "re-read --run-dir (timings re-derived leaving out --warmup steps)",
        OUT,
    )
    # Set by the driver on the jobs it launches: run, do not report.
    point: bool = flag(False, argparse.SUPPRESS, OUT)

    def problem(self) -> str | None:
        """The first problem with the values as one line, or None."""
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad:
            return f"unknown strategy {bad[0]!r}; choose from {', '.join(STRATEGIES)}"
        if any(k == "auto" for k in self.links) and "host" not in self.strategies:
            return "--links auto needs host (its compute sets the link)"
        if not set(self.strategies) & set(LINKED) and self.links != ["real"]:
            return "only host, layerwise and overlap run on an emulated link"
        if self.steps <= self.warmup:
            return "--steps must exceed --warmup"
        if self.report_only and not self.run_dir:
            return "--report-only needs --run-dir"
        if "image_size" in self.data_options:
            return "--data-opt image_size: the steps' size is --image-size"
        if self.dataset != "synthetic_images" or self.data_dir:
            return dataset_problem(self)
        return None


def dataset_problem(cfg: Config) -> str | None:
    """The launcher's check (``research.entry.cli.validate``: the folder, its
    layout or shards, the options) of the data a run of ``cfg`` reads."""
    from research.entry.cli import validate
    from research.studies.overlap import run_config

    return validate(run_config(cfg, cfg.models[0], "host", "real", None))


def get_config(model: str | None = None, paper_scale: bool = False) -> Config:
    """The reduced default, or ImageNet-size inputs at paper scale."""
    return override(Config(), **PAPER, paper_scale=True) if paper_scale else Config()


def parse(argv: list[str]) -> Config:
    return parse_config(argv, get_config, prog=PROG, doc=__doc__)


def main(argv: list[str] | None = None) -> str | None:
    from research.comm.process.env import launched_by_mpi

    argv = sys.argv[1:] if argv is None else argv
    cfg = parse(argv)
    if launched_by_mpi():
        from research.studies.presets import start_job

        world, root = start_job(cfg.threads, cfg.run_dir, "overlap")
        try:
            run_point(cfg, root, world)
        except UsageError as e:  # raised alike on every rank
            from research.usage import fail_usage

            fail_usage(PROG, str(e))
        if cfg.point or world.rank != 0:
            return None
        text = report(root, cfg.models)  # a batch job: its own size only
        print(text, flush=True)
        if cfg.plots:
            figures(root)
        return text
    from research.rundir import default_run_dir

    root = Path(cfg.run_dir or default_run_dir("overlap")).absolute()
    if cfg.report_only:
        text = report(root, cfg.models, warmup=cfg.warmup)
        print(text, flush=True)
        if cfg.plots:
            for path in figures(root, warmup=cfg.warmup):
                print(f"figure: {path}", flush=True)
        return text
    for n in cfg.ranks:
        rest = [*argv, "--run-dir", str(root), "--point"]
        code = relaunch("experiments.overlap", rest, n, cfg.threads, cfg.hosts)
        if code:
            raise SystemExit(code)
    text = report(root, cfg.models)
    print(text, flush=True)
    if cfg.plots:
        for path in figures(root):
            print(f"figure: {path}", flush=True)
    print(f"results: {root}", flush=True)
    return text


if __name__ == "__main__":
    main()
