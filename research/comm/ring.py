"""The dense allreduce of the fused and host paths: a segmented ring, mean folded in.

:func:`allreduce` is an XLA FFI custom call (``native/ring_allreduce.cc``, about
250 lines) that sums a buffer over a communicator with a ring of
``MPI_Sendrecv``: P-1 reduce-scatter steps, then P-1 allgather steps. Compared
with handing the buffer to ``MPI_Allreduce`` (mpi4jax's ``allreduce``) it

* never copies the input: the first step reads the caller's buffer, the rest
  work in the result (``in_place=True`` aliases the two instead, which saves a
  buffer when XLA may overwrite the operand and costs XLA a copy when not);
* folds the mean into the sum: with ``divisor=P`` each rank divides only the
  chunk it finishes, during its last reduction, and the allgather spreads the
  divided chunks, so the mean costs no pass of its own and every rank gets the
  same bits;
* receives peers' partial sums in ``segment_bytes`` pieces into one buffer per
  thread that stays in cache, where MPICH maps a temporary of half the message
  afresh on every large call (the page faults of ``scripts.bench_allreduce``'s
  baseline).

:func:`host_allreduce` is the same code for numpy buffers (through ctypes),
used by the host path. Other operations and dtypes, and buffers below
``RING_MIN_BYTES``, go to ``MPI_Allreduce(MPI_IN_PLACE)`` (divided
afterwards). A power-of-two divisor is a multiplication by its reciprocal,
bit-identical to the division.

It shares mpi4jax's ordered effect and token, so it is ordered with every
mpi4jax call in the same program exactly as mpi4jax's calls are among
themselves (ranks never disagree on the order of collectives). Its messages
travel on the communicator it is given, which should be dedicated to it
(``World.dup``): point-to-point messages of other code on that communicator
could match its own.

The handler is compiled on first use with the MPI compiler wrapper next to the
interpreter (``mpicxx``, from the mpich wheel, so it links the libmpi that
mpi4py loaded) against jaxlib's FFI headers, into a cache keyed by the source,
jaxlib and MPI; ranks starting together wait on a file lock, so it is built
once. :func:`available` is False (with the reason in :func:`unavailable_reason`)
when the build fails; the fused path then uses mpi4jax, the host path mpi4py.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

SOURCE = Path(__file__).with_name("native") / "ring_allreduce.cc"
TARGET = "research_ring_allreduce"

#: Bytes per received piece of a peer's partial sum: small enough to stay in
#: cache, large enough that per-message latency is small. 256 KiB, 1 MiB and
#: 4 MiB measured 31.1, 30.9 and 33.1 ms for ResNet-50 at 2 ranks (see dense.py).
DEFAULT_SEGMENT_BYTES = 2**20
#: Below this a buffer goes to MPI_Allreduce: the ring pays 2(P-1) latencies.
RING_MIN_BYTES = 2**16
_state: dict[str, Any] = {}


def _cache_dir() -> Path:
    root = os.environ.get("RESEARCH_NATIVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "research-native",
    )
    return Path(root)


def _mpicxx() -> str:
    """The C++ wrapper of the MPI mpi4py was built with (its ``mpicc``'s
    sibling, for an mpi4py built from source against a site MPI), else the
    environment's (the mpich wheel's), else the PATH's."""
    try:
        import mpi4py

        mpicc = mpi4py.get_config().get("mpicc")
    except Exception:  # noqa: BLE001 - an mpi4py without its build config
        mpicc = None
    if mpicc:
        sibling = Path(mpicc).with_name(Path(mpicc).name.replace("mpicc", "mpicxx"))
        if sibling.exists():
            return str(sibling)
    local = Path(sys.executable).parent / "mpicxx"
    return str(local) if local.exists() else "mpicxx"


def _compiler_id(cxx: str) -> str:
    try:
        out = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, timeout=30
        )
        return out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def library_path() -> Path:
    """Where the compiled handler for this source, jaxlib, MPI, compiler and
    machine lives (a cache shared by nodes of different kinds keeps apart)."""
    import platform

    import jaxlib
    from mpi4py import MPI

    cxx = _mpicxx()
    key = hashlib.sha256()
    for part in (
        SOURCE.read_text(),
        jaxlib.__version__,
        MPI.Get_library_version(),
        cxx,
        _compiler_id(cxx),
        platform.machine(),
        platform.libc_ver()[1],
    ):
        key.update(part.encode() + b"\0")
    return _cache_dir() / f"ring_allreduce-{key.hexdigest()[:16]}.so"


def _not_private(path: Path) -> str | None:
    """Why ``path`` must not be trusted: not owned by us (or root), or
    writable by group or others (anyone who can write there could make every
    rank run their code). The same rule as :mod:`research.privdir`, kept here
    because research/comm imports nothing of the project but the trace."""
    try:
        st = path.lstat()
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    if st.st_uid not in (os.getuid(), 0):
        return f"{path} belongs to uid {st.st_uid}, not to us"
    if st.st_mode & 0o022:
        return f"{path} is writable by others (mode {st.st_mode & 0o777:o})"
    return None


#: Largest ``segment_bytes``: one MPI message's element count must fit an int.
MAX_SEGMENT_BYTES = 2**31 - 1


def check_segment_bytes(segment_bytes: Any) -> int:
    """``segment_bytes`` as an int, or ``ValueError`` naming the allowed range
    (checked before any communication, on every rank alike)."""
    if isinstance(segment_bytes, bool) or not isinstance(segment_bytes, int):
        raise ValueError(f"segment_bytes must be an int, got {segment_bytes!r}")
    if not 1 <= segment_bytes <= MAX_SEGMENT_BYTES:
        raise ValueError(
            f"segment_bytes must be in 1..{MAX_SEGMENT_BYTES} (2**31 - 1), "
            f"got {segment_bytes}"
        )
    return segment_bytes


def _mpi_family(text: str) -> str:
    if "Open MPI" in text:
        return "Open MPI"
    if any(s in text for s in ("MPICH", "Intel(R) MPI", "MVAPICH")):
        return "MPICH"
    return "unknown"


def build() -> Path:
    """Compile the handler unless it is cached; returns the library's path.

    Raises:
      RuntimeError: the compiler failed (its output in the message).
    """
    import jax.ffi

    lib = library_path()
    failed = lib.with_suffix(".failed")
    if lib.exists():
        return lib
    if failed.exists():  # remembered: no rank retries a build that failed
        raise RuntimeError(f"an earlier build failed ({failed}): {failed.read_text()}")
    lib.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(lib.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another rank may be building it
        if lib.exists():
            return lib
        if failed.exists():
            raise RuntimeError(f"an earlier build failed: {failed.read_text()}")
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        cmd = [
            _mpicxx(),
            "-O3",  # vectorizes the reduction loops
            "-shared",
            "-fPIC",
            "-std=c++17",
            "-w",  # jaxlib's headers warn under g++; ours compiles clean
            f"-I{jax.ffi.include_dir()}",
            str(SOURCE),
            "-o",
            str(tmp),
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
            why = f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}"
        except OSError as e:  # no compiler at all
            proc, why = None, f"{cmd[0]}: {e.strerror or e}"
        if proc is None or proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            failed.write_text(why)
            raise RuntimeError(why)
        os.replace(tmp, lib)
    return lib


def _load() -> Any:
    """Build, load and register the handler once; the primitive, or None."""
    if "primitive" in _state:
        return _state["primitive"]
    try:
        import jax.ffi
        from mpi4py import MPI

        folder = library_path().parent
        if folder.exists():  # refused before anything is compiled into it
            unsafe = _not_private(folder)
            if unsafe:
                raise RuntimeError(f"not building or loading the ring: {unsafe}")
        path = build()
        for item in (path.parent, path):
            unsafe = _not_private(item)
            if unsafe:
                raise RuntimeError(f"not loading the native library: {unsafe}")
        lib = ctypes.CDLL(str(path))
        lib.research_ring_mpi_headers.restype = ctypes.c_char_p
        headers = lib.research_ring_mpi_headers().decode()
        runtime = _mpi_family(MPI.Get_library_version())
        if "unknown" not in (headers, runtime) and headers != runtime:
            raise RuntimeError(
                f"built against {headers}'s mpi.h but this process runs {runtime} "
                f"({MPI.Get_library_version().splitlines()[0].strip()}): rebuild "
                "with that MPI's mpicxx on PATH, or install mpi4py against the "
                "same MPI"
            )
        lib.research_ring_calls.restype = ctypes.c_int64
        _state["calls"] = lib.research_ring_calls
        host = lib.research_ring_allreduce_host
        host.argtypes = (
            ctypes.c_void_p,
            ctypes.c_void_p,
            *(ctypes.c_int64,) * 7,
            ctypes.c_char_p,
            ctypes.c_int64,
        )
        host.restype = ctypes.c_int
        _state["host"] = host
        jax.ffi.register_ffi_target(
            TARGET, jax.ffi.pycapsule(getattr(lib, TARGET)), platform="cpu"
        )
        _state["primitive"] = _make_primitive()
    except Exception as e:  # noqa: BLE001 - any failure: mpi4jax's path instead
        _state["primitive"] = None
        _state["reason"] = f"{type(e).__name__}: {e}"
    return _state["primitive"]


def available() -> bool:
    """True when the ring allreduce can be used (built and registered)."""
    return _load() is not None


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (None when it is True)."""
    _load()
    return _state.get("reason")


def ring_calls() -> int:
    """Reductions the ring itself ran in this process (its fallback to
    ``MPI_Allreduce`` for small buffers and other dtypes not counted)."""
    return int(_state["calls"]()) if _load() is not None else 0


def agree(comm: Any, native: bool = True) -> tuple[bool, str]:
    """Whether every rank of ``comm`` uses the ring, decided together.

    Collective (one allgather): each rank says whether it can load the ring
    (a rank that cannot build it, a library not ours, an MPI mismatch), and
    the ring is used only if every rank can; otherwise every rank uses MPI's
    own allreduce. Ranks never decide alone between two collectives: one
    rank in the ring's ``MPI_Sendrecv`` and another in ``MPI_Allreduce``
    would wait for each other forever.

    Returns:
      ``(use_ring, why)``: ``why`` names the allreduce chosen and, when it is
      MPI's, each rank's reason.
    """
    mine = None if native else "native=False"
    if mine is None:
        mine = unavailable_reason()
    reasons = comm.allgather(mine)
    if all(r is None for r in reasons):
        return True, "ring: every rank loaded research/comm/native/ring_allreduce.cc"
    if not native:
        return False, "MPI_Allreduce: native=False"
    bad = "; ".join(f"rank {r}: {why}" for r, why in enumerate(reasons) if why)
    return False, f"MPI_Allreduce: the ring could not be used on every rank ({bad})"


def _make_primitive() -> Any:
    # mpi4jax's private pieces, so both libraries share one ordered effect.
    from jax.core import ShapedArray
    from jax.ffi import ffi_lowering
    from mpi4jax._src.jax_compat import (
        Primitive,
        abstract_token,
        get_token_effect,
        register_lowering,
        set_token_effect,
    )
    from mpi4jax._src.utils import (
        default_primitive_impl,
        ordered_effect,
        to_dtype_handle,
        to_mpi_handle,
        unpack_hashable,
    )

    prim = Primitive("research_ring_allreduce")
    prim.def_impl(default_primitive_impl(prim))
    prim.def_effectful_abstract_eval(
        lambda x, **_: (ShapedArray(x.shape, x.dtype), {ordered_effect})
    )

    def lowering(ctx, x, op, comm, divisor, in_place, segment_bytes):
        token = get_token_effect(ctx, ordered_effect)
        ctx_tok = ctx.replace(
            avals_in=(*ctx.avals_in, abstract_token),
            avals_out=(*ctx.avals_out, abstract_token),
        )
        rule = ffi_lowering(
            TARGET,
            has_side_effect=True,
            operand_output_aliases={0: 0} if in_place else None,
        )
        out, token = rule(
            ctx_tok,
            x,
            token,
            comm=np.int64(to_mpi_handle(unpack_hashable(comm))),
            dtype=np.int64(to_dtype_handle(ctx.avals_in[0].dtype)),
            op=np.int64(to_mpi_handle(unpack_hashable(op))),
            divisor=np.int64(divisor),
            segment_bytes=np.int64(segment_bytes),
            ring_min_bytes=np.int64(RING_MIN_BYTES),
        )
        set_token_effect(ctx, ordered_effect, token)
        return [out]

    register_lowering(prim, lowering, platform="cpu")
    return prim


def _hashable(obj: Any) -> Any:
    from mpi4jax._src.utils import wrap_as_hashable

    return wrap_as_hashable(obj)


def allreduce(
    x: Any,
    *,
    op: Any,
    comm: Any,
    divisor: int = 1,
    in_place: bool = False,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> Any:
    """The sum of ``x`` over ``comm`` inside ``jit`` (CPU), divided by ``divisor``.

    Args:
      x: the array.
      op: an ``mpi4py.MPI.Op``; ``MPI.SUM`` of float32, float64, int32 and int64
        takes the ring, anything else ``MPI_Allreduce``.
      comm: an ``mpi4py.MPI.Comm`` dedicated to this use (see module docstring).
      divisor: divide the sum by this (float SUM only), folded into the ring's
        last reduction step; 1: the plain sum.
      in_place: alias ``x``'s buffer to the result (XLA copies ``x`` first when
        it cannot give the buffer away, e.g. a parameter that is not donated).
      segment_bytes: size of the pieces a partial sum arrives in.

    Raises:
      RuntimeError: the handler is not available (see :func:`available`).
      ValueError: a divisor other than 1 for an integer array or another op.
    """
    prim = _load()
    if prim is None:
        raise RuntimeError(f"ring allreduce unavailable: {_state.get('reason')}")
    divisor = int(divisor)
    if divisor < 1:
        raise ValueError(f"divisor must be >= 1, got {divisor}")
    if divisor > 1 and not (
        np.dtype(x.dtype) in (np.dtype(np.float32), np.dtype(np.float64))
        and op == _mpi_sum()
    ):
        raise ValueError(
            f"divisor={divisor} needs a float32 or float64 SUM, got {x.dtype}"
        )
    return prim.bind(
        x,
        op=_hashable(op),
        comm=_hashable(comm),
        divisor=divisor,
        in_place=bool(in_place),
        segment_bytes=check_segment_bytes(segment_bytes),
    )


def _mpi_sum() -> Any:
    from mpi4py import MPI

    return MPI.SUM


def host_allreduce(
    src: np.ndarray,
    dst: np.ndarray,
    *,
    comm: Any,
    op: Any = None,
    divisor: int = 1,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> np.ndarray:
    """The ring on host buffers: ``dst[:] = sum over ranks of src / divisor``.

    Blocking, like ``comm.Allreduce``; the GIL is released while it runs.

    Args:
      src: a C-contiguous array (read only; it may be a read-only view of a jax
        array, or ``dst`` itself to sum in place).
      dst: a writable C-contiguous array of ``src``'s dtype and size.
      comm: an ``mpi4py.MPI.Comm`` dedicated to this use.
      op: an ``mpi4py.MPI.Op`` (default ``MPI.SUM``).
      divisor: as in :func:`allreduce`.
      segment_bytes: as in :func:`allreduce`.

    Returns:
      ``dst``.

    Raises:
      RuntimeError: the handler is not available, or MPI failed.
      ValueError: mismatched buffers, or a divisor other than 1 where not allowed.
    """
    from mpi4jax._src.utils import to_dtype_handle, to_mpi_handle

    if _load() is None:
        raise RuntimeError(f"ring allreduce unavailable: {_state.get('reason')}")
    op = _mpi_sum() if op is None else op
    if not (src.flags.c_contiguous and dst.flags.c_contiguous and dst.flags.writeable):
        raise ValueError("src and dst must be C-contiguous, dst writable")
    if src.dtype != dst.dtype or src.size != dst.size:
        raise ValueError(
            f"src {src.dtype}[{src.size}] and dst {dst.dtype}[{dst.size}] differ"
        )
    check_segment_bytes(segment_bytes)
    msg = ctypes.create_string_buffer(512)
    rc = _state["host"](
        src.ctypes.data,
        dst.ctypes.data,
        dst.nbytes,
        to_mpi_handle(comm),
        to_dtype_handle(dst.dtype),
        to_mpi_handle(op),
        int(divisor),
        int(segment_bytes),
        RING_MIN_BYTES,
        msg,
        len(msg),
    )
    if rc:
        text = msg.value.decode(errors="replace")
        raise (ValueError if rc == 2 else RuntimeError)(text)
    return dst
