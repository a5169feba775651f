"""XLA's own profile of chosen steps: ``--profile START:COUNT`` (jax.profiler).

Steps are counted from 1, as ``metrics.jsonl`` and TensorBoard count them:
``--profile 20:3`` captures steps 20, 21 and 22 on every rank, or on the ranks
``--profile-ranks 0,2`` names. Each captured rank writes, in the layout of
TensorBoard's profile plugin (xprof)::

    RUN_DIR/plugins/profile/steps_20-22/<host>-rank<r>.xplane.pb
    RUN_DIR/plugins/profile/steps_20-22/<host>-rank<r>.trace.json.gz

so ``tensorboard --logdir runs/`` (with ``pip install tensorboard xprof``)
lists the run's profile as ``<run>/steps_20-22`` with one host per rank, and
``xprof RUN_DIR`` opens it alone. The trace starts before step START (the
compiled programs are warm unless START is 1) and stops after step
START+COUNT-1, outside the step times the run records: only the captured steps
themselves are slowed by the profiler (its Python and host tracers).

Lining up with our timeline (``--trace``): each captured step runs inside a
``jax.profiler.StepTraceAnnotation("train", step_num=N)``, which xprof's
step views read, and ``trace.json`` gets a span ``jax.profiler step N`` on the
rank's ``profile`` track over the same step, with the session's folder. (Our
other spans' ``step`` argument counts the steps done before, so it is N - 1.)

A rerun into the same folder replaces a session of the same steps. On an error
the trace is stopped and kept (local work only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import time
from pathlib import Path
from typing import Any

SUFFIX = ".xplane.pb"
#: What viewing a profile needs (the `dev` extra has both).
VIEWER = "pip install tensorboard xprof"


@dataclasses.dataclass(frozen=True)
class ProfileWindow:
    """Which steps (``start`` .. ``start + count - 1``) and ranks to capture.

    Attributes:
      start: the first captured step, counted from 1.
      count: how many steps.
      ranks: the captured ranks, or None for every rank.
    """

    start: int
    count: int
    ranks: tuple[int, ...] | None = None

    @classmethod
    def parse(cls, spec: str | None, ranks: str = "all") -> ProfileWindow | None:
        """``"20:3"`` and ``"0,2"`` -> a window; None or ``""`` -> None.

        Raises ``ValueError`` with the flag and what is wrong, in one line.
        """
        if not spec:
            return None
        start, sep, count = spec.partition(":")
        try:
            window = cls(int(start), int(count) if sep else 1)
        except ValueError:
            raise ValueError(
                f"--profile expects START:COUNT (e.g. 20:3), got {spec!r}"
            ) from None
        if window.start < 1 or window.count < 1:
            raise ValueError(
                f"--profile {spec}: START counts from 1 and COUNT must be >= 1"
            )
        if ranks.strip() in ("", "all"):
            return window
        try:
            picked = tuple(sorted({int(r) for r in ranks.split(",")}))
        except ValueError:
            raise ValueError(
                f"--profile-ranks expects 'all' or ranks like 0,2, got {ranks!r}"
            ) from None
        if any(r < 0 for r in picked):
            raise ValueError(f"--profile-ranks {ranks}: ranks are >= 0")
        return dataclasses.replace(window, ranks=picked)

    @property
    def last(self) -> int:
        return self.start + self.count - 1

    @property
    def session(self) -> str:
        """The profile plugin's session folder: ``steps_<start>-<last>``."""
        return f"steps_{self.start}-{self.last}"

    def problem(self, total_steps: int, world_size: int) -> str | None:
        """What cannot be captured in a run of ``total_steps`` on ``world_size``."""
        if self.start > total_steps:
            return (
                f"--profile {self.start}:{self.count} starts after the run's last "
                f"step ({total_steps})"
            )
        bad = [r for r in self.ranks or () if r >= world_size]
        if bad:
            return (
                f"--profile-ranks {','.join(map(str, bad))}: the job has ranks "
                f"0..{world_size - 1}"
            )
        return None


class NullProfiler:
    """No ``--profile`` (or not this rank): every step runs as it is."""

    def step(self, step_num: int) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def close(self) -> None:
        pass


class StepProfiler:
    """Captures one window of steps on this rank (see the module docstring)."""

    def __init__(
        self, window: ProfileWindow, run_dir: str | os.PathLike, rank: int, tracer: Any
    ) -> None:
        self.window = window
        self.rank = rank
        self.tracer = tracer
        self.session_dir = Path(run_dir) / "plugins" / "profile" / window.session
        # jax.profiler names the file after the host; every rank of a node has
        # the same, so each rank exports into a folder of its own first.
        self._tmp = Path(run_dir) / f".profile-rank{rank}"
        self._running = False
        self.files: list[Path] = []

    @classmethod
    def start(
        cls, window: ProfileWindow | None, run_dir: str | os.PathLike, rank: int, tracer
    ) -> StepProfiler | NullProfiler:
        """A profiler when ``window`` captures this rank, else a no-op."""
        if window is None or (window.ranks is not None and rank not in window.ranks):
            return NullProfiler()
        return cls(window, run_dir, rank, tracer)

    @contextlib.contextmanager
    def step(self, step_num: int):
        """Around step ``step_num`` (from 1) and its measured time."""
        w = self.window
        if not w.start <= step_num <= w.last:
            yield
            return
        import jax

        if step_num == w.start:
            shutil.rmtree(self._tmp, ignore_errors=True)
            options = jax.profiler.ProfileOptions()
            options.session_id = w.session
            jax.profiler.start_trace(str(self._tmp), profiler_options=options)
            self._running = True
        t0 = time.perf_counter()
        with jax.profiler.StepTraceAnnotation("train", step_num=step_num):
            yield
        self.tracer.complete(
            f"jax.profiler step {step_num}",
            "profile",
            t0,
            time.perf_counter(),
            step=step_num - 1,
            step_num=step_num,
            session=str(self.session_dir),
        )
        if step_num == w.last:
            self._stop()

    def _stop(self) -> None:
        import jax

        self._running = False
        jax.profiler.stop_trace()
        exported = self._tmp / "plugins" / "profile" / self.window.session
        hosts = [p.name[: -len(SUFFIX)] for p in exported.glob(f"*{SUFFIX}")]
        self.session_dir.mkdir(parents=True, exist_ok=True)
        for path in sorted(exported.iterdir()):
            host = next((h for h in hosts if path.name.startswith(h + ".")), None)
            name = path.name
            if host is not None:
                name = f"{host}-rank{self.rank}{path.name[len(host) :]}"
            dest = self.session_dir / name
            os.replace(path, dest)
            self.files.append(dest)
        shutil.rmtree(self._tmp, ignore_errors=True)
        ranks = self.window.ranks
        if self.rank == (ranks[0] if ranks else 0):  # one line per job
            who = "ranks " + ",".join(map(str, ranks)) if ranks else "every rank"
            print(
                f"r{self.rank} | jax.profiler: steps {self.window.start}-"
                f"{self.window.last} ({who}) in {self.session_dir}; view with "
                f"`tensorboard --logdir {self.session_dir.parents[2]}`, Profile tab "
                f"({VIEWER})",
                flush=True,
            )

    def close(self) -> None:
        """Stop a capture still running (a run that ended inside the window)."""
        if self._running:
            self._stop()
