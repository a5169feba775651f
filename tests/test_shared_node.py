"""Issue 25: a node shared with other users (``research/privdir.py``).

Another local user ("the intruder", made with ``useradd``) plants folders and
links where the project's node-local data goes, and leaves stale files where
the sweeps look. The planting steps run as that user (``runuser``), so these
tests need root; CI and this machine run them as root. Root may write into
any folder, so nothing but the checks keeps our files out of the planted ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from research import privdir
from research.checkpoint import CheckpointConfig, CheckpointError
from tests.checkpoint_state import initial
from tests.harness import local_user, python, run_under_mpiexec
from tests.shared_node_driver import _entries

INTRUDER = "rsh25intruder"
NEEDS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("runuser") is None,
    reason="needs root and runuser: the test makes a second local user "
    "(useradd) and plants files as that user; CI and this machine run as root",
)


def _as(user: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["runuser", "-u", user, "--", *cmd], capture_output=True, text=True, check=check
    )


def _plant_dir(path: Path) -> None:
    """The intruder's folder at ``path``, open to all (mode 0777)."""
    _as(INTRUDER, "sh", "-c", f"mkdir -p '{path}' && chmod 777 '{path}'")
    st = os.lstat(path)
    assert st.st_uid == local_user(INTRUDER) and stat.S_IMODE(st.st_mode) == 0o777


def _results(run_dir: Path) -> list[dict]:
    """What each rank of ``tests/shared_node_driver.py`` wrote, by rank."""
    files = sorted(run_dir.glob("result-r*.json"))
    return [json.loads(f.read_text()) for f in files]


def _private_tree(entries: list[dict], uid: int) -> None:
    """Every folder 0700 and every file 0600, all owned by ``uid``."""
    assert entries
    for e in entries:
        want = 0o700 if e["kind"] == "dir" else 0o600
        assert (e["uid"], e["mode"]) == (uid, want), e


@pytest.fixture
def shared_tmp():
    """A folder both users may write in (pytest's tmp_path is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="rsh25-", dir="/tmp"))
    path.chmod(0o1777)  # a shared place, as /tmp is
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- the reproduction: a fast-tier folder planted by another user --------------------
@NEEDS_ROOT
@pytest.mark.launches
def test_planted_fast_tier_folders_get_nothing_and_ours_is_private(shared_tmp):
    intruder, me = local_user(INTRUDER), privdir.user_name()
    # Stand-ins for /dev/shm and $TMPDIR that no other test shares: shared
    # places, sticky and writable by all, as those are.
    shm, tmp = shared_tmp / "shm", shared_tmp / "tmp"
    for d in (shm, tmp):
        d.mkdir()
        d.chmod(0o1777)
    run_dir = shared_tmp / "run"
    # What the intruder can predict: the folder of every user's node-local data
    # (this version), and the fast tier's own name (the version of the issue,
    # right in /dev/shm).
    mine, fallback = shm / f"research-{me}", tmp / f"research-{me}"
    digest = hashlib.sha1(str((run_dir / "checkpoints").resolve()).encode())
    old_name = Path("/dev/shm") / f"research-ckpt-{me}-{digest.hexdigest()[:12]}"
    _plant_dir(mine)
    _plant_dir(old_name)
    try:
        proc = run_under_mpiexec(
            3,
            ["-m", "tests.shared_node_driver", str(run_dir)],
            # No runtime folder: the fallback is the stand-in $TMPDIR's.
            env_extra={
                "RESEARCH_SHM_DIR": str(shm),
                "TMPDIR": str(tmp),
                "XDG_RUNTIME_DIR": "",
            },
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-6000:]
        reports = _results(run_dir)
        assert sorted(r["rank"] for r in reports) == [0, 1, 2], out[-6000:]
        # Nothing went into either planted folder (root could have written
        # there); they stay the intruder's.
        assert os.listdir(mine) == [] and os.listdir(old_name) == []
        for r in reports:
            assert r["size"] == 3 and r["uid"] == os.geteuid()
            assert r["tiers"] == ["fast", "persistent"] and r["committed"] == [1]
            # Refused with one line naming the folder and what is wrong ...
            assert set(r["warnings"]) == {
                f"refusing {mine}: it belongs to {INTRUDER} (uid {intruder}), "
                f"not to you ({me}, uid {os.geteuid()})"
            }, r["warnings"]
            # ... and the fast tier and the transfer file went into a folder
            # that is ours and private: folders 0700, files 0600.
            fast = Path(r["fast_root"])
            assert fast.parent == fallback and fast.name.startswith("ckpt-")
            _private_tree(r["fast"], os.geteuid())
            names = {Path(e["path"]).name for e in r["fast"]}
            assert {"manifest.json", "data.bin", "shard.json"} <= names
            x = r["xfer"]
            assert Path(x["path"]).parent == fallback and not x["link"]
            assert (x["uid"], x["mode"], x["folder_mode"]) == (
                os.geteuid(),
                0o600,
                0o700,
            )
        # A normal close removed the fast tier and the transfer files.
        assert [p.name for p in fallback.iterdir()] == []
    finally:
        shutil.rmtree(old_name, ignore_errors=True)


@NEEDS_ROOT
@pytest.mark.launches
def test_a_planted_fast_dir_is_refused_by_every_rank(tmp_path):
    local_user(INTRUDER)
    planted = Path("/dev/shm") / f"rsh25-planted-{os.getpid()}"
    shutil.rmtree(planted, ignore_errors=True)
    _plant_dir(planted)
    try:
        proc = run_under_mpiexec(
            3, ["-m", "tests.shared_node_driver", str(tmp_path / "run"), str(planted)]
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-6000:]
        refused = [r["refused"] for r in _results(tmp_path / "run")]
        assert len(refused) == 3, out[-6000:]
        # Every rank raises the same one line, naming the folder and the problem.
        assert set(refused) == {
            f"node-local checkpoint folder refused: ranks 0, 1, 2: refusing "
            f"{planted}: it belongs to {INTRUDER} (uid {local_user(INTRUDER)}), not to "
            f"you (root, uid 0); remove it or choose another folder with --fast-dir"
        }
        assert os.listdir(planted) == []
    finally:
        shutil.rmtree(planted, ignore_errors=True)


@NEEDS_ROOT
def test_fast_dir_flags_refuse_a_planted_folder_before_launch(tmp_path):
    local_user(INTRUDER)
    planted = Path("/dev/shm") / f"rsh25-flag-{os.getpid()}"
    shutil.rmtree(planted, ignore_errors=True)
    _plant_dir(planted)
    try:
        for cmd in (
            ["experiments.deepfreeze", "--fast-dir", str(planted)],
            ["experiments.train", "--checkpoint", "deepfreeze"]
            + ["--fast-dir", str(planted)],
        ):
            proc = python(["-m", *cmd], cwd=tmp_path, timeout=120)
            errors = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
            assert (
                f"--fast-dir '{planted}' refused: it belongs to {INTRUDER}" in errors[0]
            )
            assert os.listdir(planted) == [] and not (tmp_path / "runs").exists()
    finally:
        shutil.rmtree(planted, ignore_errors=True)


def test_train_fast_dir_flag_reaches_the_checkpointer(tmp_path):
    from experiments.train import parse
    from research.train.checkpointing import CheckpointCallback

    for flag, want in (("auto", "auto"), ("none", None), ("/x/fast", "/x/fast")):
        argv = ["--checkpoint", "deepfreeze", "--fast-dir", flag]
        cfg = parse(argv).train
        assert CheckpointCallback.for_run(cfg).config.fast_dir == want


# -- transfer files --------------------------------------------------------------------
@NEEDS_ROOT
def test_a_link_at_the_transfer_file_is_not_followed(tmp_path, shared_tmp):
    from research.checkpoint.deepfreeze import DeepFreeze
    from research.comm.world import get_world

    local_user(INTRUDER)
    target = shared_tmp / "intruders-file"
    _as(INTRUDER, "sh", "-c", f"echo intruder > '{target}' && chmod 666 '{target}'")
    ckpt = DeepFreeze(get_world(), tmp_path / "p", fast_dir=None, fsync=False)
    try:
        xfer = ckpt._xfer  # noqa: SLF001
        # Another user cannot put anything into the folder of the file at all ...
        planted = _as(INTRUDER, "ln", "-s", str(target), str(xfer), check=False)
        assert planted.returncode != 0 and not os.path.lexists(xfer)
        # ... and a link that is there anyway is replaced, never written through.
        os.symlink(target, xfer)
        ckpt.save(1, initial())
        ckpt.wait()
        assert target.read_text() == "intruder\n"
        st = os.lstat(xfer)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_uid == os.geteuid() and ckpt.committed_steps() == [1]
        os.symlink(target, shared_tmp / "link")
        with pytest.raises(FileExistsError):  # O_EXCL | O_NOFOLLOW
            privdir.create_file(shared_tmp / "link")
    finally:
        ckpt.close()


# -- sweeps ----------------------------------------------------------------------------
def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@NEEDS_ROOT
def test_sweeps_leave_other_users_files(tmp_path):
    from research.checkpoint.deepfreeze import remove_stale_transfer_files
    from research.entry.launch import remove_orphaned_shm

    local_user(INTRUDER)
    pid, shm, tag = _dead_pid(), Path("/dev/shm"), f"rsh25{os.getpid()}"
    theirs = [shm / f"research-xfer-{pid}-{tag}-r0", shm / f"mpich_shm_{tag}a"]
    ours = [
        shm / f"research-xfer-{pid}-{tag}-r1",  # where earlier versions put them
        privdir.base() / f"xfer-{pid}-{tag}-r0",
        shm / f"mpich_shm_{tag}b",
    ]
    try:
        for p in theirs:
            _as(INTRUDER, "touch", str(p))
        for p in ours:
            p.touch()
        removed = remove_stale_transfer_files()
        remove_orphaned_shm()
        assert all(p.exists() for p in theirs)
        assert not any(p.exists() for p in ours)
        assert set(ours[:2]) <= set(removed) and not set(theirs) & set(removed)
    finally:
        for p in theirs + ours:
            p.unlink(missing_ok=True)


# -- a normal run, and the check before every use -------------------------------------
def test_a_normal_runs_node_local_files_are_private(tmp_path):
    from research.comm.world import get_world

    # A killed run of an earlier version left its fast tier right in /dev/shm.
    digest = hashlib.sha1(str((tmp_path / "checkpoints").resolve()).encode())
    user = privdir.user_name()
    legacy = Path("/dev/shm") / f"research-ckpt-{user}-{digest.hexdigest()[:12]}"
    if Path("/dev/shm").is_dir():
        (legacy / "rank0" / "3").mkdir(parents=True)
    ckpt = CheckpointConfig(saver="deepfreeze", every=1, fsync=False).create(
        get_world(), tmp_path
    )
    fast = ckpt.tiers[0]
    assert not legacy.exists()  # ours: memory given back
    try:
        assert fast.private and fast.root.parent == privdir.base()
        ckpt.save(1, initial())
        ckpt.wait()
        entries = _entries(fast.root)
        assert {"manifest.json", "data.bin", "shard.json"} <= {
            Path(e["path"]).name for e in entries
        }
        _private_tree(entries, os.geteuid())
        _private_tree(_entries(privdir.base())[:1], os.geteuid())  # the folder
        st = os.lstat(ckpt._xfer)  # noqa: SLF001
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o600)
    finally:
        ckpt.close()
    assert not fast.root.exists() and not os.path.lexists(ckpt._xfer)  # noqa: SLF001


def test_a_tier_is_checked_again_before_restore_and_each_save(tmp_path):
    from research.comm.world import get_world

    fast = tmp_path / "fast"
    fast.mkdir(mode=0o700)
    (fast / "yours.txt").write_text("not a checkpoint")  # the user's own file
    config = CheckpointConfig(
        saver="deepfreeze", every=1, fast_dir=str(fast), fsync=False
    )
    ckpt = config.create(get_world(), tmp_path)
    s = initial()
    ckpt.save(1, s)
    ckpt.wait()
    fast.chmod(0o777)  # now anybody could swap the shards we would read
    with pytest.raises(CheckpointError, match=f"refusing {fast}: others may write"):
        ckpt.restore(s)
    ckpt.save(2, s)
    with pytest.raises(CheckpointError, match=f"refusing {fast}: others may write"):
        ckpt.wait()
    fast.chmod(0o700)
    restored = ckpt.restore(s)
    assert restored.step == 1 and restored.tiers == ["fast"]
    ckpt.close()
    # Only what DeepFreeze put into the user's folder went.
    assert [p.name for p in fast.iterdir()] == ["yours.txt"]
    if os.geteuid() == 0:  # another user's folder is refused when opened
        os.chown(fast, local_user(INTRUDER), -1)
        with pytest.raises(CheckpointError, match=f"{fast}: it belongs to {INTRUDER}"):
            config.create(get_world(), tmp_path)


def test_the_private_folder_falls_back_past_refused_ones(tmp_path, monkeypatch):
    shm, xdg, tmp = tmp_path / "shm", tmp_path / "xdg", tmp_path / "tmp"
    for d, mode in ((shm, 0o1777), (xdg, 0o700), (tmp, 0o1777)):
        d.mkdir()
        d.chmod(mode)
    me = privdir.user_name()
    monkeypatch.setenv("RESEARCH_SHM_DIR", str(shm))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    assert privdir.base() == shm / f"research-{me}"
    st = os.lstat(shm / f"research-{me}")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o700)
    (shm / f"research-{me}").chmod(0o770)  # a group may write: refused
    with pytest.warns(privdir.PrivateDirWarning, match="others may write in it"):
        assert privdir.base() == xdg / "research"
    (xdg / "research").rmdir()
    xdg.chmod(0o777)  # a runtime folder that is not private is not used at all
    assert xdg / "research" not in privdir.candidates()
    os.symlink(tmp / "elsewhere", tmp / f"research-{me}")
    with (
        pytest.raises(privdir.NotPrivateError) as e,
        pytest.warns(privdir.PrivateDirWarning),
    ):
        privdir.base()
    assert "\n" not in str(e.value) and "is a symbolic link" in str(e.value)
    assert not (tmp / "elsewhere").exists()
