"""The real TensorBoard server on a folder, read over its HTTP API (for tests).

    with TensorBoard(logdir) as tb:
        tb.wait_for_runs({"solo-s0", "allreduce-s0"})
        points = tb.scalars("solo-s0", "train/loss")   # [(step, value), ...]

The server is ``python -m tensorboard.main --logdir DIR --port 0`` (the `dev`
extra installs it, with xprof's profile plugin), listening on localhost only,
and stopped when the block ends.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any


class TensorBoard:
    """A TensorBoard server of ``logdir`` for the duration of a ``with`` block."""

    def __init__(self, logdir: str | os.PathLike, start_timeout_s: float = 120) -> None:
        self.logdir = Path(logdir)
        self.start_timeout_s = start_timeout_s
        self.url = ""
        self._lines: list[str] = []

    def __enter__(self) -> TensorBoard:
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tensorboard.main",
                "--logdir",
                str(self.logdir),
                "--port",
                "0",
                "--host",
                "localhost",
                "--reload_interval",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        found = threading.Event()

        def read() -> None:
            for line in self._proc.stderr:
                self._lines.append(line)
                m = re.search(r"(http://localhost:\d+)/", line)
                if m and not self.url:
                    self.url = m.group(1)
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(self.start_timeout_s):
            self.__exit__(None, None, None)
            raise RuntimeError("TensorBoard did not start:\n" + "".join(self._lines))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(20)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def get(self, path: str, **params: str) -> Any:
        """``GET path?params`` as JSON."""
        query = "?" + urllib.parse.urlencode(params) if params else ""
        with urllib.request.urlopen(self.url + path + query, timeout=60) as r:
            body = r.read()
            if r.headers.get("Content-Encoding") == "gzip":  # the profile plugin's
                body = gzip.decompress(body)
        return json.loads(body)

    def wait_for_runs(self, runs: set[str], timeout_s: float = 90) -> list[str]:
        """The server's runs, once it lists at least ``runs``."""
        deadline = time.monotonic() + timeout_s
        while True:
            have = self.get("/data/runs")
            if runs <= set(have) or time.monotonic() > deadline:
                return have
            time.sleep(0.5)

    def tags(self, run: str) -> set[str]:
        """The scalar tags of ``run``."""
        return set(self.get("/data/plugin/scalars/tags").get(run, {}))

    def scalars(self, run: str, tag: str) -> list[tuple[int, float]]:
        """``[(step, value), ...]`` of one scalar tag."""
        got = self.get("/data/plugin/scalars/scalars", run=run, tag=tag)
        return [(int(step), float(value)) for _, step, value in got]
