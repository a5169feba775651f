"""Typed options carry their ranges, and values outside them are refused
before launch: one line, exit 2. The bad values are generated from the
options dataclasses, so a new option is covered the day it is declared."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from typing import Literal

import pytest

from research.options import Option, Options, Range, option
from tests.harness import ROOT, run_env

#: String options that are not a fixed set: how each is checked before launch.
FREE_STRINGS = {
    "link": "a link spec, parsed by research.comm.link.Link.parse (--link)",
    "fast_dir": "a folder, examined by research.privdir before use",
    "rank_local": "name prefixes of leaves (a tuple of str)",
    "candidates": "adaptive's methods, parsed before launch (its problem())",
    "densities": "adaptive's top-k densities, parsed before launch (its problem())",
    "plan": "adaptive's METHOD@STEP list, parsed before launch (its problem())",
}


def _all():
    from research.checkpoint import savers
    from research.strategies import registry

    out = [("strategy", n, registry.options_class(n)) for n in registry.names()]
    return out + [
        ("checkpoint saver", n, savers.options_class(n)) for n in savers.list_savers()
    ]


def _outside(o: Option) -> list:
    """Values just outside each bound of ``o``'s range."""
    r = o.range
    if r is None:
        return []
    integer = int in o.types and float not in o.types
    out = []
    if r.ge is not None:
        out.append(r.ge - 1 if integer else math.nextafter(r.ge, -math.inf))
    if r.gt is not None:
        out.append(math.floor(r.gt) if integer else r.gt)
    if r.le is not None:
        out.append(r.le + 1 if integer else math.nextafter(r.le, math.inf))
    if r.lt is not None:
        out.append(math.ceil(r.lt) if integer else r.lt)
    return out


def test_every_declared_option_carries_its_range():
    found = _all()
    assert {n for _, n, _ in found} >= {"solo", "fused", "adaptive", "deepfreeze"}
    for kind, name, decl in found:
        for key, o in decl.spec().items():
            where = f"{kind} {name!r} option {key}"
            numeric = {int, float} & set(o.types) and bool not in o.types
            if o.choices is not None or o.types == (bool,):
                continue
            if numeric and key not in FREE_STRINGS:
                assert o.range is not None, f"{where}: no option_ranges entry"
            else:
                assert key in FREE_STRINGS, f"{where}: a str without Literal values"


def test_out_of_range_values_are_refused_by_the_checks():
    from research.checkpoint.savers import check_saver_options
    from research.strategies.registry import problem as check_options

    tried = 0
    for kind, name, decl in _all():
        check = check_options if kind == "strategy" else check_saver_options
        for key, o in decl.spec().items():
            for bad in _outside(o):
                problem = check(name, {key: bad})
                assert problem and key in problem and str(o.range) in problem, (
                    name,
                    key,
                    bad,
                    problem,
                )
                tried += 1
            if o.choices is not None:
                ints = [c for c in o.choices if type(c) is int]
                bad = max(ints) + 1 if ints else "no-such-value"
                assert "must be one of" in check(name, {key: bad}), (name, key)
            assert check(name, {key: o.default}) is None, (name, key)
            with pytest.raises(ValueError, match=f"option {key}="):  # in code too
                decl(**{key: _outside(o)[0] if o.range else object()})
    assert tried >= 20


def _parse_fails(capsys, argv: list[str]) -> str:
    from experiments.train import parse

    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert len(lines) == 1, lines
    return lines[0]


def test_the_command_line_refuses_them_in_one_line_exit_2(capsys):
    """Every out-of-range value of every strategy and saver option, through
    ``experiments.train``'s parser: one ``error:`` line, exit 2, and the
    parser runs before any launch."""
    n = 0
    for kind, name, decl in _all():
        for key, o in decl.spec().items():
            for bad in _outside(o)[:1]:
                if kind == "strategy":
                    argv = ["--strategy", name, "--strategy-opt", f"{key}={bad!r}"]
                else:
                    argv = ["--checkpoint", name, "--checkpoint-opt", f"{key}={bad!r}"]
                line = _parse_fails(capsys, argv)
                assert f"{key}=" in line and "must be" in line, line
                n += 1
    assert n >= 15


@pytest.mark.parametrize("np_", ["0", "-2"])
def test_np_below_one_is_an_error(capsys, np_):
    line = _parse_fails(capsys, ["--np", np_])
    assert f"--np must be >= 1 (1: this process alone), got {np_}" in line


def test_unknown_saver_and_option_name_the_valid_ones(capsys):
    line = _parse_fails(capsys, ["--checkpoint", "nope"])
    assert "unknown checkpoint saver 'nope'; valid: none, deepfreeze" in line
    line = _parse_fails(
        capsys, ["--checkpoint", "rank0-blocking", "--checkpoint-opt", "kep=2"]
    )
    assert "has no option 'kep'; its options: compress, fsync, keep" in line
    line = _parse_fails(capsys, ["--checkpoint-opt", "keep=2"])
    assert "--checkpoint-opt needs a saver" in line


def test_range_arithmetic():
    r = Range(gt=0, le=1)
    assert r.contains(1) and r.contains(1e-9) and not r.contains(0)
    assert str(r) == "> 0 and <= 1"
    low, high = _outside(Option((float, int), range=r))
    assert low == 0 and high == math.nextafter(1, 2)
    assert _outside(Option((int,), range=Range(ge=1, le=2**30))) == [0, 2**30 + 1]
    assert str(Range(ge=1, le=2**40)) == ">= 1 and <= 2**40"
    assert Option((int,), range=Range(ge=0)).problem("k", True) == (
        "option k=True must be int"
    )


def test_options_are_read_from_the_annotations():
    """What a field's annotation says is what is accepted and listed."""

    @dataclasses.dataclass(frozen=True)
    class Made(Options):
        name = "made"
        every: int | None = option(32, Range(ge=1))
        rate: float = option(0.5, Range(gt=0, le=1))
        how: Literal["a", "b"] = "a"
        tags: tuple[str, ...] = ("x",)

    assert Made.describe() == [
        "every  int|None >= 1 (default 32)",
        "rate   float > 0 and <= 1 (default 0.5)",
        "how    'a'|'b' (default 'a')",
        "tags   tuple[str] (default ('x',))",
    ]
    assert Made.make({"every": None, "rate": 1, "tags": ["y"]}) == Made(
        every=None, rate=1, tags=("y",)
    )
    assert (
        Made.problem({"how": "c"}) == "strategy option how='c' must be one of 'a', 'b'"
    )
    assert (
        Made.problem({"tags": ["y", 2]})
        == "strategy option tags=['y', 2] must hold strs"
    )
    assert "has no option 'evry'; its options: every, how, rate, tags" in Made.problem(
        {"evry": 1}
    )


def test_free_text_options_are_parsed_before_launch():
    from research.strategies.registry import problem as check_options

    assert check_options("adaptive", {"candidates": "host,solo"}) is None
    assert "unknown" in check_options("adaptive", {"candidates": "host,lossy"})
    assert "(0, 1]" in check_options("adaptive", {"densities": "2"})
    assert "METHOD@STEP" in check_options("adaptive", {"plan": "solo"})


def test_listing_and_checking_start_no_mpi():
    """``--list`` and the options' checks import every strategy and saver
    module, and none imports MPI: a process that relaunches itself under
    mpiexec must not start MPI (nor, checking flags, any process)."""
    code = (
        "import sys\n"
        "from experiments.train import main, parse\n"
        "parse(['--strategy', 'adaptive', '--strategy-opt', 'staleness=4',\n"
        "       '--checkpoint', 'deepfreeze', '--checkpoint-opt', 'keep=2'])\n"
        "try:\n    main(['--list'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "assert 'mpi4py.MPI' not in sys.modules, 'MPI was imported'\n"
        "print('no MPI')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=run_env(),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.rstrip().endswith("no MPI"), proc.stdout[-2000:]
    for name in ("adaptive", "staleness", "deepfreeze", "keep_fast"):
        assert name in proc.stdout, name
