"""Which allreduce a dense averager runs: the ring, MPI's own, or the faster one.

The ``native`` option of the ``fused`` and ``host`` strategies:

* ``"auto"`` (the default): where every rank can load the ring
  (:func:`research.comm.ring.decide`), the first call with real buckets times
  both allreduces on buffers of those buckets' sizes and dtypes (each warmed
  once, then at least ``MIN_REPS`` interleaved calls, more for small buffers
  up to ``MAX_REPS`` or ``BUDGET_S``; the fastest kept per rank), the ranks
  agree on the slowest rank's figures (one ``MPI_Allreduce(MAX)``), and the
  faster path is kept for the rest of the run. Both figures and the choice are
  recorded in the averager's ``allreduce_choice`` (``config.json``,
  ``summary.json``);
* ``True``: the ring wherever every rank can load it (else MPI's, with the
  reason);
* ``False``: MPI's own allreduce (``MPI_Allreduce`` through mpi4jax inside
  ``jit``, mpi4py on the host path).

Why measure: on one machine the ring avoids MPICH's page-faulting temporaries
and wins; on a cluster a flat ring of blocking ``Sendrecv`` usually loses to a
vendor MPI's tuned or hierarchical allreduce. Which one wins depends on the MPI,
the network, the rank count and the bucket sizes, all known only at run time.

Every rank must take the same path, or one waits in ``MPI_Allreduce`` while
another waits in the ring's ``Sendrecv``: the decision is collective (over the
averager's own communicator), made once per averager, and the figures it is
made from are the same on every rank after the ``MAX`` reduction.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from research.comm import ring

#: Accepted values of ``native``.
NATIVE_VALUES = (True, False, "auto")
#: Timed calls per path (after one warm-up call each; the fastest is kept):
#: at least MIN_REPS, and for fast calls as many as fit in BUDGET_S, at most
#: MAX_REPS (a 0.3 ms allreduce varies by tens of percent from call to call).
MIN_REPS, MAX_REPS, BUDGET_S = 3, 30, 0.05


def check_native(native: Any) -> bool | str:
    """``native`` if it is one of :data:`NATIVE_VALUES`, else a ValueError."""
    if native is True or native is False or native == "auto":
        return native
    raise ValueError(f"native must be true, false or 'auto', got {native!r}")


def agree(comm: Any, native: bool | str) -> dict[str, Any]:
    """The path every rank of ``comm`` takes, or ``pending`` for :func:`settle`.

    Collective over ``comm`` when there is more than one rank and ``native``
    is not False (every rank builds its averagers in the same order).

    Returns:
      ``{"ring": bool, "native": native, "reason": str | None, ...}``, the same
      on every rank; with ``"pending": True`` when ``native="auto"`` and the
      ring is usable, until :func:`settle` has timed both paths.
    """
    native = check_native(native)
    if comm is None:
        return {"ring": False, "native": native, "reason": "one rank: no communication"}
    if native is False:
        return {
            "ring": False,
            "native": False,
            "reason": "native=false: MPI_Allreduce forced",
        }
    decision = dict(ring.decide(comm), native=native)
    if not decision["ring"]:
        return decision
    if native is True:
        decision["reason"] = "native=true: the ring forced"
        return decision
    decision["pending"] = True
    decision["reason"] = "native=auto: both timed on the first call"
    return decision


def settle(
    comm: Any,
    decision: dict[str, Any],
    buckets: list[tuple[int, Any]],
    *,
    in_place: bool,
    divisor: int,
) -> dict[str, Any]:
    """Time both allreduces on ``buckets`` and keep the faster (collective).

    Args:
      comm: the averager's communicator (every rank calls this together).
      decision: what :func:`agree` returned; returned unchanged unless pending.
      buckets: ``(count, dtype)`` of every buffer one call sums, in order.
      in_place: whether the averager sums in place (the source is the result)
        or from the caller's buffer into its own (mpi4jax inside ``jit``).
      divisor: the ring folds the mean into its last step (floats only).

    Returns:
      The settled decision: ``ring`` chosen, ``pending`` removed, and
      ``measured`` holding ``ring_s``, ``mpi_s`` (the slowest rank's fastest
      call of each), ``bytes``, ``buckets`` and ``reps``.
    """
    if not decision.get("pending"):
        return decision
    from mpi4py import MPI

    dst = [np.zeros(count, dtype) for count, dtype in buckets]
    src = dst if in_place else [np.ones(count, dtype) for count, dtype in buckets]

    def run_ring() -> None:
        for s, d in zip(src, dst):
            floats = not np.issubdtype(d.dtype, np.integer)
            ring.host_allreduce(s, d, comm=comm, divisor=divisor if floats else 1)

    def run_mpi() -> None:
        for s, d in zip(src, dst):
            comm.Allreduce(MPI.IN_PLACE if in_place else s, d, op=MPI.SUM)

    paths = {"ring": run_ring, "mpi": run_mpi}

    def timed(fn: Any) -> float:
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    warm = max(timed(fn) for fn in paths.values())  # pages, caches
    # The same count on every rank (the calls are collective): from the
    # slowest rank's warm-up.
    warm = comm.allreduce(warm, op=MPI.MAX)
    reps = int(min(MAX_REPS, max(MIN_REPS, BUDGET_S // max(2 * warm, 1e-9))))
    best = {name: np.inf for name in paths}
    for _ in range(reps):  # interleaved: a load spike hits both alike
        for name, fn in paths.items():
            best[name] = min(best[name], timed(fn))
    mine = np.array([best["ring"], best["mpi"]])
    slowest = np.empty_like(mine)
    comm.Allreduce(mine, slowest, op=MPI.MAX)
    ring_s, mpi_s = float(slowest[0]), float(slowest[1])
    nbytes = sum(d.nbytes for d in dst)
    use_ring = ring_s <= mpi_s
    out = {k: v for k, v in decision.items() if k != "pending"}
    out["ring"] = use_ring
    out["reason"] = (
        f"native=auto: {'ring' if use_ring else 'MPI_Allreduce'} kept, "
        f"ring {ring_s * 1e3:.2f} ms vs MPI_Allreduce {mpi_s * 1e3:.2f} ms "
        f"for {nbytes / 1e6:.1f} MB in {len(dst)} buffers (slowest rank, "
        f"fastest of {reps})"
    )
    out["measured"] = {
        "ring_s": ring_s,
        "mpi_s": mpi_s,
        "bytes": int(nbytes),
        "buckets": len(dst),
        "reps": reps,
        "in_place": bool(in_place),
    }
    return out


def bucket_specs(plan: Any) -> list[tuple[int, Any]]:
    """``(count, dtype)`` of every bucket of a fusion plan."""
    return [(b.size, b.dtype) for b in plan.buckets]
