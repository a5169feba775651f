"""Checkpoint faults with real processes: kill -9, corrupt shards, full or bad disks.

Each test launches ``mpiexec -n 2 python -m tests.checkpoint_driver ...``
(``tests/checkpoint_driver.py``) once to write checkpoints, breaks something,
and, where there is something to restore, launches it again to restore and
compare bit for bit with a replay of the restored number of steps.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.harness import run_under_mpiexec

pytestmark = pytest.mark.launches  # MPI jobs: not in make test-fast

NP = 2


def _run(*args: object, expect_ok: bool = True):
    proc = run_under_mpiexec(
        NP, ["-m", "tests.checkpoint_driver", *map(str, args)], timeout=240
    )
    if expect_ok and proc.returncode != 0:
        pytest.fail(
            f"driver {args} exited {proc.returncode}\n--- stdout\n"
            f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
        )
    return proc


def _results(proc) -> list[dict]:
    # mpiexec forwards each rank's output in chunks, so two ranks' lines can run
    # together: decode every JSON object that follows a RESULT marker.
    dec, out, text = json.JSONDecoder(), [], proc.stdout
    for m in re.finditer(r" \| RESULT ", text):
        try:
            out.append(dec.raw_decode(text, m.end())[0])
        except json.JSONDecodeError:
            pytest.fail(f"garbled result at {m.end()}\n--- stdout\n{text}")
    return sorted(out, key=lambda r: (r.get("case", ""), r["rank"]))


def _committed(root: Path) -> dict[str, list[int]]:
    out = {}
    for tier in ("fast", "persistent"):
        path = root / tier / "manifest.json"
        steps = json.loads(path.read_text())["steps"] if path.exists() else {}
        out[tier] = sorted(int(s) for s in steps)
    return out


def _restore_and_check(
    root: Path, step: int, tiers: list[str], *args: object
) -> list[dict]:
    res = _results(_run("restore", root, *args))
    assert [r["rank"] for r in res] == list(range(NP))
    for r in res:
        assert r["step"] == step and r["identical"], r
        assert r["tiers"] == tiers, r
        assert r["extra"] == {"data": {"k": step}}
        assert step + 1 in r["after"]  # crash leftovers did not block a new save
    return res


def test_kill_one_rank_mid_write_restores_last_committed(tmp_path):
    proc = _run(
        "save",
        tmp_path,
        "--kill",
        "1",
        "--kill-event",
        "write-started",
        "--kill-step",
        "30",
        "--scale",
        "16",
        expect_ok=False,
    )
    assert proc.returncode != 0
    assert "r1 | KILL at write-started of step 30" in proc.stdout
    assert _committed(tmp_path) == {"fast": [10, 20], "persistent": [10, 20]}
    # The killed rank left step 30 half written (Orbax's temporary folder).
    assert list((tmp_path / "fast" / "rank1").glob("30*"))
    _restore_and_check(tmp_path, 20, ["fast"], "--scale", "16")


def test_kill_all_ranks_mid_flush_restores_from_the_fast_tier(tmp_path):
    proc = _run(
        "save",
        tmp_path,
        "--kill",
        "all",
        "--kill-event",
        "flush-file",
        "--kill-step",
        "30",
        expect_ok=False,
    )
    assert proc.returncode != 0 and "KILL at flush-file of step 30" in proc.stdout
    # Step 30 was committed in the fast tier; its flush was cut short.
    # (Its commit dropped step 10 from the fast tier: keep_fast is 2.)
    assert _committed(tmp_path) == {"fast": [20, 30], "persistent": [10, 20]}
    assert list((tmp_path / "persistent").glob("rank*/30.flush-tmp"))
    _restore_and_check(tmp_path, 30, ["fast"])


def test_corrupt_shard_names_the_file_and_falls_back(tmp_path):
    _run("save", tmp_path, "--steps", "30", "--keep-fast-tier")
    assert _committed(tmp_path)["persistent"] == [10, 20, 30]
    assert 30 in _committed(tmp_path)["fast"]
    bad = {}
    for tier in ("fast", "persistent"):
        d = tmp_path / tier / "rank1" / "30"
        f = max(
            (p for p in d.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
        )
        data = bytearray(f.read_bytes())
        if tier == "fast":
            f.write_bytes(data[: len(data) // 2])  # truncated
        else:
            data[len(data) // 2] ^= 0xFF  # one flipped byte
            f.write_bytes(bytes(data))
        bad[tier] = str(f)
    proc = _run("restore", tmp_path)
    res = _results(proc)
    for r in res:
        assert r["step"] == 20 and r["identical"], r
        problems = "\n".join(r["problems"])
        assert f"{bad['fast']}: truncated" in problems
        assert f"{bad['persistent']}: crc32 mismatch" in problems
    assert f"{bad['persistent']}: crc32 mismatch" in proc.stderr  # warned, naming it


def test_full_disk_and_unwritable_tier_surface_on_every_rank(tmp_path):
    res = _results(_run("errors", tmp_path))
    enospc = [r for r in res if r["case"] == "enospc"]
    notdir = [r for r in res if r["case"] == "notdir"]
    assert len(enospc) == len(notdir) == NP
    for r in enospc:
        assert r["surfaced"] in ("save", "wait"), r
        assert (
            f"rank {NP - 1}: OSError: [Errno 28] No space left on device" in r["error"]
        )
        assert 2 not in r["committed"]
    for r in notdir:
        assert r["surfaced"] in ("save", "wait"), r
        assert (
            f"rank {NP - 1}: FileExistsError" in r["error"]
            and "persistent" in r["error"]
        )
    assert _committed(tmp_path / "notdir")["persistent"] == []
    # close() met on every rank although only the last one still had a failure
    # to raise; the steps only the fast tier holds stay there for a restart.
    closes: dict[str, list[str]] = {}
    for r in res:
        if r["case"].endswith("-close"):
            closes.setdefault(r["case"], []).append(r["closed"])
    assert closes == {
        "enospc-close": ["ok"] * NP,
        "notdir-close": ["ok"] + ["raised"] * (NP - 1),
    }
    assert _committed(tmp_path / "notdir")["fast"]
    assert not (tmp_path / "enospc" / "fast" / "manifest.json").exists()
    # The failed step is never committed; the checkpoints after it still are.
    persisted = _committed(tmp_path / "enospc")["persistent"]
    assert persisted and 2 not in persisted and max(persisted) == 7
