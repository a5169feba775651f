"""End to end: ``python -m experiments.train`` as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT, python, run_env
from tests.tiny import tiny_train


@pytest.mark.launches
def test_smoke_two_ranks_relaunch(tmp_path):
    run_dir = tmp_path / "run"
    args = ["--data-opt", "n_test=128", "--steps", "8", "--eval-every", "4"]
    args += ["--trace", "--run-dir", str(run_dir)]
    proc = python(tiny_train(*args), timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name in (
        "config.json",
        "metrics.jsonl",
        "summary.json",
        "trace.json",
        "curves.png",
    ):
        assert (run_dir / name).exists(), name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 8
    config = json.loads((run_dir / "config.json").read_text())
    assert config["world_size"] == 2 and "jax" in config["versions"]
    assert proc.stdout.count("done:") == 1  # only rank 0 reports


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--model", "nope"], "unknown model 'nope'"),
        (["--dataset", "nope"], "unknown dataset 'nope'"),
        (["--batch-size", "0"], "--batch-size must be positive"),
        (["--batch-size", "-3"], "--batch-size must be positive"),
        (["--data-dir", "/no/such/folder"], "is not a folder"),
        (["--strategy", "nope"], "unknown strategy 'nope'"),
        (
            ["--strategy", "solo", "--strategy-opt", "sync_evry=4"],
            "strategy 'solo' has no option 'sync_evry'",
        ),
        (
            ["--strategy", "host", "--strategy-opt", "bucket_bytes=big"],
            "bucket_bytes='big' must be int",
        ),
        (["--threads", "-1"], "--threads must be >= 0"),
        (["--comm-timeout", "soon"], "--comm-timeout must be seconds, 'auto' or 'off'"),
        (["--comm-timeout", "-3"], "--comm-timeout must be >= 0 seconds"),
        (  # out of its range: before any rank starts
            ["--strategy", "solo", "--strategy-opt", "full_every=-3"],
            "full_every=-3 must be >= 1",
        ),
        (  # full_every's spelling before the rename (never released): refused
            ["--strategy", "solo", "--strategy-opt", "sync_every=4"],
            "strategy 'solo' has no option 'sync_every'; its options: full_every",
        ),
        (["--np", "0"], "--np must be >= 1"),
        (["--link", "10gbs"], "bad link spec '10gbs'"),
        (["--strategy", "fused", "--link", "10gbps"], "cannot run on an emulated"),
        (["--bogus-flag"], "unrecognized arguments"),
    ],
)
def test_bad_input_one_line_exit_2(args, needle, capsys):
    """Checked by the parser every process runs first (in this process here:
    a python start per case cost 2 s; the real entry point follows)."""
    from experiments.train import parse

    with pytest.raises(SystemExit) as exc:
        parse(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--strategy", "solo", "--strategy-opt", "full_every=-3"], "full_every=-3"),
        (["--np", "0"], "--np must be >= 1"),
    ],
)
def test_bad_input_as_a_user_types_it(args, needle):
    """``python -m experiments.train`` itself: one line, exit 2, no rank."""
    proc = python(["-m", "experiments.train", *args], timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and "mpiexec" not in proc.stderr


@pytest.mark.launches
def test_bad_input_under_mpiexec_printed_once():
    from tests.harness import mpiexec

    proc = subprocess.run(
        [mpiexec(), "-n", "2", sys.executable, "-m", "experiments.train"]
        + ["--model", "nope"],
        cwd=ROOT,
        env=run_env(),
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("unknown model 'nope'") == 1, proc.stderr


@pytest.mark.launches
def test_missing_data_files_named(tmp_path):
    args = ["--np", "2", "--dataset", "cifar10", "--data-dir", str(tmp_path)]
    proc = python(["-m", "experiments.train", *args], timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and "cifar-10-batches-py" in errors[0], proc.stderr[-3000:]


def test_flag_checks_before_relaunch_do_not_start_mpi_or_jax():
    # Importing mpi4py.MPI initializes MPI; the parent that relaunches itself
    # under mpiexec must check --strategy, --model (and --list) without it, and
    # without JAX and Flax: importing them was most of the launcher's start
    # (about 0.7 of 1 CPU-s), spent before any rank started.
    code = (
        "import sys\n"
        "from research.entry.cli import listing, validate\n"
        "from research.train.config import ModelConfig, StrategyConfig, TrainConfig\n"
        "assert validate(TrainConfig(strategy=StrategyConfig('majority'))) is None\n"
        "assert validate(TrainConfig(model=ModelConfig('resnet50'))) is None\n"
        "bad = TrainConfig(strategy=StrategyConfig('nope'))\n"
        "assert 'unknown strategy' in validate(bad)\n"
        "assert 'unknown model' in validate(TrainConfig(model=ModelConfig('nope')))\n"
        "assert 'solo' in listing() and 'resnet50' in listing()\n"
        "heavy = ('mpi4py', 'mpi4jax', 'jax', 'flax', 'optax', 'orbax')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    proc = python(["-c", code], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_every_strategy_is_one_module_that_registers_it():
    """A strategy is one module of research/strategies (adaptive: a package)
    that registers its options; the package imports each by name, and nothing
    reads source code to find them."""
    import research.strategies as package
    from research.strategies import registry

    shared = {"base", "registry", "staged"}  # what every strategy builds on
    root = Path(package.__file__).parent
    modules = {p.stem for p in root.glob("*.py") if p.stem != "__init__"} - shared
    modules |= {p.parent.name for p in root.glob("*/__init__.py")}
    found = {}
    for name in registry.names():
        module = registry.options_class(name).__module__
        assert module.startswith("research.strategies."), (name, module)
        found.setdefault(module.split(".")[2], []).append(name)
    assert set(found) == modules, (sorted(found), sorted(modules))
    assert found["partial"] == ["majority", "solo", "sync"]


def test_every_strategy_takes_its_own_defaults_from_the_command_line():
    """Each option's default, given as ``--strategy-opt KEY=VALUE``, parses
    and builds the options dataclass (what the ranks make the strategy from)."""
    from experiments.train import parse
    from research.strategies import registry

    for name in registry.names():
        cls = registry.options_class(name)
        flags = []
        for key, o in cls.spec().items():
            if not isinstance(o.default, tuple):
                flags += ["--strategy-opt", f"{key}={o.default!r}"]
        cfg = parse(["--strategy", name, *flags]).train
        assert cfg.strategy.typed() == cls(), name


def test_a_strategy_is_declared_in_its_own_module_only(tmp_path):
    """Adding a strategy touches its module and the package's one import line:
    the library's core (the registry, the loop and what it asks a strategy,
    the CLI, the public API, the collectives' runtime start, the GPU and
    watchdog scripts) names none of them."""
    import re

    from research.strategies import registry

    root = Path(__file__).resolve().parent.parent
    core = [
        root / "research" / "strategies" / "registry.py",
        root / "research" / "strategies" / "base.py",
        root / "research" / "train" / "loop.py",
        root / "research" / "train" / "setup.py",
        root / "research" / "train" / "preemption.py",
        root / "research" / "train" / "checkpointing.py",
        root / "research" / "train" / "report.py",
        root / "research" / "entry" / "cli.py",
        root / "research" / "comm" / "dense" / "xla.py",
        root / "research" / "api.py",
        root / "scripts" / "gpu_report.py",
        root / "scripts" / "bench_watchdog.py",
    ]
    for path in core:
        text = path.read_text()
        code = re.sub(r'""".*?"""', "", text, flags=re.S)  # docstrings may
        code = re.sub(r"#.*", "", code)
        for name in registry.names():
            assert f'"{name}"' not in code, (path.name, name)


def test_flags_come_from_the_config_fields():
    import dataclasses

    from experiments.train import parse
    from research.train.config import TrainConfig

    cfg = parse([]).train
    want = TrainConfig(epochs=3, eval_every=100)
    for f in dataclasses.fields(TrainConfig):
        if f.name != "run_dir":
            assert getattr(cfg, f.name) == getattr(want, f.name), f.name
    argv = ["--momentum", "0.5", "--no-resume", "--model-opt", "width=8", "--trace"]
    cfg = parse(argv).train
    assert (
        cfg.momentum,
        cfg.checkpoint.resume,
        cfg.model.options,
        cfg.records.trace,
    ) == (
        0.5,
        False,
        {"width": 8},
        True,
    )


def test_options_parse_literals_and_lowercase_booleans():
    from research.entry.cli import parse_options

    got = parse_options(
        ["a=16", "b=None", "c=True", "d=false", "e=TRUE", "f=cifar", "g=1e-3"], "--x"
    )
    assert got == {
        "a": 16,
        "b": None,
        "c": True,
        "d": False,
        "e": True,
        "f": "cifar",
        "g": 1e-3,
    }
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_options(["novalue"], "--x")


def test_allreduce_takes_a_path_or_auto_and_native_is_gone():
    from research.strategies.registry import problem as check_options

    for name in ("fused", "host"):
        for ok in ("auto", "ring", "mpi", "hierarchical"):
            assert check_options(name, {"allreduce": ok}) is None
        # The spelling before allreduce= (never released): refused, naming it.
        problem = check_options(name, {"native": True})
        assert "has no option 'native'" in problem and "allreduce" in problem
    problem = check_options("fused", {"allreduce": "fast"})
    assert "allreduce='fast'" in problem and "'hierarchical'" in problem
