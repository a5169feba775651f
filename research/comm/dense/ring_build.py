"""Compiling the ring allreduce's C library once per machine, MPI and jaxlib.

:func:`build` compiles ``native/ring_allreduce.cc`` with the ``mpicxx`` of the
MPI that mpi4py was built with (:func:`compiler`) against jaxlib's FFI headers,
into a cache (``$RESEARCH_NATIVE_CACHE``, else ``~/.cache/research-native``)
keyed by the source, jaxlib, host architecture, compiler and MPI library
version (:func:`library_path`); ranks starting together wait on a file lock, so
it is built once, and a failed build is remembered (``.failed``). The library
records the MPI it was built for (:func:`mpi_digest`, checked when
:mod:`research.comm.dense.ring` loads it). It is used only from a folder and file
owned by us (or root) and writable by nobody else; otherwise it is built in a
private folder and the reason kept in :func:`notes`.

Loading the library and its two bindings (XLA FFI and ctypes), which must agree
on its ABI, are :mod:`research.comm.dense.ring`'s; that module re-exports
:func:`build`, :func:`compiler` and :func:`library_path`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("native") / "ring_allreduce.cc"
#: What the build did not use and why, in the order it happened.
_notes: list[str] = []


def _cache_dir() -> Path:
    root = os.environ.get("RESEARCH_NATIVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "research-native",
    )
    return Path(root)


def _mpicxx() -> str:
    """The C++ compiler wrapper of the MPI that mpi4py is linked against.

    ``$RESEARCH_MPICXX`` if set; else the one ``scripts/install.sh --site-mpi``
    recorded in the environment (``<venv>/research-mpi.json``: the ``MPICC``
    it built mpi4py and mpi4jax with, and its C++ wrapper); else the wrappers
    mpi4py recorded (``mpi4py.get_config()``, empty in mpi4py 4), their
    ``mpicxx`` (or the one beside their ``mpicc``); else the ``mpicxx`` beside
    the interpreter, then on ``PATH``.
    """
    import json

    import mpi4py

    if os.environ.get("RESEARCH_MPICXX"):
        return os.environ["RESEARCH_MPICXX"]
    try:
        recorded = json.loads((Path(sys.prefix) / "research-mpi.json").read_text())
        if recorded.get("mpicxx"):
            return str(recorded["mpicxx"])
    except (OSError, ValueError):
        pass
    config = mpi4py.get_config()
    if config.get("mpicxx"):
        return config["mpicxx"]
    if config.get("mpicc"):
        cc = Path(config["mpicc"])
        # mpicc.openmpi -> mpicxx.openmpi (Debian's names), else plain mpicxx.
        for name in (cc.name.replace("mpicc", "mpicxx"), "mpicxx"):
            if cc.with_name(name).exists():
                return str(cc.with_name(name))
    local = Path(sys.executable).parent / "mpicxx"
    return str(local) if local.exists() else "mpicxx"


def compiler() -> str:
    """The C++ MPI wrapper the handler is (or would be) compiled with."""
    return _mpicxx()


def mpi_digest() -> str:
    """A digest of ``MPI.Get_library_version()`` (the MPI mpi4py loaded)."""
    from mpi4py import MPI

    return hashlib.sha256(MPI.Get_library_version().encode()).hexdigest()[:32]


def _compiler_identity(cxx: str) -> str:
    try:
        proc = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable: {e}"
    return proc.stdout + proc.stderr


def library_path(cache: Path | None = None) -> Path:
    """Where the compiled handler for this source, host, compiler and MPI lives.

    The key holds what makes a library unusable elsewhere: the source, jaxlib,
    the host's architecture, the compiler's path and ``--version``, and the MPI
    library version (nodes of different kinds may share one cache).
    """
    import jaxlib

    cxx = _mpicxx()
    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    for part in (
        jaxlib.__version__,
        platform.machine(),
        platform.libc_ver()[1],
        cxx,
        _compiler_identity(cxx),
        mpi_digest(),
    ):
        key.update(part.encode() + b"\0")
    return (cache or _cache_dir()) / f"ring_allreduce-{key.hexdigest()[:16]}.so"


def _unsafe(path: Path) -> str | None:
    """Why code at ``path`` must not be loaded: owned by another user (not root)
    or writable by group or others; None when it is safe."""
    st = path.stat()
    if st.st_uid not in (os.getuid(), 0):
        return f"{path} belongs to uid {st.st_uid}, not to us"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others (mode {st.st_mode & 0o777:o})"
    return None


def _private_cache() -> Path:
    """A folder of our own for the build when the configured cache is unsafe."""
    base = Path(tempfile.gettempdir()) / f"research-native-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o700)
    if base.is_symlink() or _unsafe(base):
        return Path(tempfile.mkdtemp(prefix="research-native-"))
    return base


def build() -> Path:
    """Compile the handler unless it is cached; returns the library's path.

    The library is used only from a folder and file owned by us (or root) and
    writable by nobody else; an unsafe cache is left alone and the library
    built in a private folder (the reason in :func:`notes`). A failed build is
    remembered beside the library (``.failed``), so ranks that start later do
    not repeat it under the lock.

    Raises:
      RuntimeError: the compiler failed now or before (its output in the
        message).
    """
    import jax.ffi

    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    why = _unsafe(cache)
    if why:
        _notes.append(f"cache not used: {why}")
        cache = _private_cache()
    lib = library_path(cache)
    failed = lib.with_suffix(".failed")
    if lib.exists():
        why = _unsafe(lib)
        if why is None:
            return lib
        _notes.append(f"cached library not used: {why}")
        cache = _private_cache()
        lib, failed = library_path(cache), library_path(cache).with_suffix(".failed")
    if failed.exists():
        raise RuntimeError(f"an earlier build failed ({failed}): {failed.read_text()}")
    with open(lib.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another rank may be building it
        if lib.exists():
            return lib
        if failed.exists():
            raise RuntimeError(
                f"an earlier build failed ({failed}): {failed.read_text()}"
            )
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        cmd = [
            _mpicxx(),
            "-O3",  # vectorizes the reduction loops
            "-shared",
            "-fPIC",
            "-std=c++17",
            "-w",  # jaxlib's headers warn under g++; ours compiles clean
            f'-DRESEARCH_BUILT_MPI="{mpi_digest()}"',
            f"-I{jax.ffi.include_dir()}",
            str(SOURCE),
            "-o",
            str(tmp),
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
            rc, err = proc.returncode, proc.stderr[-2000:]
        except OSError as e:
            rc, err = -1, str(e)
        if rc != 0:
            tmp.unlink(missing_ok=True)
            text = f"{' '.join(cmd)} failed ({rc}): {err}"
            failed.write_text(text)
            raise RuntimeError(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, lib)
    return lib


def notes() -> list[str]:
    """What the build did not use and why (an unsafe cache, say)."""
    return list(_notes)
