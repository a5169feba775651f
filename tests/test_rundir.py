"""The run folder's records (research/rundir.py)."""

import subprocess
import sys


def test_versions_are_read_without_importing_the_packages() -> None:
    """config.json names every package's version, and a run that never
    checkpoints does not import Orbax to learn it (a fresh process: the
    suite's own has imported everything)."""
    code = (
        "import sys; from research.rundir import versions; v = versions(); "
        "assert 'orbax.checkpoint' not in sys.modules, 'orbax imported'; "
        "import orbax.checkpoint, jax, flax, optax, mpi4py, numpy; "
        "assert v['orbax.checkpoint'] == orbax.checkpoint.__version__, v; "
        "assert v['jax'] == jax.__version__ and v['flax'] == flax.__version__, v; "
        "assert v['optax'] == optax.__version__, v; "
        "assert v['numpy'] == numpy.__version__, v; "
        "assert v['mpi4py'] == mpi4py.__version__, v; "
        "assert v['mpi'].startswith(('MPICH', 'Open MPI')), v; print('ok')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
