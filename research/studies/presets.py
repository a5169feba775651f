"""What the experiment entry points share: the config frame, run folder, start.

Each experiment's flags come from one dataclass (``experiments/<name>.py``):
``train`` (:class:`~research.train.config.TrainConfig`, nested), ``launch``
(a :class:`LaunchConfig`: ``--np``, ``--hosts``; ``create(...)`` starts the
job's ranks) and the experiment's own fields, each declared with
:func:`~research.train.config.flag`; ``get_config(model, paper_scale)``
returns it with a preset's defaults and :func:`research.entry.cli.parse_config`
builds it from the command line (explicit flags win over the preset).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from research.entry.cli import override
from research.flags import PARALLEL, flag, nested
from research.train.config import TrainConfig

NP_HELP = (
    "ranks to launch when started without mpiexec, at least 1 (1: run in this "
    "process alone, no mpiexec); ignored under mpiexec/srun; default %(default)s"
)
HOSTS_HELP = (
    "run the ranks on these hosts: n1,n2 (ranks in blocks, node by node) or "
    "n1:2,n2:1; nodes of a local cluster (scripts/cluster/localnet.sh up N) or a "
    "cluster's own hosts (over ssh); ignored under mpiexec/srun"
)


@dataclasses.dataclass
class LaunchConfig:
    """Where a job's ranks run when it is started without a launcher (``--np``,
    ``--hosts``); under mpiexec, srun or a PBS job the world given wins."""

    np: int = flag(4, NP_HELP, PARALLEL)
    hosts: str = flag("", HOSTS_HELP, PARALLEL, metavar="HOSTS")

    def create(self, module: str, argv: list[str], threads: int = 1) -> None:
        """Start the job: relaunch ``python -m module argv`` under the
        environment's mpiexec with ``np`` ranks (on ``hosts``) and exit with its
        code; return at once inside a job, or where ``np`` is 1 on this node
        (this process alone). ``threads``: compute threads per rank."""
        from research.entry.launch import maybe_relaunch

        maybe_relaunch(module, argv, self.np, threads, self.hosts)


@dataclasses.dataclass
class ExperimentConfig:
    """What every experiment's config has: its training run and its launch."""

    train: TrainConfig = nested(TrainConfig)
    launch: LaunchConfig = nested(LaunchConfig)


def with_model(cfg: Any, model: str | None, presets: Mapping[str, Mapping]) -> Any:
    """``cfg`` with ``--model model`` applied (None: keep ``cfg``'s model).

    A name in ``presets`` (``candle``) gives that preset's model, its synthetic
    task (where ``cfg`` still has the default one) and its model and data
    options beneath ``cfg``'s own.
    """
    name = model or cfg.train.model.name
    preset = presets.get(name, {})
    train = cfg.train
    dataset = train.data.name
    if "dataset" in preset and dataset == "synthetic_images":
        dataset = preset["dataset"]
    data = dataclasses.replace(
        train.data,
        name=dataset,
        options={**preset.get("data_options", {}), **train.data.options},
    )
    train = dataclasses.replace(
        train,
        model=dataclasses.replace(
            train.model,
            name=preset.get("model", name),
            options={**preset.get("model_options", {}), **train.model.options},
        ),
        data=data,
    )
    return dataclasses.replace(cfg, train=train)


def with_dataset(cfg: Any, dataset: str | None) -> Any:
    """``cfg`` with ``--dataset dataset`` applied (None: keep ``cfg``'s).

    A preset's data options describe the task it chose (``n_train``,
    ``num_classes`` of a synthetic one); on another dataset only the options
    that dataset takes stay (``image_size``: the paper's 224 on ImageNet), and
    what its files fix (the classes, the examples) comes from them. The user's
    ``--data-opt`` pairs are applied over these and checked with the rest.
    """
    if dataset is None or dataset == cfg.train.data.name:
        return cfg
    from research.data import dataset_options

    try:
        takes = dataset_options(dataset)
    except ValueError:  # an unknown name: the launcher's check says so
        return cfg
    options = {k: v for k, v in cfg.train.data.options.items() if k in takes}
    data = dataclasses.replace(cfg.train.data, name=dataset, options=options)
    return override(cfg, data=data)


def run_root(run_dir: str | None, world, experiment: str) -> Path:
    """``run_dir``, else rank 0's ``runs/<experiment>-<time>`` on every rank."""
    if run_dir:
        return Path(run_dir).absolute()
    from research.rundir import default_run_dir

    return Path(world.bcast(default_run_dir(experiment) if world.rank == 0 else None))


def start_job(
    threads: int, run_dir: str | None, experiment: str, *, compile_cache: bool = True
):
    """An experiment's start inside its MPI job: ``(world, run root)``.

    Threads per rank first (XLA reads them when it starts), the compile cache,
    MPI, then the abort hook at once, so a failure anywhere after ends the job.
    Rank 0 appends the job's provenance to ``root/run.json``
    (:mod:`research.provenance`), with the nodes and their link where the ranks
    span several.
    """
    from research.comm.world import get_world, install_abort_on_error
    from research.threads import set_threads
    from research.train.process import freeze_imports

    set_threads(threads)
    if compile_cache:
        enable_compile_cache()
    world = get_world()
    install_abort_on_error()
    freeze_imports()
    root = run_root(run_dir, world, experiment)
    if world.rank == 0:
        from research.provenance import record_job

        nodes = None
        if world.nodes > 1:
            from research.train.report import link_label

            hosts = world.topology.record()["hosts"]
            nodes = {"hosts": hosts, "network": link_label("real", world)}
        record_job(root, experiment, world.size, nodes=nodes)  # what docs/results cites
    return world, root


def enable_compile_cache() -> None:
    """Share compiled programs between ranks and arms through a disk cache.

    Every arm builds the same model, so without it each arm recompiles (5-15 s
    per arm on the loaded 2-core machine). ``JAX_COMPILATION_CACHE_DIR`` wins.
    """
    import jax

    default = os.path.join(os.path.expanduser("~"), ".cache", "research-jax")
    jax.config.update(
        "jax_compilation_cache_dir",
        os.environ.get("JAX_COMPILATION_CACHE_DIR", default),
    )
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
