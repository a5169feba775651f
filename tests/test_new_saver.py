"""A new checkpoint saver is one module and one test: this file is the test.

The module is written here into a temporary folder, outside the project: a
saver registered with ``@register_saver``, its option a field of its options
dataclass with its range beside it. Importing the module makes its name
known; nothing in the project names it, yet the option check (before
launch), ``--list``, ``CheckpointConfig`` and the saver contract of
``tests/test_saver_contract.py`` (save, restore, a crash in the middle of a
save, a resume at another world size) all take it. It is ``rank0-blocking`` on
a slow disk: each save lasts at least as long as its bytes take at
``mb_per_s`` (the emulated link's idea, for a parallel file system).
"""

from __future__ import annotations

import sys
import time

import pytest

from tests.saver_contract import run_contract

NAME = "slowdisk_saver"
MODULE = '''
import dataclasses
import time

from research.checkpoint.baselines import Rank0Blocking, Rank0BlockingOptions
from research.checkpoint.registry import Range, option, register_saver


@dataclasses.dataclass(frozen=True)
class SlowDiskOptions(Rank0BlockingOptions):
    mb_per_s: float = option(100.0, Range(gt=0, le=1e6))


@register_saver("rank0-slowdisk", SlowDiskOptions)
class SlowDiskRank0(Rank0Blocking):
    """``rank0-blocking`` whose writes take at least bytes / ``mb_per_s``."""

    def __init__(self, world, directory, *, mb_per_s: float = 100.0, **kw):
        super().__init__(world, directory, **kw)
        self.mb_per_s = float(mb_per_s)

    def save(self, step, state, extra=None):
        t0 = time.perf_counter()
        rec = super().save(step, state, extra)
        if rec.bytes_written:
            time.sleep(max(0.0, rec.bytes_written / (self.mb_per_s * 1e6)
                                - (time.perf_counter() - t0)))
            rec.blocking_s = time.perf_counter() - t0
        return rec
'''


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory):
    import importlib

    from research.checkpoint import registry

    folder = tmp_path_factory.mktemp("saver")
    (folder / f"{NAME}.py").write_text(MODULE)
    sys.path.insert(0, str(folder))
    importlib.import_module(NAME)  # registers it
    yield folder
    # The saver is gone again for the tests that follow in this process.
    sys.path.remove(str(folder))
    registry.forget_saver("rank0-slowdisk")
    sys.modules.pop(NAME, None)


def test_a_saver_from_one_outside_module_is_known_and_checked(module_dir):
    from research.checkpoint.savers import check_saver_options, list_savers
    from research.entry.cli import listing

    assert "rank0-slowdisk" in list_savers()
    assert check_saver_options("rank0-slowdisk", {"mb_per_s": 50.0}) is None
    problem = check_saver_options("rank0-slowdisk", {"mb_per_s": 0})
    assert problem == "checkpoint saver option mb_per_s=0 must be > 0 and <= 1000000.0"
    assert "no option 'mbps'" in check_saver_options("rank0-slowdisk", {"mbps": 1})
    text = listing()
    assert "rank0-slowdisk" in text and "mb_per_s" in text


def test_its_option_takes_effect(module_dir, tmp_path):
    from research.checkpoint import CheckpointConfig
    from research.comm.world import get_world
    from tests.checkpoint_state import identical, state_at

    cfg = CheckpointConfig(
        saver="rank0-slowdisk", directory=str(tmp_path), options={"mb_per_s": 5.0}
    )
    ckpt = cfg.create(get_world())
    t0 = time.perf_counter()
    rec = ckpt.save(2, state_at(2))
    assert rec.bytes_written > 0
    assert time.perf_counter() - t0 >= rec.bytes_written / 5e6  # about 0.1 s
    back = ckpt.restore(state_at(0))
    ckpt.close()
    assert back.step == 2 and identical(back.state, state_at(2))


@pytest.mark.launches
def test_it_keeps_the_saver_contract(module_dir, tmp_path):
    run_contract(tmp_path, ["rank0-slowdisk"], 2, 3, module=(NAME, module_dir))
