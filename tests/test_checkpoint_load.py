"""A DeepFreeze checkpoint of a 4-rank job, read back in one plain process.

The job is real (``tests.checkpoint_driver save`` under ``mpiexec -n 4``, the
deterministic state of ``tests.checkpoint_state``). Then, without mpiexec:
``research.checkpoint.load`` gives the newest (or a chosen) committed step,
bit-identical to the state saved, without importing mpi4py; ``python -m
scripts.export_checkpoint`` writes a standard Orbax checkpoint that a process
importing only Orbax and numpy restores, bit-identical again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from research.checkpoint.leaves import Flattener, unnest
from tests.checkpoint_state import host, identical, state_at
from tests.harness import python, run_under_mpiexec

pytestmark = [
    pytest.mark.launches,  # MPI jobs: not in make test-fast
    # One worker: a checkpoint written once (a module fixture).
    pytest.mark.xdist_group("test_checkpoint_load"),
]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ckpt4")
    proc = run_under_mpiexec(
        4,
        [
            "-m",
            "tests.checkpoint_driver",
            "save",
            str(root),
            "--steps",
            "20",
            "--every",
            "10",
            "--step-time",
            "0",
        ],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root / "persistent"


def named(tree) -> dict[str, np.ndarray]:
    """Leaves by path name, typed keys as key data (what a checkpoint stores)."""
    flat = Flattener()
    leaves, _ = flat.flatten(tree)
    return dict(zip(flat.names, jax.tree.leaves(host(tree))))


def same_bytes(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        a, b = np.asarray(got[k]), np.asarray(want[k])
        assert a.dtype == b.dtype and a.shape == b.shape, k
        assert a.tobytes() == b.tobytes(), k


def test_load_without_mpi_or_template(saved):
    from research.checkpoint import load
    from research.checkpoint.offline import steps

    assert steps(saved) == [10, 20]
    same_bytes(unnest(load(saved)), named(state_at(20)))
    same_bytes(unnest(load(saved.parent / "persistent", step=10)), named(state_at(10)))
    # With a template the leaves are typed like it (the PRNG key included).
    assert identical(load(saved, target=state_at(0)), state_at(20))
    probe = (
        "import sys; from research.checkpoint import load; "
        f"t = load({str(saved)!r}); "
        "print('mpi4py' in sys.modules, sorted(t))"
    )
    out = python(["-c", probe])
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split(" ", 1)[0] == "False", out.stdout


def test_load_says_what_is_missing_or_broken(saved, tmp_path):
    from research.checkpoint.offline import NoCheckpointError, load

    with pytest.raises(NoCheckpointError, match="no manifest.json"):
        load(tmp_path)
    with pytest.raises(NoCheckpointError, match="step 15 is not committed"):
        load(saved, step=15)


def test_export_opens_with_orbax_alone(saved, tmp_path):
    out = tmp_path / "exported"
    export = ["-m", "scripts.export_checkpoint", str(saved), "--format", "orbax"]
    export.append(str(out))
    proc = python(export)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 20 of" in proc.stdout
    # A process that imports Orbax and numpy only, as anyone else would.
    reader = (
        "import sys, numpy as np, orbax.checkpoint as ocp, jax\n"
        f"t = ocp.StandardCheckpointer().restore({str(out)!r})\n"
        "paths = jax.tree_util.tree_flatten_with_path(t)[0]\n"
        "np.savez(sys.argv[1], **{'/'.join(str(k.key) for k in p): np.asarray(v)\n"
        "                         for p, v in paths})\n"
        "print(any(m.startswith(('research', 'models')) for m in sys.modules))\n"
    )
    npz = tmp_path / "read.npz"
    got = subprocess.run(
        [sys.executable, "-c", reader, str(npz)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert got.returncode == 0, got.stderr[-3000:]
    assert got.stdout.strip() == "False"
    with np.load(npz) as z:
        same_bytes(dict(z), named(state_at(20)))
    again = python(export)
    assert again.returncode == 2 and "exists" in again.stderr
