"""The saver contract's launches and their checks, for the tests that run it.

:func:`run_contract` runs ``tests/saver_contract_driver.py`` (the ranks' side)
twice: a crash at one world size, then a resume at another, and checks what
every rank reported (``RESULT`` lines, :func:`results`).
``tests/test_saver_contract.py`` runs it over every built-in saver,
``tests/test_new_saver.py`` over one from an outside module.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

from tests.harness import run_under_mpiexec


def results(proc) -> list[dict]:
    """The driver's ``RESULT`` objects (mpiexec may join two ranks' lines)."""
    dec, out, text = json.JSONDecoder(), [], proc.stdout
    for m in re.finditer(r" \| RESULT ", text):
        out.append(dec.raw_decode(text, m.end())[0])
    return out


def _output(proc) -> str:
    return f"\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"


def run_contract(
    root: Path, savers: list[str], np_: int, other: int, module: tuple = ()
) -> None:
    """Crash at ``np_`` ranks, resume at ``other``; fails with what went wrong.

    ``module``: ``(name, folder)`` of an outside module that registers savers.
    """
    extra = ["--module", module[0], "--path", str(module[1])] if module else []
    drive = ["-m", "tests.saver_contract_driver"]

    crash = run_under_mpiexec(np_, [*drive, "crash", str(root), *savers, *extra])
    got = results(crash)
    where = _output(crash)
    trips = [r for r in got if r["case"] == "roundtrip"]
    assert len(trips) == np_ * len(savers), where
    for r in trips:
        assert r["step"] == 4 and r["identical"], (r, where)
        assert r["extra"] == {"at": 4}, (r, where)
    crashed = [r for r in got if r["case"] == "crash"]
    assert len(crashed) == np_ and all(r["ready"] for r in crashed), where
    for saver in savers:  # some rank wrote each saver's step 6 before the kill
        assert any(r["written"][saver] for r in crashed), (saver, where)
    # Killed by its own SIGKILL: mpiexec reports the signal, never success.
    assert crash.returncode != 0, where
    assert -crash.returncode == signal.SIGKILL or crash.returncode > 0, where
    for saver in savers:  # step 6 is on disk and committed nowhere
        assert any(p.is_dir() for p in (root / saver).rglob("6")), saver
        for manifest in (root / saver).rglob("manifest.json"):
            steps = sorted(map(int, json.loads(manifest.read_text())["steps"]))
            assert 6 not in steps and 4 in steps, (saver, manifest, steps)

    resume = run_under_mpiexec(other, [*drive, "resume", str(root), *savers, *extra])
    where = (
        f"\n--- stdout\n{resume.stdout[-3000:]}\n--- stderr\n{resume.stderr[-3000:]}"
    )
    assert resume.returncode == 0, where
    done = [r for r in results(resume) if r["case"] == "resume"]
    assert len(done) == other * len(savers), where
    for r in done:
        assert r["step"] == 4 and r["identical"], (r, where)
        assert r["after"] == 6 and r["after_identical"], (r, where)
