"""One rank per GPU: which accelerator a rank uses, decided before JAX starts.

Without a binding every rank of a node opens every GPU, takes GPU 0 and JAX's
default 75% of its memory (mpi4jax issue 194). :func:`bind` gives each rank
one GPU of its node from its node-local rank, as Horovod's ``local_rank``
binding does, through the variables JAX reads when its CUDA backend starts:

* ``CUDA_VISIBLE_DEVICES``: the node's GPUs (that variable's list where it is
  set, else every GPU the driver shows) are dealt round robin over the node's
  ranks, ``gpus[local_rank % G]``: G ranks on G GPUs each take their own; more
  ranks than GPUs share them;
* ``XLA_PYTHON_CLIENT_MEM_FRACTION``: ranks that share a GPU split JAX's
  default 0.75 of it (0.375 each for two) instead of each asking for 0.75.

On GPUs mpi4jax hands MPI device buffers only where the MPI is CUDA-aware
(``MPIX_Query_cuda_support``), else it stages them through host memory:
``MPI4JAX_USE_CUDA_MPI`` is set to say which (1 on an MPI that is not
CUDA-aware crashes). A variable the user set wins (their memory and mpi4jax
settings are kept; their device list is the set dealt from).
``RESEARCH_GPU_BIND=0`` leaves the environment alone. Where no GPU is visible,
or JAX has no CUDA plugin, or ``JAX_PLATFORMS`` leaves CUDA out, the rank runs
on the CPU and nothing is set.
:func:`describe` records what the rank really got once JAX runs (platform,
device kind, device id), which every run writes into ``config.json``.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

#: ``RESEARCH_GPU_BIND=0`` leaves CUDA_VISIBLE_DEVICES and memory settings alone.
OPT_OUT = "RESEARCH_GPU_BIND"
#: JAX's default share of a GPU's memory for one process.
JAX_MEM_FRACTION = 0.75
#: The user's memory settings, which a binding never overrides.
MEMORY_VARS = (
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
)
#: Distributions that give JAX a CUDA backend.
CUDA_PLUGINS = ("jax-cuda13-plugin", "jax-cuda12-plugin")


@dataclass(frozen=True)
class Binding:
    """What one rank was given: its platform, GPU and share of that GPU."""

    platform: str  # "gpu" or "cpu"
    local_rank: int
    local_size: int
    gpu: str | None = None  # the CUDA_VISIBLE_DEVICES entry this rank uses
    shared_by: int = 1  # ranks of the node on this GPU
    mem_fraction: float | None = None  # what this rank asked JAX for (None: JAX's)
    reason: str = ""
    cuda_aware_mpi: bool | None = None  # MPIX_Query_cuda_support (GPU ranks)

    def record(self) -> dict[str, Any]:
        return asdict(self)


def visible_gpus(environ: dict[str, str] | None = None) -> list[str]:
    """The node's GPUs a process may use, as ``CUDA_VISIBLE_DEVICES`` entries.

    The variable's own list where it is set (empty or ``-1``: none), else one
    entry per GPU the NVIDIA driver shows (``/proc/driver/nvidia/gpus``, else
    the ``/dev/nvidiaN`` device files), else none.
    """
    environ = os.environ if environ is None else environ
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = [s.strip() for s in listed.split(",") if s.strip()]
        return [] if ids in ([], ["-1"]) else ids
    try:
        n = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        try:
            n = sum(bool(re.fullmatch(r"nvidia\d+", f)) for f in os.listdir("/dev"))
        except OSError:
            n = 0
    return [str(i) for i in range(n)]


def cuda_jax() -> str | None:
    """The installed JAX CUDA plugin (``jax-cuda13-plugin 0.11.2``), or None."""
    for dist in CUDA_PLUGINS:
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def planned_platform(
    environ: dict[str, str] | None = None,
    gpus: list[str] | None = None,
    plugin: str | None | bool = True,
) -> tuple[str, str]:
    """``(platform, why)``: where JAX will run this process, known before it starts.

    ``gpus`` and ``plugin`` default to what this machine has
    (:func:`visible_gpus`, :func:`cuda_jax`); tests pass their own.
    """
    environ = os.environ if environ is None else environ
    gpus = visible_gpus(environ) if gpus is None else gpus
    plugin = cuda_jax() if plugin is True else plugin
    platforms = [p.strip() for p in environ.get("JAX_PLATFORMS", "").split(",")]
    if platforms != [""] and not {"cuda", "gpu"} & set(platforms):
        return "cpu", f"JAX_PLATFORMS={environ['JAX_PLATFORMS']}"
    if not gpus:
        return "cpu", "no GPU visible"
    if not plugin:
        return "cpu", (
            f"{len(gpus)} GPUs visible but JAX has no CUDA plugin "
            "(bash scripts/install.sh --cuda installs one)"
        )
    return "gpu", f"{len(gpus)} GPUs visible, {plugin}"


def plan(
    local_rank: int,
    local_size: int,
    environ: dict[str, str] | None = None,
    gpus: list[str] | None = None,
    plugin: str | None | bool = True,
) -> Binding:
    """The binding of node-local rank ``local_rank`` of ``local_size``."""
    environ = os.environ if environ is None else environ
    gpus = visible_gpus(environ) if gpus is None else gpus
    platform, why = planned_platform(environ, gpus, plugin)
    if platform != "gpu":
        return Binding("cpu", local_rank, local_size, reason=why)
    slot = local_rank % len(gpus)
    shared = len(range(slot, local_size, len(gpus)))
    fraction = None
    if shared > 1 and not any(v in environ for v in MEMORY_VARS):
        fraction = round(JAX_MEM_FRACTION / shared, 3)
    return Binding(
        "gpu",
        local_rank,
        local_size,
        gpu=gpus[slot],
        shared_by=shared,
        mem_fraction=fraction,
        reason=f"{why}; local rank {local_rank} of {local_size} -> GPU {gpus[slot]}",
    )


def environment(
    binding: Binding, environ: dict[str, str] | None = None
) -> dict[str, str]:
    """The variables that put ``binding`` into effect (before JAX starts)."""
    environ = os.environ if environ is None else environ
    if binding.platform != "gpu":
        return {}
    env = {"CUDA_VISIBLE_DEVICES": binding.gpu}
    if binding.mem_fraction is not None:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{binding.mem_fraction:g}"
    if binding.cuda_aware_mpi is not None and "MPI4JAX_USE_CUDA_MPI" not in environ:
        env["MPI4JAX_USE_CUDA_MPI"] = "1" if binding.cuda_aware_mpi else "0"
    return env


def cuda_aware_mpi() -> bool | None:
    """Whether the MPI this process loaded takes device buffers (its
    ``MPIX_Query_cuda_support``, MPICH's and Open MPI's extension); None where
    it cannot be asked. Call after MPI_Init."""
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            libs = {ln.split()[-1] for ln in f if re.search(r"/libmpi[^/]*\.so", ln)}
        for path in sorted(libs):
            query = getattr(ctypes.CDLL(path), "MPIX_Query_cuda_support", None)
            if query is not None:
                return bool(query())
    except OSError:
        pass
    return None


_binding: Binding | None = None


def jax_started() -> bool:
    """Whether JAX has made its backends (then the binding cannot take effect)."""
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - jax moved it; assume not started
        return False
    started = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(started and started())


def bind(local_rank: int, local_size: int) -> Binding:
    """Decide this rank's device and set the environment for it, once.

    Called by :func:`research.comm.world.get_world` when it makes the world,
    before any JAX computation; a process whose JAX already runs keeps what
    JAX chose (recorded with the reason).
    """
    global _binding
    if _binding is not None:
        return _binding
    unbound = None  # why this process keeps what JAX chooses
    if os.environ.get(OPT_OUT, "1") == "0":
        unbound = f"{OPT_OUT}=0"
    elif jax_started():
        unbound = (
            "JAX started before the MPI world: not bound (make the world "
            "first: research.comm.world.get_world())"
        )
    if unbound:
        planned, _ = planned_platform()
        _binding = Binding(planned, local_rank, local_size, reason=unbound)
    else:
        _binding = plan(local_rank, local_size)
        if _binding.platform == "gpu":
            _binding = replace(_binding, cuda_aware_mpi=cuda_aware_mpi())
        os.environ.update(environment(_binding))
    return _binding


def current() -> Binding | None:
    """This process's binding (None before :func:`bind`)."""
    return _binding


def describe() -> dict[str, Any]:
    """What this rank runs on now (JAX started): for ``config.json``."""
    import jax

    dev = jax.local_devices()[0]
    out = {
        "platform": dev.platform,
        "device_kind": dev.device_kind,
        "device_id": dev.id,
        "local_devices": jax.local_device_count(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "mpi4jax_cuda_mpi": os.environ.get("MPI4JAX_USE_CUDA_MPI"),
    }
    if _binding is not None:
        out["binding"] = _binding.record()
        if _binding.platform == "gpu" and dev.platform != "gpu":
            out["warning"] = (
                "bound to a GPU but JAX runs on the CPU: its CUDA plugin did "
                "not start (see JAX's warning above)"
            )
    return out
