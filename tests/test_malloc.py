"""research.comm.process.malloc: every rank keeps its freed heap unless told not to."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.harness import python, run_env

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import ctypes, resource, sys
from research.comm.process import malloc
print(malloc.state())
print(malloc.keep_heap())
print(malloc.keep_heap())  # once: the same answer
if malloc.state() == "kept":
    # 48 MiB in 4 MiB blocks, freed, then allocated and touched again: the
    # kept heap serves them from memory already faulted in.
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = (ctypes.c_void_p,)
    libc.memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
    def cycle():
        ptrs = [libc.malloc(4 << 20) for _ in range(12)]
        for p in ptrs:
            libc.memset(p, 1, 4 << 20)
        for p in ptrs:
            libc.free(p)
    cycle()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cycle()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def _probe(**env: str) -> list[str]:
    full = run_env(**env)
    for var in ("GLIBC_TUNABLES", "RESEARCH_MALLOC"):
        if var not in env:
            full.pop(var, None)
    out = python(["-c", PROBE], env=full, check=True)
    return out.stdout.split("\n")


def test_keeps_the_heap_and_reuses_it() -> None:
    lines = _probe()
    assert lines[:3] == ["not applied", "kept", "kept"]
    # 12 blocks of 1024 pages: default glibc maps and faults them in anew
    # (12,288 faults); a kept heap touches nothing new.
    assert int(lines[3]) < 1000


def test_user_says_default() -> None:
    lines = _probe(RESEARCH_MALLOC="default")
    assert lines[1] == "default (RESEARCH_MALLOC)"


def test_users_glibc_tunables_win() -> None:
    lines = _probe(GLIBC_TUNABLES="glibc.malloc.trim_threshold=1000000")
    assert lines[1] == "default (GLIBC_TUNABLES)"


def test_launch_env_adds_huge_pages_once() -> None:
    from research.comm.process.malloc import HUGETLB, launch_env

    assert launch_env({})["GLIBC_TUNABLES"] == HUGETLB
    got = launch_env({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"})["GLIBC_TUNABLES"]
    assert got == f"glibc.pthread.rseq=0:{HUGETLB}"
    mine = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
    assert launch_env(mine) == mine  # the user's word wins
    off = {"RESEARCH_MALLOC": "default"}
    assert launch_env(off) == off
    env = {"A": "1"}
    assert launch_env(env) is not env and env == {"A": "1"}


def test_huge_pages_alone_still_keep_the_heap() -> None:
    lines = _probe(GLIBC_TUNABLES="glibc.malloc.hugetlb=1")
    assert lines[1] == "kept"


@pytest.mark.launches
def test_relaunched_ranks_get_huge_pages(tmp_path, monkeypatch) -> None:
    from research.entry.launch import relaunch

    pkg = tmp_path / "probe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    out = tmp_path / "tunables"
    (pkg / "show.py").write_text(
        "import os, sys\n"
        f"open({str(out)!r} + os.environ.get('PMI_RANK', '0'), 'w')"
        ".write(os.environ.get('GLIBC_TUNABLES', ''))\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{ROOT}")
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("RESEARCH_MALLOC", raising=False)
    assert relaunch("probe_pkg.show", [], 2) == 0
    for rank in (0, 1):
        assert (tmp_path / f"tunables{rank}").read_text() == "glibc.malloc.hugetlb=1"
