"""Runs every tests/mpi/test_*.py file under a real ``mpiexec``: the
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
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.launches  # MPI jobs: not in make test-fast

HERE = Path(__file__).parent
ROOT = HERE.parent
# Ranks and runs compile the same programs: a persistent cache shared by every
# process of the suite turns most compiles after the first into a disk read.
COMPILE_CACHE_ENV = {
    "JAX_COMPILATION_CACHE_DIR": os.environ.get(
        "JAX_COMPILATION_CACHE_DIR", f"/tmp/research-jax-cache-{os.getuid()}"
    ),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
#: XLA for every process the suite starts: one intra-op thread per process
#: (ranks oversubscribe 2 cores), and LLVM at -O1. The suite's processes both
#: compile (models' gradients in the test's own process) and train (the
#: experiments it runs): -O0 compiled no faster than -O1 and its steps ran
#: slower, XLA's default compiled slower and ran no faster. test_stages,
#: test_conv and the scalability smoke test, CPU-s from an empty compile cache
#: / a warm one: -O0 144 / 69, -O1 141 / 51, default 153 / 61 (bench lock,
#: 2026-11-27). One level for every process that trains: a test compares their
#: numbers with its own bit for bit.
_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false"
#: And XLA:CPU's older elemental emitters instead of its MLIR fusion emitters,
#: which took most of a small program's compile time: from an empty cache
#: ResNet-tiny's gradient compiled in 1.2 CPU-s instead of 2.0 at -O1 (0.5
#: instead of 1.5 at -O0), 80 one-op programs in 0.6 instead of 1.4 (-O0), and
#: tests/mpi/test_dense's 120-leaf average in 0.5 instead of 1.3 (-O0). At -O1
#: the small CNN's, VGG-tiny's and P1B2's steps ran as fast, the ResNets' 7%
#: (tiny) and 16% (ResNet-50) slower (bench lock, 2026-11-27).
_COMPILE_FAST = "--xla_cpu_use_fusion_emitters=false"
XLA_TEST_FLAGS = f"{_ONE_THREAD} {_COMPILE_FAST} --xla_backend_optimization_level=1"
#: tests/mpi's ranks (:func:`test_under_mpiexec`): many small programs, each
#: compiled once and run briefly, so compiling is what costs and LLVM -O0 pays.
#: Never for a job whose numbers a test compares with its own process's: the
#: two levels round differently (a checkpoint of a 4-rank job differed from the
#: same state computed in the test in the last bit). From an empty compile cache
#: the 2-rank run took 161 CPU-s instead of 212 at -O1 (83 both from a warm one).
XLA_MPI_TEST_FLAGS = f"{_ONE_THREAD} {_COMPILE_FAST} --xla_backend_optimization_level=0"
FILES = sorted(p.name for p in (HERE / "mpi").glob("test_*.py"))
#: What marks a process as one of an MPI job's ranks: a process a test starts
#: outside mpiexec drops them, or it would take itself for a rank.
MPI_JOB_VARS = (
    "PMI_RANK",
    "PMI_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_RANK",
    "RESEARCH_UNDER_MPI",
)


def mpiexec() -> str:
    """The environment's ``mpiexec``; refused under ``make test-fast``
    (``RESEARCH_NO_MPIEXEC``): a test that launches must be marked
    ``launches`` (``tests/conftest.py``)."""
    if os.environ.get("RESEARCH_NO_MPIEXEC"):
        raise RuntimeError(
            "RESEARCH_NO_MPIEXEC is set (make test-fast): mark this test "
            "@pytest.mark.launches"
        )
    exe = Path(sys.executable).parent / "mpiexec"
    return str(exe) if exe.exists() else "mpiexec"


def launcher() -> list[str]:
    """The launch command: ``RESEARCH_MPIEXEC`` when set (``make test-site-mpi``
    sets ``mpirun --allow-run-as-root --oversubscribe``, Open MPI's), else
    :func:`mpiexec`. Either takes ``-n N`` next."""
    custom = os.environ.get("RESEARCH_MPIEXEC", "").strip()
    if custom and os.environ.get("RESEARCH_NO_MPIEXEC"):
        mpiexec()  # refused the same way
    return shlex.split(custom) if custom else [mpiexec()]


def run_under_mpiexec(
    np_: int, args: list[str], timeout: float = 300, env_extra: dict | None = None
) -> subprocess.CompletedProcess:
    from tests.conftest import run_env  # conftest imports this module

    env = run_env(
        RESEARCH_UNDER_MPI="1",
        XLA_FLAGS=XLA_TEST_FLAGS,  # as the test's own process: bit-equal results
        NPROC="1",  # XLA:CPU's intra-op pool: one thread per rank
        # sparse_allreduce(auto) uses its documented defaults, not whatever
        # calibration this machine's user cache holds (tests/conftest.py).
        RESEARCH_SPARSE_COST="defaults",
        # tests/mpi/conftest.py checks the world it gets against this.
        RESEARCH_EXPECTED_NP=str(np_),
        **COMPILE_CACHE_ENV,
    )
    # The outer pytest's options (say --durations, -q) are not the ranks': the
    # summary line this file reads must stay as it is.
    env.pop("PYTEST_ADDOPTS", None)
    env.update(env_extra or {})
    cmd = [*launcher(), "-n", str(np_), sys.executable, *args]
    return subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


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
from research.comm.registry import get_averager
w = get_world()
x = np.full(2**20, float(w.rank), np.float32)  # a 4 MB leaf
want = np.mean(np.arange(w.size, dtype=np.float64))
out = {}
for name in ("fused", "host"):
    avg = get_averager(name, w)
    if name == "fused":
        got = jax.jit(avg.average_in_jit)({"a": jnp.asarray(x)})["a"]
    else:
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
    from tests.conftest import run_env  # conftest imports this module

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
    from tests.test_shared_node import _user  # retries: two workers may race

    if os.getuid() != 0:
        pytest.skip("needs root to create a second local user (useradd)")
    return _user(INTRUDER)


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
