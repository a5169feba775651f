"""XLA:CPU settings the models train fast with, applied by the project's entry points.

jaxlib 0.10's XLA:CPU hands convolutions, dots and reductions to YNNPACK by
default, and its YNNPACK convolutions run on one thread: on the 2-core machine a
1x1 256->64 convolution at 28x28 (batch 16) took 4.07 ms with both cores and
4.08 ms pinned to one (``taskset``), a 3x3 64->64 one 6.3 and 6.7 ms, while XLA's
Eigen convolution, which uses the intra-op pool, took 2.4-2.6 and 3.5-3.8 ms.
So :data:`FLAG` keeps YNNPACK for reductions and single dots, where it is fast,
and leaves convolutions to Eigen. Whole training steps
(``scripts/bench_compute.py --no-torch``, median of 7, back to back, load
1.1-2.1; ``RESEARCH_XLA_DEFAULTS=0`` for XLA's default):

=========  ===========  ================================  =================
model      XLA default  reductions + dots to YNNPACK      nothing to YNNPACK
=========  ===========  ================================  =================
ResNet-50  1045 ms      799 ms                            1743 ms
VGG-16     812 ms       651 ms                            840 ms
=========  ===========  ================================  =================

(The last column from an earlier run.) With one compute thread per rank
(``--threads 1``, as MPI runs on few cores use) it helps too: ResNet-50 1684 ->
1412 ms, VGG-16 1956 -> 1644 ms.

The flag goes into ``XLA_FLAGS``, which XLA reads once, when JAX makes its CPU
client. Importing ``models`` does not touch the environment (a library must not
change its caller's numerics): the launchers put it into their ranks'
environment (``research.threads.thread_env``) and the experiments and benchmarks
call :func:`apply` before any computation; a warning says so if JAX was
already running. It is left out where the user's
``XLA_FLAGS`` already sets ``--xla_cpu_experimental_ynn_fusion_type`` (their
choice wins), where ``RESEARCH_XLA_DEFAULTS=0``, and for a jaxlib outside the
series it was measured on (an unknown flag makes XLA abort at start-up).
"""

from __future__ import annotations

import os
import warnings

FLAG_NAME = "--xla_cpu_experimental_ynn_fusion_type"
FLAG = f"{FLAG_NAME}=LIBRARY_FUSION_TYPE_REDUCE,LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"
#: ``RESEARCH_XLA_DEFAULTS=0`` leaves XLA_FLAGS as the user set it.
OPT_OUT = "RESEARCH_XLA_DEFAULTS"
#: The jaxlib series whose XLA has the flag and where it was measured.
JAXLIB_SERIES = ((0, 10),)


def _jaxlib_series() -> tuple[int, int] | None:
    try:
        import jaxlib.version
    except ImportError:
        return None
    parts = jaxlib.version.__version__.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def with_defaults(flags: str, environ: dict[str, str] | None = None) -> str:
    """``flags`` (an XLA_FLAGS value) with :data:`FLAG` added where it applies."""
    environ = os.environ if environ is None else environ
    tokens = flags.split()
    if environ.get(OPT_OUT, "1") == "0":
        return flags
    if any(t.split("=", 1)[0] == FLAG_NAME for t in tokens):
        return flags
    if _jaxlib_series() not in JAXLIB_SERIES:
        return flags
    return " ".join([*tokens, FLAG])


def _backend_started() -> bool:
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - jax moved it; assume not started
        return False
    started = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(started and started())


def apply() -> bool:
    """Adds :data:`FLAG` to ``os.environ["XLA_FLAGS"]``; True if it will take effect."""
    current = os.environ.get("XLA_FLAGS", "")
    wanted = with_defaults(current)
    if wanted == current:
        return FLAG in current.split()
    if _backend_started():
        warnings.warn(
            "models: JAX's CPU client already exists, so XLA_FLAGS can no longer "
            f"take {FLAG} (convolutions stay on single-threaded YNNPACK, about 1.3x "
            "slower steps); import models before running any JAX computation",
            stacklevel=3,
        )
        return False
    os.environ["XLA_FLAGS"] = wanted
    return True
