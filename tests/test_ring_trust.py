"""The native ring library is loaded only from a file and folder that are ours.

A cache folder that others can write (``RESEARCH_NATIVE_CACHE`` pointed at a
shared place), or a library file that another user planted under the expected
name, would let someone else run code in every rank. Either way the library is
not loaded, the reason is given, and the averagers use MPI's own allreduce.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
from research.comm import ring
print("PATH", ring.library_path())
print("REASON", ring.unavailable_reason())
"""


def probe(cache: Path) -> dict[str, str]:
    env = dict(os.environ, RESEARCH_NATIVE_CACHE=str(cache), PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)


def test_a_cache_others_can_write_is_not_used(tmp_path):
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    cache.chmod(0o777)
    out = probe(cache)
    assert "writable by others" in out["REASON"], out
    assert str(cache) in out["REASON"]


@pytest.mark.skipif(os.getuid() != 0, reason="planting as another user needs root")
def test_a_library_planted_by_another_user_is_not_loaded(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    lib = Path(probe(cache)["PATH"])
    lib.write_bytes(b"not a library: loading it would run the planter's code")
    os.chown(lib, 65534, 65534)  # nobody
    out = probe(cache)
    assert "belongs to uid 65534" in out["REASON"], out
    assert lib.read_bytes().startswith(b"not a library")  # never replaced or run
