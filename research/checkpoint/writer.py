"""The DeepFreeze writer: serializes and writes shards with Orbax, flushes tiers.

It runs in a helper process per rank (``python -m research.checkpoint.writer``,
started by :class:`WriterProcess`), for two reasons measured on a CPU-bound
host: Orbax's Python (asyncio, metadata) in a thread of the training process
competes for the GIL with the training thread and with the communication
thread, and a separate process can be niced so that the operating system runs
it in the gaps the training leaves. It never imports mpi4py (under mpiexec
that would start another MPI rank); agreement and manifests stay in the rank.

Protocol: JSON lines on stdin/stdout. The array bytes travel through a file
in ``/dev/shm`` that both processes map (one copy, no pickling):

* ``{"op": "write", "path", "buffer", "size", "units": [{"name", "shape",
  "dtype", "offset", "nbytes"}], "meta", "format", "compress", "pause"}`` ->
  with ``format="raw"`` (the default), ``rawshard.write_raw``: CRC-32C of every
  unit, the buffer written as one file, tmp + rename; with ``"orbax"``, CRC-32
  of every unit, Orbax async save into ``path`` (tmp + rename), then the
  files' sizes and CRC-32s. Either replies with the checksums, the files and
  ``tags`` for the manifest's shard entry (format, checksum algorithm); with
  ``fsync`` (the shard goes straight into the persistent tier) its files and
  directories are made durable before the reply; with ``private`` (the
  node-local fast tier) folders are made 0700 and raw files 0600;
* ``{"op": "flush", "src", "dst", "files", "checksum", "fsync", "verify",
  "pause"}`` -> copy into ``<dst>.flush-tmp`` (sizes checked; checksums too
  with ``verify``), renamed to ``dst``;
* ``{"op": "remove", "paths"}``; ``{"op": "exit"}``.

With ``pause`` the writer reports ``{"op": "progress", "event": ...}`` in the
middle of the work (Orbax writes in flight; the first file flushed) and waits
for ``{"op": "continue"}``: fault tests kill the rank at that moment.
:class:`Writer` serves the same requests inside the rank (``writer="thread"``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from research.checkpoint.integrity import (
    LEGACY_CHECKSUM,
    array_crc32,
    copy_verified,
    fsync_tree,
    remove_tree,
    scan_dir,
)
from research.checkpoint.rawshard import DATA, RAW_FORMAT, SPARE, make_dirs, write_raw
from research.threads import thread_env

Progress = Callable[[str], None]

#: Checksum of raw shards: hardware CRC-32C (see ``integrity.py``).
RAW_CHECKSUM = "crc32c"


class Writer:
    """Handles write/flush/remove requests (in the helper process or a thread)."""

    def __init__(self, own_process: bool = False) -> None:
        self._ckptrs: dict[bool, Any] = {}
        # The writer's own CPU clock: the helper's process clock (Orbax's threads
        # included), or the calling thread's when it serves a rank's thread.
        self._clock = time.process_time if own_process else time.thread_time
        # Transfer files mapped by earlier writes: {path: ((dev, ino, size), map)}.
        self._maps: dict[str, tuple[tuple[int, int, int], np.memmap]] = {}

    def handle(self, req: dict, progress: Progress) -> dict[str, Any]:
        """Serve ``req``; the reply's ``cpu_s`` is the writer's CPU spent on it."""
        cpu0 = self._clock()
        rep = self._handle(req, progress)
        rep["cpu_s"] = self._clock() - cpu0
        return rep

    def _handle(self, req: dict, progress: Progress) -> dict[str, Any]:
        op = req["op"]
        if op == "write":
            return self.write(req, progress)
        if op == "flush":
            return self.flush(req, progress)
        if op == "remove":
            for p in req["paths"]:
                remove_tree(Path(p))
            self._prune()  # a removed transfer file's mapping goes too
            return {"ok": True}
        raise ValueError(f"unknown writer request {op!r}")

    def write(self, req: dict, progress: Progress) -> dict[str, Any]:
        buf = self._map(req["buffer"], req["size"])
        if req.get("format", "raw") == "raw":
            rep = self._write_raw(req, buf, progress)
        else:
            rep = self._write_orbax(req, buf, progress)
        if req.get("fsync"):
            # The shard went straight to the persistent tier: durable before
            # the rank reports it written, as the manifest commits it next.
            fsync_tree(Path(req["path"]))
        return rep

    def _map(self, path: str, size: int) -> np.ndarray:
        """The first ``size`` bytes of the transfer file, mapped once per file.

        A fresh mapping per write faults in every page again (about 0.5 ms of
        the writer's CPU per 10 MB here); the rank reuses its transfer file, so
        the writer keeps its mapping while the file is the same (device, inode,
        size). Mappings of files that are gone are dropped (``_prune``).
        """
        self._prune()
        st = os.stat(path)
        key = (st.st_dev, st.st_ino, st.st_size)
        if size > st.st_size:
            raise ValueError(f"{path} holds {st.st_size} bytes, not {size}")
        cached = self._maps.get(path)
        if cached is None or cached[0] != key:
            self._maps.pop(path, None)
            mm = np.memmap(path, dtype=np.uint8, mode="r", shape=(st.st_size,))
            self._maps[path] = cached = (key, mm)
        return cached[1][:size]

    def _prune(self) -> None:
        for path, (key, _) in list(self._maps.items()):
            try:
                st = os.stat(path)
            except FileNotFoundError:
                st = None
            if st is None or (st.st_dev, st.st_ino, st.st_size) != key:
                del self._maps[path]  # an unlinked file's memory is freed now

    def _write_raw(self, req: dict, buf: np.ndarray, progress: Progress) -> dict:
        """One data file and one JSON file (``rawshard.py``): the cheap default."""
        meta = dict(req["meta"])
        path = Path(req["path"])
        remove_tree(path)  # a stale shard of an uncommitted earlier attempt
        private = bool(req.get("private"))
        if req.get("pause"):
            tmp = path.parent / f"{path.name}.raw-tmp"
            remove_tree(tmp)
            make_dirs(tmp, private)
            progress("write-started")  # the step's tmp directory is on disk
        crcs, files = write_raw(path, buf, req["units"], meta, RAW_CHECKSUM, private)
        del buf
        return {
            "ok": True,
            "crc32": crcs,
            "files": files,
            "bytes": sum(size for size, _ in files.values()),
            "tags": {"format": RAW_FORMAT, "checksum": RAW_CHECKSUM},
        }

    def _write_orbax(self, req: dict, buf: np.ndarray, progress: Progress) -> dict:
        """An Orbax composite item (``shard.py``; zstd when ``compress``)."""
        from research.checkpoint.shard import new_checkpointer, shard_args

        arrays = {}
        for u in req["units"]:
            raw = buf[u["offset"] : u["offset"] + u["nbytes"]]
            arrays[u["name"]] = raw.view(np.dtype(u["dtype"])).reshape(u["shape"])
        crcs = {n: array_crc32(a) for n, a in arrays.items()}
        meta = dict(req["meta"])
        meta["units"] = [{**u, "crc32": crcs[u["name"]]} for u in meta.get("units", [])]
        path = Path(req["path"])
        remove_tree(path)  # a stale shard of an uncommitted earlier attempt
        remove_tree(path.with_name(f"{path.name}.orbax-checkpoint-tmp"))
        mode = 0o700 if req.get("private") else 0o777
        path.parent.mkdir(mode=mode, parents=True, exist_ok=True)
        compress = bool(req.get("compress"))
        if compress not in self._ckptrs:
            self._ckptrs[compress] = new_checkpointer(use_async=True, compress=compress)
        ckptr = self._ckptrs[compress]
        ckptr.save(path, args=shard_args(arrays, meta))
        if req.get("pause"):
            # Orbax creates the checkpoint's directories in its own background
            # thread: report only once the half-written step is on disk.
            _wait_for(lambda: any(path.parent.glob(f"{path.name}*")), timeout=30)
            progress("write-started")  # Orbax's writes are in flight
        ckptr.wait_until_finished()
        del arrays, buf
        files = scan_dir(path)
        return {
            "ok": True,
            "crc32": crcs,
            "files": files,
            "bytes": sum(size for size, _ in files.values()),
        }

    def flush(self, req: dict, progress: Progress) -> dict[str, Any]:
        final = Path(req["dst"])
        tmp = final.with_name(f"{final.name}.flush-tmp")
        remove_tree(tmp)
        remove_tree(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        pause = req.get("pause")

        def on_file(i: int) -> None:
            if pause and i == 1:
                progress("flush-file")  # one file copied, the rest not yet

        n = copy_verified(
            Path(req["src"]),
            tmp,
            req["files"],
            fsync=req["fsync"],
            verify=req.get("verify", False),
            on_file=on_file,
            algo=req.get("checksum") or LEGACY_CHECKSUM,
            reuse={DATA: final.parent / SPARE},
        )
        os.rename(tmp, final)
        if req["fsync"]:
            fd = os.open(final.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return {"ok": True, "bytes": n}

    def close(self) -> None:
        self._maps.clear()
        for c in self._ckptrs.values():
            c.close()
        self._ckptrs.clear()


# -- the rank's side -------------------------------------------------------------------
_NOT_PASSED = ("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "HYDRA_", "MPIR_", "I_MPI_")


#: What a batch system sends every process of a job before it ends it.
_JOB_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


@contextlib.contextmanager
def _signals_blocked(signals):
    if not hasattr(signal, "pthread_sigmask"):  # not POSIX: nothing to block
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class WriterProcess:
    """Starts the helper process and sends it requests (one at a time).

    Use :meth:`shared`: one helper per rank serves every checkpointer of the
    process, so its start-up (importing jax and Orbax, seconds) is paid once and
    two checkpointers never run Orbax saves at the same time.

    Args:
      nice: niceness added to the helper (0: same priority as training).
      idle: run the helper under ``SCHED_IDLE`` (see :func:`_run_when_idle`).
    """

    _shared: dict[tuple[int, bool], WriterProcess] = {}
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls, nice: int = 10, idle: bool = False) -> WriterProcess:
        """This process's helper of that priority, started on first use (again
        if it died)."""
        with cls._shared_lock:
            key = (nice, idle)
            proc = cls._shared.get(key)
            if proc is None or proc.proc.poll() is not None:
                proc = cls._shared[key] = cls(nice, idle)
                atexit.register(proc.close)
            return proc

    def __init__(self, nice: int = 10, idle: bool = False) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_PASSED)}
        env.update(
            JAX_PLATFORMS="cpu",  # never take an accelerator from the training
            # One compute thread, and no model flags: the writer only copies.
            **thread_env(1, model_flags=False),
            RESEARCH_WRITER_NICE=str(nice),
            RESEARCH_WRITER_IDLE="1" if idle else "0",
            PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
        )
        # Started with the job's stop signals blocked (the mask survives exec):
        # a batch system's signal that comes while the helper imports would
        # otherwise kill it before :func:`main` ignores it. Blocked here only
        # in this thread and only for the fork; a signal meant for the rank
        # goes to another thread or waits the microseconds until unblocked.
        with _signals_blocked(_JOB_SIGNALS):
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "research.checkpoint.writer"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                text=True,
                bufsize=1,
            )
        self._ready = False
        self._lock = threading.Lock()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.poll()
            raise RuntimeError(f"checkpoint writer process ended (exit code {code})")
        return json.loads(line)

    def _send(self, msg: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            # The same failure as a read that finds the pipe closed: say so
            # alike, whichever end noticed first.
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            raise RuntimeError(
                f"checkpoint writer process ended (exit code {code})"
            ) from None

    def request(self, req: dict, progress: Progress) -> dict[str, Any]:
        """Send one request and wait (sleeping in a pipe read) for its reply."""
        with self._lock:
            if not self._ready:
                self._read()  # {"op": "ready"}: imports done
                self._ready = True
            self._send(req)
            while (msg := self._read()).get("op") == "progress":
                progress(msg["event"])
                self._send({"op": "continue"})
            return msg

    def close(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            try:
                self._send({"op": "exit"})
                self.proc.wait(timeout)
            except (OSError, RuntimeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


def _wait_for(cond, timeout: float, poll: float = 0.005) -> None:
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(poll)


# -- the helper process ----------------------------------------------------------------
def _die_with_parent() -> None:
    """SIGKILL this helper when its rank dies (a killed rank leaves no writer)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the closed stdin ends the loop instead
    if os.getppid() == 1:
        os._exit(1)


def _run_when_idle() -> None:
    """SCHED_IDLE: this process runs only on a core nothing else wants.

    Nice 10 still takes a share of a busy core, and on 2 cores shared by 4 ranks
    whose allreduce needs every rank scheduled the writer's burst right after a
    checkpoint is what DeepFreeze costs. Measured as two arms of one run (README,
    DeepFreeze section): no difference at load 2-4, 2.5 points less overhead at
    load 3-6 (not significant). Off by default: on a machine saturated by other
    jobs an idle-class writer starves and checkpoints then wait (with it on,
    ``tests/test_checkpoint_faults.py``'s error driver ran past its 240 s limit
    at load 5.5; without, the file passed in 32 s). Linux only; elsewhere the
    niceness alone applies.
    """
    policy = getattr(os, "SCHED_IDLE", None)
    if policy is None:
        return
    with contextlib.suppress(OSError):  # forbidden here: niceness alone
        os.sched_setscheduler(0, policy, os.sched_param(0))


def main() -> None:
    _die_with_parent()
    # A batch system signals every process of the job; the rank decides when
    # its writer finishes (research.train.preemption), so the writer stays.
    # They came blocked from the rank (WriterProcess): ignoring them drops any
    # that arrived during start-up, then they are unblocked.
    for sig in _JOB_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _JOB_SIGNALS)
    nice = int(os.environ.get("RESEARCH_WRITER_NICE", "0"))
    if nice:
        os.nice(nice)
    if os.environ.get("RESEARCH_WRITER_IDLE") == "1":
        _run_when_idle()
    replies, sys.stdout = sys.stdout, sys.stderr  # library prints stay off the pipe

    def send(msg: dict) -> None:
        replies.write(json.dumps(msg) + "\n")
        replies.flush()

    def progress(event: str) -> None:
        send({"op": "progress", "event": event})
        if not sys.stdin.readline():  # {"op": "continue"}, or EOF: the rank died
            os._exit(1)  # leave the half-written step as it is, like the rank

    import logging

    absl = logging.getLogger("absl")
    absl.setLevel(logging.ERROR)
    # Orbax writes _CHECKPOINT_METADATA from its own thread, not atomically, and
    # may read it back before the write lands; it logs an ERROR, then rewrites the
    # file (its TODO b/340287956). Harmless: drop exactly that message.
    absl.addFilter(
        lambda rec: not str(rec.msg).startswith("Failed to json parse Metadata file")
    )
    writer = Writer(own_process=True)
    # jax and Orbax (about 1 s of CPU here) are imported by the first Orbax
    # shard only (``compress``): raw shards, the default, need numpy alone, and
    # a short run's ranks start without this process competing for the cores.
    send({"op": "ready", "pid": os.getpid()})
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "exit":
            break
        try:
            rep = writer.handle(req, progress)
        except Exception as e:  # noqa: BLE001 - reported to the rank, which raises
            rep = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        send(rep)
    writer.close()


if __name__ == "__main__":
    main()
