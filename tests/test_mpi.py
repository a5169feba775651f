"""Runs every tests/mpi/test_*.py file under a real ``mpiexec`` (the launch is
``tests/harness.py``'s): the
communication files with 3 ranks (a rank count that is not a power of two: the
ring's uneven chunks, recursive doubling's extra ranks), those whose
algorithms change shape at a power of two also with 4, and the rest with 2
(:data:`GROUPS`; each choice measured with coverage.py, the notes below).

One launch per rank count runs all of its files: each rank runs pytest on the
files in the same order, and the job passes only if every rank passes (a
failing test aborts the job, naming itself: ``tests/mpi/conftest.py``). One
launch instead of one per file saves each file's start-up (Python, JAX, MPI
and pytest in every rank: about 5 s of a 2-core machine per launch at 4
ranks) and lets the files share what they compile. ``RESEARCH_MPI_FILES=a.py,b.py``
runs only those files. XLA is pinned to one intra-op thread per rank so 4
ranks on 2 cores don't fight.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import (
    COMPILE_CACHE_ENV,
    MPI_FILES,
    XLA_MPI_TEST_FLAGS,
    XLA_TEST_FLAGS,
    local_user,
    mpiexec,
    run_env,
    run_under_mpiexec,
)

pytestmark = pytest.mark.launches  # MPI jobs: not in make test-fast

FILES = MPI_FILES


#: The communication files, also run at 3 ranks. Not test_overlap.py: its
#: 3-rank run reached no line of research/ that the other runs did not
#: (coverage.py on every rank, 2026-11-27), for 33 CPU-s; the contract test
#: still runs the overlapped strategies at 3 ranks.
COMMUNICATION = {
    "test_adaptive.py",
    "test_api.py",
    "test_contract.py",
    "test_ring.py",
    "test_ring_staged.py",
    "test_dense.py",
    "test_partial.py",
    "test_sparse.py",
    "test_sparse_select.py",
    "test_sparse_strategy.py",
    "test_handles.py",
}
#: The files whose algorithms take another shape at a power of two above 2
#: (the ring's chunks, recursive doubling and halving, quorum sizes): also
#: run at 4 ranks. Every file ran at 4 until 2026-11-26; measured with
#: coverage.py then, that run reached 10,499 lines of research/, of which 6
#: the 2- and 3-rank runs did not (a watchdog traffic reading and a
#: TensorBoard timed flush, both timing-dependent), at 144 s of the suite's
#: ~890 (docs/journal.md).
#: test_dense.py left this group on 2026-11-27: its averaging is the same at
#: every size, and the allreduces under it are test_ring.py's; without it the
#: runs reached the same arcs of research/ (coverage.py, docs/journal.md).
POWER_OF_TWO = {"test_ring.py", "test_sparse.py", "test_partial.py"}
#: The files run at 2 ranks: those the other groups don't run, and
#: test_sparse.py, whose 2-rank run alone reaches a dense part in the sparse
#: sum (an owner's whole chunk). With branch coverage (coverage.py on every
#: rank, 2026-11-27) the other communication files' 2-rank run reached no arc
#: of research/ that the 3- and 4-rank runs and these files did not, but one:
#: a second pass of the loop over added strategy modules, which depends on the
#: order the files run in. They took 37 of the 2-rank run's 53 s (alone).
TWO_RANKS = (set(FILES) - COMMUNICATION) | {"test_sparse.py"}
#: The files each rank count runs.
GROUPS = {
    2: sorted(TWO_RANKS),
    3: sorted(COMMUNICATION),
    4: sorted(POWER_OF_TWO),
}


def _selected(names: list[str]) -> list[str]:
    wanted = os.environ.get("RESEARCH_MPI_FILES", "").strip()
    if not wanted:
        return names
    chosen = {w.strip() for w in wanted.split(",") if w.strip()}
    return [n for n in names if n in chosen]


@pytest.mark.parametrize("np_", sorted(GROUPS))
def test_under_mpiexec(np_: int) -> None:
    names = _selected(GROUPS[np_])
    if not names:
        pytest.skip(f"RESEARCH_MPI_FILES selects none of the {np_}-rank files")
    files = [f"tests/mpi/{n}" for n in names]
    # A hang guard for the whole group (about 2 min at 3 ranks here, quiet).
    proc = run_under_mpiexec(
        np_,
        ["-m", "pytest", *files, "-x"],
        timeout=1500,
        env_extra={"XLA_FLAGS": XLA_MPI_TEST_FLAGS},
    )
    if proc.returncode != 0:
        pytest.fail(
            f"mpiexec -n {np_} pytest {' '.join(files)} exited "
            f"{proc.returncode}\n--- stdout\n{proc.stdout[-8000:]}\n"
            f"--- stderr\n{proc.stderr[-6000:]}"
        )
    # Every file ran (collection counts them on rank 0's summary line).
    assert " passed" in proc.stdout, proc.stdout[-3000:]


AVERAGE_SCRIPT = """
import json, sys
import numpy as np, jax, jax.numpy as jnp
from research.comm.world import get_world
from research.comm.dense import FusedAllreduce, HostAllreduce
w = get_world()
x = np.full(2**20, float(w.rank), np.float32)  # a 4 MB leaf
want = np.mean(np.arange(w.size, dtype=np.float64))
out = {}
for name in ("fused", "host"):
    if name == "fused":
        avg = FusedAllreduce(w)
        got = jax.jit(avg.average_in_jit)({"a": jnp.asarray(x)})["a"]
    else:
        avg = HostAllreduce(w)
        got = avg.reduce({"a": x})[0]["a"]
    assert np.allclose(np.asarray(got), want), (name, np.asarray(got)[:3])
    out[name] = avg.allreduce_choice
with open(f"{sys.argv[1]}/choice-{w.rank}.json", "w") as f:
    json.dump(out, f)
"""


def _choices(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("choice-*.json"))]


def test_ranks_agree_when_one_cannot_build(tmp_path):
    """Issue 21, reproduction 1: one rank whose native cache is unusable. Before,
    it fell back alone and the job hung (one rank in MPI_Allreduce, the others in
    the ring); now every rank takes MPI_Allreduce and says why."""
    script = tmp_path / "t.py"
    script.write_text(AVERAGE_SCRIPT)
    env = run_env(XLA_FLAGS=XLA_TEST_FLAGS, NPROC="1", **COMPILE_CACHE_ENV)
    py = sys.executable
    cmd = [mpiexec(), "-n", "1", "env", "RESEARCH_NATIVE_CACHE=/proc/no-such-dir"]
    cmd += [py, str(script), str(tmp_path), ":", "-n", "2"]
    cmd += [py, str(script), str(tmp_path)]
    # A hang guard, not a speed check (it took 37 s on the 2-core machine).
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    choices = _choices(tmp_path)
    assert len(choices) == 3
    for c in choices:
        for name in ("fused", "host"):
            assert c[name]["ring"] is False
            assert "rank 0" in c[name]["reason"] and "no-such-dir" in c[name]["reason"]
    assert proc.stderr.count("ring allreduce not used") == 1  # rank 0, once


INTRUDER = "ringintruder"


def _intruder_uid() -> int:
    if os.getuid() != 0:
        pytest.skip("needs root to create a second local user (useradd)")
    return local_user(INTRUDER)  # retries: two workers may race


@pytest.mark.parametrize("where", ["world-writable-cache", "library-of-another"])
def test_planted_library_is_not_loaded(tmp_path, where):
    """Issue 25, item 4: a library planted by another user at the name the
    cache key gives, in a world-writable cache (or as their file in ours), is
    never loaded: the ring is built in a private folder and the reason noted."""
    from research.comm.dense import ring

    uid = _intruder_uid()
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    if where == "world-writable-cache":
        os.chown(cache, uid, uid)
        cache.chmod(0o777)
    marker = tmp_path / "planted-code-ran"
    planted = tmp_path / "planted.c"
    planted.write_text(
        "#include <stdio.h>\n__attribute__((constructor)) static void run(void) {"
        f' FILE* f = fopen("{marker}", "w"); if (f) fclose(f); }}\n'
    )
    lib = ring.library_path(cache)
    subprocess.run(["cc", "-shared", "-fPIC", str(planted), "-o", str(lib)], check=True)
    os.chown(lib, uid, uid)  # the intruder's file
    script = tmp_path / "t.py"
    script.write_text(AVERAGE_SCRIPT)
    proc = run_under_mpiexec(
        2,
        [str(script), str(tmp_path)],
        env_extra={"RESEARCH_NATIVE_CACHE": str(cache)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not marker.exists(), "the planted library ran"
    choices = _choices(tmp_path)
    assert len(choices) == 2
    for c in choices:
        # Built again, privately: a candidate (auto then times it against MPI's).
        assert "ring" in c["fused"]["candidates"]
        notes = " ".join(c["fused"]["notes"])
        assert "not used" in notes and str(cache) in notes
