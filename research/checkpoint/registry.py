"""Checkpoint savers by name, each with its typed options, registered as strategies are.

A saver lives in one module: its class, its options (a frozen dataclass of
:class:`SaverOptions`, with ranges: ``research.options``) and its
registration::

    @dataclass(frozen=True)
    class Rank0BlockingOptions(SaverOptions):
        keep: int = option(3, Range(ge=1))

    @register_saver("rank0-blocking", Rank0BlockingOptions)
    class Rank0Blocking(Checkpointer): ...

``CheckpointConfig(saver=NAME).create(world, run_dir)`` builds it, ``--checkpoint
NAME --checkpoint-opt KEY=VALUE`` is checked before launch and ``--list`` shows
it with its options, from the dataclass; the DeepFreeze study measures it and
``tests/test_saver_contract.py`` runs it through save, restore, a crash in the
middle of a save and a resume at another world size. The built-in savers are
imported by ``research.checkpoint.savers`` (the lookups); a saver of your own is
known once its module is imported. The saver modules import no MPI until a
saver is made, so flags are checked before MPI starts.

"none" is not a saver: it means no checkpoints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from research.options import Options, Range, option

__all__ = ["NONE", "Range", "SaverOptions", "option", "register_saver"]

#: The name that means "no checkpoints".
NONE = "none"
_SAVERS: dict[str, type[SaverOptions]] = {}

F = TypeVar("F", bound=type)


@dataclasses.dataclass(frozen=True)
class SaverOptions(Options):
    """A saver's options; :meth:`create` builds the saver."""

    kind: ClassVar[str] = "checkpoint saver"
    #: The saver class these options build (set by :func:`register_saver`).
    saver: ClassVar[type]
    #: Whether the saver may run beside JAX's distributed runtime (Orbax's,
    #: inside the rank's process, cannot: ``research.comm.dense.xla``).
    beside_xla_runtime: ClassVar[bool] = True

    def create(self, world: Any, directory: Any, **kw: Any) -> Any:
        """The saver (collective); ``kw``: constructor arguments that are no
        options (``fault_hook``)."""
        return type(self).saver(world, directory, **dataclasses.asdict(self), **kw)


def register_saver(name: str, options: type[SaverOptions]) -> Callable[[F], F]:
    """Class decorator: the class is saver ``name``, built from ``options``.

    Registering the same class again (a reloaded module) is allowed; another
    class under a taken name is an error.
    """
    if name == NONE:
        raise ValueError(f"{NONE!r} means no checkpoints; choose another name")

    def deco(cls: F) -> F:
        old = _SAVERS.get(name)
        if old is not None and old.saver.__qualname__ != cls.__qualname__:
            raise ValueError(f"checkpoint saver {name!r} is already registered")
        options.name, options.saver = name, cls
        cls.name = name  # type: ignore[attr-defined]
        _SAVERS[name] = options
        return cls

    return deco


def forget_saver(name: str) -> None:
    """Take ``name`` out again (a test's own saver)."""
    _SAVERS.pop(name, None)


def registered() -> dict[str, type[SaverOptions]]:
    """The savers registered so far, by name (``research.checkpoint.savers``
    imports the built-in ones first)."""
    return dict(_SAVERS)
