"""Which allreduce a dense averager runs: the ring, MPI's own, hierarchical, or
the fastest of them.

The ``allreduce`` option of the ``fused`` and ``host`` strategies:

* ``"auto"`` (the default): the candidates are MPI's own allreduce, the ring
  (where every rank can load it, :func:`research.comm.dense.ring.decide`) and the
  hierarchical allreduce (where the ranks span more than one node and some node
  holds more than one rank: elsewhere it is one of the other two). With more
  than one candidate the first call times a whole average of the real buckets
  each way, as the averager would run it (inside ``jit`` for ``fused``: each
  program compiled and run on zeros of the gradient's shapes while the step is
  traced; on the gradient itself for ``host``). Each runs once untimed
  (compilation, page faults), once more to size the count, then at least
  ``MIN_REPS`` times interleaved, more for small gradients up to ``MAX_REPS`` or
  ``BUDGET_S``; the fastest call is kept per rank. The ranks agree on the
  slowest rank's figures (one ``MPI_Allreduce(MAX)``) and the fastest path is
  kept for the rest of the run. The figures and the choice are recorded in the
  averager's ``allreduce_choice`` (``config.json``, ``summary.json``);
* ``"ring"``: this project's segmented ring (:mod:`research.comm.dense.ring`)
  wherever every rank can load it (else MPI's, with the reason); on GPU
  arrays staged through host memory by XLA's host callback (``"staged":
  true`` in the record). Staged, it is not a candidate of ``auto`` yet: it
  has not run on a GPU (the next lent GPU times it,
  ``scripts.bench_allreduce``'s ``fused-ring``);
* ``"mpi"``: MPI's own allreduce (``MPI_Allreduce`` through mpi4jax inside
  ``jit``, mpi4py on the host path);
* ``"hierarchical"``: reduce within each node (shared memory), allreduce among
  one leader per node (the network), broadcast within the node
  (:mod:`research.comm.dense.hierarchical`);
* ``"xla"``: XLA's own collectives across the processes (NCCL on GPUs, gloo on
  the CPU; :mod:`research.comm.dense.xla`): a candidate of ``auto``
  where JAX's distributed runtime runs, which the Trainer starts on GPUs with
  one rank each (on the CPU gloo took 4x the ring: named, not timed).

Why measure: on one machine the ring avoids MPICH's page-faulting temporaries
and wins; across nodes a flat ring sends every byte over the network 2(P-1)/P
times while the hierarchical one sends the node's sum once; a vendor MPI's tuned
allreduce may beat both. Which wins depends on the MPI, the network, the layout
of ranks on nodes and the bucket sizes, all known only at run time.

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

from research.comm.dense import ring

#: The allreduce paths a dense averager can take.
PATHS = ("ring", "mpi", "hierarchical", "xla")
#: Accepted values of ``allreduce``.
ALLREDUCE_VALUES = ("auto", *PATHS)
#: Timed calls per path (after one warm-up call each; the fastest is kept):
#: at least MIN_REPS, and for fast calls as many as fit in BUDGET_S, at most
#: MAX_REPS (a 0.3 ms allreduce varies by tens of percent from call to call).
MIN_REPS, MAX_REPS, BUDGET_S = 3, 30, 0.05
#: How the ring runs where the buffers are not host memory (a GPU's).
STAGED = "staged through host memory by XLA's host callback"
_LABEL = {
    "ring": "ring",
    "mpi": "MPI_Allreduce",
    "hierarchical": "hierarchical",
    "xla": "XLA collectives",
}


def check_allreduce(value: Any) -> str:
    """``value`` as one of :data:`ALLREDUCE_VALUES`, else a ValueError."""
    if isinstance(value, str) and value.lower() in ALLREDUCE_VALUES:
        return value.lower()
    raise ValueError(
        f"allreduce must be one of {', '.join(ALLREDUCE_VALUES)}, got {value!r}"
    )


def hierarchical_differs(topology: Any) -> bool:
    """Whether the hierarchical allreduce is a path of its own for ``topology``:
    more than one node, and some node with more than one rank."""
    if topology is None:
        return False
    return topology.nodes > 1 and max(topology.node_sizes) > 1


def agree(
    comm: Any, allreduce: str, topology: Any = None, host_memory: bool = False
) -> dict[str, Any]:
    """The path every rank of ``comm`` takes, or ``pending`` for :func:`settle`.

    Collective over ``comm`` when there is more than one rank and the ring may
    be used (every rank builds its averagers in the same order).

    Args:
      comm: the averager's communicator (None: one rank).
      allreduce: one of :data:`ALLREDUCE_VALUES`.
      topology: the world's :class:`~research.comm.world.Topology` (None:
        unknown, the hierarchical path is not a candidate of ``auto``).
      host_memory: the averager sums host (numpy) buffers whatever JAX's
        platform, so the ring serves it on GPUs too (copied to the host).

    Returns:
      ``{"path": ..., "ring": bool, "allreduce": allreduce, "reason": str |
      None, "candidates": [...], ...}``, the same on every rank; with
      ``"pending": True`` when ``auto`` has several candidates, until
      :func:`settle` has timed them.
    """
    allreduce = check_allreduce(allreduce)
    base = {"allreduce": allreduce, "native": _native_of(allreduce)}
    if comm is None:
        return _path("mpi", base, "one rank: no communication", ["mpi"])
    if allreduce == "mpi":
        return _path("mpi", base, "allreduce=mpi: MPI_Allreduce forced", ["mpi"])
    if allreduce == "hierarchical":
        why = "allreduce=hierarchical: forced"
        return _path("hierarchical", base, why, ["hierarchical"])
    from research.comm.dense import xla as xla_collective

    if allreduce == "xla":
        if not xla_collective.running():
            why = xla_collective.status().get("reason") or (
                "JAX's distributed runtime is not running (start it with "
                "research.comm.dense.xla.start(world) before any JAX array)"
            )
            raise ValueError(f"allreduce=xla: {why}")
        return _path("xla", base, "allreduce=xla: XLA's collectives forced", ["xla"])
    decision = ring.decide(comm, "cpu" if host_memory else None)
    base["notes"] = decision.get("notes", [])
    staged = decision["ring"] and decision["staged"]
    if allreduce == "ring":
        if decision["ring"]:
            why = "allreduce=ring: the ring forced"
            if staged:
                base["staged"] = True
                why += f"; {STAGED}"
            return _path("ring", base, why, ["ring"])
        return _path("mpi", base, decision["reason"], ["mpi"])
    # Staged, the ring is not timed by auto until it has run on a GPU.
    candidates = ["ring"] if decision["ring"] and not staged else []
    candidates.append("mpi")
    if hierarchical_differs(topology):
        candidates.append("hierarchical")
    if xla_collective.running():
        candidates.append("xla")
    if len(candidates) == 1:
        why = decision["reason"]
        if staged:
            why = f"the ring would be {STAGED}: not a candidate of auto until "
            why += "measured on a GPU (allreduce=ring forces it)"
        return _path("mpi", base, why, candidates)
    out = _path(candidates[0], base, None, candidates)
    out["pending"] = True
    out["reason"] = f"allreduce=auto: {', '.join(candidates)} timed on the first call"
    return out


def _native_of(allreduce: str) -> Any:
    """The former ``native`` value, kept in the record for older readers."""
    return {"ring": True, "mpi": False}.get(allreduce, allreduce)


def _path(path: str, base: dict, reason: str | None, candidates: list) -> dict:
    return {
        **base,
        "path": path,
        "ring": path == "ring",
        "reason": reason,
        "candidates": list(candidates),
    }


def settle(
    comm: Any,
    decision: dict[str, Any],
    paths: dict[str, Callable[[], Any]],
    *,
    nbytes: int,
    buffers: int,
) -> dict[str, Any]:
    """Time the candidate paths and keep the fastest (collective over ``comm``).

    Args:
      comm: the averager's communicator (every rank calls this together).
      decision: what :func:`agree` returned; returned unchanged unless pending.
      paths: ``{path: fn}`` for every candidate: each runs one whole average of
        the real buckets the averager's way (its packing, its dividing, its
        allreduce), and returns when it is done. Each is called once untimed
        first (compilation, first-touch page faults).
      nbytes, buffers: the size of what one call sums, for the record.

    Returns:
      The settled decision: ``path`` chosen, ``pending`` removed, and
      ``measured`` holding ``<path>_s`` for each candidate (the slowest rank's
      fastest call), ``bytes``, ``buckets`` and ``reps``.
    """
    if not decision.get("pending"):
        return decision
    from mpi4py import MPI

    names = [p for p in decision["candidates"] if p in paths]

    def timed(fn: Callable[[], Any]) -> float:
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    for name in names:
        paths[name]()  # compiled, warm
    # As many calls as the budget allows, the same count on every rank (the
    # calls are collective): sized from the slowest rank's second call.
    warm = comm.allreduce(max(timed(paths[n]) for n in names), op=MPI.MAX)
    budget = BUDGET_S // max(len(names) * warm, 1e-9)
    reps = int(min(MAX_REPS, max(MIN_REPS, budget)))
    best = {name: np.inf for name in names}
    for _ in range(reps):  # interleaved: a load spike hits all alike
        for name in names:
            best[name] = min(best[name], timed(paths[name]))
    mine = np.array([best[n] for n in names])
    slowest = np.empty_like(mine)
    comm.Allreduce(mine, slowest, op=MPI.MAX)
    times = {n: float(t) for n, t in zip(names, slowest)}
    # Ties go to the earlier candidate (ring, mpi, hierarchical, xla).
    chosen = min(names, key=lambda n: (times[n], names.index(n)))
    out = {k: v for k, v in decision.items() if k != "pending"}
    out["path"] = chosen
    out["ring"] = chosen == "ring"
    others = ", ".join(f"{_LABEL[n]} {times[n] * 1e3:.2f} ms" for n in names)
    out["reason"] = (
        f"allreduce=auto: {_LABEL[chosen]} kept ({others}) for "
        f"{nbytes / 1e6:.1f} MB in {buffers} buffers (slowest rank, fastest of "
        f"{reps})"
    )
    out["measured"] = {
        **{f"{n}_s": times[n] for n in names},
        "bytes": int(nbytes),
        "buckets": int(buffers),
        "reps": reps,
    }
    return out


def path_of(recorded: dict[str, Any]) -> str | None:
    """The path a settled record names (records before ``path`` say ``ring``)."""
    if "path" in recorded:
        return recorded["path"]
    if "ring" in recorded:
        return "ring" if recorded["ring"] else "mpi"
    return None


def adopt(decision: dict[str, Any], recorded: dict[str, Any] | None) -> dict[str, Any]:
    """``decision`` settled as ``recorded`` says, where ``auto`` has not measured
    yet: a resumed run takes the path the interrupted one took, so it continues
    bit for bit (the paths sum in different orders, which differ in the last bit
    at rank counts that are not powers of two).

    ``recorded`` is a settled decision of an earlier run with the same
    configuration (from a checkpoint: the same on every rank). Unchanged when
    nothing is pending, nothing usable is recorded, or the recorded path is not
    a candidate here (the ring unusable, or another layout of nodes).
    """
    if not decision.get("pending") or not recorded or recorded.get("pending"):
        return decision
    path = path_of(recorded)
    if path not in decision["candidates"]:
        return decision
    out = {k: v for k, v in decision.items() if k != "pending"}
    out["path"] = path
    out["ring"] = path == "ring"
    out["measured"] = recorded.get("measured")
    out["reason"] = f"allreduce=auto: {_LABEL[path]}, as the run this one resumes took"
    return out
