"""Declared options carry their ranges, and values outside them are refused
before launch: one line, exit 2. The bad values are generated from the
declarations, so a new option is covered the day it is declared."""

from __future__ import annotations

import math

import pytest

from research.options import Option, Range

#: String options that are not a fixed set: how each is checked before launch.
FREE_STRINGS = {
    "link": "a link spec, parsed by research.comm.link.Link.parse (--link)",
    "fast_dir": "a folder, examined by research.privdir before use",
    "rank_local": "name prefixes of leaves (a tuple of str)",
    "candidates": "adaptive's methods, parsed before launch (options_check)",
    "densities": "adaptive's top-k densities, parsed before launch (options_check)",
    "plan": "adaptive's METHOD@STEP list, parsed before launch (options_check)",
}


def _strategies():
    import research.train  # noqa: F401  (its strategies: layerwise)
    from research.comm import declared

    return declared.strategies()


def _savers():
    from research.checkpoint.registry import declared_saver, list_savers

    return {n: declared_saver(n) for n in list_savers()}


def _all():
    out = [("strategy", n, d) for n, d in _strategies().items()]
    return out + [("checkpoint saver", n, d) for n, d in _savers().items()]


def _outside(option: Option) -> list:
    if option.range is None:
        return []
    integer = int in option.types and float not in option.types
    return option.range.outside(integer)


def test_every_declared_option_carries_its_range():
    found = _all()
    assert {n for _, n, _ in found} >= {"solo", "fused", "deepfreeze"}
    for kind, name, decl in found:
        for key, o in decl.options.items():
            where = f"{kind} {name!r} option {key}"
            numeric = {int, float} & set(o.types) and bool not in o.types
            if o.choices is not None or o.types == (bool,):
                continue
            if numeric and key not in FREE_STRINGS:
                assert o.range is not None, f"{where}: no option_ranges entry"
            else:
                assert key in FREE_STRINGS, f"{where}: a str without Literal values"


def test_out_of_range_values_are_refused_by_the_checks():
    from research.checkpoint.registry import check_saver_options
    from research.comm.registry import check_options

    tried = 0
    for kind, name, decl in _all():
        check = check_options if kind == "strategy" else check_saver_options
        for key, o in decl.options.items():
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
            if o.default is not ...:
                assert check(name, {key: o.default}) is None, (name, key)
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
        for key, o in decl.options.items():
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
    low, high = r.outside(integer=False)
    assert low == 0 and high == math.nextafter(1, 2)
    assert Range(ge=1, le=2**30).outside(integer=True) == [0, 2**30 + 1]
    assert str(Range(ge=1, le=2**40)) == ">= 1 and <= 2**40"
    assert Option((int,), range=Range(ge=0)).problem("k", True) == (
        "option k=True must be int"
    )


def test_free_text_options_are_parsed_before_launch():
    from research.comm.registry import check_options

    assert check_options("adaptive", {"candidates": "host,solo"}) is None
    assert "unknown" in check_options("adaptive", {"candidates": "host,lossy"})
    assert "(0, 1]" in check_options("adaptive", {"densities": "2"})
    assert "METHOD@STEP" in check_options("adaptive", {"plan": "solo"})
