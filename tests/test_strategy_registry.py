"""A strategy is registered by its options class, by name; what is wrong with a
registration or a lookup is refused by name before any step (no executor to
find: the strategy is one object)."""

from __future__ import annotations

import dataclasses

import pytest

from research.strategies import registry
from research.strategies.base import StrategyOptions


def test_a_taken_name_and_an_unknown_one_are_refused_by_name():
    with pytest.raises(ValueError, match="'host' is already registered"):

        @registry.register("host")
        @dataclasses.dataclass(frozen=True)
        class _Other(StrategyOptions):
            pass

    assert registry.options_class("host").__qualname__ == "HostOptions"
    with pytest.raises(ValueError) as e:
        registry.options_class("hots")
    assert "unknown strategy 'hots'; choose one of" in str(e.value)
    assert "host" in str(e.value) and "majority" in str(e.value)


def test_options_that_make_no_strategy_say_so_when_made():
    @registry.register("half")
    @dataclasses.dataclass(frozen=True)
    class _Half(StrategyOptions):
        """Registered, but its module never wrote ``create``."""

    try:
        assert "half" in registry.names()
        with pytest.raises(NotImplementedError):
            registry.create("half", world=None)
    finally:
        registry.forget("half")
    assert "half" not in registry.names()
