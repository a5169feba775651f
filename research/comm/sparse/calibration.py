"""The sparse cost model's parameters: measured on first use, cached, agreed.

``sparse_allreduce(..., algorithm="auto")`` ranks the algorithms with the
model of :mod:`research.comm.sparse.cost`, whose parameters depend on the
machine, the MPI library, the rank count and how many nodes the ranks span.
:func:`agreed_model` gets them once per communicator (collective; rank 0
decides and broadcasts, so every rank chooses alike):

* ``$RESEARCH_SPARSE_COST=PATH``: that file (measured and written there when
  it does not exist yet); ``$RESEARCH_SPARSE_COST=defaults``: :data:`DEFAULTS`;
* otherwise the cache, ``$XDG_CACHE_HOME/research`` (``~/.cache/research``):
  ``sparse_cost_<P>_<key>.json``, the key a hash of the machine (CPU model,
  logical cores), the MPI library's version string, P and the node count, all
  recorded in the file. Another machine or another MPI has another key, so it
  is measured afresh; a file whose recorded key differs is not used.
* No file yet: every rank measures briefly (:func:`calibrate` with
  :data:`QUICK_REPS` timed repetitions: 0.65 s at 2 ranks and 1.2 s at 4 on
  a 2-core machine, against 1.3 and 1.7 s with the full 9),
  once per machine, MPI and P; rank 0 saves it and the run goes on. Nothing
  is printed.
* It cannot be measured or saved (an unwritable cache: the measured model is
  still used for this run), or the environment says ``defaults``:
  :data:`DEFAULTS`, silently. The model a run used, with where it came from,
  is in its ``summary.json`` (``sparse_cost_model``).

``python -m scripts.calibrate_sparse`` measures with the full settings (9
repetitions) and writes the same file; the SparCML study does that for every
rank count it runs at (:func:`ensure_calibrated`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from research.comm.sparse.cost import DEFAULTS, CostModel
from research.provenance import cpu_model

_ENV = "RESEARCH_SPARSE_COST"
#: Timed repetitions of the brief first-use calibration and of the full one.
QUICK_REPS, FULL_REPS = 3, 9


def _mpi_library() -> str:
    from mpi4py import MPI

    return MPI.Get_library_version().strip().splitlines()[0].strip()


def cache_key(size: int, nodes: int = 1) -> dict[str, Any]:
    """What a calibration is valid for: machine, MPI library, ranks, nodes."""
    return {
        "machine": f"{cpu_model()} ({os.cpu_count()} logical cores, "
        f"{platform.machine()})",
        "mpi": _mpi_library(),
        "size": int(size),
        "nodes": int(nodes),
    }


def default_path(size: int, key: dict[str, Any] | None = None) -> Path | None:
    """``$RESEARCH_SPARSE_COST`` (None when it says ``defaults``), else the
    cache file for ``key`` (default: :func:`cache_key` of ``size`` on one node)."""
    env = os.environ.get(_ENV)
    if env:
        return None if env.strip().lower() == "defaults" else Path(env)
    key = key or cache_key(size)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "research" / f"sparse_cost_{size}_{digest[:12]}.json"


def read_model(path: Path, key: dict[str, Any] | None = None) -> CostModel | None:
    """The model saved at ``path``; None if it is missing, unreadable, or
    measured for another key (machine, MPI, ranks, nodes)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if key is not None and "key" in data and data["key"] != key:
        return None
    fields = {f.name for f in dataclasses.fields(CostModel)} - {"source"}
    try:
        known = {k: float(data[k]) for k in fields if k in data}
        return CostModel(**known, source=str(path))
    except (TypeError, ValueError):
        return None


def load_model(size: int, path: str | os.PathLike | None = None) -> CostModel:
    """The saved model for ``size`` ranks on this machine and MPI (one node),
    or :data:`DEFAULTS`; no collective, nothing measured, nothing printed."""
    p = Path(path) if path is not None else default_path(size)
    found = None if p is None else read_model(p, None if path else cache_key(size))
    return found or DEFAULTS


def _nodes(comm) -> int:
    return len(set(comm.allgather(socket.gethostname())))


def _save(model: CostModel, path: Path, key: dict[str, Any]) -> str | None:
    """Write ``model`` to ``path`` atomically; the reason when it cannot be."""
    record = dataclasses.asdict(model) | {
        "key": key,
        "size": key["size"],
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(path)
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    return None


def ensure_calibrated(comm, say=None, *, quick: bool = False) -> Path | None:
    """Measure the model for ``comm`` unless a valid one is saved (collective).

    Rank 0 looks for :func:`default_path`; where there is none, every rank of
    ``comm`` calibrates and rank 0 saves it, saying so through ``say`` (a
    print-like function, None: silent). Returns the path (None: defaults).
    """
    key = cache_key(comm.Get_size(), _nodes(comm))
    path = default_path(comm.Get_size(), key)
    missing = comm.bcast(
        path is not None and read_model(path, key) is None
        if comm.Get_rank() == 0
        else None
    )
    if missing:
        if say is not None and comm.Get_rank() == 0:
            say(
                f"sparse cost model: no calibration for {comm.Get_size()} ranks at "
                f"{path}; calibrating now (a few seconds)"
            )
        calibrate(comm, path, reps=QUICK_REPS if quick else FULL_REPS, key=key)
    return path


_agreed: dict[tuple[int, int], CostModel] = {}
_agreed_lock = threading.Lock()


def agreed_model(comm) -> CostModel:
    """The model every rank of ``comm`` uses (see the module docstring):
    loaded, or measured briefly on first use, by rank 0's decision, and
    broadcast. Collective on the first call per communicator."""
    ident = (comm.py2f(), comm.Get_size())
    with _agreed_lock:
        if ident in _agreed:
            return _agreed[ident]
        key = cache_key(comm.Get_size(), _nodes(comm))
        path = default_path(comm.Get_size(), key)
        model = None
        if comm.Get_rank() == 0:
            model = DEFAULTS if path is None else read_model(path, key)
        model = comm.bcast(model, root=0)
        if model is None:  # nothing valid saved: measure now, briefly
            model = calibrate(comm, path, reps=QUICK_REPS, key=key)
        _agreed[ident] = model
        return model


def cached_model(comm) -> CostModel | None:
    """The model :func:`agreed_model` gave ``comm``, if it was asked for one
    (no collective)."""
    return _agreed.get((comm.py2f(), comm.Get_size()))


def _fit(sizes: Sequence[float], times: Sequence[float]) -> tuple[float, float]:
    # Latency from the smallest message; per-byte cost from a least-squares
    # slope through it (an unconstrained intercept is mostly noise).
    alpha = max(float(times[0]), 1e-7)
    x = np.asarray(sizes, float) - sizes[0]
    y = np.asarray(times, float) - times[0]
    return alpha, max(float(x @ y / (x @ x)), 1e-13)


def _best_time(fn, reps: int, sync=None) -> float:
    """The fastest of ``reps`` timed calls. Not the median: on a shared machine
    noise only ever adds time (a partner not yet scheduled made a 64-byte
    exchange's median 1.3 ms here under load, 29 us in a calmer calibration), and
    the model must rank algorithms by what the link and the CPU can do."""
    fn()  # warm-up: first-touch pages, connections
    ts = []
    for _ in range(reps):
        if sync is not None:
            sync()  # start together, outside the timed region
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.min(ts))


def calibrate(
    comm,
    path: str | os.PathLike | None = None,
    *,
    reps: int = FULL_REPS,
    save: bool = True,
    key: dict[str, Any] | None = None,
) -> CostModel:
    """Measure the model's parameters on ``comm`` (collective, a few seconds).

    Every rank measures; the slowest rank's figure of each parameter is kept
    (bulk-synchronous collectives wait for it), so all ranks return the same
    model. Rank 0 writes it to ``path`` (default :func:`default_path`); where
    it cannot, the model is still returned, its ``source`` saying why.
    """
    from mpi4py import MPI

    from research.comm.sparse.vector import SparseVector, merge

    rank, size = comm.Get_rank(), comm.Get_size()
    if key is None:
        key = cache_key(size, _nodes(comm))
    rng = np.random.default_rng(rank)
    partner = rank ^ 1
    sizes = [64, 2**14, 2**18, 2**21, 2**23]
    p2p = []
    for nbytes in sizes:
        buf, out = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)

        def exchange(buf=buf, out=out):
            if partner < size:
                comm.Sendrecv(buf, partner, 7, out, partner, 7)

        p2p.append(_best_time(exchange, reps, comm.Barrier) if size > 1 else 0.0)
    # Up to 64 MB: per byte, large allreduces cost more than small ones here
    # (a 102 MB one took 3x what a line through 16 MB predicted).
    ar_sizes = [2, 2**16, 2**20, 2**22, 2**24]
    ar = []
    for n in ar_sizes:
        x = np.ones(n, np.float32)

        def allreduce(x=x):
            comm.Allreduce(MPI.IN_PLACE, x, MPI.SUM)

        ar.append(_best_time(allreduce, reps, comm.Barrier))
    # Float32 and sorted indices, as gradients arrive; the scatter at 1/8
    # density, where the choice between dense and split algorithms is made
    # (sparser scatters touch a cache line per element and cost more each).
    dim, n = 2**22, 2**17

    def sparse(k: int) -> SparseVector:
        idx = np.sort(rng.choice(dim, k, replace=False))
        return SparseVector(idx, rng.random(k, dtype=np.float32), dim)

    a, b = sparse(n), sparse(n)
    gamma = _best_time(lambda: merge(a, b), reps) / (2 * n)
    acc, c = np.zeros(dim, np.float32), sparse(dim // 8)

    def scatter_add():
        acc[c._indices] += c.values

    delta = _best_time(scatter_add, reps) / c.nnz
    big = np.ones(2**23, np.uint8)
    copy = _best_time(lambda: np.concatenate([big, big]), reps) / (2 * big.nbytes)
    alpha, beta = _fit(sizes, p2p) if size > 1 else (DEFAULTS.alpha, DEFAULTS.beta)
    ar_alpha, ar_beta = _fit([4 * n for n in ar_sizes], ar)
    mine = np.array([alpha, beta, gamma, delta, ar_alpha, ar_beta, copy])
    comm.Allreduce(MPI.IN_PLACE, mine, MPI.MAX)
    p = Path(path) if path is not None else default_path(size, key)
    how = f"measured {time.strftime('%Y-%m-%d')}, {reps} repetitions"
    problem = None
    if save and rank == 0 and p is not None:
        model = CostModel(*(float(v) for v in mine), source=str(p))
        problem = _save(model, p, key)
    problem = comm.bcast(problem, root=0)
    source = f"{p}" if p is not None and save and not problem else how
    if problem:
        source = f"{how}, not saved ({problem})"
    comm.Barrier()
    return CostModel(*(float(v) for v in mine), source=source)


def record(model: CostModel) -> dict[str, Any]:
    """The model as ``summary.json`` keeps it: its parameters and source."""
    return dataclasses.asdict(model)
