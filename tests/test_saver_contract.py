"""Every registered checkpoint saver through the same contract, under MPI.

For each name ``list_savers()`` knows (a new saver is checked without being
named here), with real processes (``tests/saver_contract_driver.py``): at 2
and at 3 ranks, save steps 2 and 4 and restore step 4 bit for bit; start
saving step 6 and SIGKILL every rank once the step's data is on disk but not
committed; then, at the other world size (3 and 2), restore step 4 bit for bit,
save step 6 over the crash's leftovers and restore it. All savers share each
job, so the contract costs four launches whatever their number.
"""

from __future__ import annotations

import pytest

from tests.saver_contract import run_contract

pytestmark = pytest.mark.launches  # MPI jobs: not in make test-fast


@pytest.mark.parametrize(("np_", "other"), [(2, 3), (3, 2)])
def test_every_saver_keeps_the_contract(tmp_path, np_, other):
    from research.checkpoint.savers import list_savers

    savers = list_savers()
    assert "deepfreeze" in savers and len(savers) >= 4
    run_contract(tmp_path, savers, np_, other)
