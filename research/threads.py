"""Compute threads per rank: the variables and XLA flags that size XLA:CPU's pools.

``--threads`` is set before JAX creates its CPU client, through the variables
XLA:CPU really reads (:func:`thread_env`); :func:`xla_compute_threads` counts
what a process got. On GPUs the CPU-only flags are left out.
"""

from __future__ import annotations

import os

#: Environment variables that size XLA:CPU's intra-op thread pool. The PJRT CPU
#: client makes its Eigen pool with ``PJRT_NPROC`` (else ``NPROC``) threads, else
#: one per schedulable CPU; XLA has no command-line flag for it. Measured on the
#: 2-core machine, one 2048x2048 float32 matmul: NPROC=1 208 ms at 1.00 CPU
#: seconds per wall second, NPROC=2 97 ms at 1.97, unset 93 ms at 1.95; the
#: process then has exactly N ``tf_XLAEigen`` threads (tests/test_threads.py).
THREAD_ENV_VARS = ("PJRT_NPROC", "NPROC")
_BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# Tokens earlier versions put into XLA_FLAGS; not XLA flags (a bare token is read
# as a flag-file name and XLA aborts at start-up), so they are dropped.
_STALE_TOKENS = ("intra_op_parallelism_threads",)


#: XLA:CPU settings this module adds (one Eigen thread); with the models'
#: XLA:CPU defaults, taken out again where the ranks run on GPUs.
_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false"


def xla_thread_flags(
    threads: int, model_flags: bool = True, platform: str | None = None
) -> str:
    """XLA_FLAGS for ``threads`` per rank: the inherited flags, with
    ``--xla_cpu_multi_thread_eigen=false`` added for one thread (0: untouched),
    and the models' XLA:CPU defaults (``models.xla_cpu``) unless opted out or
    ``model_flags`` is False (a process that runs no model: nothing of
    ``models`` is imported then).

    Those are CPU settings: where this node's ranks will run on GPUs
    (``platform``, else :func:`research.comm.process.devices.planned_platform`) the
    ones this project adds are left out (and removed where inherited), and
    XLA's own GPU defaults stand.
    """
    if platform is None:
        from research.comm.process.devices import planned_platform

        platform = planned_platform()[0]
    flags = [
        f
        for f in os.environ.get("XLA_FLAGS", "").split()
        if not f.startswith(_STALE_TOKENS)
        and not (threads > 0 and f.startswith("--xla_cpu_multi_thread_eigen"))
    ]
    if platform != "cpu":
        if model_flags:
            from models.xla_cpu import FLAG

            flags = [f for f in flags if f != FLAG]
        return " ".join(f for f in flags if f != _ONE_THREAD)
    if threads == 1:
        flags.append(_ONE_THREAD)
    if not model_flags:
        return " ".join(flags)
    from models.xla_cpu import with_defaults

    return with_defaults(" ".join(flags))


def thread_env(threads: int, model_flags: bool = True) -> dict[str, str]:
    """Environment that gives each rank ``threads`` compute threads (0: XLA's default).

    XLA:CPU's intra-op pool is sized by ``PJRT_NPROC``/``NPROC`` (see
    :data:`THREAD_ENV_VARS`); BLAS and OpenMP pools by their own variables.
    ``model_flags``: as in :func:`xla_thread_flags`.
    """
    env = {"XLA_FLAGS": xla_thread_flags(threads, model_flags)}
    if threads > 0:
        for var in (*THREAD_ENV_VARS, *_BLAS_VARS):
            env[var] = str(threads)
    return env


def check_xla_flags(flags: str | None = None) -> str | None:
    """A one-line problem with XLA_FLAGS (a token not starting with ``--``), or None."""
    flags = os.environ.get("XLA_FLAGS", "") if flags is None else flags
    bad = [f for f in flags.split() if not f.startswith("--")]
    if bad:
        return (
            f"XLA_FLAGS holds {bad[0]!r}, which is not an XLA flag (every token "
            "must start with --; XLA would read it as a flag file and abort)"
        )
    return None


def xla_compute_threads() -> int | None:
    """Threads of XLA:CPU's intra-op pool in this process, counted in /proc.

    The pool's threads are named ``tf_XLAEigen``; None where /proc is missing.
    Counts only once JAX has made its CPU client (after the first computation).
    """
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    n = 0
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                n += f.read().strip() == "tf_XLAEigen"
        except OSError:  # the thread ended meanwhile
            continue
    return n


def set_threads(threads: int) -> None:
    """Apply :func:`thread_env` to this process (before JAX makes its CPU client)."""
    os.environ.update(thread_env(threads))
