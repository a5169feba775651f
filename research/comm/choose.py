"""Which allreduce a dense averager runs: the ring, MPI's own, or the faster one.

The ``native`` option of the ``fused`` and ``host`` strategies:

* ``"auto"`` (the default): where every rank can load the ring
  (:func:`research.comm.ring.decide`), the first call times a whole average
  of the real buckets both ways, as the averager would run it (inside ``jit``
  for ``fused``: both programs compiled and run on zeros of the gradient's
  shapes while the step is traced; on the gradient itself for ``host``). Each
  runs twice untimed (compilation, page faults, and the second sizes the
  count), then at least ``MIN_REPS`` times interleaved, more for small
  gradients up to ``MAX_REPS`` or ``BUDGET_S``; the fastest call is kept per
  rank. The ranks agree on the slowest rank's figures (one
  ``MPI_Allreduce(MAX)``), and the faster path is kept for the rest of the
  run. Both figures and the choice are recorded in the averager's
  ``allreduce_choice`` (``config.json``, ``summary.json``);
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
from collections.abc import Callable
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
    paths: dict[str, Callable[[], Any]],
    *,
    nbytes: int,
    buffers: int,
) -> dict[str, Any]:
    """Time both paths and keep the faster (collective over ``comm``).

    Args:
      comm: the averager's communicator (every rank calls this together).
      decision: what :func:`agree` returned; returned unchanged unless pending.
      paths: ``{"ring": fn, "mpi": fn}``: each runs one whole average of the
        real buckets the averager's way (its packing, its dividing, its
        allreduce), and returns when it is done. Each is called once untimed
        first (compilation, first-touch page faults).
      nbytes, buffers: the size of what one call sums, for the record.

    Returns:
      The settled decision: ``ring`` chosen, ``pending`` removed, and
      ``measured`` holding ``ring_s``, ``mpi_s`` (the slowest rank's fastest
      call of each), ``bytes``, ``buckets`` and ``reps``.
    """
    if not decision.get("pending"):
        return decision
    from mpi4py import MPI

    def timed(fn: Callable[[], Any]) -> float:
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    for fn in paths.values():
        fn()  # compiled, warm
    # As many calls as the budget allows, the same count on every rank (the
    # calls are collective): sized from the slowest rank's second call.
    warm = comm.allreduce(max(timed(fn) for fn in paths.values()), op=MPI.MAX)
    reps = int(min(MAX_REPS, max(MIN_REPS, BUDGET_S // max(2 * warm, 1e-9))))
    best = {name: np.inf for name in paths}
    for _ in range(reps):  # interleaved: a load spike hits both alike
        for name, fn in paths.items():
            best[name] = min(best[name], timed(fn))
    mine = np.array([best["ring"], best["mpi"]])
    slowest = np.empty_like(mine)
    comm.Allreduce(mine, slowest, op=MPI.MAX)
    ring_s, mpi_s = float(slowest[0]), float(slowest[1])
    use_ring = ring_s <= mpi_s
    out = {k: v for k, v in decision.items() if k != "pending"}
    out["ring"] = use_ring
    out["reason"] = (
        f"native=auto: {'ring' if use_ring else 'MPI_Allreduce'} kept, "
        f"ring {ring_s * 1e3:.2f} ms vs MPI_Allreduce {mpi_s * 1e3:.2f} ms "
        f"for {nbytes / 1e6:.1f} MB in {buffers} buffers (slowest rank, "
        f"fastest of {reps})"
    )
    out["measured"] = {
        "ring_s": ring_s,
        "mpi_s": mpi_s,
        "bytes": int(nbytes),
        "buckets": int(buffers),
        "reps": reps,
    }
    return out


def adopt(decision: dict[str, Any], recorded: dict[str, Any] | None) -> dict[str, Any]:
    """``decision`` settled as ``recorded`` says, where ``native=auto`` has not
    measured yet: a resumed run takes the path the interrupted one took, so it
    continues bit for bit (the two paths sum in different orders, which differ
    in the last bit at rank counts that are not powers of two).

    ``recorded`` is a settled decision of an earlier run with the same
    configuration (from a checkpoint: the same on every rank). Unchanged when
    nothing is pending, nothing usable is recorded, or the ring was recorded
    but cannot be used here.
    """
    if not decision.get("pending") or not recorded or "ring" not in recorded:
        return decision
    if recorded.get("pending"):
        return decision
    use_ring = bool(recorded["ring"]) and bool(decision["ring"])
    out = {k: v for k, v in decision.items() if k != "pending"}
    out["ring"] = use_ring
    out["measured"] = recorded.get("measured")
    path = "ring" if use_ring else "MPI_Allreduce"
    out["reason"] = f"native=auto: {path}, as the run this one resumes took"
    return out
