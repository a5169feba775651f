"""An in-place MPI allreduce inside ``jit``: the fused path's missing pass.

mpi4jax's allreduce gives MPI a send and a distinct receive buffer (its FFI
handler never passes ``MPI_IN_PLACE``), so MPICH starts by copying the input
into the output: one extra pass over all 102 MB of a ResNet-50 gradient per
step, on top of the divide pass that makes the sum a mean. :func:`allreduce`
is the same collective with the operand aliased to the result
(``operand_output_aliases``): XLA hands the handler one buffer, which is summed
with ``MPI_IN_PLACE``, so the divide's output *is* the result.

It shares mpi4jax's ordered effect and token, so it is ordered with every
mpi4jax call in the same program exactly as mpi4jax's calls are among
themselves (ranks never disagree on the order of collectives).

The handler (``native/allreduce_inplace.cc``, 40 lines) is compiled on first
use with the MPI compiler wrapper next to the interpreter (``mpicxx``, from the
mpich wheel, so it links the libmpi that mpi4py loaded) against jaxlib's FFI
headers, into a cache keyed by the source, jaxlib and MPI; ranks starting
together wait on a file lock, so it is built once. :func:`available` is False
(with the reason in :func:`unavailable_reason`) when the build fails; the
fused path then uses mpi4jax.
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

SOURCE = Path(__file__).with_name("native") / "allreduce_inplace.cc"
TARGET = "research_allreduce_inplace"
_state: dict[str, Any] = {}


def _cache_dir() -> Path:
    root = os.environ.get("RESEARCH_NATIVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "research-native",
    )
    return Path(root)


def _mpicxx() -> str:
    local = Path(sys.executable).parent / "mpicxx"
    return str(local) if local.exists() else "mpicxx"


def library_path() -> Path:
    """Where the compiled handler for this source, jaxlib and MPI lives."""
    import jaxlib
    from mpi4py import MPI

    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    key.update(jaxlib.__version__.encode())
    key.update(MPI.Get_library_version().encode())
    key.update(_mpicxx().encode())
    return _cache_dir() / f"allreduce_inplace-{key.hexdigest()[:16]}.so"


def build() -> Path:
    """Compile the handler unless it is cached; returns the library's path.

    Raises:
      RuntimeError: the compiler failed (its output in the message).
    """
    import jax.ffi

    lib = library_path()
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    with open(lib.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another rank may be building it
        if lib.exists():
            return lib
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        cmd = [
            _mpicxx(),
            "-O2",
            "-shared",
            "-fPIC",
            "-std=c++17",
            "-w",  # jaxlib's headers warn under g++; ours compiles clean
            f"-I{jax.ffi.include_dir()}",
            str(SOURCE),
            "-o",
            str(tmp),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}"
            )
        os.replace(tmp, lib)
    return lib


def _load() -> Any:
    """Build, load and register the handler once; the primitive, or None."""
    if "primitive" in _state:
        return _state["primitive"]
    try:
        import jax.ffi

        lib = ctypes.CDLL(str(build()))
        jax.ffi.register_ffi_target(
            TARGET, jax.ffi.pycapsule(getattr(lib, TARGET)), platform="cpu"
        )
        _state["primitive"] = _make_primitive()
    except Exception as e:  # noqa: BLE001 - any failure: mpi4jax's path instead
        _state["primitive"] = None
        _state["reason"] = f"{type(e).__name__}: {e}"
    return _state["primitive"]


def available() -> bool:
    """True when the in-place allreduce can be used (built and registered)."""
    return _load() is not None


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (None when it is True)."""
    _load()
    return _state.get("reason")


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

    prim = Primitive("research_allreduce_inplace")
    prim.def_impl(default_primitive_impl(prim))
    prim.def_effectful_abstract_eval(
        lambda x, op, comm: (ShapedArray(x.shape, x.dtype), {ordered_effect})
    )

    def lowering(ctx, x, op, comm):
        token = get_token_effect(ctx, ordered_effect)
        ctx_tok = ctx.replace(
            avals_in=(*ctx.avals_in, abstract_token),
            avals_out=(*ctx.avals_out, abstract_token),
        )
        rule = ffi_lowering(TARGET, has_side_effect=True, operand_output_aliases={0: 0})
        out, token = rule(
            ctx_tok,
            x,
            token,
            comm=np.int64(to_mpi_handle(unpack_hashable(comm))),
            dtype=np.int64(to_dtype_handle(ctx.avals_in[0].dtype)),
            op=np.int64(to_mpi_handle(unpack_hashable(op))),
        )
        set_token_effect(ctx, ordered_effect, token)
        return [out]

    register_lowering(prim, lowering, platform="cpu")
    return prim


def _hashable(obj: Any) -> Any:
    from mpi4jax._src.utils import wrap_as_hashable

    return wrap_as_hashable(obj)


def allreduce(x: Any, *, op: Any, comm: Any) -> Any:
    """``MPI_Allreduce(MPI_IN_PLACE, x)`` inside ``jit`` (CPU); the reduced array.

    Args:
      x: the array (its buffer becomes the result's where XLA can alias it).
      op: an ``mpi4py.MPI.Op`` (e.g. ``MPI.SUM``).
      comm: an ``mpi4py.MPI.Comm``.

    Raises:
      RuntimeError: the handler is not available (see :func:`available`).
    """
    prim = _load()
    if prim is None:
        raise RuntimeError(f"in-place allreduce unavailable: {_state.get('reason')}")
    return prim.bind(x, op=_hashable(op), comm=_hashable(comm))
