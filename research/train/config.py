"""The typed configuration of one training run, and its command-line flags.

``TrainConfig`` nests the parts that build themselves: ``model`` (a
:class:`ModelConfig`: ``create()`` builds it), ``data`` (a :class:`DataConfig`:
``create()`` gives a rank's dataset and loader), ``strategy`` (a
:class:`StrategyConfig`: ``typed()`` is the strategy's options dataclass,
whose ``create()`` builds the strategy), ``records`` (a :class:`RecordsConfig`:
``research.train.records.Records.open`` opens the run's writers with it),
``faults`` (a :class:`~research.train.faults.FaultConfig`: ``create(run_dir)``
arms the watchdog's timeout) and ``checkpoint`` (a
:class:`~research.checkpoint.config.CheckpointConfig`: ``create()`` builds the
saver). Each field that users set from the command line
carries its flag in its metadata (:func:`research.flags.flag`), so a new field is
one line and ``research.entry.cli`` builds the parser and the config from these
classes alone. The experiments' configs (``experiments/*.py``) declare their own
fields the same way and nest this class as ``train``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from research.checkpoint.config import CheckpointConfig
from research.flags import MODEL, OPTIM, OUTPUT, PARALLEL, flag, nested
from research.train.faults import FaultConfig

#: The model's computation dtype for each ``--precision``.
PRECISION_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


@dataclasses.dataclass
class ModelConfig:
    """Which model a run trains (``--model``, ``--model-opt``, ``--precision``);
    ``create`` builds it (``models.get_model``)."""

    name: str = flag(
        "cnn_small",
        "model name (see --list); default %(default)s",
        MODEL,
        name="--model",
        metavar="MODEL",
    )
    options: dict[str, Any] = flag(
        None,
        "model option, repeatable (e.g. width=16, stem=cifar)",
        MODEL,
        name="--model-opt",
        factory=dict,
    )
    precision: str = flag(
        "fp32",
        "bf16: the model computes in bfloat16 (mixed precision), parameters, "
        "gradients, optimizer and updates stay float32; fp32: all float32 "
        "(a --model-opt dtype=... wins); default %(default)s",
        MODEL,
        choices=("fp32", "bf16"),
    )

    def built_with(self) -> dict[str, Any]:
        """``--model-opt``'s options, with the computation dtype ``--precision``
        asks for (a ``dtype`` given there wins)."""
        return {"dtype": PRECISION_DTYPES[self.precision], **self.options}

    def create(self, num_classes: int) -> Any:
        """The model (a Flax module) for ``num_classes`` classes."""
        import models

        return models.get_model(self.name, num_classes=num_classes, **self.built_with())

    def problem(self) -> str | None:
        """An unknown model as one line, or None."""
        import models

        if self.name not in models.list_models():
            names = ", ".join(models.list_models())
            return f"unknown model {self.name!r}; choose one of {names}"
        return None


@dataclasses.dataclass
class DataConfig:
    """Which dataset a run reads and how (``--dataset``, ``--data-*``).

    ``create`` builds this rank's dataset and loader (research.data.protocol:
    in memory or streamed); a bad folder or option raises there, on one rank,
    with no collective.
    """

    name: str = flag(
        "synthetic_images",
        "dataset name (see --list); default %(default)s",
        MODEL,
        name="--dataset",
        metavar="DATASET",
    )
    dir: str | None = flag(
        None,
        "folder of an on-disk dataset (cifar10, candle_nt3, candle_p1b2, imagenet)",
        MODEL,
        name="--data-dir",
        metavar="DATA_DIR",
    )
    options: dict[str, Any] = flag(
        None,
        "dataset option, repeatable (e.g. n_train=4096, features=512; "
        "imagenet: image_size=112, eval_examples=10000)",
        MODEL,
        name="--data-opt",
        factory=dict,
    )
    workers: int = flag(
        0,
        "decoding threads per rank for a streamed dataset (imagenet), beside "
        "the feeder thread that decodes when 0 (on one core 0 was the fastest: "
        "python -m scripts.bench_input); a GPU node wants several per GPU; "
        "default %(default)s",
        MODEL,
        name="--data-workers",
        metavar="N",
    )

    def create(
        self, *, batch_size: int, rank: int, size: int, seed: int
    ) -> tuple[Any, Any]:
        """This rank's ``(dataset, loader)``: ``batch_size`` examples a step
        for rank ``rank`` of ``size``, ``seed`` the data's and the order's."""
        from research.data import get_dataset

        dataset = get_dataset(self.name, path=self.dir, seed=seed, **self.options)
        loader = dataset.loader(
            batch_size=batch_size, rank=rank, size=size, seed=seed, workers=self.workers
        )
        return dataset, loader

    def problem(self) -> str | None:
        """The first problem with these values as one line, or None: the name,
        the folder, its layout or shards and the options, checked before any
        rank starts (a bad file is named)."""
        import os

        from research.data import check_dataset, list_datasets

        if self.name not in list_datasets():
            return (
                f"unknown dataset {self.name!r}; choose one of "
                f"{', '.join(list_datasets())}"
            )
        if self.dir is not None and not os.path.isdir(self.dir):
            return f"--data-dir {self.dir!r} is not a folder"
        if self.workers < 0:
            return (
                "--data-workers must be >= 0 (0: in the feeder thread), got "
                f"{self.workers}"
            )
        return check_dataset(self.name, self.dir, self.options)


@dataclasses.dataclass
class StrategyConfig:
    """How the ranks average (``--strategy``, ``--strategy-opt``, ``--link``):
    ``typed()`` is the chosen strategy's own options dataclass (its fields and
    ranges: ``research.strategies``), whose ``create(world)`` builds the
    strategy."""

    name: str = flag(
        "fused",
        "gradient averaging: fused (mpi4jax in jit), host (on the host), or a "
        "paper's strategy (see --list); default %(default)s",
        PARALLEL,
        name="--strategy",
        metavar="STRATEGY",
    )
    options: dict[str, Any] = flag(
        None,
        "strategy option, repeatable (e.g. bucket_bytes=67108864; see --list)",
        PARALLEL,
        name="--strategy-opt",
        factory=dict,
    )
    link: str = flag(
        "real",
        "emulated network link for host-side collectives, e.g. 10gbps or "
        "100gbps:2us (each also sleeps as long as that link would take); "
        "default %(default)s",
        PARALLEL,
    )

    def to(self, name: str, options: dict[str, Any] | None = None) -> StrategyConfig:
        """Strategy ``name`` with ``options`` on the same link (how a study
        sets each arm's)."""
        return dataclasses.replace(self, name=name, options=dict(options or {}))

    def typed(self) -> Any:
        """The strategy's options dataclass (``--link`` applied where the
        strategy has a link); a bad option is a ``ValueError`` naming it."""
        from research.strategies.registry import make_options

        return make_options(self.name, self.options, self.link)

    def problem(self) -> str | None:
        """An unknown strategy, a bad option or a link it cannot run on, as one
        line, or None."""
        from research.strategies import registry

        if self.name not in registry.names():
            return (
                f"unknown strategy {self.name!r}; choose one of "
                f"{', '.join(registry.names())}"
            )
        problem = registry.options_class(self.name).problem(self.options)
        if problem:
            return f"--strategy-opt: {problem}"
        return registry.problem(self.name, {}, self.link)


@dataclasses.dataclass
class RecordsConfig:
    """What a run writes as it trains besides its summary (``--log-every``,
    ``--trace``, ``--tensorboard``, ``--profile``); the loop opens the writers
    with them (:meth:`research.train.records.Records.open`, a module above this
    one)."""

    log_every: int = flag(
        10, "write a metrics.jsonl row every N steps; default %(default)s", OUTPUT
    )
    trace: bool = flag(False, "write the timeline trace.json", OUTPUT, negatable=True)
    trace_max_events: int = flag(
        200_000, "timeline events kept per rank; default %(default)s", OUTPUT
    )
    tensorboard: bool = flag(
        True,
        "TensorBoard scalars (loss, accuracy, rate, step phases, communication, "
        "checkpoint blocking) into the run folder, written off the training "
        "thread; view with `tensorboard --logdir runs/`",
        OUTPUT,
        negatable=True,
    )
    profile: str | None = flag(
        None,
        "capture jax.profiler traces of COUNT steps from step START (counted "
        "from 1, as metrics.jsonl and TensorBoard count) into "
        "RUN_DIR/plugins/profile/, for TensorBoard's profile plugin "
        "(pip install tensorboard xprof)",
        OUTPUT,
        metavar="START:COUNT",
        type=str,
    )
    profile_ranks: str = flag(
        "all",
        "the ranks --profile captures, e.g. 0,2; default %(default)s",
        OUTPUT,
        metavar="RANKS",
    )


def checkpointing(saver: str = "none", every: int = 100, **kw: Any) -> CheckpointConfig:
    """A run's checkpointing: ``saver`` every ``every`` steps and after the
    last (``kw``: more of :class:`CheckpointConfig`'s fields)."""
    return CheckpointConfig(saver=saver, every=every, final=True, **kw)


@dataclasses.dataclass
class TrainConfig:
    """Everything that defines a run; written resolved to ``config.json``.

    Steps: ``steps`` when positive, else ``epochs`` times the steps of one epoch.
    """

    model: ModelConfig = nested(ModelConfig)
    data: DataConfig = nested(DataConfig)
    batch_size: int = flag(32, "examples per rank per step; default %(default)s", OPTIM)
    steps: int = flag(
        0, "training steps (overrides --epochs when > 0); default %(default)s", OPTIM
    )
    epochs: float = flag(
        1.0, "epochs over the training split; default %(default)s", OPTIM
    )
    lr: float = flag(0.05, "peak learning rate; default %(default)s", OPTIM)
    scale_lr: bool = flag(
        False, "multiply --lr by global batch / 256 (Goyal et al.)", OPTIM
    )
    schedule: str = flag(
        "cosine",
        "learning-rate schedule after warm-up; default %(default)s",
        OPTIM,
        choices=("constant", "step", "cosine"),
    )
    warmup_steps: int = flag(20, "linear warm-up steps; default %(default)s", OPTIM)
    momentum: float = flag(0.9, "SGD momentum; default %(default)s", OPTIM)
    weight_decay: float = flag(5e-4, "L2 weight decay; default %(default)s", OPTIM)
    seed: int = flag(
        0, "seed of data, initialisation and sharding; default %(default)s", OPTIM
    )
    strategy: StrategyConfig = nested(StrategyConfig)
    faults: FaultConfig = nested(FaultConfig)
    threads: int = flag(
        1,
        "compute threads per rank (XLA:CPU's pool; 0: XLA's default); "
        "default %(default)s",
        PARALLEL,
    )
    eval_every: int = flag(
        100, "evaluate on the test split every N steps; default %(default)s", OUTPUT
    )
    eval_batch_size: int = flag(
        256, "examples per rank per evaluation batch; default %(default)s", OUTPUT
    )
    records: RecordsConfig = nested(RecordsConfig)
    run_dir: str = flag(
        "", "run folder (default runs/<experiment>-<timestamp>)", OUTPUT
    )
    progress: bool = flag(True, "no progress bar on rank 0", OUTPUT)
    # Checkpointing (research.checkpoint): a saver's name or "none"; every N
    # steps and after the last one; resume from the newest committed step.
    checkpoint: CheckpointConfig = nested(lambda: checkpointing())
