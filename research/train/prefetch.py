"""The next batch already on the device when the step starts: a loader, fed ahead.

:class:`DeviceFeed` wraps any loader of ``research.data.protocol`` (in memory or
streamed). A feeder thread takes the loader's host batches and puts each on
the device (``jax.device_put``, asynchronous on a GPU) while the step before
it computes, holding up to ``depth`` of them (2: double-buffered). What the
training thread waits for in :meth:`DeviceFeed.next_batch` is then the
honest input wait of the step: ``data_wait_s`` in ``metrics.jsonl``, the
``load batch`` span of the timeline's data track and TensorBoard's
``step/data_wait_s`` (``research/train/loop.py``). Near 0 means the input
keeps up; a large one means input, not computation or communication, bounds
the run.

Its :attr:`~DeviceFeed.position` is the loader's position after the last
batch handed out (each queued batch carries the position it leaves), so a
checkpoint never records batches read ahead but not trained on; restoring a
position drops what was read ahead. Nothing here is collective: :meth:`close`
(stop the thread, close the loader) is safe on an error path.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

#: How long stopping the feeder thread may take (a batch being read).
JOIN_S = 30.0


class DeviceFeed:
    """``loader``'s batches, ``depth`` of them put on the device ahead.

    Args:
      loader: a ``research.data.protocol.Loader``.
      depth: device batches held ahead (>= 1).
    """

    def __init__(self, loader: Any, depth: int = 2) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.loader, self.depth = loader, depth
        self.steps_per_epoch = loader.steps_per_epoch
        self.wait_s = 0.0  # the last next_batch's wait
        self._position = loader.position
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def _feed(self, q: queue.Queue, stop: threading.Event) -> None:
        import jax

        device = jax.local_devices()[0]
        try:
            while not stop.is_set():
                x, y = self.loader.next_batch()
                item = (jax.device_put(x, device), jax.device_put(y, device))
                item = (*item, self.loader.position)
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # handed to the training thread, raised there
            q.put(e)

    def next_batch(self) -> tuple[Any, Any]:
        """The next ``(x, y)``, on the device; sets :attr:`wait_s`."""
        t0 = time.perf_counter()
        if self._thread is None:
            self._queue = queue.Queue(self.depth)
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._feed,
                args=(self._queue, self._stop),
                name="device-feed",
                daemon=True,
            )
            self._thread.start()
        item = self._queue.get()
        if isinstance(item, BaseException):
            self._thread = None
            raise item
        x, y, self._position = item
        self.wait_s = time.perf_counter() - t0
        return x, y

    @property
    def position(self) -> dict[str, Any]:
        """The loader's position after the last batch handed out."""
        return self._position

    def set_position(self, position: Mapping[str, Any]) -> None:
        """Drop what was read ahead and continue from ``position``."""
        self._halt()
        self.loader.set_position(position)
        self._position = self.loader.position

    def _join(self, limit_s: float) -> bool:
        """Stop the feeder thread, taking what it queues so a put waiting for
        room returns; whether it ended within ``limit_s``."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        end = time.monotonic() + limit_s
        while thread.is_alive() and time.monotonic() < end:
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=0.05)
        return not thread.is_alive()

    def _halt(self) -> None:
        if self._thread is None:
            return
        if not self._join(JOIN_S):
            raise RuntimeError(f"the device feed's thread did not stop in {JOIN_S} s")
        # The loader read ahead of what was handed out: back to the last one.
        self.loader.set_position(self._position)

    def close(self) -> None:
        """Stop the feeder thread and close the loader (no collective; a
        thread stuck in the loader is left to die with the process)."""
        if self._join(JOIN_S):
            self.loader.close()

    def summary(self) -> dict[str, Any]:
        """The loader's own figures."""
        return self.loader.summary()
