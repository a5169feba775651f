"""DeepFreeze's raw shard format and the two checksum algorithms."""

from __future__ import annotations

import os
import signal
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from research.checkpoint.integrity import (
    CorruptShardError,
    array_crc32,
    checksum_combine,
    checksum_fn,
    copy_verified,
    file_crc32,
    scan_dir,
    verify_dir,
)
from research.checkpoint.rawshard import DATA, META, read_raw, stage, write_raw
from research.checkpoint.writer import Writer


def _staged(tmp_path):
    rng = np.random.default_rng(0)
    host = [
        rng.standard_normal((33, 7)).astype(np.float32),
        np.arange(5, dtype=np.int64),
        np.ones((0, 3), np.float32),
        rng.standard_normal(11).astype(np.float64),
    ]
    names = ["a/w", "b/step", "c/empty", "d/x"]
    units, size, buf = stage(host, names, None, tmp_path / "xfer")
    return host, names, units, size, buf


def test_raw_shard_round_trip_and_checksums(tmp_path):
    host, names, units, size, buf = _staged(tmp_path)
    assert all(u["offset"] % 64 == 0 for u in units)
    crcs, files = write_raw(tmp_path / "7", buf, units, {"step": 7}, "crc32c")
    assert sorted(files) == [DATA, META]
    assert not (tmp_path / "7.raw-tmp").exists()
    for name, a in zip(names, host, strict=True):
        assert crcs[name] == array_crc32(a, "crc32c")
        assert crcs[name] != array_crc32(a) or a.size == 0  # a different algorithm
    # The recorded file checksums are what a fresh scan computes.
    assert scan_dir(tmp_path / "7", "crc32c") == files
    verify_dir(tmp_path / "7", files, "crc32c")
    arrays, meta = read_raw(tmp_path / "7", names)
    assert meta == {"step": 7}
    for name, a in zip(names, host, strict=True):
        assert arrays[name].dtype == a.dtype
        np.testing.assert_array_equal(arrays[name], a)


def test_raw_shard_corruption_is_named(tmp_path):
    _, _, units, _, buf = _staged(tmp_path)
    _, files = write_raw(tmp_path / "7", buf, units, {}, "crc32c")
    data = tmp_path / "7" / DATA
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0x01
    data.write_bytes(bytes(raw))
    with pytest.raises(CorruptShardError, match=r"data\.bin: crc32 mismatch"):
        verify_dir(tmp_path / "7", files, "crc32c")
    data.write_bytes(bytes(raw[:50]))
    with pytest.raises(CorruptShardError, match=r"data\.bin: truncated"):
        verify_dir(tmp_path / "7", files, "crc32c")
    with pytest.raises(ValueError, match="past the data"):
        read_raw(tmp_path / "7", [units[-1]["name"]])


def test_legacy_crc32_is_the_default(tmp_path):
    # Manifests written before CRC-32C name no algorithm: zlib's CRC-32 verifies.
    (tmp_path / "f.bin").write_bytes(b"abc" * 1000)
    size, crc = file_crc32(tmp_path / "f.bin")
    assert crc == zlib.crc32(b"abc" * 1000) and size == 3000
    verify_dir(tmp_path, {"f.bin": [size, crc]})
    with pytest.raises(CorruptShardError, match="crc32 mismatch"):
        verify_dir(tmp_path, {"f.bin": [size, crc]}, "crc32c")


def test_crc32c_without_the_package_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "google_crc32c", None)  # import fails
    with pytest.raises(RuntimeError, match="google-crc32c"):
        array_crc32(np.ones(4, np.float32), "crc32c")
    with pytest.raises(ValueError, match="unknown checksum"):
        array_crc32(np.ones(4, np.float32), "md5")


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling classes")
@pytest.mark.parametrize("idle", [False, True])
def test_writer_process_priority(idle):
    from research.checkpoint.writer import WriterProcess

    proc = WriterProcess(nice=10, idle=idle)
    try:
        proc.request({"op": "remove", "paths": []}, lambda event: None)  # started
        pid = proc.proc.pid
        want = os.SCHED_IDLE if idle else os.SCHED_OTHER
        assert os.sched_getscheduler(pid) == want
        # 10 below us, or the lowest there is (19) when we run niced already
        assert os.getpriority(os.PRIO_PROCESS, pid) >= min(19, 10 + os.nice(0))
    finally:
        proc.close()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux /proc")
def test_writer_survives_a_job_signal_while_it_starts():
    # A batch system signals every process of the job, the writer too, maybe
    # while it still imports (CI once: SIGUSR1 3 steps in killed both ranks'
    # writers, exit -10, and the stop's checkpoint failed). It starts with the
    # signals blocked and ignores them before it unblocks them.
    from research.checkpoint.writer import WriterProcess

    proc = WriterProcess(nice=0)
    try:
        pid = proc.proc.pid
        for sig in (signal.SIGUSR1, signal.SIGTERM) * 20:  # through its start-up
            os.kill(pid, sig)
            time.sleep(0.01)
        assert proc.request({"op": "remove", "paths": []}, lambda event: None)
        os.kill(pid, signal.SIGUSR1)  # and once it runs
        assert proc.request({"op": "remove", "paths": []}, lambda event: None)
        assert proc.proc.poll() is None
        blocked = int(
            next(
                line.split()[1]
                for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("SigBlk:")
            ),
            16,
        )
        assert not blocked & (1 << (signal.SIGUSR1 - 1) | 1 << (signal.SIGTERM - 1))
    finally:
        proc.close()
    # The rank's own mask is as it was.
    assert signal.SIGUSR1 not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


@pytest.mark.parametrize("algo", ["crc32", "crc32c"])
def test_checksum_combine_matches_one_pass(algo):
    fn = checksum_fn(algo)
    rng = np.random.default_rng(1)
    for la, lb in [(0, 0), (0, 9), (9, 0), (1, 1), (63, 1000), (4097, 123457)]:
        a, b = rng.bytes(la), rng.bytes(lb)
        assert checksum_combine(algo, fn(a), fn(b), lb) == fn(a + b), (la, lb)
    with pytest.raises(ValueError, match="unknown checksum"):
        checksum_combine("md5", 0, 0, 1)


def test_file_checksum_covers_stale_padding(tmp_path):
    # The padding between units holds whatever the transfer file held before:
    # the combined file checksum must cover those bytes, as a scan does.
    host, names, units, size, buf = _staged(tmp_path)
    buf[:] = 0xAB
    units, size, buf = stage(host, names, buf, tmp_path / "xfer")
    assert buf[units[0]["nbytes"]] == 0xAB  # padding after the first unit
    _, files = write_raw(tmp_path / "7", buf, units, {}, "crc32c")
    assert scan_dir(tmp_path / "7", "crc32c") == files


def test_writer_remaps_a_replaced_transfer_file(tmp_path):
    # The writer keeps its mapping of the transfer file between writes; a file
    # replaced or grown in between is mapped again, never read stale.
    w = Writer()
    xfer, buf = tmp_path / "xfer", None
    for step, scale in ((1, 1.0), (2, 2.0), (3, 3.0)):
        host = [np.full((50 * step, 3), scale, np.float32)]
        if step == 3:
            xfer.unlink()  # a new file (new inode) of the same name
        units, size, buf = stage(host, ["w"], None if step == 3 else buf, xfer)
        req = {"op": "write", "path": str(tmp_path / str(step)), "buffer": str(xfer)}
        rep = w.handle({**req, "size": size, "units": units, "meta": {}}, print)
        assert rep["ok"]
        assert rep["crc32"]["w"] == array_crc32(host[0], "crc32c")
        assert scan_dir(tmp_path / str(step), "crc32c") == rep["files"]
    assert len(w._maps) == 1
    w.handle({"op": "remove", "paths": [str(xfer)]}, print)
    assert not w._maps and not xfer.exists()
    w.close()


@pytest.mark.parametrize("size", [100, (1 << 20) + 4096, (3 << 20) + 123])
@pytest.mark.parametrize("spare_size", [None, 10, 5 << 20])
def test_flush_copy_is_exact(tmp_path, size, spare_size):
    # Large files go with O_DIRECT (whole blocks) plus sendfile (the tail),
    # over a recycled spare that may be longer or shorter than the file.
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    data = np.random.default_rng(2).bytes(size)
    (src / DATA).write_bytes(data)
    spare = tmp_path / "spare"
    if spare_size is not None:
        spare.write_bytes(b"\xff" * spare_size)
    files = scan_dir(src, "crc32c")
    n = copy_verified(
        src, dst, files, verify=True, fsync=True, algo="crc32c", reuse={DATA: spare}
    )
    assert n == size and (dst / DATA).read_bytes() == data
    assert not spare.exists()
    verify_dir(dst, files, "crc32c")


@pytest.mark.parametrize("fmt", ["raw", "orbax"])
@pytest.mark.parametrize("fsync", [True, False])
def test_write_straight_to_the_persistent_tier_is_durable(
    tmp_path, monkeypatch, fmt, fsync
):
    # Without a fast tier the shard is written into the persistent tier and
    # committed next (no flush follows), so its files, its folder and the
    # folder holding its name must be synced before the writer replies.
    synced = set()
    real = os.fsync

    def recording(fd):
        st = os.fstat(fd)
        synced.add((st.st_dev, st.st_ino))
        return real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    _, _, units, size, _ = _staged(tmp_path)
    if fmt == "orbax":
        units = [u for u in units if u["nbytes"]]  # Orbax refuses empty arrays
    path = tmp_path / "tier" / "rank0" / "7"
    w = Writer()
    req = {"op": "write", "path": str(path), "buffer": str(tmp_path / "xfer")}
    rep = w.handle(
        {**req, "size": size, "units": units, "meta": {}, "format": fmt}
        | {"fsync": fsync},
        print,
    )
    w.close()
    assert rep["ok"], rep
    wanted = [path / rel for rel in rep["files"]] + [path, path.parent]
    ids = {(p.stat().st_dev, p.stat().st_ino) for p in wanted}
    if fsync:
        missing = [
            p for p in wanted if (p.stat().st_dev, p.stat().st_ino) not in synced
        ]
        assert not missing
    else:
        assert not ids & synced
