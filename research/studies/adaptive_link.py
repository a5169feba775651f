"""A link whose rate changes at fixed steps while a job trains (the adaptive study).

The rates are ``tc`` settings of a local cluster (``research/localnet.py``),
which only the root network namespace can change, while the ranks run inside
the nodes' namespaces. So the change is asked for through files in a folder
both see (the run root):

* rank 0, at the end of a step that starts a new phase (and before the first
  step), writes ``request.json`` ``{"seq": n, "rate": "1gbit", "step": s}``
  and waits for ``ack.json`` with the same ``seq``; then every rank meets at a
  barrier, so no rank runs the phase's first step on the old rate;
* :class:`LinkController`, a thread of the process that launched the job (in
  the root namespace), polls for requests, sets every node's link
  (``Cluster.set_rate``) and writes the ack.

The time this takes is outside every step's time (the loop's ``train_time``
counts steps only), so it costs no arm anything. A schedule is
``"0:10gbit,80:1gbit,160:10gbit"``: from step 0 at 10 Gb/s, from step 80 at
1 Gb/s, from step 160 at 10 Gb/s again.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from research.train.callback import Callback

REQUEST, ACK = "request.json", "ack.json"


def parse_schedule(spec: str) -> list[tuple[int, str]]:
    """``"0:10gbit,80:1gbit"`` as ``[(0, "10gbit"), (80, "1gbit")]``.

    Raises:
      ValueError: a malformed entry, a bad rate, no entry at step 0, or steps
        out of order.
    """
    from research.localnet import LocalnetError, parse_rate

    out = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        step, _, rate = part.partition(":")
        if not step.isdigit() or not rate:
            raise ValueError(f"link schedule entry {part!r} must be STEP:RATE")
        try:
            parse_rate(rate)
        except LocalnetError as e:
            raise ValueError(f"link schedule: {e}") from None
        out.append((int(step), rate))
    steps = [s for s, _ in out]
    if not out or steps[0] != 0 or steps != sorted(set(steps)):
        raise ValueError(
            f"link schedule {spec!r}: steps must start at 0 and increase, "
            "e.g. 0:10gbit,80:1gbit,160:10gbit"
        )
    return out


def _write(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class LinkSchedule(Callback):
    """Asks for the schedule's rate at its steps (rank 0), then a barrier.

    Args:
      folder: the folder :class:`LinkController` watches.
      schedule: from :func:`parse_schedule`.
      timeout: seconds to wait for an ack before failing the job.
    """

    def __init__(
        self, folder: str | Path, schedule: list[tuple[int, str]], timeout: float = 60
    ) -> None:
        self.folder, self.schedule, self.timeout = Path(folder), schedule, timeout
        self.changes: list[dict[str, Any]] = []

    def on_train_start(self, trainer) -> None:
        self._set(trainer, 0)

    def on_step_end(self, trainer, step: int) -> None:
        if any(s == step for s, _ in self.schedule[1:]) and step < trainer.total_steps:
            self._set(trainer, step)

    def _set(self, trainer, step: int) -> None:
        rate = [r for s, r in self.schedule if s <= step][-1]
        if trainer.world.rank == 0:
            t0 = time.perf_counter()
            seq = int(time.time_ns())
            _write(self.folder / REQUEST, {"seq": seq, "rate": rate, "step": step})
            while (_read(self.folder / ACK) or {}).get("seq") != seq:
                if time.perf_counter() - t0 > self.timeout:
                    raise RuntimeError(
                        f"link schedule: no answer within {self.timeout:.0f} s to "
                        f"setting {rate} at step {step} (is the launching process, "
                        "which runs the link controller, still there?)"
                    )
                time.sleep(0.005)
            self.changes.append(
                {"step": step, "rate": rate, "seconds": time.perf_counter() - t0}
            )
        trainer.world.barrier()

    def summary(self) -> dict[str, Any]:
        return {"link_changes": self.changes}


class LinkController:
    """Serves :class:`LinkSchedule`'s requests from the launching process.

    Args:
      folder: where requests come (created here).
      set_rate: ``set_rate(rate)`` changes every node's link.
    """

    def __init__(self, folder: str | Path, set_rate) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        for name in (REQUEST, ACK):
            (self.folder / name).unlink(missing_ok=True)
        self.set_rate = set_rate
        self.error: BaseException | None = None
        self.log: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> LinkController:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _serve(self) -> None:
        done = None
        while not self._stop.is_set():
            req = _read(self.folder / REQUEST)
            if req is not None and req.get("seq") != done:
                try:
                    self.set_rate(req["rate"])
                except BaseException as e:  # the job times out and says why
                    self.error = e
                    return
                self.log.append({**req, "utc": time.strftime("%H:%M:%S")})
                _write(self.folder / ACK, {"seq": req["seq"]})
                done = req["seq"]
            self._stop.wait(0.005)
