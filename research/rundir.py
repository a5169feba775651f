"""The run folder: config.json, metrics.jsonl, trace.json, summary.json, figures.

Only rank 0 writes the shared files; plot code reads nothing but these files.
A restarted run (``--max-restarts``) also has ``restarts.json``: one record per
restart, written by the launcher (:mod:`research.entry.restart`) and completed
by the restarted run (:mod:`research.train.restart_record`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any


def default_run_dir(experiment: str) -> str:
    """``<cwd>/runs/<experiment>-<UTC timestamp>``, absolute (the timestamp is rank
    0's): libraries handed paths below it (Orbax) refuse relative ones."""
    return os.path.abspath(
        os.path.join(
            "runs", f"{experiment}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
        )
    )


#: The packages whose versions a run records: module name, distribution name.
_VERSIONED = (
    ("jax", "jax"),
    ("jaxlib", "jaxlib"),
    ("flax", "flax"),
    ("optax", "optax"),
    ("orbax.checkpoint", "orbax-checkpoint"),
    ("mpi4py", "mpi4py"),
    ("mpi4jax", "mpi4jax"),
    ("numpy", "numpy"),
)


def versions() -> dict[str, str]:
    """The installed versions of the packages a run depends on, read from their
    distributions' metadata: a run that never checkpoints does not import Orbax
    (0.25 s of every rank 0's start) just to name its version."""
    from importlib import metadata

    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for mod, dist in _VERSIONED:
        try:
            out[mod] = metadata.version(dist)
        except metadata.PackageNotFoundError:  # a missing optional package
            out[mod] = "missing"
    try:
        from mpi4py import MPI

        out["mpi"] = MPI.Get_library_version().splitlines()[0].strip()
    except Exception:  # noqa: BLE001
        pass
    return out


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:
        return obj.item()
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON atomically (tmp + rename): a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(_jsonable(obj), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


class MetricsWriter:
    """Appends one JSON object per line to ``metrics.jsonl`` (rank 0 only)."""

    def __init__(self, run_dir: str | os.PathLike, enabled: bool = True) -> None:
        self.enabled = enabled
        path = Path(run_dir) / "metrics.jsonl"
        self._f = open(path, "a") if enabled else None  # noqa: SIM115 - kept open

    def write(self, row: dict[str, Any]) -> None:
        if self._f is not None:
            self._f.write(json.dumps(_jsonable(row)) + "\n")
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """All rows of ``metrics.jsonl``; a line cut off by a crash is skipped."""
    rows = []
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def step_medians(run_dir: str | os.PathLike, warmup: int) -> dict[str, Any]:
    """Medians of rank 0's step timings after ``warmup`` steps, any strategy.

    Read from the strategies' common keys (``research.strategies.base.PHASES``):
    ``step_s``, ``compute_s``, ``comm_s`` (communication under way) and
    ``exposed_s`` (the training thread waiting for it); None where a run did
    not separate a phase (the fused program's communication is in its compute).
    ``steps_measured`` counts the rows used.
    """
    import statistics

    # Step rows only: evaluations and a strategy's own rows have a "kind".
    rows = [r for r in read_metrics(run_dir) if not r.get("kind")]
    rows = [r for r in rows if r["step"] > warmup] or rows

    def median(key: str) -> float | None:
        vals = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    return {
        "step_s": median("step_time"),
        "compute_s": median("compute_s"),
        "comm_s": median("comm_busy_s"),
        "exposed_s": median("comm_exposed_s"),
        "sent_bytes": median("comm_bytes"),
        "steps_measured": len(rows),
    }


#: The restarts' records in a run folder.
RESTARTS = "restarts.json"


def read_restarts(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The restarts recorded so far in ``run_dir`` (an empty list: none)."""
    try:
        return json.loads((Path(run_dir) / RESTARTS).read_text())
    except (OSError, ValueError):
        return []


def write_restarts(run_dir: str | os.PathLike, records: list[dict]) -> None:
    """Replace ``restarts.json`` atomically."""
    path = Path(run_dir) / RESTARTS
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(records, indent=1))
    os.replace(tmp, path)
