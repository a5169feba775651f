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
used by the host path. On a backend other than the CPU (a GPU) the custom call
does not lower: there :func:`allreduce` stages instead (``staged``), through
XLA's host callback: XLA copies the buffer to host memory, the ring sums it
there with :func:`host_allreduce`, and XLA copies the result back, ordered by
mpi4jax's token as the custom call is. Other operations and dtypes, and
buffers below ``RING_MIN_BYTES_PER_RANK`` times the size, go to
``MPI_Allreduce(MPI_IN_PLACE)`` (divided afterwards). Complex buffers travel as
pairs of reals; buffers of more than ``MAX_COUNT`` elements go in pieces. A
power-of-two divisor is a multiplication by its reciprocal, bit-identical to
the division.

It shares mpi4jax's ordered effect and token, so it is ordered with every
mpi4jax call in the same program exactly as mpi4jax's calls are among
themselves (ranks never disagree on the order of collectives). Its messages
travel on the communicator it is given, which should be dedicated to it
(``World.dup``): point-to-point messages of other code on that communicator
could match its own.

The handler is compiled on first use, once per machine, MPI and jaxlib
(:mod:`research.comm.dense.ring_build`: the cache, its lock, the compiler, the MPI it
was built for, and why a cached library is refused); this module loads it,
refuses it when mpi4py loaded another MPI than the one it was built for, and
binds it twice (XLA FFI and ctypes), which must agree on its ABI.
:func:`decide` makes the choice collectively: the ring only where every rank
can load it (an averager asks when it is built, :mod:`research.comm.dense`);
elsewhere the fused path uses mpi4jax, the host path mpi4py. Where every rank
can, ``allreduce=auto`` then times the ring against MPI's own allreduce and keeps
the faster (:mod:`research.comm.dense.choose`).
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

import numpy as np

# The build's public names stay importable from here.
from research.comm.dense.ring_build import SOURCE, build, compiler, library_path  # noqa: F401
from research.comm.dense.ring_build import mpi_digest as _mpi_digest
from research.comm.dense.ring_build import notes as _build_notes

TARGET = "research_ring_allreduce"

#: Bytes per received piece of a peer's partial sum: small enough to stay in
#: cache, large enough that per-message latency is small. 256 KiB, 1 MiB and
#: 4 MiB measured 31.1, 30.9 and 33.1 ms for ResNet-50 at 2 ranks (see dense.py).
DEFAULT_SEGMENT_BYTES = 2**20
#: Below ``RING_MIN_BYTES_PER_RANK * P`` bytes a buffer goes to MPI_Allreduce:
#: the ring pays 2(P-1) latencies with messages of 1/P of the buffer, so the
#: threshold grows with P to keep each message at least this large (64 KiB at
#: 2 ranks, as measured here before; 2 MiB at 64 ranks).
RING_MIN_BYTES_PER_RANK = 2**15
#: Largest piece one call hands to MPI (counts are C ints); larger buffers go
#: in pieces of this many elements. A module constant so tests can shrink it.
MAX_COUNT = 2**31 - 1
#: segment_bytes must lie in [1, MAX_SEGMENT_BYTES].
MAX_SEGMENT_BYTES = 2**30
_state: dict[str, Any] = {}


def _load() -> Any:
    """Build, load and register the handler once; the primitive, or None."""
    if "primitive" in _state:
        return _state["primitive"]
    try:
        import jax.ffi

        path = build()
        lib = ctypes.CDLL(str(path))
        lib.research_ring_built_mpi.restype = ctypes.c_char_p
        built = lib.research_ring_built_mpi().decode()
        if built != _mpi_digest():
            from mpi4py import MPI

            raise RuntimeError(
                f"{path} was built for another MPI than the one mpi4py loaded "
                f"({MPI.Get_library_version().splitlines()[0].strip()}); "
                "rebuild mpi4py and remove the cached library"
            )
        host = lib.research_ring_allreduce_host
        host.argtypes = (
            ctypes.c_void_p,
            ctypes.c_void_p,
            *(ctypes.c_int64,) * 8,
            ctypes.c_char_p,
            ctypes.c_int64,
        )
        host.restype = ctypes.c_int
        lib.research_ring_calls.restype = ctypes.c_int64
        lib.research_ring_bytes.restype = ctypes.c_int64
        lib.research_ring_peers.restype = ctypes.c_int64
        _state["host"] = host
        _state["calls"] = lib.research_ring_calls
        # Read by the communication watchdog (research.comm.faults.traffic).
        _state["bytes"] = lib.research_ring_bytes
        _state["peers"] = lib.research_ring_peers
        jax.ffi.register_ffi_target(
            TARGET, jax.ffi.pycapsule(getattr(lib, TARGET)), platform="cpu"
        )
        _state["primitive"] = _make_primitive()
    except Exception as e:  # noqa: BLE001 - any failure: mpi4jax's path instead
        _state["primitive"] = None
        _state["reason"] = f"{type(e).__name__}: {e}"
    return _state["primitive"]


def available() -> bool:
    """True when the ring allreduce can be used on this rank (built, loaded)."""
    return _load() is not None


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (None when it is True)."""
    _load()
    return _state.get("reason")


def notes() -> list[str]:
    """What the build did not use and why (an unsafe cache, say)."""
    return _build_notes()


def ring_calls() -> int:
    """Calls that took the ring so far in this process (0 when not loaded).

    Counted inside the C library, where the ring runs; calls that went to
    ``MPI_Allreduce`` (small buffers, other ops, the fallback) do not count.
    """
    return int(_state["calls"]()) if _state.get("calls") else 0


def decide(comm: Any, backend: str | None = None) -> dict[str, Any]:
    """Whether every rank of ``comm`` can use the ring: one answer for all.

    Collective over ``comm`` (every rank calls it, with the same ``comm``):
    each rank tries to load the ring, the ranks exchange what they found, and
    the ring is used only when every rank can. Rank 0 prints the reasons of the
    ranks that cannot, once per process.

    Args:
      comm: an ``mpi4py.MPI.Comm``.
      backend: where the buffers live: JAX's default backend (None:
        ``jax.default_backend()``), or ``"cpu"`` for host buffers. The custom
        call lowers for the CPU only; on any other backend the ring is staged
        through host memory (``staged``, see :func:`allreduce`).

    Returns:
      ``{"ring": bool, "staged": bool, "reason": str | None, "notes": [...]}``,
      the same on every rank.
    """
    import jax

    backend = backend or jax.default_backend()
    mine = None if available() else unavailable_reason()
    if mine is None and backend != "cpu":
        try:
            _staged_primitive()
        except Exception as e:  # noqa: BLE001 - any failure: mpi4jax's path
            mine = f"backend {backend}: the staged ring cannot be made: {e}"
    found = comm.allgather((mine, notes()))
    bad = [(r, why) for r, (why, _) in enumerate(found) if why]
    reason = None
    if bad:
        reason = "; ".join(f"rank {r}: {why}" for r, why in bad[:4])
        if len(bad) > 4:
            reason += f"; and {len(bad) - 4} more ranks"
    all_notes = sorted({n for _, ns in found for n in ns})
    decision = {
        "ring": not bad,
        "staged": backend != "cpu",
        "reason": reason,
        "notes": all_notes,
    }
    if comm.Get_rank() == 0 and (reason or all_notes) and not _state.get("said"):
        _state["said"] = True
        what = f"ring allreduce not used, MPI_Allreduce instead: {reason}"
        for line in [what if bad else "", *all_notes]:
            if line:
                print(f"research.comm.dense.ring: {line}", file=sys.stderr, flush=True)
    return decision


def _ordered_primitive(name: str) -> Any:
    """A primitive of one array in, one alike out, on mpi4jax's ordered effect
    (so both libraries' calls share one token), evaluated by compiling it."""
    from jax.core import ShapedArray
    from mpi4jax._src.jax_compat import Primitive
    from mpi4jax._src.utils import default_primitive_impl, ordered_effect

    prim = Primitive(name)
    prim.def_impl(default_primitive_impl(prim))
    prim.def_effectful_abstract_eval(
        lambda x, **_: (ShapedArray(x.shape, x.dtype), {ordered_effect})
    )
    return prim


def _make_primitive() -> Any:
    # mpi4jax's private pieces, so both libraries share one ordered effect.
    from jax.ffi import ffi_lowering
    from mpi4jax._src.jax_compat import (
        abstract_token,
        get_token_effect,
        register_lowering,
        set_token_effect,
    )
    from mpi4jax._src.utils import (
        ordered_effect,
        to_dtype_handle,
        to_mpi_handle,
        unpack_hashable,
    )

    prim = _ordered_primitive("research_ring_allreduce")

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
            ring_min_bytes=np.int64(ring_min_bytes(unpack_hashable(comm))),
            max_count=np.int64(MAX_COUNT),
        )
        set_token_effect(ctx, ordered_effect, token)
        return [out]

    register_lowering(prim, lowering, platform="cpu")
    return prim


def ring_min_bytes(comm: Any) -> int:
    """Buffers below this many bytes go to ``MPI_Allreduce`` on ``comm``."""
    return RING_MIN_BYTES_PER_RANK * comm.Get_size()


def check_segment_bytes(segment_bytes: Any) -> int:
    """``segment_bytes`` as an int, or a ValueError that says the range."""
    if (
        isinstance(segment_bytes, bool)
        or not isinstance(segment_bytes, (int, np.integer))
        or not 1 <= segment_bytes <= MAX_SEGMENT_BYTES
    ):
        raise ValueError(
            f"segment_bytes must be an integer in [1, {MAX_SEGMENT_BYTES}], "
            f"got {segment_bytes!r}"
        )
    return int(segment_bytes)


_DIVISIBLE = tuple(
    np.dtype(t) for t in (np.float32, np.float64, np.complex64, np.complex128)
)


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
    staged: bool | None = None,
) -> Any:
    """The sum of ``x`` over ``comm`` inside ``jit``, divided by ``divisor``.

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
      staged: sum through host memory by XLA's host callback (``x`` copied
        to the host, :func:`host_allreduce`, the result copied back) instead
        of the custom call, which lowers for the CPU only (None:
        staged where JAX's default backend is not the CPU). ``in_place`` does
        not apply: the callback's result is a buffer of its own.

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
    if divisor > 1 and not (np.dtype(x.dtype) in _DIVISIBLE and op == _mpi_sum()):
        raise ValueError(
            f"divisor={divisor} needs a float32/64 or complex SUM, got {x.dtype}"
        )
    segment_bytes = check_segment_bytes(segment_bytes)
    if staged is None:
        import jax

        staged = jax.default_backend() != "cpu"
    if staged:
        return _staged_primitive().bind(
            x,
            op=_hashable(op),
            comm=_hashable(comm),
            divisor=divisor,
            segment_bytes=segment_bytes,
        )
    return prim.bind(
        x,
        op=_hashable(op),
        comm=_hashable(comm),
        divisor=divisor,
        in_place=bool(in_place),
        segment_bytes=segment_bytes,
    )


def _staged_primitive() -> Any:
    """The staged ring's primitive, made once (raises where JAX lacks what it
    is made of: :func:`decide` says so before any averager uses it)."""
    if "staged" not in _state:
        _state["staged"] = _make_staged_primitive()
    return _state["staged"]


def _make_staged_primitive() -> Any:
    """The staged ring: a primitive on mpi4jax's ordered effect (ordered with
    mpi4jax's calls and the custom call, as they are among themselves) whose
    lowering, on every platform, is XLA's host callback: XLA hands the buffer
    to Python in host memory (a GPU's copied there), :func:`host_allreduce`
    sums it into a fresh array, and XLA copies that back.

    It lowers through ``emit_python_callback``, the lowering under
    ``jax.experimental.io_callback``, not through ``io_callback`` itself:
    that one puts every operand on JAX's CPU device before calling, and on
    the CPU (the tests) reading it back there waited on the very program that
    was calling: the tests hung in 5 of 8 runs (docs/journal.md)."""
    # Private, as mpi4jax's pieces are: the lowering io_callback is made of.
    from jax._src.callback import emit_python_callback
    from jax._src.interpreters import mlir
    from mpi4jax._src.jax_compat import get_token_effect, set_token_effect
    from mpi4jax._src.utils import ordered_effect, unpack_hashable

    prim = _ordered_primitive("research_ring_allreduce_staged")

    def lowering(ctx, x, op, comm, divisor, segment_bytes):
        comm, op = unpack_hashable(comm), unpack_hashable(op)

        def on_host(a: np.ndarray) -> tuple[np.ndarray]:
            out = np.empty(a.shape, a.dtype)
            host_allreduce(
                np.ascontiguousarray(a),
                out,
                comm=comm,
                op=op,
                divisor=divisor,
                segment_bytes=segment_bytes,
            )
            return (out,)

        token = get_token_effect(ctx, ordered_effect)
        out, token, _ = emit_python_callback(
            ctx,
            on_host,
            token,
            [x],
            ctx.avals_in,
            ctx.avals_out,
            has_side_effect=True,
            returns_token=True,
        )
        set_token_effect(ctx, ordered_effect, token)
        return out

    # Not cacheable: each module must register its own host callback.
    mlir.register_lowering(prim, lowering, cacheable=False)
    return prim


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
    segment_bytes = check_segment_bytes(segment_bytes)
    msg = ctypes.create_string_buffer(512)
    rc = _state["host"](
        src.ctypes.data,
        dst.ctypes.data,
        dst.nbytes,
        to_mpi_handle(comm),
        to_dtype_handle(dst.dtype),
        to_mpi_handle(op),
        int(divisor),
        segment_bytes,
        ring_min_bytes(comm),
        MAX_COUNT,
        msg,
        len(msg),
    )
    if rc:
        text = msg.value.decode(errors="replace")
        raise (ValueError if rc == 2 else RuntimeError)(text)
    return dst
