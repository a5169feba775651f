"""The library leaves its caller's process alone (issue: no side effects at import
or construction): importing ``research.checkpoint`` and building, using and
closing a DeepFreeze checkpointer changes no environment variable and imports
nothing of ``models``, whose XLA:CPU flag would change the caller's numerics.

Run in a fresh interpreter of its own, without mpiexec (a world of one).
"""

from __future__ import annotations

from tests.harness import python, run_env

PROBE = """
import os, sys
import jax.numpy as jnp
jnp.ones(3).block_until_ready()  # the user's program: JAX already running
before = dict(os.environ)  # what JAX itself sets on import and start is the user's
import research.checkpoint
from research.checkpoint import CheckpointConfig
from research.comm.world import get_world

world = get_world()
state = {"w": jnp.arange(12.0).reshape(3, 4), "b": jnp.ones(4)}
ckpt = CheckpointConfig(saver="deepfreeze", every=1).create(world, sys.argv[1])
ckpt.save(1, state)
ckpt.wait()
restored = ckpt.restore(state)
ckpt.close()
assert restored is not None and int(restored.step) == 1, restored
changed = sorted(
    k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)
)
print("CHANGED", changed)
mods = sorted(m for m in sys.modules if m.split(".")[0] == "models")
print("MODELS", mods)
"""


def test_checkpointer_changes_no_environment_and_imports_no_models(tmp_path):
    env = {k: v for k, v in run_env().items() if not k.startswith("RESEARCH_")}
    proc = python(["-c", PROBE, str(tmp_path / "run")], env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert lines["CHANGED"] == "[]", lines["CHANGED"]
    assert lines["MODELS"] == "[]", lines["MODELS"]


def test_checkpoint_config_due_follows_every():
    """``every`` is honoured where the caller asks: ``due`` (the Trainer's hook
    uses the same rule); ``save`` itself saves whenever it is called."""
    from research.checkpoint import CheckpointConfig

    c = CheckpointConfig(every=10)
    assert [s for s in range(1, 26) if c.due(s, 25)] == [10, 20]
    final = CheckpointConfig(every=10, final=True)
    assert [s for s in range(1, 26) if final.due(s, 25)] == [10, 20, 25]
    assert not any(CheckpointConfig(every=0).due(s) for s in range(1, 50))


def test_drain_is_the_one_word_for_what_is_in_flight():
    """``drain`` is the one word for delivering what is in flight or carried;
    ``flush``, its spelling before (never released), is gone from the
    strategies and the collective (an AttributeError, not a second name)."""
    from research.comm.partial import PartialAllreduce
    from research.strategies.base import GradientStrategy, Strategy

    for cls in (Strategy, GradientStrategy, PartialAllreduce):
        assert hasattr(cls, "drain") and not hasattr(cls, "flush"), cls
