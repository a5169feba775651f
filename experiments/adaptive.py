"""Averaging that adapts while it trains, against every fixed strategy and an
oracle, on a link that changes and under a straggler (issues 31, 43).

Claim: ``--strategy adaptive`` (``research/strategies/adaptive/``), which predicts
what dense (``host``), top-k (``sparse``) and the partial collectives
(``majority``, ``solo``) would cost from a model fitted to the running one's
own steps and switches to the one that makes progress fastest, reaches the
target test accuracy sooner than the best fixed method and close to the
oracle (the best fixed method per phase, known in advance), at dense's
accuracy. Checked per rank count, each on a 90% interval over the seeds (PASS,
FAIL or UNDECIDED), with every arm's start-up in its time to the target, on
seeds the model was not tuned on (tuned on 0-2, judged on 3-5 by default).

What runs: this machine as nodes of a local cluster (network namespaces
joined by ``tc``-shaped links, ``scripts/cluster/localnet.sh``; made here and
removed at the end, unless ``--hosts`` names nodes of yours), one MPI job per
rank count (``--nps``, one rank per node, TCP), every arm for every seed on
one scenario (``--scenario``; ``research/studies/adaptive.py``): the link's
rate changed at fixed steps, one window of steps with a random straggler.
``mixed`` (default), built to give switching room (each phase favours
another method by far): 10 Gb/s, 1 Gb/s, 10 Gb/s with eager-SGD's 0.32 s
straggler, 10 Gb/s; ``link-drop``: the first demonstration's (a slow link in
which top-k wins, a mild straggler: little to win by switching). The model is
CANDLE P1B2 with 4096 input features, whose gradient is large for its
computation. It writes ``table.md``, ``results.json`` and ``adaptive.png`` to
the run root; ``python -m scripts.results ROOT`` renders the page.

Commands::

    python -m experiments.adaptive                 # mixed, 2 and 4 ranks, seeds 3-5
    python -m experiments.adaptive --scenario link-drop
    python -m experiments.adaptive --nps 4 --seeds 1 --run-dir runs/ad   # one job
    python -m experiments.adaptive --report-only --run-dir runs/ad       # the report
    python -m experiments.adaptive --nps 2 --seeds 0 --steps 40 \\
        --link-schedule 0:10gbit,15:1gbit,25:10gbit \\
        --straggler random:k=1:seconds=0.1:start=28:end=36 --target-acc 0.2

Results: ``docs/results/adaptive.md``; history: ``docs/journal.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from research.entry.cli import override, parse_config, without
from research.flags import CKPT, OUTPUT, flag, nested
from research.studies.adaptive import ARMS, JUDGED_SEEDS, SCENARIOS, TUNED_SEEDS
from research.studies.presets import ExperimentConfig
from research.train.config import (
    DataConfig,
    ModelConfig,
    RecordsConfig,
    StrategyConfig,
    TrainConfig,
)
from research.usage import UsageError, fail_usage

PROG = "python -m experiments.adaptive"
STUDY = "adaptive study"
FEATURES = 4096


def _train() -> TrainConfig:
    return TrainConfig(
        model=ModelConfig("candle_p1b2", {"features": FEATURES}),
        data=DataConfig(
            name="synthetic_tabular",
            options={"features": FEATURES, "n_train": 4096, "n_test": 1024},
        ),
        batch_size=32,
        steps=320,
        lr=0.01,
        schedule="constant",
        warmup_steps=10,
        momentum=0.9,
        # Every arm applies decay in its optimizer alike (adaptive keeps it
        # there for top-k too); 0 keeps the fixed top-k arm the same method.
        weight_decay=0.0,
        eval_every=10,
        records=RecordsConfig(log_every=1),
        strategy=StrategyConfig("adaptive"),
    )


DEFAULT = "mixed"


@dataclasses.dataclass
class Config(ExperimentConfig):
    """The arms, the schedule and the nodes."""

    train: TrainConfig = nested(_train)
    scenario: str = flag(
        DEFAULT, "the link's schedule, the straggler, the steps and the target "
        "(set apart by the flags below); default %(default)s", STUDY,
        choices=tuple(SCENARIOS),
    )  # fmt: skip
    nps: list[int] = flag(
        None, "rank counts, one MPI job each", STUDY, factory=lambda: [2, 4]
    )
    seeds: list[int] = flag(
        None,
        "seeds; default %(default)s, none of the seeds the model was tuned on "
        f"({', '.join(map(str, TUNED_SEEDS))})",
        STUDY,
        factory=lambda: list(JUDGED_SEEDS),
    )
    arms: list[str] = flag(
        None, "arms", STUDY, factory=lambda: list(ARMS), nargs="*", choices=ARMS
    )
    link_schedule: str = flag(
        SCENARIOS[DEFAULT]["link_schedule"],
        "STEP:RATE,...: the links' rate from each step on; default %(default)s",
        STUDY,
    )
    straggler: str = flag(
        SCENARIOS[DEFAULT]["straggler"],
        "the imbalance (research/imbalance.py), a window of steps; default %(default)s",
        STUDY,
    )
    density: float = flag(0.05, "top-k density (fixed arm and adaptive)", STUDY)
    staleness: int = flag(8, "partial collectives' synchronous round every", STUDY)
    adaptive_options: dict[str, Any] = flag(
        None, "an option of adaptive, repeatable", STUDY, factory=dict,
        name="--adaptive-opt",
    )  # fmt: skip
    target_acc: float = flag(
        SCENARIOS[DEFAULT]["target_acc"], "test accuracy to reach", STUDY
    )
    cluster: str = flag("ad", "name of the local cluster made here", STUDY)
    no_link: bool = flag(
        False,
        "no schedule: the link as it is (without --hosts: ranks on this "
        "machine, shared memory)",
        STUDY,
    )
    report_only: bool = flag(
        False,
        "run nothing: the table and figure again from the run folders under "
        "--run-dir (for --nps, --seeds and --arms; jobs run apart, one seed each)",
        STUDY,
    )
    job: int = flag(0, argparse.SUPPRESS, STUDY)  # this MPI job's rank count
    plots: bool = flag(True, "skip the figure", OUTPUT, name="--no-plots")

    def problem(self) -> str | None:
        """The first problem with the values as one line, or None."""
        from research.imbalance import parse_imbalance
        from research.studies.adaptive_link import parse_schedule

        try:
            parse_schedule(self.link_schedule)
            parse_imbalance(self.straggler, size=max(self.nps or [1]))
        except ValueError as e:
            return str(e)
        if not self.nps or min(self.nps) < 2:
            return "--nps: rank counts of at least 2"
        if not 0 < self.density <= 1:
            return "--density must lie in (0, 1]"
        # As the arm runs: the density and the staleness bound put in.
        from research.strategies import registry
        from research.studies.adaptive import arm_strategy

        return registry.problem("adaptive", arm_strategy(self, "adaptive")[1])


def get_config(
    model: str | None = None, paper_scale: bool = False, scenario: str | None = None
) -> Config:
    """The demonstration's defaults (P1B2 with 4096 features) on ``scenario``."""
    name = scenario or DEFAULT
    sc = SCENARIOS[name]
    cfg = override(
        Config(), scenario=name, steps=sc["steps"], target_acc=sc["target_acc"],
        link_schedule=sc["link_schedule"], straggler=sc["straggler"],
    )  # fmt: skip
    if model:
        cfg = override(cfg, **{"model.name": model})
    return cfg


def _select(given: dict[str, Any]) -> dict[str, Any]:
    return {"model": given.get("train.model.name"), "scenario": given.get("scenario")}


def parse(argv: list[str]) -> Config:
    # Each arm sets its strategy, seed and link; the jobs their ranks.
    hide = (CKPT, "strategy", "seed", "np")
    return parse_config(
        argv, get_config, prog=PROG, doc=__doc__, hide=hide, select=_select
    )


def _driver(cfg: Config, argv: list[str]) -> Path:
    """Outside MPI: the nodes, one job per rank count, the link, the report."""
    from research import localnet
    from research.entry.launch import relaunch
    from research.rundir import default_run_dir
    from research.studies.adaptive_link import LinkController

    root = Path(cfg.train.run_dir or default_run_dir("adaptive")).absolute()
    root.mkdir(parents=True, exist_ok=True)
    made = None
    if not cfg.launch.hosts and not cfg.no_link:
        first = cfg.link_schedule.split(",")[0].split(":")[1]
        try:
            made = localnet.up(max(cfg.nps), rate=first, name=cfg.cluster)
        except localnet.LocalnetError as e:
            raise UsageError(f"{e} (or name nodes of a cluster with --hosts)") from None
        os.environ[localnet.DIR_ENV] = str(made.dir)
    hosts = cfg.launch.hosts or (",".join(made.hosts()) if made else "")
    try:
        cluster = localnet.find_cluster(hosts.split(",")) if hosts else None
        if cluster is None and not cfg.no_link:
            raise UsageError(
                f"--hosts {hosts}: not nodes of a local cluster, whose links this "
                "command could shape (--no-link runs without a schedule)"
            )

        def set_rate(rate: str) -> None:
            for host in cluster.hosts():
                cluster.set_rate(host, rate)

        rest = without(argv, "--run-dir") + ["--run-dir", str(root)]
        for n in cfg.nps:
            with LinkController(root / "link", set_rate if cluster else None) as ctl:
                code = relaunch(
                    "experiments.adaptive", [*rest, "--job", str(n)], n,
                    cfg.train.threads, hosts,
                )  # fmt: skip
            if ctl.error is not None:
                raise UsageError(f"changing the link failed: {ctl.error}")
            if code != 0:
                raise SystemExit(code)
            log = root / f"link-np{n}.json"  # appended: seeds may run apart
            done = json.loads(log.read_text()) if log.exists() else []
            log.write_text(json.dumps(done + ctl.log, indent=1))
    finally:
        if made is not None:
            localnet.down(cfg.cluster)
    return root


def report(cfg: Config, root: Path) -> dict[str, Any]:
    """``table.md``, ``results.json`` and the figure from the run folders."""
    from research.rundir import write_json
    from research.studies.adaptive import analyze
    from research.studies.adaptive_page import render
    from research.studies.adaptive_report import checks

    data = analyze(root, cfg)
    data["checks"] = checks(data)
    write_json(root / "results.json", data)
    text = "\n".join(render(root)) + "\n"  # the page's part, from results.json
    (root / "table.md").write_text(text)
    if cfg.plots:
        from research.studies.adaptive_plots import plot

        plot(root, data, {P: P * cfg.train.batch_size for P in data["np"]})
    print(text, flush=True)
    return data


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse(argv)  # bad flags end here, before paying for MPI start-up
    from research.comm.process.env import launched_by_mpi

    if cfg.report_only:
        root = Path(cfg.train.run_dir or "")
        if not cfg.train.run_dir or not root.is_dir():
            fail_usage(PROG, "--report-only reads an existing run: give its --run-dir")
        return report(cfg, root.absolute())
    if not launched_by_mpi():
        try:
            root = _driver(cfg, argv)
        except UsageError as e:
            fail_usage(PROG, str(e))
        return report(cfg, root)
    from research.studies.adaptive import run_job
    from research.studies.presets import start_job

    world, root = start_job(cfg.train.threads, cfg.train.run_dir, "adaptive")
    try:
        run_job(cfg, root, world)
    except UsageError as e:
        fail_usage(PROG, str(e))
    if not cfg.job and world.rank == 0:  # the user's own mpiexec: report here
        return report(cfg, root)
    return None


if __name__ == "__main__":
    main()
