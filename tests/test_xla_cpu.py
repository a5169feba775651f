"""``models.xla_cpu``: the XLA:CPU flag the models train faster with, and when set
(by the entry points: importing ``models`` sets nothing).

The effect is checked on XLA's own compiled program: with the flag a convolution
is a plain ``convolution`` (Eigen, on the intra-op pool); without it XLA wraps it
in a YNNPACK fusion (``__ynn``), which runs on one thread.
"""

from __future__ import annotations

import pytest

from models import xla_cpu
from tests.harness import python, run_env

PROBE = """
import warnings
warnings.simplefilter("always")
import os, sys
if sys.argv[1] == "jax-first":
    import jax.numpy as jnp
    jnp.ones(3).block_until_ready()
with warnings.catch_warnings(record=True) as caught:
    import models
    if sys.argv[1] != "import-only":
        models.xla_cpu.apply()
import jax, jax.numpy as jnp
from jax import lax
x, w = jnp.ones((4, 16, 16, 32)), jnp.ones((3, 3, 32, 32))
conv = lambda x, w: lax.conv_general_dilated(
    x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")) * 2.0
text = jax.jit(conv).lower(x, w).compile().as_text()
ynn_conv = any("__ynn" in l and "conv_general_dilated" in l for l in text.splitlines())
print("FLAGS", os.environ.get("XLA_FLAGS", ""))
print("YNN_CONV", ynn_conv)
print("WARNED", any("already exists" in str(c.message) for c in caught))
"""


def _probe(mode: str, **env: str) -> dict[str, str]:
    clean = {
        k: v for k, v in run_env().items() if k not in ("XLA_FLAGS", xla_cpu.OPT_OUT)
    }
    proc = python(["-c", PROBE, mode], env=dict(clean, **env), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        out[key] = value
    return out


def test_flag_is_added_once_and_the_users_choice_wins():
    env: dict[str, str] = {}
    once = xla_cpu.with_defaults("--xla_cpu_enable_fast_math=false", env)
    assert once.split() == ["--xla_cpu_enable_fast_math=false", xla_cpu.FLAG]
    assert xla_cpu.with_defaults(once, env) == once
    own = f"{xla_cpu.FLAG_NAME}=LIBRARY_FUSION_TYPE_REDUCE"
    assert xla_cpu.with_defaults(own, env) == own
    assert xla_cpu.with_defaults("", {xla_cpu.OPT_OUT: "0"}) == ""


def test_importing_models_leaves_the_environment_alone():
    out = _probe("import-only")
    assert out["FLAGS"] == ""
    assert out["YNN_CONV"] == "True"
    assert out["WARNED"] == "False"


def test_apply_takes_convolutions_off_ynnpack():
    out = _probe("models-first")
    assert xla_cpu.FLAG in out["FLAGS"].split()
    assert out["YNN_CONV"] == "False"
    assert out["WARNED"] == "False"


def test_opting_out_keeps_xlas_default():
    out = _probe("models-first", **{xla_cpu.OPT_OUT: "0"})
    assert out["FLAGS"] == ""
    assert out["YNN_CONV"] == "True"  # so the check above is not vacuous


def test_too_late_to_set_it_is_said_not_silent():
    out = _probe("jax-first")
    assert out["YNN_CONV"] == "True"
    assert out["WARNED"] == "True"


@pytest.mark.parametrize("version,applies", [("0.10.2", True), ("0.11.0", False)])
def test_other_jaxlib_series_are_left_alone(monkeypatch, version, applies):
    import jaxlib.version

    monkeypatch.setattr(jaxlib.version, "__version__", version)
    assert (xla_cpu.FLAG in xla_cpu.with_defaults("", {}).split()) is applies
