"""Typed experiment configs: flags from one dataclass, presets as functions.

Each ``experiments/<name>.py`` declares ``Config`` (a dataclass whose fields
carry their flags), ``get_config(...)`` (a preset's defaults) and ``parse``
(``research.entry.cli.parse_config``). No MPI here: parsing happens before launch.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from research.entry.cli import override

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = (
    "train", "eager_sgd", "deepfreeze", "sparcml", "overlap", "scalability",
    "adaptive",
)  # fmt: skip


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_flag_is_a_field_and_the_defaults_are_get_config(name):
    mod = importlib.import_module(f"experiments.{name}")
    cfg = mod.parse([])
    assert dataclasses.is_dataclass(cfg) and isinstance(cfg, mod.Config)
    assert cfg == mod.get_config()


def test_explicit_flags_win_over_presets():
    from experiments.eager_sgd import parse

    paper = parse(["--paper-scale"])
    assert (paper.train.model.name, paper.train.lr, paper.launch.np) == (
        "resnet50",
        0.1,
        64,
    )
    assert paper.train.model.options == {"stem": "imagenet", "image_size": 224}
    mine = parse(["--paper-scale", "--lr", "0.3", "--np", "8", "--model", "vgg16"])
    assert (mine.train.model.name, mine.train.lr, mine.launch.np) == ("vgg16", 0.3, 8)
    # A --model that names a preset: its model, task and options, under the
    # user's own --model-opt.
    candle = parse(["--model", "candle", "--model-opt", "features=64"])
    assert candle.train.model.name == "candle_p1b2"
    assert candle.train.data.name == "synthetic_tabular"
    assert candle.train.model.options == {"features": 64}
    assert candle.train.data.options == {"features": 512}


def test_a_preset_chosen_by_a_flag_keeps_the_flag_names():
    """The sweep preset turns ``sweep`` on; the flag stays ``--sweep`` (named by
    the class's default), and the flags implying it choose the preset too."""
    from experiments.eager_sgd import parse

    cfg = parse(["--sweep-ranks", "2", "3"])
    assert cfg.sweep and cfg.sweep_ranks == [2, 3]
    assert cfg.train.model.name == "candle_p1b2" and cfg.train.steps == 16
    assert parse(["--sweep"]).sweep_model_size == [256, 2048, 8192]
    digits = parse(["--dataset", "digits"])
    assert (digits.train.lr, digits.target_acc) == (0.2, 0.95)
    assert digits.train.model.options["image_size"] == 8


def test_bad_values_are_one_line_and_exit_2(capsys):
    from experiments.sparcml import parse

    with pytest.raises(SystemExit) as e:
        parse(["--densities", "2"])
    assert e.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == [
        "python -m experiments.sparcml: error: --densities must lie in (0, 1]"
    ]


def test_override_sets_fields_where_they_live():
    from experiments.deepfreeze import Config

    cfg = override(Config(), lr=0.5, rounds=2)
    assert (cfg.train.lr, cfg.rounds) == (0.5, 2)
    with pytest.raises(TypeError, match="no field 'nope'"):
        override(Config(), nope=1)


def test_studies_take_configs_and_raise_instead_of_exiting():
    """The study code never parses flags nor ends the process."""
    for path in sorted((ROOT / "research" / "studies").glob("*.py")):
        text = path.read_text()
        for word in ("argparse", "SystemExit", "fail_usage", "sys.exit"):
            assert word not in text, (path.name, word)


def _one_error_line(capsys, parse, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert len(lines) == 1, lines
    return lines[0]


def test_old_flag_spellings_are_refused_in_one_line(capsys):
    """The spellings before the renames (never released) are unknown flags and
    names now: one line, exit 2, before any rank."""
    from experiments.deepfreeze import parse as deepfreeze
    from experiments.eager_sgd import parse as eager

    assert eager(["--allreduce-strategy", "host"]).allreduce_strategy == "host"
    line = _one_error_line(capsys, eager, ["--sync-strategy", "host"])
    assert "unrecognized arguments: --sync-strategy" in line
    line = _one_error_line(capsys, deepfreeze, ["--strategies", "rank0-blocking"])
    assert "unrecognized arguments: --strategies" in line
    line = _one_error_line(capsys, deepfreeze, ["--savers", "rank0-sync"])
    assert "unknown checkpoint saver 'rank0-sync'" in line


def test_sync_names_only_the_strategy_and_full_every_the_rounds(capsys):
    """``sync_every`` became ``full_every``: the option and the flag of that
    name; the old ones (never released) are refused in one line."""
    from experiments.eager_sgd import parse as eager
    from experiments.train import parse as train
    from research.strategies.registry import problem

    assert eager(["--full-every", "6"]).full_every == 6
    cfg = train(["--strategy", "solo", "--strategy-opt", "full_every=4"]).train
    assert cfg.strategy.options == {"full_every": 4}
    line = _one_error_line(capsys, eager, ["--sync-every", "6"])
    assert "unrecognized arguments: --sync-every" in line
    argv = ["--strategy", "solo", "--strategy-opt", "sync_every=4"]
    assert "has no option 'sync_every'" in _one_error_line(capsys, train, argv)
    assert problem("majority", {"full_every": 0}) == (
        "strategy option full_every=0 must be >= 1"
    )


def test_the_strategy_flags_make_one_typed_strategy_config(capsys):
    """``--strategy``, ``--strategy-opt`` and ``--link`` land on
    ``train.strategy``; ``typed()`` is the strategy's own options dataclass,
    ``to()`` another strategy on the same link, a bad value one line; an
    experiment that hides ``strategy`` hides all three flags."""
    from experiments.adaptive import parse as adaptive
    from experiments.train import parse as train
    from research.strategies.host import HostOptions
    from research.train.config import StrategyConfig

    argv = ["--strategy", "host", "--strategy-opt", "allreduce=ring"]
    cfg = train([*argv, "--link", "10gbps"]).train
    assert cfg.strategy == StrategyConfig("host", {"allreduce": "ring"}, "10gbps")
    assert cfg.strategy.typed() == HostOptions(allreduce="ring", link="10gbps")
    arm = cfg.strategy.to("sparse", {"density": 0.1})
    assert (arm.name, arm.options, arm.link) == ("sparse", {"density": 0.1}, "10gbps")
    assert cfg.strategy.options == {"allreduce": "ring"}  # not shared with the arm
    assert "unknown strategy 'nope'" in StrategyConfig("nope").problem()
    bad = StrategyConfig("host", {"bucket_bytes": "big"}).problem()
    assert bad.startswith("--strategy-opt: ")
    assert StrategyConfig("fused", link="10gbps").problem().startswith("--link: ")
    with pytest.raises(ValueError, match="bucket_bytes"):
        StrategyConfig("host", {"bucket_bytes": "big"}).typed()
    with pytest.raises(SystemExit):
        adaptive(["--help"])
    shown = capsys.readouterr().out
    assert "--link-schedule" in shown  # adaptive's own
    for flag in ("--strategy", "--strategy-opt", "--link"):
        assert not re.search(rf"^\s+{flag}(?![\w-])", shown, re.M), flag
